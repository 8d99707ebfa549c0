//! The rule source of a walk in this process: rules from the rule cache,
//! the snapshot's compiled tables or the CFI of a module only
//! `_dl_find_object` knows, and the modules whose rules went into the cache
//! that way.

use core::cell::Cell;
use core::sync::atomic::Ordering;

use super::cache::{cache_get, cache_put, cache_rule, clear_cache, unpack_cached};
use super::flags::FLAGS;
use super::hot::{hot_run, Hot};
use super::loader::{dl_find, sections_from_hdr, DlModule};
use super::snapshot::{published, unloaded, LocalModule, Snapshot};
use super::A;
use crate::arch::{Applied, Arch};
use crate::unwind::cfi::{self, FdeAt};
use crate::unwind::code::CodeCheck;
use crate::unwind::{FastEnd, Found, Memory, RuleSource, UnwindError, UnwindRegs};

pub(crate) struct LocalSource {
    snap: Option<&'static Snapshot>,
    last: Cell<Option<DlModule>>,
    /// Whether the rule cache held anything when the walk began: if not
    /// (the first capture of the process), the walk only writes it, so each
    /// of its pages is faulted in once (a read first would map the zero
    /// page, and the write then fault again).
    pub(super) read_cache: bool,
    /// The module this walk last noted in [`SEEN`] (frames in a row mostly
    /// share a module: the table is scanned once per module, not per frame).
    seen: Cell<Option<DlModule>>,
    /// The walk's last CIE (see [`crate::unwind::cfi_fast::CieMemo`]).
    cie: crate::unwind::cfi_fast::CieCache,
    /// The stack the walk starts on, `[lo, hi)`: the rule cache's fast
    /// path walks frames on it (frames on another, after a signal frame on
    /// an alternate stack, take the generic step).
    stack: (u64, u64),
    /// The executable ranges the walk has met (callers' return addresses
    /// must lie in one).
    code: Cell<CodeCheck>,
}

impl LocalSource {
    #[inline(always)]
    pub(crate) fn new(stack: (u64, u64)) -> Self {
        LocalSource {
            snap: published(),
            last: Cell::new(None),
            read_cache: FLAGS.cache_used.load(Ordering::Relaxed),
            seen: Cell::new(None),
            cie: Default::default(),
            stack,
            code: Cell::new(CodeCheck::new()),
        }
    }

    /// [`seen_module`], once per module per walk.
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn note_seen(&self, d: DlModule) -> bool {
        if self.seen.get() == Some(d) {
            return true;
        }
        let ok = seen_module(d);
        if ok {
            self.seen.set(Some(d));
        }
        ok
    }

    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn dl_module(&self, addr: u64) -> Option<DlModule> {
        if let Some(m) = self.last.get() {
            if m.start <= addr && addr < m.end {
                return Some(m);
            }
        }
        let m = dl_find(addr)?;
        self.last.set(Some(m));
        Some(m)
    }

    /// The snapshot's module holding `addr`, if it is still the object
    /// loaded there (see [`LocalModule::live`]).
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn module(&self, addr: u64) -> Option<&'static LocalModule> {
        let s = self.snap?;
        let m = s.find(addr)?;
        if m.still_loaded(addr, |a| self.dl_module(a)) {
            return Some(m);
        }
        unloaded(s);
        None
    }
}

impl RuleSource<A> for LocalSource {
    #[inline(always)]
    fn return_address(&self, ra: u64, sp: u64) -> u64 {
        crate::unwind::hook_table::resolve(ra, sp)
    }

    /// A caller outside the code of the loaded modules is garbage read as a
    /// return address.
    #[inline(always)]
    fn is_code(&self, ra: u64) -> bool {
        let mut c = self.code.get();
        let ok = c.is_code(ra as usize);
        self.code.set(c);
        ok
    }

    /// The rule cache's hot loop ([`hot_run`]) on the walk's first stack.
    /// Before the first rule is cached (this walk may cache the first ones)
    /// the cache is not even read: its pages are then faulted in by writes
    /// only.
    #[inline(always)]
    fn fast_walk(&self, regs: &mut UnwindRegs, out: &mut [usize]) -> (usize, FastEnd) {
        let (lo, hi) = self.stack;
        if !self.read_cache || regs.sp < lo || regs.sp >= hi {
            return (0, FastEnd::Slow);
        }
        let mut hot = Hot {
            pc: regs.pc,
            sp: regs.sp,
            fp: regs.fp,
        };
        // SAFETY: `out.len()` slots at `out`; `regs.sp` lies in the stack
        // whose top is `hi`, and `regs.pc` is a return address (the
        // unwinder's promise).
        let (k, end) = unsafe { hot_run(&mut hot, hi, out.as_mut_ptr(), out.len()) };
        if k > 0 {
            *regs = UnwindRegs {
                pc: hot.pc,
                sp: hot.sp,
                fp: hot.fp,
                lr: 0,
            };
        }
        (k, end)
    }

