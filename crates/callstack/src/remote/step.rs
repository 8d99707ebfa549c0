//! Unwinding the threads of another process with the crate's unwinder
//! ([`crate::unwind::Unwinder`]: compiled CFI tables first, then the
//! frame-pointer rule), reading memory from the core or the live process.
//!
//! [`RemoteUnwinder`] is the one place that ties a [`Snapshot`] to the
//! unwinder: it compiles each module's CFI table the first time a frame
//! lands in that module (from the file on disk, or from the vDSO image read
//! out of the target), and maps the target's architecture to the
//! unwinder's.

use super::{Machine, Module, Registers, Snapshot, Thread};
use crate::arch::aarch64::Aarch64;
use crate::arch::riscv64::Riscv64;
use crate::arch::x86_64::X86_64;
use crate::arch::Applied;
use crate::types::Frame;
use crate::unwind::insn::{CodeMemory, InsnFallback};
use crate::unwind::{
    self, Found, Memory, ModuleSet, RuleSource, StopReason, UnwindError, UnwindRegs, UnwindTable,
    Unwinder,
};
use std::sync::Arc;

/// The frames of one thread and why the walk ended early, if it did.
#[derive(Clone, Debug, Default)]
pub struct Unwound {
    /// Innermost first.
    pub frames: Vec<Frame>,
    /// Set when the walk stopped before the outermost frame: why.
    pub stop: Option<String>,
}

impl Unwound {
    /// The address to symbolize frame `i` at: its
    /// [`Frame::lookup_address`] (`pc - 1` for a return address), except
    /// for a frame that returned into a signal trampoline (the next frame
    /// was found through the signal frame): its pc is the trampoline's
    /// first instruction, looked up as is.
    pub fn lookup(&self, i: usize) -> u64 {
        let f = &self.frames[i];
        if self.returns_to_signal_trampoline(i) {
            return f.pc;
        }
        f.lookup_address()
    }

    /// Whether frame `i` is the signal trampoline a handler returned to:
    /// the frame after it was found through the kernel's signal frame.
    pub fn returns_to_signal_trampoline(&self, i: usize) -> bool {
        self.frames
            .get(i + 1)
            .is_some_and(|n| n.method == unwind::Method::SignalFrame)
    }
}

/// The modules of a snapshot as a [`RuleSource`]: a [`ModuleSet`] whose
/// tables are compiled the first time a frame lands in their module (from
/// the file on disk, or the vDSO image read out of the target), plus the
/// x86-64 signal-return trampoline check.
///
/// A module's first frames do not compile its table: they are unwound from
/// the module's `.eh_frame` directly, the FDE found through
/// `.eh_frame_hdr` ([`Direct`]). A dump of a small process has a handful
/// of frames in glibc, whose whole table costs more than a thousand direct
/// evaluations; a module with many frames gets its table after the first few.
struct LazySet<A: crate::arch::Arch> {
    set: ModuleSet<A>,
    /// The modules' code, to recognize the signal-return trampoline.
    code: RemoteCode,
    /// Each module's direct CFI reader, sorted by start.
    direct: Vec<Direct>,
    /// The rules found in compiled tables, by pc ([`RuleCache`]).
    cache: RuleCache,
}

/// A direct-mapped cache of the rules a [`LazySet`] found in its compiled
/// tables: a recording meets the same few return addresses sample after
/// sample, and each would otherwise be two binary searches (the module,
/// then its table's rows, mostly cache misses in large tables). One word
/// per entry, the pc above a rule packed in 16 bits ([`Arch::pack`]), so
/// that threads sharing the set never see a pc with another's rule.
/// Rules that do not pack (0) and pcs of no module are not kept.
///
/// [`Arch::pack`]: crate::arch::Arch::pack
struct RuleCache {
    slots: Box<[std::sync::atomic::AtomicU64]>,
}

impl RuleCache {
    const SLOTS: usize = 1024;

    fn new() -> RuleCache {
        RuleCache {
            slots: (0..Self::SLOTS)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
        }
    }

    fn slot(&self, pc: u64) -> &std::sync::atomic::AtomicU64 {
        let h = pc.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
        &self.slots[h as usize & (Self::SLOTS - 1)]
    }

    /// The packed rule kept for `pc`.
    fn get(&self, pc: u64) -> Option<u16> {
        if pc >> 48 != 0 {
            return None;
        }
        let w = self.slot(pc).load(std::sync::atomic::Ordering::Relaxed);
        (w != 0 && w >> 16 == pc).then_some(w as u16)
    }

