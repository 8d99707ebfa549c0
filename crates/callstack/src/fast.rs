//! Fast capture: the frame-pointer walk.
//!
//! Every read is bounded: a frame record is read only if it lies inside the
//! current thread's stack, at or above the stack pointer of the capture, and
//! aligned; each next record must lie strictly above the previous one. A
//! corrupt chain (garbage, a cycle, a pointer below the stack) ends the walk,
//! and so does a return address outside the executable code of the loaded
//! modules (see `code`; one lock-free lookup per module the walk enters).

use crate::arch::{Arch, FrameRecordLayout};
use crate::stack;
#[cfg(callstack_native)]
use crate::stack::StackMemory;
use crate::types::UnwindRegs;
#[cfg(callstack_native)]
use crate::unwind::Unwinder;
use crate::unwind::{FastEnd, Found, NativeArch, RuleSource};

#[cfg(callstack_native)]
crate::arch::native::define_fast_entry!();
// Windows' ABI differs from the architecture's System V one: its own entry.
#[cfg(all(windows, callstack_fast))]
crate::sys::windows::x86_64::define_entry!(fast_entry, walk_from_entry);

/// Called by the architecture's naked `fast_entry` with its own frame record
/// (`fp`, whose return address is inside the caller of the capture) and its
/// stack pointer (`sp`, the lowest address the walk may read).
///
/// Shaped so that the common case costs no register saves: the cached stack
/// bounds are checked here, and both outcomes are tail calls (the walk
/// itself, or the cold path that looks the bounds up first).
///
/// # Safety
/// `out` must be valid for `max` writes (or null, or `max == 0`).
#[cfg(callstack_fast)]
pub(crate) unsafe extern "C" fn walk_from_entry(
    skip: u32,
    max: u32,
    out: *mut usize,
    fp: usize,
    sp: usize,
) -> u32 {
    if out.is_null() || max == 0 {
        return 0;
    }
    match stack::cached_stack_end(sp) {
        // SAFETY: as promised by our caller; `hi` bounds this thread's stack.
        Some(hi) => unsafe { walk_bounded(skip, max, out, fp, sp, hi) },
        // SAFETY: as promised by our caller.
        None => unsafe { walk_first_on_this_stack(skip, max, out, fp, sp) },
    }
}

/// The first capture on a thread (or on another stack): look the bounds up,
/// then walk.
///
/// # Safety
/// As [`walk_from_entry`], with `out` non-null.
#[cfg(callstack_fast)]
#[cold]
#[inline(never)]
unsafe fn walk_first_on_this_stack(
    skip: u32,
    max: u32,
    out: *mut usize,
    fp: usize,
    sp: usize,
) -> u32 {
    let hi = stack::stack_end(sp);
    // SAFETY: as promised by our caller; `hi` is 0 (nothing read) or the end
    // of the mapping holding `sp`.
    unsafe { walk_bounded(skip, max, out, fp, sp, hi) }
}

/// The walk with known bounds `[sp, hi)`, from the entry's own frame
/// record. [`FrameRecords`]' fast path first, as the loop would take it at
/// that frame; with exit hooks live, the loop itself
/// ([`walk_records`]), whose generic step resolves their trampolines.
///
/// # Safety
/// `out` must be valid for `max` writes and non-null; `[sp, hi)` must be
/// readable memory (or `hi` 0).
#[cfg(callstack_fast)]
#[inline(never)]
unsafe fn walk_bounded(
    skip: u32,
    max: u32,
    out: *mut usize,
    fp: usize,
    sp: usize,
    hi: usize,
) -> u32 {
    // SAFETY: the caller promises `out` holds `max` writable slots.
    let out = unsafe { core::slice::from_raw_parts_mut(out, max as usize) };
    #[cfg(target_os = "linux")]
    if crate::unwind::hook_table::any_live() {
        return hooked(fp, sp, hi, skip as usize, out) as u32;
    }
    let source = FrameRecords::new(sp, hi);
    let n = source.walk(fp, sp, skip as usize, out).n;
    source.keep_hints();
    n as u32
}

/// `capture_fast` with exit hooks live: the entry's record read here (its
/// return address is inside the caller of the capture), then the loop.
#[cfg(all(target_os = "linux", callstack_native))]
#[cold]
#[inline(never)]
fn hooked(fp: usize, sp: usize, hi: usize, skip: usize, out: &mut [usize]) -> usize {
    match record_caller(fp, sp, hi) {
        Some(start) => walk_records(start, false, sp, hi, skip, out),
        None => 0,
    }
}