    #[inline(always)]
    fn rule(&self, addr: u64) -> Found<<A as Arch>::Rule> {
        if self.read_cache {
            let p = cache_get(addr);
            if p != 0 {
                return Found::Rule(unpack_cached(p));
            }
        }
        self.rule_slow(addr)
    }

    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn evaluate<M: Memory + ?Sized>(
        &self,
        addr: u64,
        regs: &UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, UnwindError> {
        // Interrupted in the exit-hook trampoline where its frame is empty
        // (before it pushes the original return address, at its final
        // jump): the caller's pc is in the hook table or just below `sp`,
        // which the CFI also says but a walk's memory may not reach.
        if let Some(pc) = crate::unwind::hook_table::in_trampoline(addr, regs, mem) {
            return Ok(Applied::Caller {
                regs: UnwindRegs { pc, ..*regs },
                signal: false,
            });
        }
        if let Some(m) = self.module(addr) {
            let svma = addr.wrapping_sub(m.bias);
            let t = &m.table;
            return cfi::evaluate::<A, M>(
                &t.sections(),
                t.fde_for_evaluation(svma),
                svma,
                regs,
                mem,
            );
        }
        match self.dl_module(addr) {
            Some(d) => match sections_from_hdr(d.eh_frame_hdr, d.end) {
                Some(secs) => cfi::evaluate::<A, M>(&secs, FdeAt::Search, addr, regs, mem),
                None => Ok(Applied::NoCfi),
            },
            None => Ok(Applied::NoCfi),
        }
    }

    /// By the code at `pc`, where the architecture recognises its signal
    /// trampoline that way in process (`exact::LOCAL_SIGRETURN_BYTES`, 0
    /// where its CFI is relied on instead).
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn is_signal_trampoline(&self, pc: u64) -> bool {
        #[cfg(callstack_native)]
        {
            use crate::arch::native::exact::{is_sigreturn_trampoline, LOCAL_SIGRETURN_BYTES};
            if LOCAL_SIGRETURN_BYTES == 0 {
                return false;
            }
            let known = match self.snap {
                Some(s) => s.in_code(pc) && self.module(pc).is_some(),
                None => false,
            };
            if !known {
                return false;
            }
            // SAFETY: `pc` is at least 16 bytes (no fewer than
            // `LOCAL_SIGRETURN_BYTES`) below the end of an executable
            // segment of a module still loaded (checked with
            // `_dl_find_object` when glibc has it): mapped and readable.
            let code =
                unsafe { core::slice::from_raw_parts(pc as *const u8, LOCAL_SIGRETURN_BYTES) };
            is_sigreturn_trampoline(code)
        }
        #[cfg(not(callstack_native))]
        {
            let _ = pc;
            false
        }
    }
}

impl LocalSource {
    #[cold]
    #[inline(never)]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn rule_slow(&self, addr: u64) -> Found<<A as Arch>::Rule> {
        if let Some(m) = self.module(addr) {
            let rule = m.table.lookup(addr.wrapping_sub(m.bias));
            cache_put(addr, cache_rule(rule));
            return Found::Rule(rule);
        }
        if let Some(d) = self.dl_module(addr) {
            if self.seen.get() != Some(d) {
                FLAGS.stale.store(true, Ordering::Relaxed);
            }
            // The rule from the CFI directly, cached like a table's (so the
            // next capture through here takes the hot loop, prepared or
            // not) once the module is noted in `SEEN`.
            let Some(secs) = sections_from_hdr(d.eh_frame_hdr, d.end) else {
                return Found::Rule(A::EVALUATE);
            };
            let rule = cfi::rule_at::<A>(&secs, addr, &self.cie);
            let p = cache_rule(rule);
            if p != 0 && rule != A::EVALUATE && self.note_seen(d) {
                cache_put(addr, p);
            }
            return Found::Rule(rule);
        }
        Found::Unknown
    }
}

/// Notes that the rules of `d` (found by `_dl_find_object` now) go into the
/// rule cache; false when they must not (the table of modules is full).
///
/// This is how a cached rule of an unloaded library is kept from being
/// taken for another: if a noted module overlaps `d` but is not `d` (other
/// mapping or other `.eh_frame_hdr`), it was unloaded (`dlclose`) and `d`
/// loaded in its place, so the cache, which may hold its rules, is cleared
/// and its slot given to `d`. Like the snapshot's check, this runs on a
/// cache miss (the first return address of the new library that is not a
/// cached key of the old one). Lock-free, async-signal-safe.
#[cold]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn seen_module(d: DlModule) -> bool {
    if d.start == 0 || d.end <= d.start || d.eh_frame_hdr == 0 {
        return false;
    }
    let mut free = None;
    for (i, m) in FLAGS.seen.iter().enumerate() {
        let start = m.start.load(Ordering::Acquire);
        if start == 0 {
            free = free.or(Some(i));
            continue;
        }
        let end = m.end.load(Ordering::Acquire);
        let hdr = m.hdr.load(Ordering::Acquire);
        if end == 0 || hdr == 0 {
            continue;
        }
        if start == d.start && end == d.end && hdr == d.eh_frame_hdr {
            return true;
        }
        if start < d.end && d.start < end {
            // Another object was loaded here: not any more.
            clear_cache();
            m.end.store(0, Ordering::Release);
            m.hdr.store(0, Ordering::Release);
            m.start.store(d.start, Ordering::Release);
            m.end.store(d.end, Ordering::Release);
            m.hdr.store(d.eh_frame_hdr, Ordering::Release);
            return true;
        }
    }
    // A free slot (claimed against concurrent captures).
    for m in FLAGS.seen.iter().skip(free.unwrap_or(FLAGS.seen.len())) {
        if m.start
            .compare_exchange(0, d.start, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            m.end.store(d.end, Ordering::Release);
            m.hdr.store(d.eh_frame_hdr, Ordering::Release);
            return true;
        }
    }
    false
}
