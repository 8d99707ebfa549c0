//! x86-64: the System V frame record (`push rbp; mov rbp, rsp`).
//!
//! ```text
//!   [rbp + 8]  return address into the caller
//!   [rbp + 0]  caller's rbp
//! ```

// The naked entries are defined (by these macros) only where this module is
// the native architecture; elsewhere it serves cores of x86-64.
#![cfg_attr(not(target_arch = "x86_64"), allow(unused_macros, unused_imports))]

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub mod context;
pub mod core_regs;
pub mod insn_cache;
pub mod instruction_analysis;
pub mod perf_regs;

use super::FrameRecordLayout;

pub mod exact;
pub(crate) mod exit_hook;
mod rule;
pub mod signal;
pub(crate) mod switch;

pub(crate) use rule::from_insn;
pub use rule::{UnwindRuleX86_64, X86_64};

/// This module's architecture.
pub const MACHINE: super::Machine = super::Machine::X86_64;

/// The x86-64 frame record: saved rbp at `[rbp]`, return address at `[rbp + 8]`.
pub const FRAME_RECORD: FrameRecordLayout = FrameRecordLayout {
    below: 0,
    fp_offset: 0,
    ra_offset: 8,
    align: 8,
};

/// Defines the naked entry of `capture_fast`, `fast_entry`, in the module
/// that invokes it (`fast`, beside the `walk_from_entry` it calls).
macro_rules! define_fast_entry {
    () => {
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
                ".cfi_startproc",
                "push rbp",
                ".cfi_adjust_cfa_offset 8",
                ".cfi_offset rbp, -16",
                "mov rbp, rsp",
                "mov rcx, rbp",
                "mov r8, rsp",
                "call {walk}",
                "pop rbp",
                ".cfi_adjust_cfa_offset -8",
                ".cfi_same_value rbp",
                "ret",
                ".cfi_endproc",
                walk = sym walk_from_entry,
            )
        }
    };
}
pub(crate) use define_fast_entry;

/// The signature of the function [`regs_entry`] hands over to: its three
/// arguments, then `[pc, sp, fp]` of the entry's caller as it will be after
/// the entry returns (`pc` is the return address into it).
#[cfg(target_arch = "x86_64")]
pub type RegsEntryFn = unsafe extern "C" fn(*const u8, *mut u8, usize, *const u64) -> usize;

/// A naked entry that records the registers of its caller (return address,
/// stack pointer after the return, `rbp`) and calls `f` with them; the
/// machine-code unwinder starts from there.
///
/// # Safety
/// `f` must be safe to call with `a`, `b`, `c` and a pointer to three words.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn regs_entry(a: *const u8, b: *mut u8, c: usize, f: RegsEntryFn) -> usize {
    // SAFETY: builds a standard frame, stores [ra, caller sp, caller rbp] in
    // 32 bytes of its own stack (keeping 16-byte alignment at the call),
    // passes their address as the 4th argument, and restores rsp/rbp before
    // returning.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "push rbp",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset rbp, -16",
        "mov rbp, rsp",
        ".cfi_def_cfa_register rbp",
        "sub rsp, 32",
        "mov rax, [rbp + 8]",
        "mov [rsp], rax",
        "lea rax, [rbp + 16]",
        "mov [rsp + 8], rax",
        "mov rax, [rbp]",
        "mov [rsp + 16], rax",
        "mov rax, rcx",
        "mov rcx, rsp",
        "call rax",
        "leave",
        ".cfi_def_cfa rsp, 8",
        ".cfi_same_value rbp",
        "ret",
        ".cfi_endproc",
    )
}