    fn put(&self, pc: u64, packed: u16) {
        if pc >> 48 == 0 && packed != 0 {
            let w = (pc << 16) | packed as u64;
            self.slot(pc).store(w, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn clear(&mut self) {
        for s in self.slots.iter_mut() {
            *s.get_mut() = 0;
        }
    }
}

#[cfg(test)]
mod rule_cache_tests {
    use super::RuleCache;

    /// A pc gets back its own rule, never another pc's in the same slot;
    /// rules that do not pack and pcs above 48 bits are not kept.
    #[test]
    fn a_pc_gets_its_own_rule_or_none() {
        let mut c = RuleCache::new();
        c.put(0x5555_0000_1234, 7);
        assert_eq!(c.get(0x5555_0000_1234), Some(7));
        assert_eq!(c.get(0x5555_0000_1235), None);
        // Every pc of many, in 1024 slots: a hit is always the pc's own.
        for pc in (0..20_000u64).map(|i| 0x7f00_0000_0000 + i * 13) {
            c.put(pc, (pc % 60_000) as u16 + 1);
        }
        let mut hits = 0;
        for pc in (0..20_000u64).map(|i| 0x7f00_0000_0000 + i * 13) {
            if let Some(p) = c.get(pc) {
                assert_eq!(p, (pc % 60_000) as u16 + 1);
                hits += 1;
            }
        }
        assert!(hits > 0 && hits <= RuleCache::SLOTS);
        c.put(0x1000, 0);
        assert_eq!(c.get(0x1000), None);
        c.put(1 << 50, 3);
        assert_eq!(c.get(1 << 50), None);
        c.clear();
        assert!((0..20_000u64).all(|i| c.get(0x7f00_0000_0000 + i * 13).is_none()));
    }
}

/// A module's `.eh_frame` read pc by pc until `budget` lookups have been
/// made, then its compiled table (see [`LazySet`]).
struct Direct {
    start: u64,
    end: u64,
    bias: u64,
    image: Option<Arc<Vec<u8>>>,
    file: Option<std::path::PathBuf>,
    /// The sections, read at the first lookup; `None` when the module has
    /// no `.eh_frame_hdr` search table (its table is compiled at once).
    cfi: std::sync::OnceLock<Option<DirectCfi>>,
    /// Lookups made in the module so far.
    used: std::sync::atomic::AtomicUsize,
    /// The key its compiled table is shared under ([`shared_tables`]).
    key: Option<String>,
    /// The caller's clock at the last frame found in the module
    /// ([`RemoteUnwinder::mark_used`]): which tables a memory budget
    /// drops first.
    last_used: std::sync::atomic::AtomicU64,
}

struct DirectCfi {
    bytes: CodeBytes,
    /// `.eh_frame_hdr` and `.eh_frame`: byte ranges in `bytes`, addresses.
    hdr: (std::ops::Range<usize>, u64),
    eh: (std::ops::Range<usize>, u64),
    text: u64,
    got: u64,
    /// Lookups evaluated directly before the table is compiled: one per KiB
    /// of `.eh_frame` (compiling costs about 80 instructions a byte, a
    /// direct evaluation a few thousand), at least 16.
    budget: usize,
}

impl Direct {
    fn cfi(&self) -> Option<&DirectCfi> {
        self.cfi
            .get_or_init(|| {
                // Compiled already (for another process mapping the same
                // file): no direct lookups, its table from the first one.
                if self.key.as_deref().is_some_and(shared_tables::is_live) {
                    return None;
                }
                let bytes = match (&self.image, &self.file) {
                    (Some(img), _) => CodeBytes::Image(img.clone()),
                    (None, Some(p)) => CodeBytes::File(super::files::map_file(p).ok()?),
                    (None, None) => return None,
                };
                DirectCfi::read(bytes)
            })
            .as_ref()
    }

    /// Whether the lookup just counted by [`LazySet::rule`] is direct.
    fn is_direct(&self, cfi: &DirectCfi) -> bool {
        self.used.load(std::sync::atomic::Ordering::Relaxed) <= cfi.budget
    }
}

impl DirectCfi {
    fn read(bytes: CodeBytes) -> Option<DirectCfi> {
        use object::{Object, ObjectSection};
        let file = object::File::parse(bytes.get()).ok()?;
        let range = |name: &str| -> Option<(std::ops::Range<usize>, u64)> {
            let s = file.section_by_name(name)?;
            // Never compressed in practice; a compressed one goes the
            // compiled way.
            if s.compressed_file_range().ok()?.format != object::CompressionFormat::None {
                return None;
            }
            let (off, size) = s.file_range()?;
            let r = off as usize..off.checked_add(size)? as usize;
            bytes.get().get(r.clone())?;
            Some((r, s.address()))
        };
        let hdr = range(".eh_frame_hdr")?;
        let eh = range(".eh_frame")?;
        let addr = |name: &str| file.section_by_name(name).map(|s| s.address()).unwrap_or(0);
        let (text, got) = (addr(".text"), addr(".got"));
        let budget = (eh.0.len() / 1024).max(16);
        Some(DirectCfi {
            bytes,
            hdr,
            eh,
            text,
            got,
            budget,
        })
    }

    fn sections(&self) -> unwind::cfi::CfiSections<'_> {
        let b = self.bytes.get();
        unwind::cfi::CfiSections {
            eh_frame_hdr: Some((&b[self.hdr.0.clone()], self.hdr.1)),
            eh_frame: Some((&b[self.eh.0.clone()], self.eh.1)),
            debug_frame: None,
            text: self.text,
            got: self.got,
        }
    }
}

/// Compiled tables shared by every snapshot of this process that maps the
/// same file (path and build-id): the recorder of a whole host, or of a
/// program that forks, compiles glibc's CFI once, not once per process.
/// Held weakly: a table goes when no snapshot uses it any more.
/// Strong holds on the shared items (tables, function lists) most
/// recently asked for, up to a number of bytes: a whole-host recording
/// sees the same programs (`gzip`, `sleep`, a compiler) start and exit
/// again and again, and a table held only by its processes' snapshots is
/// freed with the last of them and compiled again for the next. Off
/// (0 bytes) unless a recorder sets a limit ([`set_keep_bytes`]); the
/// holds count in the live bytes a memory budget sees, and
/// [`release_kept`] lets them go.
pub(crate) mod kept {
    use std::any::Any;
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    type Hold = (String, Arc<dyn Any + Send + Sync>, usize);

    /// The holds, oldest first, and their bytes and limit.
    pub(super) struct Kept {
        holds: VecDeque<Hold>,
        bytes: usize,
        limit: usize,
    }

    impl Kept {
        pub(super) const fn new() -> Kept {
            Kept {
                holds: VecDeque::new(),
                bytes: 0,
                limit: 0,
            }
        }

        /// Holds `item` as the most recent one, letting the oldest go
        /// while over the limit.
        pub(super) fn touch(&mut self, key: &str, item: Arc<dyn Any + Send + Sync>, bytes: usize) {
            // A large item (a compiler's or a browser's library) is not
            // kept: it would push out many small ones.
            if bytes > self.limit / 4 {
                return;
            }
            if let Some(i) = self.holds.iter().position(|h| h.0 == key) {
                let h = self.holds.remove(i).expect("found");
                self.bytes -= h.2;
            }
            self.holds.push_back((key.to_string(), item, bytes));
            self.bytes += bytes;
            while self.bytes > self.limit {
                let Some(h) = self.holds.pop_front() else {
                    break;
                };
                self.bytes -= h.2;
            }
        }

        pub(super) fn set_limit(&mut self, limit: usize) {
            self.limit = limit;
            while self.bytes > self.limit {
                let Some(h) = self.holds.pop_front() else {
                    break;
                };
                self.bytes -= h.2;
            }
        }
    }

    pub(super) static TABLES: Mutex<Kept> = Mutex::new(Kept::new());
    pub(super) static FUNCTIONS: Mutex<Kept> = Mutex::new(Kept::new());

    fn lock(m: &Mutex<Kept>) -> std::sync::MutexGuard<'_, Kept> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps up to `bytes` of the most recently asked-for tables, and as
    /// many of function lists, alive after the last snapshot using them
    /// is gone (0: none, the default).
    pub(crate) fn set_keep_bytes(bytes: usize) {
        lock(&TABLES).set_limit(bytes);
        lock(&FUNCTIONS).set_limit(bytes);
    }

    /// Lets every hold go (the items used by a snapshot stay).
    pub(crate) fn release_kept() {
        let limit = lock(&TABLES).limit;
        set_keep_bytes(0);
        set_keep_bytes(limit);
    }

    pub(super) fn touch(
        m: &Mutex<Kept>,
        key: &str,
        item: Arc<dyn Any + Send + Sync>,
        bytes: usize,
    ) {
        lock(m).touch(key, item, bytes);
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The most recent holds stay within the limit, the oldest go
        /// first, one too large for a quarter of it is not held, and a
        /// held item lives on after its last other owner lets it go.
        #[test]
        fn holds_the_most_recent_within_the_limit() {
            let mut k = Kept::new();
            let item = |n: u32| -> Arc<dyn Any + Send + Sync> { Arc::new(n) };
            // Off: nothing held.
            k.touch("a", item(0), 10);
            assert!(k.holds.is_empty());
            k.set_limit(100);
            let a = item(1);
            let weak = Arc::downgrade(&a);
            k.touch("a", a, 20);
            k.touch("b", item(2), 20);
            k.touch("c", item(3), 20);
            assert!(weak.upgrade().is_some(), "held after its owner let go");
            // Asked for again: the most recent; then "b" is the oldest.
            k.touch("a", item(1), 20);
            k.touch("d", item(4), 25);
            k.touch("e", item(5), 25);
            let keys: Vec<&str> = k.holds.iter().map(|h| h.0.as_str()).collect();
            assert_eq!(keys, ["c", "a", "d", "e"]);
            assert_eq!(k.bytes, 90);
            // Larger than a quarter of the limit: not held.
            k.touch("big", item(6), 26);
            assert!(k.holds.iter().all(|h| h.0 != "big"));
            k.set_limit(0);
            assert!(k.holds.is_empty() && k.bytes == 0);
            assert!(weak.upgrade().is_none(), "let go at limit 0");
        }
    }
}

pub(crate) mod shared_tables {
    use super::UnwindTable;
    use std::any::Any;
    use std::collections::HashMap;
    use std::path::Path;
    use std::sync::{Arc, Mutex, Weak};

    /// A table, held weakly, and the bytes it takes.
    type Entry = (Weak<dyn Any + Send + Sync>, usize);
    static TABLES: Mutex<Option<HashMap<String, Entry>>> = Mutex::new(None);

    /// The key of `path`'s table for architecture `A`: its build-id, or
    /// for a file without one, its size and modification time.
    pub(super) fn key<A: crate::arch::Arch>(
        path: &Path,
        build_id: Option<&[u8]>,
    ) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let id: String = match build_id.filter(|b| !b.is_empty()) {
            Some(b) => b.iter().map(|b| format!("{b:02x}")).collect(),
            None => {
                let md = std::fs::metadata(path).ok()?;
                format!("{}:{}.{}", md.size(), md.mtime(), md.mtime_nsec())
            }
        };
        Some(format!("{}\0{}\0{}", A::NAME, id, path.display()))
    }

    /// The path of a key's file.
    pub(crate) fn path_of(key: &str) -> &str {
        key.splitn(3, '\0').nth(2).unwrap_or(key)
    }

    /// Whether the table of `key` is compiled and alive.
    pub(crate) fn is_live(key: &str) -> bool {
        let map = TABLES.lock().unwrap_or_else(|e| e.into_inner());
        map.as_ref()
            .and_then(|m| m.get(key))
            .is_some_and(|(w, _)| w.strong_count() > 0)
    }

    /// The bytes of the tables alive now.
    pub(crate) fn live_bytes() -> usize {
        let map = TABLES.lock().unwrap_or_else(|e| e.into_inner());
        map.as_ref().map_or(0, |m| {
            m.values()
                .filter(|(w, _)| w.strong_count() > 0)
                .map(|(_, n)| n)
                .sum()
        })
    }

    /// The tables alive now (used by some snapshot): key and bytes.
    pub(crate) fn live() -> Vec<(String, usize)> {
        let map = TABLES.lock().unwrap_or_else(|e| e.into_inner());
        map.as_ref()
            .map(|m| {
                m.iter()
                    .filter(|(_, (w, _))| w.strong_count() > 0)
                    .map(|(k, (_, n))| (k.clone(), *n))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The live table of `key`, else `compile()`'s, kept for the others.
    pub(super) fn get_or_compile<A: crate::arch::Arch>(
        key: &str,
        compile: impl FnOnce() -> Arc<UnwindTable<A>>,
    ) -> Arc<UnwindTable<A>>
    where
        UnwindTable<A>: Send + Sync + 'static,
    {
        let found = {
            let map = TABLES.lock().unwrap_or_else(|e| e.into_inner());
            map.as_ref()
                .and_then(|m| m.get(key))
                .and_then(|(w, _)| w.upgrade())
                .and_then(|t| t.downcast::<UnwindTable<A>>().ok())
        };
        if let Some(t) = found {
            super::kept::touch(&super::kept::TABLES, key, t.clone(), t.heap_bytes());
            return t;
        }
        // Compiled outside the lock (another thread may compile the same
        // table meanwhile: the last one stays, both are right).
        let t = compile();
        let bytes = t.heap_bytes();
        let any: Arc<dyn Any + Send + Sync> = t.clone();
        {
            let mut map = TABLES.lock().unwrap_or_else(|e| e.into_inner());
            let map = map.get_or_insert_with(HashMap::new);
            if map.len() > 4096 {
                map.retain(|_, (w, _)| w.strong_count() > 0);
            }
            map.insert(key.to_string(), (Arc::downgrade(&any), bytes));
        }
        super::kept::touch(&super::kept::TABLES, key, any, bytes);
        t
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::unwind::X86_64;

        #[test]
        fn a_table_is_compiled_once_while_used() {
            let k = key::<X86_64>(Path::new("/lib/x.so"), Some(&[1, 2, 3])).unwrap();
            let n = std::cell::Cell::new(0);
            let compile = || {
                n.set(n.get() + 1);
                Arc::new(UnwindTable::<X86_64>::empty().unwrap())
            };
            let a = get_or_compile(&k, compile);
            let b = get_or_compile(&k, compile);
            assert!(Arc::ptr_eq(&a, &b));
            assert_eq!(n.get(), 1);
            // Another build of the same path is another table.
            let other = key::<X86_64>(Path::new("/lib/x.so"), Some(&[9])).unwrap();
            let c = get_or_compile(&other, compile);
            assert!(!Arc::ptr_eq(&a, &c));
            assert_eq!(n.get(), 2);
            // Unused, it goes.
            drop((a, b));
            let _d = get_or_compile(&k, compile);
            assert_eq!(n.get(), 3);
        }
    }
}

impl<A: crate::arch::Arch> LazySet<A> {
    fn new(mods: &[Module], code: RemoteCode) -> Self {
        let mut set = ModuleSet::new();
        let mut direct = Vec::new();
        for m in mods {
            let image = m.image.clone();
            let file = m.file.clone();
            let key = match (&image, &file) {
                (None, Some(p)) => shared_tables::key::<A>(p, m.build_id.as_deref()),
                _ => None,
            };
            direct.push(Direct {
                start: m.start,
                end: m.end,
                bias: m.bias,
                image: image.clone(),
                file: file.clone(),
                cfi: std::sync::OnceLock::new(),
                used: std::sync::atomic::AtomicUsize::new(0),
                key: key.clone(),
                last_used: std::sync::atomic::AtomicU64::new(0),
            });
            set.add_shared(m.start, m.end, m.bias, move || {
                let compile = || {
                    let t = match (&image, &file) {
                        (Some(img), _) => UnwindTable::from_elf_bytes(img),
                        (None, Some(p)) => match super::files::map_file(p) {
                            Ok(map) => UnwindTable::from_elf_bytes(&map),
                            Err(e) => Err(unwind::TableError::Io(e)),
                        },
                        // No usable file: frames here are unwound by frame pointer.
                        (None, None) => UnwindTable::empty(),
                    };
                    // A file whose CFI cannot be read is unwound by frame pointer.
                    std::sync::Arc::new(
                        t.or_else(|_| UnwindTable::empty())
                            .expect("an empty unwind table always builds"),
                    )
                };
                match &key {
                    Some(k) => shared_tables::get_or_compile(k, compile),
                    None => compile(),
                }
            });
        }
        direct.sort_by_key(|d| d.start);
        LazySet {
            set,
            code,
            direct,
            cache: RuleCache::new(),
        }
    }

    /// Drops the compiled table of every module shared under `key` (and
    /// its mapped CFI): its next lookups are direct again, its table
    /// compiled again once they are many.
    fn forget(&mut self, key: &str) {
        self.cache.clear();
        for d in &mut self.direct {
            if d.key.as_deref() == Some(key) {
                d.cfi = std::sync::OnceLock::new();
                *d.used.get_mut() = 0;
                self.set.forget(d.start);
            }
        }
    }

    /// Marks the module holding `addr` used at `tick`; its range.
    fn mark_used(&self, addr: u64, tick: u64) -> Option<(u64, u64)> {
        let i = self.direct.partition_point(|d| d.start <= addr);
        let d = self.direct.get(i.checked_sub(1)?)?;
        if addr >= d.end {
            return None;
        }
        d.last_used
            .store(tick, std::sync::atomic::Ordering::Relaxed);
        Some((d.start, d.end))
    }

    /// Each shared module's key and the tick it was last marked used at.
    fn used_ticks(&self) -> impl Iterator<Item = (&str, u64)> {
        self.direct.iter().filter_map(|d| {
            let t = d.last_used.load(std::sync::atomic::Ordering::Relaxed);
            d.key.as_deref().map(|k| (k, t))
        })
    }

    /// The direct reader of the module holding `addr`.
    fn direct(&self, addr: u64) -> Option<(&Direct, &DirectCfi)> {
        let i = self.direct.partition_point(|d| d.start <= addr);
        let d = self.direct.get(i.checked_sub(1)?)?;
        if addr >= d.end {
            return None;
        }
        Some((d, d.cfi()?))
    }

    /// Whether `pc` is an `rt_sigreturn` trampoline: x86-64 glibc's
    /// `__restore_rt`, aarch64 `mov x8, #139; svc #0` (the vDSO's
    /// `__kernel_rt_sigreturn`, or qemu-user's trampoline page), riscv64
    /// `li a7, 139; ecall` (the vDSO's `__vdso_rt_sigreturn`, or
    /// qemu-user's anonymous trampoline page). The frame above it is a
    /// kernel signal frame.
    fn sigreturn_at(&self, pc: u64) -> bool {
        let mut reader = self.code.clone();
        match A::NAME {
            "x86_64" => {
                let mut code = [0u8; 9];
                reader.read_code(pc, &mut code) == code.len()
                    && crate::arch::x86_64::exact::is_sigreturn_trampoline(&code)
            }
            "aarch64" => crate::arch::aarch64::signal::is_trampoline(&mut reader, pc),
            "riscv64" => crate::arch::riscv64::signal::is_trampoline(&mut reader, pc),
            _ => false,
        }
    }
}

impl<A: crate::arch::Arch> RuleSource<A> for LazySet<A> {
    fn rule(&self, addr: u64) -> Found<A::Rule> {
        // Only rules of compiled tables are cached: a pc found here is in a
        // module past its direct lookups (`forget` empties the cache).
        if let Some(p) = self.cache.get(addr) {
            return Found::Rule(A::unpack(p));
        }
        if let Some((d, cfi)) = self.direct(addr) {
            if d.used.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < cfi.budget {
                // `evaluate` reads this lookup's FDE from `.eh_frame`.
                return Found::Rule(A::EVALUATE);
            }
        }
        let found = self.set.rule(addr);
        if let Found::Rule(r) = found {
            self.cache.put(addr, A::pack(r));
        }
        found
    }

    fn evaluate<M: Memory + ?Sized>(
        &self,
        addr: u64,
        regs: &UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, UnwindError> {
        // The trampoline's own CFI describes the signal frame with DWARF
        // expressions; the architecture's signal-frame layout says the same
        // and marks the caller's pc as exact (see `is_signal_trampoline`).
        if self.sigreturn_at(regs.pc) {
            return Ok(Applied::NoCfi);
        }
        if let Some((d, cfi)) = self.direct(addr) {
            if d.is_direct(cfi) {
                return unwind::cfi::evaluate::<A, M>(
                    &cfi.sections(),
                    unwind::cfi::FdeAt::Search,
                    addr.wrapping_sub(d.bias),
                    regs,
                    mem,
                );
            }
        }
        self.set.evaluate(addr, regs, mem)
    }

    fn is_signal_trampoline(&self, pc: u64) -> bool {
        self.sigreturn_at(pc)
    }
}

/// An executable segment of a module: runtime `[start, end)` and its bytes.
struct CodeSegment {
    start: u64,
    end: u64,
    bytes: CodeBytes,
    offset: usize,
}

#[derive(Clone)]
enum CodeBytes {
    File(Arc<memmap2::Mmap>),
    Image(Arc<Vec<u8>>),
}

impl CodeBytes {
    fn get(&self) -> &[u8] {
        match self {
            CodeBytes::File(m) => m,
            CodeBytes::Image(v) => v,
        }
    }
}

/// A module's function bounds from its symbol tables, at its file's
/// addresses (bias 0): the functions' `[start, end)`, sorted, and the cold
/// parts `(start, end, parent start)`, sorted. Shared by every snapshot
/// that maps the same file ([`shared_functions`]).
#[derive(Default)]
struct FunctionLists {
    functions: Vec<(u64, u64)>,
    cold: Vec<(u64, u64, u64)>,
}

impl FunctionLists {
    /// The lists of the object file `data`.
    fn of(data: &[u8]) -> FunctionLists {
        let mut l = FunctionLists::default();
        crate::unwind::insn::inprocess::function_symbols_split(
            data,
            0,
            &mut l.functions,
            &mut l.cold,
        );
        l.functions.sort_unstable();
        l.functions.dedup_by_key(|f| f.0);
        l.cold.sort_unstable();
        l
    }

    fn bytes(&self) -> usize {
        self.functions.len() * 16 + self.cold.len() * 24
    }
}

/// Function lists shared by every snapshot of this process that maps the
/// same file (build-id, else size and time; and path), as the compiled
/// tables are ([`shared_tables`]): read once per file, not once per
/// process. Held weakly.
pub(crate) mod shared_functions {
    use super::FunctionLists;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, Weak};

    type Entry = (Weak<FunctionLists>, usize);
    static LISTS: Mutex<Option<HashMap<String, Entry>>> = Mutex::new(None);

    /// The live lists of `key`, else `read()`'s, kept for the others.
    pub(super) fn get_or_read(
        key: &str,
        read: impl FnOnce() -> FunctionLists,
    ) -> Arc<FunctionLists> {
        let found = {
            let map = LISTS.lock().unwrap_or_else(|e| e.into_inner());
            map.as_ref()
                .and_then(|m| m.get(key))
                .and_then(|(w, _)| w.upgrade())
        };
        if let Some(l) = found {
            super::kept::touch(&super::kept::FUNCTIONS, key, l.clone(), l.bytes());
            return l;
        }
        let l = Arc::new(read());
        {
            let mut map = LISTS.lock().unwrap_or_else(|e| e.into_inner());
            let map = map.get_or_insert_with(HashMap::new);
            if map.len() > 4096 {
                map.retain(|_, (w, _)| w.strong_count() > 0);
            }
            map.insert(key.to_string(), (Arc::downgrade(&l), l.bytes()));
        }
        super::kept::touch(&super::kept::FUNCTIONS, key, l.clone(), l.bytes());
        l
    }

    /// The bytes of the lists alive now (used by some snapshot).
    pub(crate) fn live_bytes() -> usize {
        let map = LISTS.lock().unwrap_or_else(|e| e.into_inner());
        map.as_ref().map_or(0, |m| {
            m.values()
                .filter(|(w, _)| w.strong_count() > 0)
                .map(|(_, n)| n)
                .sum()
        })
    }
}

/// A module's function lists where it is loaded, read from its file's
/// symbol tables the first time an analysis asks (code with CFI never
/// does: a whole-host recording would otherwise read the symbol tables of
/// every program started, for nothing).
struct ModuleFunctions {
    start: u64,
    end: u64,
    bias: u64,
    /// The file's key in [`shared_functions`] (`None`: an image, read for
    /// this snapshot only).
    key: Option<String>,
    bytes: CodeBytes,
    lists: std::sync::OnceLock<Arc<FunctionLists>>,
}

impl ModuleFunctions {
    fn lists(&self) -> &FunctionLists {
        self.lists.get_or_init(|| match &self.key {
            Some(k) => shared_functions::get_or_read(k, || FunctionLists::of(self.bytes.get())),
            None => Arc::new(FunctionLists::of(self.bytes.get())),
        })
    }
}

/// The code of the target's modules, read from their files on disk (or the
/// vDSO image), for instruction analysis and stack scanning, with the
/// function bounds of their symbol tables (none for a stripped module, where
/// the analyzers guess a function's start as they do without symbols).
#[derive(Clone)]
struct RemoteCode {
    segments: Arc<Vec<CodeSegment>>,
    /// Each module's function bounds (from its `.symtab`/`.dynsym`),
    /// sorted by start.
    functions: Arc<Vec<ModuleFunctions>>,
    /// Sorted `[start, end)` of the executable mappings of modules whose
    /// file was not found (and not held by the snapshot): code that is
    /// there, unread ([`CodeMemory::is_unread_code`]).
    unread: Arc<Vec<(u64, u64)>>,
}

impl RemoteCode {
    /// The code of `snap`: its modules' executable segments plus the
    /// executable memory in no module (qemu-user's signal trampolines).
    fn of_snapshot(snap: &Snapshot) -> RemoteCode {
        let mut functions = Vec::new();
        let mut segments = Self::segments_of(
            &snap.modules,
            super::files::exec_segments,
            Some(&mut functions),
        );
        for (start, bytes) in &snap.anon_code {
            segments.push(CodeSegment {
                start: *start,
                end: start.wrapping_add(bytes.len() as u64),
                bytes: CodeBytes::Image(bytes.clone()),
                offset: 0,
            });
        }
        segments.sort_by_key(|s| s.start);
        functions.sort_by_key(|f| f.start);
        let mut unread: Vec<(u64, u64)> = snap
            .modules
            .iter()
            .filter(|m| m.file.is_none() && m.image.is_none())
            .flat_map(|m| m.mappings.iter())
            .filter(|x| x.executable == Some(true) && x.start < x.end)
            .map(|x| (x.start, x.end))
            .collect();
        unread.sort_unstable();
        RemoteCode {
            segments: Arc::new(segments),
            functions: Arc::new(functions),
            unread: Arc::new(unread),
        }
    }

    /// Every `PT_LOAD` of `mods` (for reading `.ARM.extab` words).
    fn all_segments(mods: &[Module]) -> RemoteCode {
        Self::with_segments(mods, |d| {
            super::files::load_segments(d)
                .map(|(_, v)| v.into_iter().map(|(a, o, f, _)| (a, o, f)).collect())
                .unwrap_or_default()
        })
    }

    fn with_segments(
        mods: &[Module],
        segs: fn(&[u8]) -> Vec<super::files::FileSegment>,
    ) -> RemoteCode {
        let mut segments = Self::segments_of(mods, segs, None);
        segments.sort_by_key(|s| s.start);
        RemoteCode {
            segments: Arc::new(segments),
            functions: Arc::new(Vec::new()),
            unread: Arc::new(Vec::new()),
        }
    }

    /// The segments `segs` picks out of each module's file (or image), at
    /// its load bias; with `symbols`, also appends each module's function
    /// bounds there (`.symtab` and `.dynsym`, read when first asked for,
    /// once per file while a snapshot holds them: [`shared_functions`]).
    fn segments_of(
        mods: &[Module],
        segs: fn(&[u8]) -> Vec<super::files::FileSegment>,
        mut symbols: Option<&mut Vec<ModuleFunctions>>,
    ) -> Vec<CodeSegment> {
        let mut segments = Vec::new();
        for m in mods {
            let bytes = match (&m.image, &m.file) {
                (Some(img), _) => CodeBytes::Image(img.clone()),
                (None, Some(f)) => match super::files::map_file(f) {
                    Ok(map) => CodeBytes::File(map),
                    Err(_) => continue,
                },
                (None, None) => continue,
            };
            if let Some(out) = symbols.as_mut() {
                let key = match (&m.image, &m.file) {
                    // (The lists do not depend on the architecture named
                    // in the key.)
                    (None, Some(p)) => shared_tables::key::<X86_64>(p, m.build_id.as_deref()),
                    _ => None,
                };
                out.push(ModuleFunctions {
                    start: m.start,
                    end: m.end,
                    bias: m.bias,
                    key,
                    bytes: bytes.clone(),
                    lists: std::sync::OnceLock::new(),
                });
            }
            for (vaddr, off, filesz) in segs(bytes.get()) {
                let bytes = bytes.clone();
                segments.push(CodeSegment {
                    start: m.bias.wrapping_add(vaddr),
                    end: m.bias.wrapping_add(vaddr).wrapping_add(filesz),
                    bytes,
                    offset: off as usize,
                });
            }
        }
        segments
    }
}

impl RemoteCode {
    /// The function lists of the module holding `addr`.
    fn functions_at(&self, addr: u64) -> Option<&ModuleFunctions> {
        let i = self.functions.partition_point(|m| m.start <= addr);
        let m = self.functions.get(i.checked_sub(1)?)?;
        (addr < m.end).then_some(m)
    }
}

impl CodeMemory for RemoteCode {
    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        let i = self.segments.partition_point(|s| s.start <= addr);
        let Some(s) = i.checked_sub(1).and_then(|i| self.segments.get(i)) else {
            return 0;
        };
        if addr >= s.end {
            return 0;
        }
        let from = s.offset + (addr - s.start) as usize;
        let avail = ((s.end - addr) as usize).min(buf.len());
        match s.bytes.get().get(from..from + avail) {
            Some(src) => {
                buf[..avail].copy_from_slice(src);
                avail
            }
            None => 0,
        }
    }

    fn function_bounds(&mut self, addr: u64) -> Option<(u64, u64)> {
        let m = self.functions_at(addr)?;
        let (s, e) =
            crate::unwind::insn::lookup_function(&m.lists().functions, addr.wrapping_sub(m.bias))?;
        Some((s.wrapping_add(m.bias), e.wrapping_add(m.bias)))
    }

    fn function_entry(&mut self, addr: u64) -> Option<(u64, Option<(u64, u64)>)> {
        let m = self.functions_at(addr)?;
        let b = m.bias;
        let lists = m.lists();
        let (entry, bounds) = crate::unwind::insn::inprocess::function_entry_in(
            &lists.functions,
            &lists.cold,
            addr.wrapping_sub(b),
        )?;
        Some((
            entry.wrapping_add(b),
            bounds.map(|(s, e)| (s.wrapping_add(b), e.wrapping_add(b))),
        ))
    }

    fn is_unread_code(&mut self, addr: u64) -> bool {
        // Bytes the dump holds there (around a crashing pc) are read, not
        // believed.
        let i = self.unread.partition_point(|r| r.0 <= addr);
        i > 0 && addr < self.unread[i - 1].1 && self.read_code(addr, &mut [0u8; 1]) == 0
    }
}

/// A module's `.ARM.exidx`: its runtime start and end, the section's bytes
/// and runtime address.
type Exidx = (u64, u64, Vec<u8>, u64);

/// `.ARM.exidx` of each module at its runtime address, and the modules'
/// images for `.ARM.extab` words: ARM's unwind tables, read once per
/// snapshot and shared by its threads' walks.
#[derive(Clone)]
struct RemoteArmTables {
    exidx: Arc<Vec<Exidx>>,
    image: RemoteCode,
}

impl RemoteArmTables {
    fn new(mods: &[Module]) -> RemoteArmTables {
        use object::{Object, ObjectSection};
        let mut exidx = Vec::new();
        for m in mods {
            let Some(path) = &m.file else { continue };
            let Ok(map) = super::files::map_file(path) else {
                continue;
            };
            let Ok(f) = object::File::parse(&map[..]) else {
                continue;
            };
            if let Some(sec) = f.section_by_name(".ARM.exidx") {
                if let Ok(d) = sec.data() {
                    exidx.push((
                        m.start,
                        m.end,
                        d.to_vec(),
                        m.bias.wrapping_add(sec.address()),
                    ));
                }
            }
        }
        RemoteArmTables {
            exidx: Arc::new(exidx),
            image: RemoteCode::all_segments(mods),
        }
    }
}

/// ARM code and its EHABI tables as one reader, for the ARM walker.
struct ArmReader {
    code: RemoteCode,
    tables: RemoteArmTables,
}

impl CodeMemory for ArmReader {
    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        self.code.read_code(addr, buf)
    }

    fn function_bounds(&mut self, addr: u64) -> Option<(u64, u64)> {
        self.code.function_bounds(addr)
    }

    fn function_entry(&mut self, addr: u64) -> Option<(u64, Option<(u64, u64)>)> {
        self.code.function_entry(addr)
    }

    fn is_unread_code(&mut self, addr: u64) -> bool {
        self.code.is_unread_code(addr)
    }
}

impl crate::unwind::insn::arm::unwinder::ArmTables for ArmReader {
    fn exidx_for(&mut self, pc: u64) -> Option<crate::unwind::insn::arm::ehabi::ExidxTable<'_>> {
        self.tables.exidx_for(pc)
    }

    fn read_word(&mut self, addr: u64) -> Option<u32> {
        self.tables.read_word(addr)
    }
}

impl crate::unwind::insn::arm::unwinder::ArmTables for RemoteArmTables {
    fn exidx_for(&mut self, pc: u64) -> Option<crate::unwind::insn::arm::ehabi::ExidxTable<'_>> {
        self.exidx.iter().find(|e| pc >= e.0 && pc < e.1).map(|e| {
            crate::unwind::insn::arm::ehabi::ExidxTable {
                data: &e.2,
                addr: e.3,
            }
        })
    }
    fn read_word(&mut self, addr: u64) -> Option<u32> {
        let mut b = [0u8; 4];
        (self.image.read_code(addr, &mut b) == 4).then(|| u32::from_le_bytes(b))
    }
}

