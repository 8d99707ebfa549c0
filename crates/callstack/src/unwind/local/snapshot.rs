//! The snapshot of the loaded modules with their compiled tables:
//! [`prepare`] builds and publishes it, a capture checks that a module of
//! it is still the object loaded at its addresses.

use core::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::cache::clear_cache;
use super::flags::FLAGS;
use super::loader::{dl_find, has_dl_find_object, sections_from_hdr, DlModule};
use super::A;
use crate::unwind::UnwindTable;

pub(super) struct LocalModule {
    pub(super) bias: u64,
    path: std::path::PathBuf,
    pub(super) table: Arc<UnwindTable<A>>,
    /// Who the module was when the snapshot was taken (None without
    /// `_dl_find_object`): a capture compares it with what is loaded at its
    /// addresses now, so that a module unloaded by `dlclose` since (and
    /// whatever is loaded at its addresses now) is never taken for this one.
    live: Option<Identity>,
}

/// A loaded object as `_dl_find_object` sees it, and its GNU build-id where
/// it sits in the object's first page (always mapped while the object is
/// loaded): the same mapping with another build-id is another build (a
/// rebuilt plugin reloaded at the same address, say).
struct Identity {
    dl: DlModule,
    /// Offset of the build-id bytes from `dl.start`, and the bytes.
    build_id: Option<(u64, Box<[u8]>)>,
    /// False when what `_dl_find_object` found at the module's text at
    /// `prepare` time is not the listed module (it was unloaded, and maybe
    /// replaced, while `prepare` ran): the module then never matches.
    confirmed: bool,
}

impl Identity {
    /// Called by [`prepare`] for a listed module, with `_dl_find_object`.
    fn of(m: &crate::modules::Module) -> Identity {
        let unconfirmed = Identity {
            dl: DlModule {
                start: 0,
                end: 0,
                eh_frame_hdr: 0,
            },
            build_id: None,
            confirmed: false,
        };
        let Some(text) = m.segments.iter().find(|s| s.executable) else {
            return unconfirmed;
        };
        let Some(dl) = dl_find(text.start as u64) else {
            return unconfirmed;
        };
        let mut confirmed = m.eh_frame_hdr.map_or(0, |h| h as u64) == dl.eh_frame_hdr;
        let page = 4096u64.min(dl.end.saturating_sub(dl.start)) as usize;
        let build_id = match m.build_id.as_deref() {
            Some(id) if !id.is_empty() => {
                // SAFETY: the first page of a loaded object (the start of
                // its first PT_LOAD mapping, which holds at least the ELF
                // header) is mapped and readable while it is loaded.
                let first = unsafe { core::slice::from_raw_parts(dl.start as *const u8, page) };
                match first.windows(id.len()).position(|w| w == id) {
                    Some(at) => Some((at as u64, Box::from(id))),
                    // GNU ld, gold and lld put the note in the first page:
                    // another object is loaded there now.
                    None => {
                        confirmed = false;
                        None
                    }
                }
            }
            _ => None,
        };
        Identity {
            dl,
            build_id,
            confirmed,
        }
    }
}

impl LocalModule {
    /// Whether the module is still the object loaded at `addr` (one of its
    /// addresses), by `_dl_find_object` (lock-free) and the build-id.
    /// Always true without `_dl_find_object`. Async-signal-safe.
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    pub(super) fn still_loaded(
        &self,
        addr: u64,
        now: impl FnOnce(u64) -> Option<DlModule>,
    ) -> bool {
        let Some(then) = &self.live else {
            return true;
        };
        if !then.confirmed {
            return false;
        }
        let Some(d) = now(addr) else {
            return false;
        };
        if d.start != then.dl.start
            || d.end != then.dl.end
            || d.eh_frame_hdr != then.dl.eh_frame_hdr
        {
            return false;
        }
        match &then.build_id {
            None => true,
            Some((at, id)) => {
                // SAFETY: `[start + at, start + at + len)` lies in the first
                // page of the object loaded at `start` now (checked at
                // `prepare`: `at + len <= 4096` and within the mapping).
                let now_id =
                    unsafe { core::slice::from_raw_parts((d.start + at) as *const u8, id.len()) };
                now_id == &id[..]
            }
        }
    }
}

pub(super) struct Snapshot {
    /// Executable segments `(start, end, module index)`, sorted.
    pub(super) segments: Box<[(u64, u64, usize)]>,
    pub(super) modules: Box<[LocalModule]>,
    adds: u64,
    subs: u64,
    /// Set by the first capture that finds one of `modules` unloaded: it
    /// clears the rule cache once (see [`LocalSource::module`](super::source::LocalSource::module)).
    unloaded_seen: AtomicBool,
}

