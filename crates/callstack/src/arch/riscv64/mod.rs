//! RISC-V 64 (`riscv64gc`, LP64D): the frame record of GCC and LLVM with
//! `-fno-omit-frame-pointer` (`addi sp, sp, -N; sd ra, N-8(sp);
//! sd s0, N-16(sp); addi s0, sp, N`). Unlike x86-64 and AArch64, the frame
//! pointer `s0` (`x8`) points just *above* the saved pair, at the CFA:
//!
//! ```text
//!   [s0 - 8]   ra, the return address into the caller
//!   [s0 - 16]  caller's s0
//! ```
//!
//! The in-process entries (`exact.rs`, `fast_entry`, `switch.rs`) are
//! compiled behind `cfg(target_arch = "riscv64")` and tested under
//! qemu-user (`scripts/test-riscv64.sh`); the rule form (`rule.rs`) and the
//! signal frame (`signal.rs`) are compiled on every host.

pub mod core_regs;
pub mod instruction_analysis;
pub mod signal;

use super::FrameRecordLayout;

mod rule;
pub use rule::{Riscv64, UnwindRuleRiscv64};

#[cfg(target_arch = "riscv64")]
pub mod exact;
pub(crate) mod switch;

/// This module's architecture.
#[allow(dead_code)] // read through `arch::native` on a riscv64 host
pub const MACHINE: super::Machine = super::Machine::Riscv64;

/// DWARF number of `ra` (`x1`), the return-address column.
pub const DWARF_RA: u16 = 1;
/// DWARF number of `sp` (`x2`).
pub const DWARF_SP: u16 = 2;
/// DWARF number of `s0`/`fp` (`x8`), the frame pointer.
pub const DWARF_FP: u16 = 8;

/// The RISC-V frame record: it starts 16 bytes below `s0`; the caller's
/// `s0` at `[s0 - 16]`, `ra` at `[s0 - 8]`.
pub const FRAME_RECORD: FrameRecordLayout = FrameRecordLayout {
    below: 16,
    fp_offset: 0,
    ra_offset: 8,
    align: 16,
};

/// Defines the naked entry of `capture_fast`, `fast_entry`, in the module
/// that invokes it (`fast`, beside the `walk_from_entry` it calls).
#[cfg(target_arch = "riscv64")]
macro_rules! define_fast_entry {
    () => {
        /// The naked entry of `capture_fast` on RISC-V 64; see the x86-64 one.
        ///
        /// # Safety
        /// `out` must be valid for `max` writes of `usize` (or `max` must be 0).
        #[unsafe(naked)]
        pub unsafe extern "C" fn fast_entry(skip: u32, max: u32, out: *mut usize) -> u32 {
            // SAFETY: pushes a frame record (s0, ra), points s0 just above
            // it, passes s0 and sp as the 4th and 5th arguments, and
            // restores both before `ret`.
            core::arch::naked_asm!(
                ".cfi_startproc",
                "addi sp, sp, -16",
                ".cfi_def_cfa_offset 16",
                "sd ra, 8(sp)",
                "sd s0, 0(sp)",
                ".cfi_offset ra, -8",
                ".cfi_offset s0, -16",
                "addi s0, sp, 16",
                "mv a3, s0",
                "mv a4, sp",
                "call {walk}",
                "ld ra, 8(sp)",
                "ld s0, 0(sp)",
                ".cfi_restore ra",
                ".cfi_restore s0",
                "addi sp, sp, 16",
                ".cfi_def_cfa_offset 0",
                "ret",
                ".cfi_endproc",
                walk = sym walk_from_entry,
            )
        }
    };
}
#[cfg(target_arch = "riscv64")]
pub(crate) use define_fast_entry;

#[cfg(all(target_arch = "riscv64", target_os = "linux"))]
pub mod context;