/// The caller's frame read from the frame record at `fp` (its return
/// address, the frame pointer it saved), if that record lies inside the
/// readable stack `[lo, hi)` and is aligned.
#[cfg(callstack_native)]
pub(crate) fn record_caller(fp: usize, lo: usize, hi: usize) -> Option<UnwindRegs> {
    let layout = crate::arch::native::FRAME_RECORD;
    let record_end = layout.fp_offset.max(layout.ra_offset) + core::mem::size_of::<usize>();
    let rec = fp.checked_sub(layout.below)?;
    if rec < lo || rec.checked_add(record_end).is_none_or(|e| e > hi) || rec % layout.align != 0 {
        return None;
    }
    // SAFETY: `[rec, rec + record_end)` lies inside `[lo, hi)`, readable
    // stack memory of this thread (the caller's promise), and `rec` is
    // aligned.
    let (next, ra) = unsafe {
        (
            core::ptr::read_volatile((rec + layout.fp_offset) as *const usize),
            core::ptr::read_volatile((rec + layout.ra_offset) as *const usize),
        )
    };
    Some(UnwindRegs {
        pc: ra as u64,
        sp: (rec + 16) as u64,
        fp: next as u64,
        lr: 0,
    })
}

/// Walks the frame records of the stack `[lo, hi)` from the frame `start`
/// (its pc exact when `exact`, else a return address) into `out`, after
/// dropping `skip`: [`Unwinder::run_pcs`] over [`FrameRecords`]. Returns
/// how many pcs it wrote. Async-signal-safe, never reads outside
/// `[lo, hi)`.
///
/// Used by `capture_fast` with exit hooks live and by the crash handler (a
/// walk from the interrupted frame pointer where CFI found no caller).
#[cfg(callstack_native)]
pub(crate) fn walk_records(
    start: UnwindRegs,
    exact: bool,
    lo: usize,
    hi: usize,
    skip: usize,
    out: &mut [usize],
) -> usize {
    let source = FrameRecords::new(lo, hi);
    let mut mem = StackMemory::with_bounds(lo, hi);
    let (n, _) = Unwinder::new(&source, start, exact).run_pcs(&mut mem, skip, out);
    source.keep_hints();
    n
}

/// `capture_fast`'s rule source: every frame is a frame record, and no CFI
/// is read. Its fast path walks the records with
/// [`walk_frame_records_checked`]; the chain's rules there (inside the
/// stack, aligned, strictly up, a return address in code) are the ones the
/// capture promises, so where that walk ends, the capture ends. With exit
/// hooks live it walks none: a record may then hold a hook's trampoline
/// where its return address was, and the generic step (the frame-pointer
/// rule) resolves it ([`RuleSource::return_address`]).
#[cfg(callstack_fast)]
struct FrameRecords {
    /// The stack: `[lo, hi)`.
    lo: usize,
    hi: usize,
    /// The two executable ranges the walk is in. A return address in
    /// neither takes [`code_miss`] (out of line) and replaces the older
    /// range. The walk starts with the ranges the process's last walk
    /// ended with ([`crate::unwind::code::hints`]), so a warm walk makes no
    /// lookup.
    code: core::cell::Cell<[crate::unwind::code::Range; 2]>,
    /// The ranges the walk started with.
    hints: [crate::unwind::code::Range; 2],
}

#[cfg(callstack_fast)]
impl FrameRecords {
    /// The source for the stack `[lo, hi)`, starting from the executable
    /// ranges the process's last walk ended with.
    #[inline(always)]
    fn new(lo: usize, hi: usize) -> Self {
        let hints = crate::unwind::code::hints();
        FrameRecords {
            lo,
            hi,
            code: core::cell::Cell::new(hints),
            hints,
        }
    }

    /// Leaves the ranges this walk ended with for the next one.
    #[inline(always)]
    fn keep_hints(&self) {
        let code = self.code.get();
        if code != self.hints {
            crate::unwind::code::set_hints(code);
        }
    }

    /// [`FrameRecords::walk`] as a call of its own, for the loop's fast
    /// path: the kernel then keeps its state in registers.
    #[inline(never)]
    fn records(&self, fp: usize, sp: usize, skip: usize, out: &mut [usize]) -> Walked {
        self.walk(fp, sp, skip, out)
    }