impl Snapshot {
    #[inline]
    pub(super) fn find(&self, addr: u64) -> Option<&LocalModule> {
        let i = self.segments.partition_point(|s| s.0 <= addr);
        let s = self.segments.get(i.checked_sub(1)?)?;
        if addr < s.1 {
            Some(&self.modules[s.2])
        } else {
            None
        }
    }

    /// Whether `addr` is at least 16 bytes below the end of one of the
    /// snapshot's executable segments.
    #[cfg(callstack_native)]
    #[inline]
    pub(super) fn in_code(&self, addr: u64) -> bool {
        let i = self.segments.partition_point(|s| s.0 <= addr);
        match i.checked_sub(1).and_then(|i| self.segments.get(i)) {
            Some(s) => addr < s.1 && s.1 - addr >= 16,
            None => false,
        }
    }
}

/// The published module snapshot, if [`prepare`] ran. Lock-free.
#[inline(always)]
pub(super) fn published() -> Option<&'static Snapshot> {
    let p = FLAGS.snapshot.load(Ordering::Acquire).cast::<Snapshot>();
    // SAFETY: the only pointer ever stored there is a leaked
    // `Box<Snapshot>` (in `prepare`), never freed.
    unsafe { p.as_ref() }
}

/// The executable segment of the published module snapshot (see
/// [`prepare`]) that holds `addr`: lock-free, no system call. `None` before
/// any snapshot, or outside its segments.
pub(crate) fn snapshot_code_range(addr: u64) -> Option<(u64, u64)> {
    let s = published()?;
    let i = s.segments.partition_point(|seg| seg.0 <= addr);
    let seg = s.segments.get(i.checked_sub(1)?)?;
    (addr < seg.1).then_some((seg.0, seg.1))
}
static PREPARE_LOCK: Mutex<()> = Mutex::new(());

/// Length of an `.eh_frame` in memory: its entries up to the zero
/// terminator, or to `limit`.
fn eh_frame_len(start: u64, limit: u64) -> usize {
    let mut p = start;
    while p + 4 <= limit {
        // SAFETY: `p + 4 <= limit`, inside the module's mapped segment.
        let len = unsafe { core::ptr::read_unaligned(p as *const u32) } as u64;
        if len == 0 {
            return (p + 4 - start) as usize;
        }
        let (hdr, len) = if len == 0xffff_ffff {
            if p + 12 > limit {
                break;
            }
            // SAFETY: as above, `p + 12 <= limit`.
            (12, unsafe {
                core::ptr::read_unaligned((p + 4) as *const u64)
            })
        } else {
            (4, len)
        };
        match p.checked_add(hdr + len) {
            Some(n) if n <= limit => p = n,
            _ => break,
        }
    }
    (p.min(limit) - start) as usize
}

/// Compiles the table of one loaded module from its memory (the bytes are
/// copied, so the table stays valid after a `dlclose`).
fn compile_loaded(m: &crate::modules::Module) -> Option<UnwindTable<A>> {
    let hdr = m.eh_frame_hdr? as u64;
    let seg_end = m
        .segments
        .iter()
        .find(|s| s.start as u64 <= hdr && hdr < (s.start + s.size) as u64)
        .map(|s| (s.start + s.size) as u64)?;
    let secs = sections_from_hdr(hdr, seg_end)?;
    let (eh, eh_addr) = secs.eh_frame?;
    let eh_seg_end = m
        .segments
        .iter()
        .find(|s| s.start as u64 <= eh_addr && eh_addr < (s.start + s.size) as u64)
        .map(|s| (s.start + s.size) as u64)?;
    let len = eh_frame_len(eh_addr, eh_seg_end).min(eh.len());
    let bias = m.bias as u64;
    UnwindTable::from_sections(crate::unwind::SectionsInput {
        eh_frame_hdr: None,
        eh_frame: Some((eh[..len].to_vec(), eh_addr.wrapping_sub(bias))),
        debug_frame: None,
        text: 0,
        got: 0,
    })
    .ok()
}

/// Statistics of the last [`prepare`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrepareStats {
    /// Modules in the snapshot.
    pub modules: usize,
    /// Modules whose table was compiled by this call (others were reused).
    pub compiled: usize,
    /// Compiled rows in those tables.
    pub rows: usize,
    /// CFI rows they came from.
    pub cfi_rows: usize,
    /// Bytes of those tables.
    pub table_bytes: usize,
    /// Bytes of the `.eh_frame` sections they came from.
    pub eh_frame_bytes: usize,
}