/// What a snapshot's walks read besides the code, per architecture.
enum Tables {
    /// x86-64: the modules' CFI, compiled as the walks need it.
    X86_64(LazySet<X86_64>),
    /// AArch64: the modules' CFI, compiled as the walks need it.
    Aarch64(LazySet<Aarch64>),
    /// RISC-V 64: the modules' CFI, compiled as the walks need it.
    Riscv64(LazySet<Riscv64>),
    /// 32-bit ARM: the modules' EHABI tables (`.ARM.exidx`, `.ARM.extab`),
    /// then prologue analysis (no CFI unwinder for ARM yet).
    Arm(RemoteArmTables),
    /// MIPS: prologue analysis of the code alone (no CFI unwinder yet).
    Mips,
}

/// Unwinds the threads of one [`Snapshot`], sharing compiled tables
/// between threads.
pub struct RemoteUnwinder<'s> {
    snap: &'s Snapshot,
    tables: Tables,
    code: RemoteCode,
}

impl<'s> RemoteUnwinder<'s> {
    /// An unwinder for the threads of `snap`. Nothing is compiled yet.
    pub fn new(snap: &'s Snapshot) -> Self {
        let code = RemoteCode::of_snapshot(snap);
        let tables = match snap.arch {
            Machine::X86_64 => Tables::X86_64(LazySet::new(&snap.modules, code.clone())),
            Machine::Aarch64 => Tables::Aarch64(LazySet::new(&snap.modules, code.clone())),
            Machine::Riscv64 => Tables::Riscv64(LazySet::new(&snap.modules, code.clone())),
            Machine::Arm => Tables::Arm(RemoteArmTables::new(&snap.modules)),
            Machine::Mips => Tables::Mips,
        };
        // Frames with neither CFI nor a frame pointer go to instruction
        // analysis and stack scanning, which decode with iced-x86.
        crate::unwind::insn::warm_up();
        RemoteUnwinder { snap, tables, code }
    }