    /// The kernel of the fast path: walks the records from `fp` (reading
    /// nothing below `sp`) into `out`, after dropping `skip`.
    #[inline(always)]
    fn walk(&self, fp: usize, sp: usize, skip: usize, out: &mut [usize]) -> Walked {
        let [mut a, mut b] = self.code.get();
        let w = walk_frame_records_checked(
            crate::arch::native::FRAME_RECORD,
            fp,
            sp.max(self.lo),
            self.hi,
            skip,
            out,
            |ra| {
                if a.contains(ra) {
                    return true;
                }
                let r = if b.contains(ra) {
                    b
                } else {
                    match code_miss(ra, self.lo, self.hi) {
                        Some(r) => r,
                        None => return false,
                    }
                };
                (a, b) = (r, a);
                true
            },
        );
        self.code.set([a, b]);
        w
    }
}

#[cfg(callstack_fast)]
impl RuleSource<NativeArch> for FrameRecords {
    #[inline(always)]
    fn rule(&self, _: u64) -> Found<<NativeArch as Arch>::Rule> {
        Found::Rule(NativeArch::NO_CFI)
    }

    #[inline(always)]
    fn return_address(&self, ra: u64, cfa: u64) -> u64 {
        #[cfg(target_os = "linux")]
        {
            // `cfa` is the end of the frame record `ra` was read from.
            crate::unwind::hook_table::resolve_record(ra, cfa)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = cfa;
            ra
        }
    }

    #[inline(always)]
    fn is_code(&self, ra: u64) -> bool {
        let [a, b] = self.code.get();
        let ra = ra as usize;
        a.contains(ra) || b.contains(ra) || code_miss(ra, self.lo, self.hi).is_some()
    }

    #[inline(always)]
    fn fast_walk(&self, regs: &mut UnwindRegs, out: &mut [usize]) -> (usize, FastEnd) {
        // With exit hooks live, a record may hold the trampoline where its
        // return address was: every frame takes the generic step, which
        // resolves it ([`RuleSource::return_address`]).
        #[cfg(target_os = "linux")]
        if crate::unwind::hook_table::any_live() {
            return (0, FastEnd::Slow);
        }
        let w = self.records(regs.fp as usize, regs.sp as usize, 0, out);
        if w.n < out.len() {
            // The chain ended by the kernel's rules, the capture's.
            return (w.n, FastEnd::Outermost);
        }
        // Full: the frame of the last return address written has its
        // record at `w.next` (0 when that is no record). Its stack pointer
        // is not known, only that it lies at or below the record: the
        // lowest a walk from there reads, which keeps "strictly up the
        // stack" from one call to the next.
        *regs = UnwindRegs {
            pc: out[w.n - 1] as u64,
            sp: w
                .next
                .saturating_sub(crate::arch::native::FRAME_RECORD.below) as u64,
            fp: w.next as u64,
            lr: 0,
        };
        (w.n, FastEnd::Full)
    }
}

/// The executable range holding `ra` when it is in neither of the walk's
/// two: a lookup. `None` when `ra` is not code (the stack `[sp, hi)` and the
/// first page are not, without a lookup).
#[cfg(callstack_fast)]
#[cold]
#[inline(never)]
fn code_miss(ra: usize, sp: usize, hi: usize) -> Option<crate::unwind::code::Range> {
    if ra.wrapping_sub(sp) < hi.wrapping_sub(sp) || ra < 4096 {
        return None;
    }
    crate::unwind::code::code_range(ra).map(crate::unwind::code::Range::from)
}

/// Walks frame records from `fp`, reading only inside `[lo, hi)`, taking any
/// non-null return address: [`walk_frame_records_checked`] accepting all.
/// Returns how many return addresses it wrote.
#[cfg_attr(not(test), allow(dead_code))]
#[inline(always)]
pub(crate) fn walk_frame_records(
    layout: FrameRecordLayout,
    fp: usize,
    lo: usize,
    hi: usize,
    skip: usize,
    out: &mut [usize],
) -> usize {
    walk_frame_records_checked(layout, fp, lo, hi, skip, out, |_| true).n
}

/// What [`walk_frame_records_checked`] did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Walked {
    /// How many return addresses it wrote.
    pub n: usize,
    /// When it filled `out`: the saved frame pointer of the record the last
    /// one was read from (the frame pointer of that return address's frame)
    /// if it passed the checks of a record to read next (inside the stack,
    /// aligned, strictly above that record), else 0. Otherwise unspecified.
    pub next: usize,
}

