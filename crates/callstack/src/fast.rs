//! Fast capture: the frame-pointer walk.
//!
//! Every read is bounded: a frame record is read only if it lies inside the
//! current thread's stack, at or above the stack pointer of the capture, and
//! aligned; each next record must lie strictly above the previous one. A
//! corrupt chain (garbage, a cycle, a pointer below the stack) ends the walk,
//! and so does a return address outside the executable code of the loaded
//! modules (see `code`; one lock-free lookup per module the walk enters).

use crate::arch::FrameRecordLayout;
use crate::stack;

#[cfg(target_arch = "x86_64")]
crate::arch::x86_64::define_fast_entry!();
#[cfg(target_arch = "aarch64")]
crate::arch::aarch64::define_fast_entry!();

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
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
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
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
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

/// The walk with known bounds `[sp, hi)`.
///
/// # Safety
/// `out` must be valid for `max` writes and non-null; `[sp, hi)` must be
/// readable memory (or `hi` 0).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
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
    // A return address outside code (a frame record reached through a
    // register that code without frame pointers used for something else)
    // ends the walk. The executable range the walk is in stays in registers
    // (a subtraction and a compare per frame, off the walk's chain of
    // loads); a frame in the other range swaps the two, and one in neither
    // takes `code_miss`, out of line. The walk starts with the ranges the
    // process's last walk ended with ([`crate::unwind::code::hints`]), so a warm
    // walk makes no lookup.
    let hints = crate::unwind::code::hints();
    let [mut a, mut b] = hints;
    let n = walk_frame_records_checked(
        crate::arch::native::FRAME_RECORD,
        fp,
        sp,
        hi,
        skip as usize,
        out,
        |ra| {
            if a.contains(ra) {
                return true;
            }
            let r = if b.contains(ra) {
                b
            } else {
                match code_miss(ra, sp, hi) {
                    Some(r) => r,
                    None => return false,
                }
            };
            (a, b) = (r, a);
            true
        },
    );
    if [a, b] != hints {
        crate::unwind::code::set_hints([a, b]);
    }
    #[cfg(target_os = "linux")]
    if crate::unwind::hook_table::any_live() {
        return exit_hooked(fp, sp, hi, skip as usize, &mut out[..n]) as u32;
    }
    n as u32
}

/// `capture_fast`'s walk when exit hooks are live: a frame record whose
/// return address is the exit-hook trampoline gets the original address
/// (the record's frame has its CFA at `fp + 16`). The walk is done again,
/// knowing it ends after `out.len()` frames, to learn each frame's record.
/// Returns how many frames stay (a trampoline without an entry ends them).
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
#[cold]
#[inline(never)]
fn exit_hooked(fp: usize, sp: usize, hi: usize, skip: usize, out: &mut [usize]) -> usize {
    let Some(t) = crate::unwind::hook_table::trampoline() else {
        return out.len();
    };
    if !out.contains(&(t as usize)) {
        return out.len();
    }
    let layout = crate::arch::native::FRAME_RECORD;
    for i in 0..out.len() {
        if out[i] != t as usize {
            continue;
        }
        // The record of frame `skip + i`: walk again to it.
        let mut fp_i = fp;
        let mut ok = true;
        for _ in 0..skip + i {
            let next = match read_record_fp(layout, fp_i, sp, hi) {
                Some(n) => n,
                None => {
                    ok = false;
                    break;
                }
            };
            fp_i = next;
        }
        let ra = if ok {
            crate::unwind::hook_table::resolve(t, (fp_i + 16) as u64)
        } else {
            0
        };
        if ra == 0 {
            return i;
        }
        out[i] = ra as usize;
    }
    out.len()
}

/// The saved frame pointer of the record at `fp`, if the record lies in
/// `[sp, hi)` and is aligned (the checks the walk made before reading it).
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn read_record_fp(layout: FrameRecordLayout, fp: usize, sp: usize, hi: usize) -> Option<usize> {
    let end = layout.fp_offset.max(layout.ra_offset) + core::mem::size_of::<usize>();
    if fp < sp || fp.checked_add(end)? > hi || fp % layout.align != 0 {
        return None;
    }
    // SAFETY: `[fp, fp + end)` is inside `[sp, hi)`, readable stack memory
    // of this thread (see `walk_bounded`).
    Some(unsafe { core::ptr::read_volatile((fp + layout.fp_offset) as *const usize) })
}

/// The executable range holding `ra` when it is in neither of the walk's
/// two: a lookup. `None` when `ra` is not code (the stack `[sp, hi)` and the
/// first page are not, without a lookup).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
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
    walk_frame_records_checked(layout, fp, lo, hi, skip, out, |_| true)
}

/// Walks frame records from `fp`, reading only inside `[lo, hi)`.
///
/// Writes return addresses to `out` after dropping the first `skip`, and
/// returns how many it wrote. Stops at a null return address, one that
/// `is_code` rejects (a frame record reached through a register that code
/// without frame pointers used for something else), a record outside the
/// bounds, a misaligned record, or a record that does not move strictly up
/// the stack.
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
) -> usize {
    let record_end = layout.fp_offset.max(layout.ra_offset) + core::mem::size_of::<usize>();
    let misaligned = layout.align - 1;
    let shift = layout.align.trailing_zeros();
    // `last`: the highest aligned address a whole record may start at.
    let Some(last) = hi.checked_sub(record_end) else {
        return 0;
    };
    let last = last & !misaligned;
    if fp < lo || fp > last || fp & misaligned != 0 {
        return 0;
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
            core::ptr::read_volatile((fp + layout.fp_offset) as *const usize),
            core::ptr::read_volatile((fp + layout.ra_offset) as *const usize),
        )
    };
    while skip > 0 {
        let (next, ra) = read(fp);
        let next_room = room(next);
        if ra == 0 || next_room >= fp_room || !is_code(ra) {
            return 0;
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
            return n;
        }
        out[n] = ra;
        let next_room = room(next);
        if next_room >= fp_room {
            return n + 1;
        }
        let (next2, ra2) = read(next);
        if ra2 == 0 || !is_code(ra2) {
            return n + 1;
        }
        out[n + 1] = ra2;
        n += 2;
        let next2_room = room(next2);
        if next2_room >= next_room {
            return n;
        }
        fp = next2;
        fp_room = next2_room;
    }
    if n < len {
        let (_, ra) = read(fp);
        if ra != 0 && is_code(ra) {
            out[n] = ra;
            n += 1;
        }
    }
    n
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
}