    /// Unwinds thread `t`, reading memory through `mem`, at most `max` frames.
    pub fn unwind<M: Memory + ?Sized>(&self, mem: &mut M, t: &Thread, max: usize) -> Unwound {
        let mut out = Unwound::default();
        self.unwind_into(mem, t, max, &mut out);
        out
    }

    /// [`RemoteUnwinder::unwind`] into `out` (its frames' buffer used
    /// again: a recorder unwinds thousands of samples a second).
    pub fn unwind_into<M: Memory + ?Sized>(
        &self,
        mem: &mut M,
        t: &Thread,
        max: usize,
        out: &mut Unwound,
    ) {
        out.frames.clear();
        let regs = &t.registers;
        let Some(pc) = regs.pc() else {
            out.stop = Some("no program counter in the thread's registers".into());
            return;
        };
        let start = UnwindRegs {
            pc,
            sp: regs.sp().unwrap_or(0),
            fp: regs.fp().unwrap_or(0),
            lr: lr_of(regs),
        };
        let stack_end = t.stack_end.unwrap_or(u64::MAX);
        let fallback = InsnFallback::new(self.code.clone(), stack_end);
        let frames = &mut out.frames;
        out.stop = match &self.tables {
            Tables::X86_64(set) => walk_into(set, start, mem, max, fallback, frames),
            Tables::Aarch64(set) => walk_into(set, start, mem, max, fallback, frames),
            Tables::Riscv64(set) => walk_into(set, start, mem, max, fallback, frames),
            Tables::Arm(tables) => {
                let mut r16 = [0u32; 16];
                for (i, r) in r16.iter_mut().enumerate() {
                    *r = regs.get(i as u16).unwrap_or(0) as u32;
                }
                let mut reader = ArmReader {
                    code: self.code.clone(),
                    tables: tables.clone(),
                };
                *out = code_frames(max, |each| {
                    crate::unwind::insn::walk::arm_each(r16, mem, &mut reader, stack_end, each)
                });
                return;
            }
            Tables::Mips => {
                let mut code = self.code.clone();
                *out = code_frames(max, |each| {
                    crate::unwind::insn::walk::risc_each::<crate::unwind::insn::mips::Arch, _, _>(
                        start, mem, &mut code, stack_end, each,
                    )
                });
                return;
            }
        };
    }