/// Walks frame records from `fp`, reading only inside `[lo, hi)`.
///
/// Writes return addresses to `out` after dropping the first `skip`.
/// Stops at a null return address, one that `is_code` rejects (a frame
/// record reached through a register that code without frame pointers used
/// for something else), a record outside the bounds, a misaligned record,
/// or a record that does not move strictly up the stack.
///
/// Shaped for speed without dropping a check: the skipped records are walked
/// in a loop of their own, the main loop takes two frames per turn (one
/// length check for both), and "aligned, strictly above the previous record,
/// inside the stack" is a single unsigned compare per frame (see `room`).
#[inline(always)]
pub(crate) fn walk_frame_records_checked(
    layout: FrameRecordLayout,
    mut fp: usize,
    lo: usize,
    hi: usize,
    mut skip: usize,
    out: &mut [usize],
    mut is_code: impl FnMut(usize) -> bool,
) -> Walked {
    let none = Walked { n: 0, next: 0 };
    // The walk runs on the records' addresses (`fp - below`, the frame
    // pointer itself where it points at its record); `next` is given back
    // as a frame pointer.
    let below = layout.below;
    let fp_of = |rec: usize| if rec == 0 { 0 } else { rec.wrapping_add(below) };
    fp = fp.wrapping_sub(below);
    let record_end = layout.fp_offset.max(layout.ra_offset) + core::mem::size_of::<usize>();
    let misaligned = layout.align - 1;
    let shift = layout.align.trailing_zeros();
    // `last`: the highest aligned address a whole record may start at.
    let Some(last) = hi.checked_sub(record_end) else {
        return none;
    };
    let last = last & !misaligned;
    if fp < lo || fp > last || fp & misaligned != 0 {
        return none;
    }
    // From here on the record at `fp` may be read: `lo <= fp <= last`,
    // aligned. Each step accepts `next` by the same rules plus "strictly
    // above `fp`" in one compare:
    //
    // `room(x) = (last - x).rotate_right(log2 align)`. For an aligned
    // `x <= last` that is the number of aligned slots between `x` and
    // `last`, so `room(next) < room(fp)` means `next > fp`. A misaligned
    // `next` leaves its low bits at the top after the rotation, and a
    // `next > last` wraps `last - next`: both give a value above any room of
    // an address inside the stack, so the compare fails for them too.
    let room = |x: usize| last.wrapping_sub(x).rotate_right(shift);
    let mut fp_room = room(fp);
    // SAFETY (`read`): only called with an `fp` accepted above or by
    // `room(next) < fp_room`: `[fp, fp + record_end)` lies inside
    // `[lo, hi)`, which is mapped, readable stack memory of this thread (see
    // `stack`), and `fp` is aligned.
    let read = |fp: usize| unsafe {
        (
            core::ptr::read_volatile((fp + layout.fp_offset) as *const usize).wrapping_sub(below),
            core::ptr::read_volatile((fp + layout.ra_offset) as *const usize),
        )
    };
    while skip > 0 {
        let (next, ra) = read(fp);
        let next_room = room(next);
        if ra == 0 || next_room >= fp_room || !is_code(ra) {
            return none;
        }
        skip -= 1;
        fp = next;
        fp_room = next_room;
    }
    // Two frames per turn (one length check for both), then maybe one more.
    let mut n = 0;
    let len = out.len();
    while n + 2 <= len {
        let (next, ra) = read(fp);
        if ra == 0 || !is_code(ra) {
            return Walked { n, next: fp_of(fp) };
        }
        out[n] = ra;
        let next_room = room(next);
        if next_room >= fp_room {
            return Walked {
                n: n + 1,
                next: fp_of(next),
            };
        }
        let (next2, ra2) = read(next);
        if ra2 == 0 || !is_code(ra2) {
            return Walked {
                n: n + 1,
                next: fp_of(next),
            };
        }
        out[n + 1] = ra2;
        n += 2;
        let next2_room = room(next2);
        if next2_room >= next_room {
            return Walked { n, next: 0 };
        }
        fp = next2;
        fp_room = next2_room;
    }
    if n < len {
        let (next, ra) = read(fp);
        if ra != 0 && is_code(ra) {
            out[n] = ra;
            // Read on only after checking `next` like any record.
            let next = if room(next) < fp_room { next } else { 0 };
            return Walked {
                n: n + 1,
                next: fp_of(next),
            };
        }
    }
    Walked { n, next: fp_of(fp) }
}