/// Builds (or refreshes) the compiled unwind tables of every loaded module
/// and publishes them for [`crate::capture_exact`] and
/// [`crate::capture_from_context`].
///
/// Optional with glibc 2.35+ (captures find modules without it, more
/// slowly); needed once before capturing with an older glibc. Call it again
/// after `dlclose`: with glibc 2.35+ captures detect an unloaded module by
/// themselves (see the module docs of `unwind::local`), but until `prepare`
/// runs, a frame whose return address equals one cached from the unloaded
/// library may still be unwound with its old rule; with an older glibc it
/// is required. Cheap when nothing changed (one `dl_iterate_phdr`).
///
/// Not async-signal-safe: allocates, takes the loader's lock. Never call it
/// from a signal handler.
pub fn prepare() -> PrepareStats {
    let _g = PREPARE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // The instruction-analysis fallback's disassembler tables.
    crate::unwind::insn::warm_up();
    // (0, 0) when the loader keeps no counters: then only a `stale` flag or
    // the first call builds a snapshot.
    let (adds, subs) = crate::modules::loader_counters().unwrap_or((0, 0));
    let old = published();
    let stale = FLAGS.stale.swap(false, Ordering::AcqRel);
    if let Some(o) = old {
        if o.adds == adds && o.subs == subs && !stale {
            return PrepareStats {
                modules: o.modules.len(),
                ..Default::default()
            };
        }
    }
    let mut stats = PrepareStats::default();
    let mut modules: Vec<LocalModule> = Vec::new();
    let mut segments: Vec<(u64, u64, usize)> = Vec::new();
    let mut removed = false;
    let listed = crate::modules::loaded_modules();
    if let Some(o) = old {
        removed = o.modules.iter().any(|om| {
            !listed
                .iter()
                .any(|m| m.bias as u64 == om.bias && m.path == om.path)
        });
    }
    for m in &listed {
        let reuse = old.and_then(|o| {
            o.modules
                .iter()
                .find(|om| om.bias == m.bias as u64 && om.path == m.path)
                .map(|om| om.table.clone())
        });
        let table = match reuse {
            Some(t) => t,
            None => match compile_loaded(m).or_else(|| UnwindTable::empty().ok()) {
                Some(t) => {
                    let s = t.stats();
                    stats.compiled += 1;
                    stats.rows += s.rows;
                    stats.cfi_rows += s.cfi_rows;
                    stats.table_bytes += s.table_bytes;
                    stats.eh_frame_bytes += s.cfi_bytes;
                    Arc::new(t)
                }
                None => continue,
            },
        };
        let idx = modules.len();
        for s in m.segments.iter().filter(|s| s.executable) {
            segments.push((s.start as u64, (s.start + s.size) as u64, idx));
        }
        let live = has_dl_find_object().then(|| Identity::of(m));
        modules.push(LocalModule {
            bias: m.bias as u64,
            path: m.path.clone(),
            table,
            live,
        });
    }
    segments.sort_by_key(|s| s.0);
    stats.modules = modules.len();
    let snap = Box::new(Snapshot {
        segments: segments.into_boxed_slice(),
        modules: modules.into_boxed_slice(),
        adds,
        subs,
        unloaded_seen: AtomicBool::new(false),
    });
    // The old snapshot is leaked on purpose: a capture may still read it.
    FLAGS
        .snapshot
        .store(Box::into_raw(snap).cast(), Ordering::Release);
    if removed {
        clear_cache();
    }
    // Code may have changed under cached instruction-analysis answers (and
    // the rules they settled in the rule cache, dropped at the next use:
    // `cache::insn_words_current`).
    crate::unwind::insn::cache::invalidate();
    stats
}

/// Starts a background thread that runs [`prepare`] now and then again
/// whenever a capture met a module without a compiled table or the set of
/// loaded objects changed (checked every `period`). Returns at once; a
/// second call does nothing.
pub fn prepare_in_background(period: std::time::Duration) {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("callstack-prepare".into())
        .spawn(move || loop {
            prepare();
            std::thread::sleep(period);
        });
}

/// A module of `s` is no longer loaded (`dlclose` without [`prepare`]
/// since): the next [`prepare`] must rebuild the snapshot, and the rule
/// cache, which may hold the module's rules, is cleared (once per
/// snapshot; lock-free, a few microseconds). Async-signal-safe.
#[cold]
#[inline(never)]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(super) fn unloaded(s: &Snapshot) {
    FLAGS.stale.store(true, Ordering::Relaxed);
    if !s.unloaded_seen.swap(true, Ordering::Relaxed) {
        clear_cache();
    }
}
