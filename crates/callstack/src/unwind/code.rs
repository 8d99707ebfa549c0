//! Is this a return address? A check that a value lies in executable code
//! of a loaded module, for walks that must not report garbage (a frame
//! record reached through a register that a function without frame
//! pointers used for something else).
//!
//! Async-signal-safe and lock-free. A value is first compared with the
//! ranges already found ([`RANGES`], one word each, process-wide); a miss
//! looks it up in the executable segments of the published module snapshot
//! (after `callstack::prepare()`; a binary search), else through glibc's
//! `_dl_find_object` and the module's ELF program headers (in its first
//! page, mapped while it is loaded), and keeps the range found. The
//! frame-pointer walk keeps its current range in registers (see
//! `fast::walk_bounded` and [`hints`]). Without `_dl_find_object` (glibc
//! before 2.35) and without a snapshot nothing can be checked without a
//! lock, and every value is accepted. On Windows the lookup is the
//! loader's module list and the PE section headers of the module holding
//! the value (`sys/windows/loader.rs`).
//!
//! What is checked is a value, never the code: nothing is read at the
//! address. The program headers are read right after `_dl_find_object`
//! found the module; a `dlclose` of that very module on another thread in
//! between is the one window (the same one the exact walk's build-id check
//! has).

use core::sync::atomic::{AtomicUsize, Ordering};

/// Executable ranges met during a walk. [`CodeCheck::is_code`] tries the
/// last range found, then the process-wide table of ranges found before
/// ([`RANGES`]), and only then looks the address up.
#[derive(Clone, Copy)]
pub(crate) struct CodeCheck {
    last: (usize, usize),
}

impl CodeCheck {
    /// A check that knows no range of its own yet.
    #[inline(always)]
    pub(crate) fn new() -> Self {
        CodeCheck { last: (0, 0) }
    }

    /// Whether `addr` lies in an executable segment of a loaded module.
    #[inline(always)]
    pub(crate) fn is_code(&mut self, addr: usize) -> bool {
        // A walk's frames run in one module for long stretches.
        let (lo, hi) = self.last;
        if addr.wrapping_sub(lo) < hi - lo {
            return true;
        }
        self.other(addr)
    }

    #[inline(never)]
    fn other(&mut self, addr: usize) -> bool {
        match code_range(addr) {
            Some(r) => {
                self.last = r;
                true
            }
            None => false,
        }
    }
}

/// An executable range as the frame-pointer walk keeps it in registers:
/// `[lo, lo + len)`, compared with one subtraction.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    lo: usize,
    len: usize,
}

impl Range {
    /// Whether `addr` lies in the range.
    #[inline(always)]
    pub(crate) fn contains(self, addr: usize) -> bool {
        addr.wrapping_sub(self.lo) < self.len
    }

    #[inline(always)]
    fn from_word(w: usize) -> Range {
        Range {
            lo: (w >> LEN_BITS) << PAGE,
            len: (w & ((1 << LEN_BITS) - 1)) << PAGE,
        }
    }

    #[inline(always)]
    fn word(self) -> usize {
        (self.lo >> PAGE) << LEN_BITS | self.len >> PAGE
    }
}

impl From<(usize, usize)> for Range {
    #[inline(always)]
    fn from((lo, hi): (usize, usize)) -> Range {
        Range { lo, len: hi - lo }
    }
}

/// The two ranges the last frame-pointer walk of the process ended in
/// (page-rounded, as [`RANGES`] keeps them), for the next walk to start
/// with. Shared by all threads; written only when they change.
static HINTS: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];

/// The ranges the next walk starts with (see [`HINTS`]).
#[inline(always)]
pub(crate) fn hints() -> [Range; 2] {
    [
        Range::from_word(HINTS[0].load(Ordering::Relaxed)),
        Range::from_word(HINTS[1].load(Ordering::Relaxed)),
    ]
}

/// Keeps a walk's last two ranges for the next walk (only ranges that fit
/// a word; a range that does not is found again by [`code_range`]).
#[cold]
pub(crate) fn set_hints(r: [Range; 2]) {
    for (h, r) in HINTS.iter().zip(r) {
        let w = r.word();
        if Range::from_word(w) == r {
            h.store(w, Ordering::Relaxed);
        }
    }
}

/// The executable range `[lo, hi)` holding `addr`, if `addr` is code: from
/// the table of ranges found before, else looked up (and added to it).
#[inline(never)]
pub(crate) fn code_range(addr: usize) -> Option<(usize, usize)> {
    // Page-rounded like the table's, so that a walk's ranges compare equal
    // to the hints made from them.
    let page = (1 << PAGE) - 1;
    RANGES
        .find(addr)
        .or_else(|| lookup(addr).map(|(lo, hi)| (lo & !page, (hi + page) & !page)))
}

