//! AArch64: the AAPCS64 frame record (`stp x29, x30, [sp, #-N]!; mov x29, sp`).
//!
//! ```text
//!   [x29 + 8]  x30, the return address into the caller
//!   [x29 + 0]  caller's x29
//! ```
//!
//! The in-process entries (`exact.rs`, `fast_entry`) are compiled behind
//! `cfg(target_arch = "aarch64")` and tested under qemu-user
//! (`scripts/test-aarch64.sh`); cores of aarch64 programs are read offline
//! on any host.

#[cfg(all(target_arch = "aarch64", target_os = "linux"))]
pub mod context;
pub mod core_regs;
pub(crate) mod exit_hook;
pub mod instruction_analysis;
pub mod perf_regs;
pub mod signal;

use super::FrameRecordLayout;

// The portable hot loop, shared with RISC-V.
#[cfg(any(target_arch = "aarch64", target_arch = "riscv64"))]
pub(crate) mod hot;
mod rule;
// The packed forms, shared with RISC-V (whose rules have the same shape:
// `arch/riscv64/rule.rs`).
#[cfg(test)]
pub(crate) use rule::fast_form;
#[allow(unused_imports)]
pub(crate) use rule::{
    decode_fast, decode_wide, from_wide_word, pack_insn, unpack_insn, wide_word, FastForm,
    INSN_MARK, INSN_UNPACKED, PACKED_END,
};
pub use rule::{Aarch64, UnwindRuleAarch64};

/// This module's architecture.
pub const MACHINE: super::Machine = super::Machine::Aarch64;

#[cfg(target_arch = "aarch64")]
pub mod exact;
pub(crate) mod switch;

/// The AArch64 frame record: saved x29 at `[x29]`, x30 at `[x29 + 8]`.
pub const FRAME_RECORD: FrameRecordLayout = FrameRecordLayout {
    below: 0,
    fp_offset: 0,
    ra_offset: 8,
    align: 16,
};

/// Defines the naked entry of `capture_fast`, `fast_entry`, in the module
/// that invokes it (`fast`, beside the `walk_from_entry` it calls).
#[cfg(target_arch = "aarch64")]
macro_rules! define_fast_entry {
    () => {
        /// The naked entry of `capture_fast` on AArch64; see the x86-64 one.
        ///
        /// # Safety
        /// `out` must be valid for `max` writes of `usize` (or `max` must be 0).
        #[cfg(target_arch = "aarch64")]
        #[unsafe(naked)]
        pub unsafe extern "C" fn fast_entry(skip: u32, max: u32, out: *mut usize) -> u32 {
            // SAFETY: pushes a frame record (x29, x30), points x29 at it, passes x29
            // and sp as the 4th and 5th arguments, and restores both before `ret`.
            core::arch::naked_asm!(
                ".cfi_startproc",
                "stp x29, x30, [sp, #-16]!",
                ".cfi_def_cfa_offset 16",
                ".cfi_offset x29, -16",
                ".cfi_offset x30, -8",
                "mov x29, sp",
                "mov x3, x29",
                "mov x4, sp",
                "bl {walk}",
                "ldp x29, x30, [sp], #16",
                ".cfi_def_cfa_offset 0",
                ".cfi_restore x29",
                ".cfi_restore x30",
                "ret",
                ".cfi_endproc",
                walk = sym walk_from_entry,
            )
        }
    };
}
#[cfg(target_arch = "aarch64")]
pub(crate) use define_fast_entry;
