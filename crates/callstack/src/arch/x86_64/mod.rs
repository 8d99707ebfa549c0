//! x86-64: the System V frame record (`push rbp; mov rbp, rsp`).
//!
//! ```text
//!   [rbp + 8]  return address into the caller
//!   [rbp + 0]  caller's rbp
//! ```

pub mod regs;

use super::FrameRecordLayout;

pub mod exact;
mod rule;
pub(crate) mod switch;

pub use rule::{UnwindRuleX86_64, X86_64};

/// The x86-64 frame record: saved rbp at `[rbp]`, return address at `[rbp + 8]`.
pub const FRAME_RECORD: FrameRecordLayout = FrameRecordLayout {
    fp_offset: 0,
    ra_offset: 8,
    align: 8,
};

/// The naked entry of `capture_fast` (and of the C `callstack_capture_fast`).
///
/// It pushes an exact frame record whatever flags the crate was built with,
/// so `[rbp + 8]` is always the return address into the caller, then calls
/// the portable walk with that frame pointer and the current stack pointer as
/// the lowest address the walk may read.
///
/// # Safety
/// `out` must be valid for `max` writes of `usize` (or `max` must be 0).
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn fast_entry(skip: u32, max: u32, out: *mut usize) -> u32 {
    // SAFETY: builds a standard frame, passes rbp (our record) and rsp as the
    // 4th and 5th arguments, calls the walk, and restores rbp before `ret`.
    // The stack stays 16-byte aligned at the call (8 for the return address,
    // 8 for the pushed rbp).
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "mov rcx, rbp",
        "mov r8, rsp",
        "call {walk}",
        "pop rbp",
        "ret",
        walk = sym crate::fast::walk_from_entry,
    )
}