#[cfg(test)]
mod tests {
    //! The walk on crafted frame records in an ordinary array: every way a
    //! chain can be wrong must end the walk, and never read outside the array.
    use super::walk_frame_records;
    use crate::arch::{aarch64, x86_64, FrameRecordLayout};

    const X86: FrameRecordLayout = x86_64::FRAME_RECORD;
    const W: usize = core::mem::size_of::<usize>();

    /// A fake stack: `words` usizes, 16-byte aligned.
    struct Fake {
        mem: Vec<u128>,
    }

    impl Fake {
        fn new(words: usize) -> Self {
            Fake {
                mem: vec![0u128; words.div_ceil(2)],
            }
        }
        fn lo(&self) -> usize {
            self.mem.as_ptr() as usize
        }
        fn hi(&self) -> usize {
            self.lo() + self.mem.len() * 16
        }
        /// Address of word `i`.
        fn at(&self, i: usize) -> usize {
            self.lo() + i * W
        }
        /// Writes a record at word `i`: saved frame pointer, return address.
        fn record(&mut self, i: usize, next: usize, ra: usize) {
            let base = self.mem.as_mut_ptr() as *mut usize;
            // SAFETY: the tests only write records inside `mem`.
            unsafe {
                *base.add(i) = next;
                *base.add(i + 1) = ra;
            }
        }
        fn walk(&self, fp: usize, skip: usize, out: &mut [usize]) -> usize {
            walk_frame_records(X86, fp, self.lo(), self.hi(), skip, out)
        }
    }

    /// A good chain of 5 records at words 0, 4, 10, 12, 20; ends at a null
    /// frame pointer (below the stack).
    fn good_chain() -> Fake {
        let mut f = Fake::new(32);
        let words = [0, 4, 10, 12, 20];
        for (k, &w) in words.iter().enumerate() {
            let next = words.get(k + 1).map_or(0, |&n| f.at(n));
            f.record(w, next, 0x1000 + k);
        }
        f
    }

    #[test]
    fn walks_a_good_chain() {
        let f = good_chain();
        let mut out = [0usize; 16];
        let n = f.walk(f.at(0), 0, &mut out);
        assert_eq!(&out[..n], &[0x1000, 0x1001, 0x1002, 0x1003, 0x1004]);
    }

    #[test]
    fn skip_and_short_out() {
        let f = good_chain();
        let mut out = [0usize; 16];
        assert_eq!(f.walk(f.at(0), 2, &mut out), 3);
        assert_eq!(&out[..3], &[0x1002, 0x1003, 0x1004]);
        assert_eq!(f.walk(f.at(0), 5, &mut out), 0);
        assert_eq!(f.walk(f.at(0), 99, &mut out), 0);
        let mut two = [0usize; 2];
        assert_eq!(f.walk(f.at(0), 1, &mut two), 2);
        assert_eq!(two, [0x1001, 0x1002]);
        assert_eq!(f.walk(f.at(0), 0, &mut []), 0);
    }

    #[test]
    fn every_out_length_and_every_kind_of_end() {
        // Chains of 1 to 7 records ending in each way; for every `out`
        // length and skip, the result is the matching slice of the full walk
        // (the walk takes two frames per turn, so odd and even ends matter).
        for records in 1..=7usize {
            for end in 0..3 {
                let mut f = Fake::new(32);
                for k in 0..records {
                    let next = if k + 1 < records {
                        f.at(2 * (k + 1))
                    } else {
                        match end {
                            0 => 0,                // below the stack
                            1 => f.at(2 * k),      // a cycle
                            _ => f.at(2 * k) + 20, // misaligned
                        }
                    };
                    f.record(2 * k, next, 0x500 + k);
                }
                let full: Vec<usize> = (0..records).map(|k| 0x500 + k).collect();
                for skip in 0..=records + 1 {
                    for len in 0..=records + 2 {
                        let mut out = vec![0usize; len];
                        let n = f.walk(f.at(0), skip, &mut out);
                        let from = skip.min(records);
                        let want = &full[from..(from + len).min(records)];
                        assert_eq!(
                            &out[..n],
                            want,
                            "{records} records, end {end}, skip {skip}, len {len}"
                        );
                    }
                }
            }
        }
        // A null return address mid-chain, at every position.
        for zero_at in 0..6usize {
            let mut f = Fake::new(32);
            for k in 0..6 {
                let next = if k < 5 { f.at(2 * (k + 1)) } else { 0 };
                let ra = if k == zero_at { 0 } else { 0x600 + k };
                f.record(2 * k, next, ra);
            }
            for len in 0..8 {
                let mut out = vec![0usize; len];
                assert_eq!(
                    f.walk(f.at(0), 0, &mut out),
                    zero_at.min(len),
                    "zero at {zero_at}, len {len}"
                );
            }
        }
    }