    /// The snapshot being unwound.
    pub fn snapshot(&self) -> &Snapshot {
        self.snap
    }

    /// Marks the module holding `pc` (one whose compiled CFI table is
    /// shared with other snapshots) used at `tick`, the caller's clock;
    /// returns its range, so that the frames after it in the same module
    /// can be passed over.
    pub(crate) fn mark_used(&self, pc: u64, tick: u64) -> Option<(u64, u64)> {
        match &self.tables {
            Tables::X86_64(s) => s.mark_used(pc, tick),
            Tables::Aarch64(s) => s.mark_used(pc, tick),
            Tables::Riscv64(s) => s.mark_used(pc, tick),
            Tables::Arm(_) | Tables::Mips => None,
        }
    }

    /// The key of each module with a shared table, and the last tick
    /// [`RemoteUnwinder::mark_used`] gave it (0: never).
    pub(crate) fn used_ticks(&self) -> Vec<(&str, u64)> {
        match &self.tables {
            Tables::X86_64(s) => s.used_ticks().collect(),
            Tables::Aarch64(s) => s.used_ticks().collect(),
            Tables::Riscv64(s) => s.used_ticks().collect(),
            Tables::Arm(_) | Tables::Mips => Vec::new(),
        }
    }

    /// Drops this snapshot's hold on the compiled table shared under
    /// `key` (compiled again when needed): with every snapshot's dropped,
    /// the table is freed.
    pub(crate) fn forget_module(&mut self, key: &str) {
        match &mut self.tables {
            Tables::X86_64(s) => s.forget(key),
            Tables::Aarch64(s) => s.forget(key),
            Tables::Riscv64(s) => s.forget(key),
            Tables::Arm(_) | Tables::Mips => {}
        }
    }

