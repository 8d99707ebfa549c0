//! Fast capture: the frame-pointer walk.
//!
//! Every read is bounded: a frame record is read only if it lies inside the
//! current thread's stack, at or above the stack pointer of the capture, and
//! aligned; each next record must lie strictly above the previous one. A
//! corrupt chain (garbage, a cycle, a pointer below the stack) ends the walk.

use crate::arch::FrameRecordLayout;
use crate::stack;

/// Called by the architecture's naked `fast_entry` with its own frame record
/// (`fp`, whose return address is inside the caller of the capture) and its
/// stack pointer (`sp`, the lowest address the walk may read).
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
    let hi = stack::stack_end(sp);
    // SAFETY: the caller promises `out` holds `max` writable slots.
    let out = unsafe { core::slice::from_raw_parts_mut(out, max as usize) };
    walk_frame_records(
        crate::arch::native::FRAME_RECORD,
        fp,
        sp,
        hi,
        skip as usize,
        out,
    ) as u32
}

/// Walks frame records from `fp`, reading only inside `[lo, hi)`.
///
/// Writes return addresses to `out` after dropping the first `skip`, and
/// returns how many it wrote. Stops at a null return address, a record
/// outside the bounds, a misaligned record, or a record that does not move
/// strictly up the stack.
///
/// Shaped for speed without dropping a check: the skipped records are walked
/// in a loop of their own, and "strictly above the previous record and
/// inside the stack" is one unsigned compare (`next - fp - 1 < last - fp`).
#[inline(always)]
pub(crate) fn walk_frame_records(
    layout: FrameRecordLayout,
    mut fp: usize,
    lo: usize,
    hi: usize,
    mut skip: usize,
    out: &mut [usize],
) -> usize {
    let record_end = layout.fp_offset.max(layout.ra_offset) + core::mem::size_of::<usize>();
    let misaligned = layout.align - 1;
    // `last`: the highest address a record may start at.
    let Some(last) = hi.checked_sub(record_end) else {
        return 0;
    };
    if fp < lo || fp > last || fp & misaligned != 0 {
        return 0;
    }
    // From here on `lo <= fp <= last` and `fp` is aligned: the record at
    // `fp` may be read. Each step checks the next record the same way.
    //
    // SAFETY (both reads below): `[fp, fp + record_end)` lies inside
    // `[lo, hi)`, which is mapped, readable stack memory of this thread (see
    // `stack`), and `fp` is aligned.
    let read = |fp: usize| unsafe {
        (
            core::ptr::read_volatile((fp + layout.fp_offset) as *const usize),
            core::ptr::read_volatile((fp + layout.ra_offset) as *const usize),
        )
    };
    // `next` is a valid record after `fp`: strictly above it, at most
    // `last`, aligned. `fp <= last`, so `last - fp` does not wrap, and a
    // `next <= fp` wraps `next - fp - 1` to a huge value.
    let next_ok = |fp: usize, next: usize| {
        next.wrapping_sub(fp).wrapping_sub(1) < last - fp && next & misaligned == 0
    };
    while skip > 0 {
        let (next, ra) = read(fp);
        if ra == 0 || !next_ok(fp, next) {
            return 0;
        }
        skip -= 1;
        fp = next;
    }
    let mut n = 0;
    while n < out.len() {
        let (next, ra) = read(fp);
        if ra == 0 {
            break;
        }
        out[n] = ra;
        n += 1;
        if !next_ok(fp, next) {
            break;
        }
        fp = next;
    }
    n
}