    #[test]
    fn garbage_saved_frame_pointer_ends_the_walk() {
        for garbage in [
            0,
            1,
            0xdead_beef,
            usize::MAX,
            usize::MAX - 7,
            usize::MAX - 15,
            usize::MAX / 2,
        ] {
            let mut f = good_chain();
            f.record(10, garbage, 0x1002);
            let mut out = [0usize; 16];
            let n = f.walk(f.at(0), 0, &mut out);
            assert_eq!(&out[..n], &[0x1000, 0x1001, 0x1002], "{garbage:#x}");
        }
    }

    #[test]
    fn cycles_end_the_walk() {
        // A record pointing at itself.
        let mut f = good_chain();
        f.record(10, f.at(10), 0x1002);
        let mut out = [0usize; 16];
        assert_eq!(f.walk(f.at(0), 0, &mut out), 3);
        // A record pointing back down to an earlier one.
        let mut f = good_chain();
        f.record(12, f.at(4), 0x1003);
        assert_eq!(f.walk(f.at(0), 0, &mut out), 4);
        // Records each one word above the previous (overlapping): they move
        // up, so they are walked, and the walk still ends inside the array.
        let mut f = Fake::new(32);
        for i in 0..30 {
            f.record(i, f.at(i + 1), 0x2000 + i);
        }
        assert!(f.walk(f.at(0), 0, &mut [0usize; 64]) <= 31);
    }

    #[test]
    fn pointers_outside_the_stack_end_the_walk() {
        let f = good_chain();
        let mut out = [0usize; 16];
        // Below the stack.
        assert_eq!(f.walk(f.lo() - 16, 0, &mut out), 0);
        assert_eq!(f.walk(0, 0, &mut out), 0);
        // At or past the end, or a record straddling the end.
        assert_eq!(f.walk(f.hi(), 0, &mut out), 0);
        assert_eq!(f.walk(f.hi() - W, 0, &mut out), 0);
        assert_eq!(f.walk(usize::MAX - 7, 0, &mut out), 0);
        // The last record that fits is read.
        let mut g = Fake::new(32);
        g.record(30, 0, 0x77);
        assert_eq!(g.walk(g.at(30), 0, &mut out), 1);
        // A chain that jumps below `lo` mid-way.
        let mut f = good_chain();
        f.record(12, f.lo() - 64, 0x1003);
        assert_eq!(f.walk(f.at(0), 0, &mut out), 4);
        // ... or to the last word, where a whole record does not fit.
        let mut f = good_chain();
        f.record(12, f.hi() - W, 0x1003);
        assert_eq!(f.walk(f.at(0), 0, &mut out), 4);
        // Bounds that cannot hold a record.
        assert_eq!(walk_frame_records(X86, 8, 0, 8, 0, &mut out), 0);
        assert_eq!(walk_frame_records(X86, 0, 0, 0, 0, &mut out), 0);
    }

    #[test]
    fn misaligned_frame_pointers_end_the_walk() {
        let f = good_chain();
        let mut out = [0usize; 16];
        for off in 1..8 {
            assert_eq!(f.walk(f.at(0) + off, 0, &mut out), 0);
            let mut g = good_chain();
            g.record(4, g.at(10) + off, 0x1001);
            assert_eq!(g.walk(g.at(0), 0, &mut out), 2, "offset {off}");
        }
        // AArch64 wants 16-byte records: word 4 (32 bytes) is fine, an
        // 8-byte aligned one is not.
        let mut a = Fake::new(32);
        a.record(0, a.at(4), 0x1);
        a.record(4, a.at(6), 0x2);
        a.record(6, a.at(9), 0x3);
        a.record(9, 0, 0x4);
        let n = walk_frame_records(aarch64::FRAME_RECORD, a.at(0), a.lo(), a.hi(), 0, &mut out);
        assert_eq!(&out[..n], &[0x1, 0x2, 0x3]);
    }