    /// The memory of this snapshot's own code map, in bytes: its segments
    /// and its modules' places (their function lists are shared by file:
    /// [`shared_functions::live_bytes`]).
    pub(crate) fn code_bytes(&self) -> usize {
        self.code.functions.len() * std::mem::size_of::<ModuleFunctions>()
            + self.code.unread.len() * 16
            + self.code.segments.len() * std::mem::size_of::<CodeSegment>()
    }
}

/// Runs one of the machine-code walks of 32-bit targets (arm, mips: no CFI
/// unwinder there yet) into frames, at most `max`. On ARM a Thumb pc
/// carries bit 0, which is dropped from the frame's pc.
fn code_frames(
    max: usize,
    walk: impl FnOnce(&mut dyn FnMut(&Frame) -> bool) -> StopReason,
) -> Unwound {
    let mut out = Unwound::default();
    if max > 0 {
        walk(&mut |f| {
            out.frames.push(Frame {
                pc: f.pc & !1,
                ..*f
            });
            out.frames.len() < max
        });
    }
    if out.frames.len() >= max {
        out.stop = Some(format!("stopped after {max} frames"));
    }
    out
}

fn lr_of(regs: &Registers) -> u64 {
    match regs.arch {
        Machine::Aarch64 => regs.get(30).unwrap_or(0),
        Machine::Arm => regs.get(14).unwrap_or(0),
        Machine::Mips => regs.get(31).unwrap_or(0),
        Machine::Riscv64 => regs
            .get(crate::arch::riscv64::core_regs::DWARF_RA)
            .unwrap_or(0),
        Machine::X86_64 => 0,
    }
}