/// The slow way: the module snapshot, else `_dl_find_object` and the
/// module's program headers; a range found goes into [`RANGES`].
#[cold]
#[inline(never)]
fn lookup(addr: usize) -> Option<(usize, usize)> {
    #[cfg(not(windows))]
    let found = match crate::unwind::local::snapshot_code_range(addr as u64) {
        Some((lo, hi)) => Some((lo as usize, hi as usize)),
        None => exec_range(addr),
    };
    #[cfg(windows)]
    let found = exec_range(addr);
    if let Some(r) = found {
        RANGES.put(r);
    }
    found
}

/// Executable ranges found so far, process-wide, each in one word (page
/// numbers: start and length), so a reader never sees half of one.
/// Lock-free; a full table overwrites its entries in turn.
///
/// A range may outlive its module (a `dlclose`): a value in it is then
/// still taken for code. That makes the check softer, never unsafe: nothing
/// is read at a checked address.
struct Ranges {
    words: [AtomicUsize; RANGE_SLOTS],
    next: AtomicUsize,
}

const RANGE_SLOTS: usize = 16;
const PAGE: usize = 12;
/// Bits of a word that hold the length in pages.
const LEN_BITS: u32 = 28;

/// Writes the pages of [`RANGES`] and [`HINTS`] once, at load (see
/// `touch_flags` in `unwind/local/cache.rs`): a first capture reads them
/// and then writes them, which would fault twice on a page nothing else
/// has touched (where they land depends on the binary's layout).
#[cfg(target_os = "linux")]
pub(crate) fn touch_at_load() {
    // A compare-exchange writes even when it changes nothing (an idempotent
    // `fetch_add(0)` would be compiled into a load).
    for w in [&RANGES.next, &RANGES.words[0], &HINTS[0]] {
        let _ = w.compare_exchange(0, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Forgets every range found (a module was unloaded: its range may hold
/// another module's data next). Lock-free; a walk running meanwhile may
/// still use a range it read before.
#[cfg(windows)]
pub(crate) fn forget_all() {
    for w in RANGES.words.iter().chain(HINTS.iter()) {
        w.store(0, Ordering::Relaxed);
    }
}

static RANGES: Ranges = Ranges {
    words: [const { AtomicUsize::new(0) }; RANGE_SLOTS],
    next: AtomicUsize::new(0),
};

impl Ranges {
    /// The range holding `addr` (page-rounded, so a few bytes past an
    /// executable segment's ends, in its own mapped pages, count too).
    #[inline]
    fn find(&self, addr: usize) -> Option<(usize, usize)> {
        let page = addr >> PAGE;
        self.words.iter().find_map(|w| {
            let w = w.load(Ordering::Relaxed);
            let (lo, len) = (w >> LEN_BITS, w & ((1 << LEN_BITS) - 1));
            (page.wrapping_sub(lo) < len).then_some((lo << PAGE, (lo + len) << PAGE))
        })
    }

    fn put(&self, (lo, hi): (usize, usize)) {
        let (lo, hi) = (lo >> PAGE, (hi + (1 << PAGE) - 1) >> PAGE);
        let len = hi.saturating_sub(lo);
        // Ranges that do not fit a word (all memory, when nothing can be
        // checked) are not kept: they are found again at once.
        if len == 0 || len >= 1 << LEN_BITS || lo >= 1 << (usize::BITS - LEN_BITS) {
            return;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % RANGE_SLOTS;
        self.words[i].store(lo << LEN_BITS | len, Ordering::Relaxed);
    }
}

/// The executable segment of a loaded module that holds `addr`; everything
/// when no check is possible (no `_dl_find_object`).
fn exec_range(addr: usize) -> Option<(usize, usize)> {
    #[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]
    {
        if !crate::has_dl_find_object() {
            return Some((0, usize::MAX));
        }
        let m = crate::unwind::local::dl_find(addr as u64)?;
        match crate::unwind::local::exec_segment_in(m, addr as u64) {
            Some(r) => r.map(|(lo, hi)| (lo as usize, hi as usize)),
            // Program headers not where we look: the whole module.
            None => Some((m.start as usize, m.end as usize)),
        }
    }
    // The executable section of the module holding it, from the loader's
    // list.
    #[cfg(windows)]
    {
        crate::sys::windows::loader::exec_range(addr)
    }
    #[cfg(not(any(
        windows,
        all(target_os = "linux", target_env = "gnu", target_pointer_width = "64")
    )))]
    {
        let _ = addr;
        Some((0, usize::MAX))
    }
}

/// From the first bytes of a loaded ELF64 object mapped at `start`: the
/// executable `PT_LOAD` segment holding `addr`, at runtime addresses.
/// `Some((0, 0))` (no range) when `addr` is in no executable segment; `None`
/// when the headers are not in `first` (then nothing is known).
#[cfg_attr(windows, allow(dead_code))]
pub(crate) fn elf_exec_segment(first: &[u8], start: usize, addr: usize) -> Option<(usize, usize)> {
    const PT_LOAD: u32 = 1;
    const PF_X: u32 = 1;
    let u16_at = |o: usize| Some(u16::from_le_bytes(first.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(first.get(o..o + 4)?.try_into().ok()?));
    let u64_at =
        |o: usize| Some(u64::from_le_bytes(first.get(o..o + 8)?.try_into().ok()?) as usize);
    if first.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let phoff = u64_at(32)?;
    let phentsize = u16_at(54)? as usize;
    let phnum = u16_at(56)? as usize;
    if phentsize < 56
        || phnum == 0
        || phoff.checked_add(phnum.checked_mul(phentsize)?)? > first.len()
    {
        return None;
    }
    let ph = |i: usize| phoff + i * phentsize;
    // The load bias: the first PT_LOAD, page-aligned, is mapped at `start`.
    let first_vaddr = (0..phnum)
        .filter(|&i| u32_at(ph(i)) == Some(PT_LOAD))
        .filter_map(|i| u64_at(ph(i) + 16))
        .min()?;
    let bias = start.wrapping_sub(first_vaddr & !0xfff);
    for i in 0..phnum {
        let o = ph(i);
        if u32_at(o)? != PT_LOAD || u32_at(o + 4)? & PF_X == 0 {
            continue;
        }
        let lo = bias.wrapping_add(u64_at(o + 16)?);
        let hi = lo.wrapping_add(u64_at(o + 40)?);
        if lo <= addr && addr < hi {
            return Some((lo, hi));
        }
    }
    Some((0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_function() -> usize {
        a_function as *const () as usize
    }

    #[test]
    fn code_is_code_and_data_is_not() {
        let mut c = CodeCheck::new();
        assert!(c.is_code(a_function() + 1));
        assert!(c.is_code(libc::strlen as *const () as usize));
        if crate::has_dl_find_object() {
            // Writable data: read-only data may share the code's segment
            // (AArch64's default layout, without `-z separate-code`).
            static DATA: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
            let heap = Box::new(5u64);
            let local = 0u64;
            // Under qemu-user (scripts/test-aarch64.sh) `_dl_find_object`
            // gives the executable's writable segment as an object of its
            // own, with no ELF header at its start: the check then takes
            // the whole object as code (its fallback when the headers are
            // not where it looks).
            if std::env::var_os("CALLSTACK_TEST_QEMU").is_none() {
                assert!(!c.is_code(&DATA as *const _ as usize));
            }
            // x86-64's linker keeps read-only data out of the code segment.
            #[cfg(target_arch = "x86_64")]
            {
                static READ_ONLY: [u8; 64] = [1; 64];
                assert!(!c.is_code(&READ_ONLY as *const _ as usize));
            }
            assert!(!c.is_code(&*heap as *const u64 as usize));
            assert!(!c.is_code(&local as *const u64 as usize));
            assert!(!c.is_code(0x7fd9_8000_0002));
            assert!(!c.is_code(0));
            assert!(!c.is_code(usize::MAX));
            // Still knows the code it found.
            assert!(c.is_code(a_function()));
            // The vDSO's code is code too (a signal may land in it).
            // SAFETY: getauxval has no preconditions.
            let vdso = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize;
            if vdso != 0 {
                assert!(exec_range(vdso + 0x800).is_some());
            }
        }
    }

    #[test]
    fn headers_out_of_reach_give_nothing() {
        assert_eq!(elf_exec_segment(b"\x7fELF\x02\x01", 0x1000, 0x1000), None);
        assert_eq!(elf_exec_segment(b"garbage", 0x1000, 0x1000), None);
        let mut h = [0u8; 64];
        h[..6].copy_from_slice(b"\x7fELF\x02\x01");
        h[32] = 0xff; // phoff past the page
        h[54] = 56;
        h[56] = 1;
        assert_eq!(elf_exec_segment(&h, 0x1000, 0x1000), None);
    }
}