    #[test]
    fn null_return_address_ends_the_walk() {
        let mut f = good_chain();
        f.record(10, f.at(12), 0);
        let mut out = [0usize; 16];
        assert_eq!(f.walk(f.at(0), 0, &mut out), 2);
        // ... also while skipping.
        assert_eq!(f.walk(f.at(0), 1, &mut out), 1);
        assert_eq!(f.walk(f.at(0), 2, &mut out), 0);
    }

    #[test]
    fn one_compare_check_matches_the_plain_rules() {
        // `next_ok` folds three rules into one compare; compare it with the
        // plain rules over many (fp, next) pairs near the edges.
        // Every word holds 1: any record the walk reaches past the crafted
        // one has a non-null return address and an invalid saved frame
        // pointer, so the walk returns 2 exactly when it accepted `next`.
        let mut f = Fake::new(64);
        let (lo, hi) = (f.lo(), f.hi());
        let fill = |f: &mut Fake| {
            for i in (0..64).step_by(2) {
                f.record(i, 1, 1);
            }
        };
        fill(&mut f);
        let mut cases = Vec::new();
        for fp_w in [0usize, 1, 2, 30, 60, 61, 62] {
            for delta in -40isize..=600 {
                cases.push((fp_w, delta));
            }
        }
        for (fp_w, delta) in cases {
            let fp = f.at(fp_w);
            let next = fp.wrapping_add_signed(delta);
            let last = hi - 2 * W;
            f.record(fp_w, next, 0x99);
            let mut out = [0usize; 4];
            let n = walk_frame_records(X86, fp, lo, hi, 0, &mut out);
            let fp_ok = fp <= last;
            let next_ok = next > fp && next <= last && next % 8 == 0;
            let expect = if !fp_ok {
                0
            } else if next_ok {
                2
            } else {
                1
            };
            assert_eq!(n, expect, "fp word {fp_w}, delta {delta}");
            fill(&mut f);
        }
    }

    /// The loop over [`super::FrameRecords`] (the crash handler's walk, and
    /// `capture_fast`'s with exit hooks live) gives what the kernel alone
    /// gives, for every skip and output length: its fast path stops and
    /// resumes at every frame when skipping (8 frames at a time) and when
    /// `out` is short, and must keep "strictly up the stack" across those
    /// stops.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[test]
    fn the_loop_over_frame_records_matches_the_kernel() {
        use crate::types::UnwindRegs;
        // Return addresses in this binary's code, as the source checks.
        let code = the_loop_over_frame_records_matches_the_kernel as *const () as usize;
        for records in [1usize, 5, 9, 17] {
            for end in 0..3 {
                let mut f = Fake::new(64);
                for k in 0..records {
                    let next = if k + 1 < records {
                        f.at(2 * (k + 1))
                    } else {
                        match end {
                            0 => 0,
                            1 => f.at(2 * k),
                            _ => f.at(2 * k) - 16,
                        }
                    };
                    f.record(2 * k, next, code + 1 + k);
                }
                let start = UnwindRegs {
                    pc: code as u64,
                    sp: f.lo() as u64,
                    fp: f.at(0) as u64,
                    lr: 0,
                };
                let mut full: Vec<usize> = vec![code];
                full.extend((0..records).map(|k| code + 1 + k));
                // From an exact pc (here one in no module, above the first
                // page), whose frame record is at the frame pointer: the
                // same chain follows.
                let mut exact = vec![0usize; full.len() + 1];
                let n = super::walk_records(
                    UnwindRegs {
                        pc: 0xdead_0000,
                        ..start
                    },
                    true,
                    f.lo(),
                    f.hi(),
                    0,
                    &mut exact,
                );
                assert_eq!(exact[0], 0xdead_0000);
                assert_eq!(
                    &exact[1..n],
                    &full[1..],
                    "{records} records, end {end}, exact pc"
                );
                for skip in 0..=full.len() + 1 {
                    for len in 1..=full.len() + 1 {
                        let mut out = vec![0usize; len];
                        let n = super::walk_records(start, false, f.lo(), f.hi(), skip, &mut out);
                        let from = skip.min(full.len());
                        let want = &full[from..(from + len).min(full.len())];
                        assert_eq!(
                            &out[..n],
                            want,
                            "{records} records, end {end}, skip {skip}, len {len}"
                        );
                    }
                }
            }
        }
    }
}