/// Unwinds from `start` with `set` (and `fallback` where it has no
/// rule), pushing at most `max` frames onto `frames`; why it stopped
/// (`None`: at the outermost frame).
fn walk_into<A: crate::arch::Arch, M: Memory + ?Sized, F: unwind::Fallback<A>>(
    set: &LazySet<A>,
    start: UnwindRegs,
    mem: &mut M,
    max: usize,
    fallback: F,
    frames: &mut Vec<Frame>,
) -> Option<String> {
    // A core's or a stopped thread's pc is exact: it was interrupted there.
    let mut u = Unwinder::with_fallback(set, start, true, fallback);
    let why = if max == 0 {
        StopReason::Running
    } else {
        u.run(mem, |f| {
            frames.push(*f);
            frames.len() < max
        })
    };
    match why {
        StopReason::Running if frames.len() >= max => Some(format!("stopped after {max} frames")),
        StopReason::Running | StopReason::Outermost => None,
        StopReason::UnknownModule(pc) => Some(format!("{pc:#x} is in no known module")),
        StopReason::NoRule(pc) => Some(format!(
            "no CFI and no frame pointer to unwind the frame at {pc:#x}"
        )),
        StopReason::Error(e) => Some(e.to_string()),
        StopReason::BufferFull => Some(format!("stopped after {max} frames")),
    }
}

/// Unwinds thread `t` of `snap` (a one-off [`RemoteUnwinder`]; use one
/// [`RemoteUnwinder`] for all threads of a snapshot to share its tables).
pub fn unwind_thread<M: Memory + ?Sized>(
    snap: &Snapshot,
    mem: &mut M,
    t: &Thread,
    max: usize,
) -> Unwound {
    RemoteUnwinder::new(snap).unwind(mem, t, max)
}
