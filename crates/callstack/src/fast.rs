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
    let Some(bounds) = stack::bounds_for(sp) else {
        return 0;
    };
    // SAFETY: the caller promises `out` holds `max` writable slots.
    let out = unsafe { core::slice::from_raw_parts_mut(out, max as usize) };
    walk_frame_records(
        crate::arch::native::FRAME_RECORD,
        fp,
        sp,
        bounds.hi,
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
    let Some(last) = hi.checked_sub(record_end) else {
        return 0;
    };
    let mut n = 0;
    while n < out.len() {
        if fp < lo || fp > last || fp & (layout.align - 1) != 0 {
            break;
        }
        // SAFETY: `[fp, fp + record_end)` lies inside `[lo, hi)`, which is
        // mapped, readable stack memory of this thread (see `stack`).
        let (next, ra) = unsafe {
            (
                core::ptr::read_volatile((fp + layout.fp_offset) as *const usize),
                core::ptr::read_volatile((fp + layout.ra_offset) as *const usize),
            )
        };
        if ra == 0 {
            break;
        }
        if skip > 0 {
            skip -= 1;
        } else {
            out[n] = ra;
            n += 1;
        }
        if next <= fp {
            break;
        }
        fp = next;
    }
    n
}
