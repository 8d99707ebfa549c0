//! RISC-V 64 entries of exact capture, and the rule forms its hot loop
//! applies (AArch64's, from `arch/aarch64/rule.rs` through `rule.rs`,
//! under the names x86-64's `exact` gives them).

/// Defines the naked entry of `capture_exact` on RISC-V 64, `exact_entry`,
/// in the module that invokes it (`unwind::local`, beside
/// `exact_from_entry`): it passes `ra` (the return address into the
/// caller), `sp` and `s0` and tail-calls the walk.
macro_rules! define_exact_entry {
    () => {
        /// The naked entry of `capture_exact` (and of the C
        /// `callstack_capture_exact`): see `arch::riscv64::exact`.
        ///
        /// # Safety
        /// `out` must be valid for `max` writes of `usize` (or `max` must be 0).
        #[unsafe(naked)]
        pub unsafe extern "C" fn exact_entry(skip: u32, max: u32, out: *mut usize) -> u32 {
            // SAFETY: only argument registers (and t1, for the tail call)
            // are written; the tail call keeps ra, so the walk returns
            // straight to the caller.
            core::arch::naked_asm!(
                ".cfi_startproc",
                "mv a3, ra",
                "mv a4, sp",
                "mv a5, s0",
                "tail {imp}",
                ".cfi_endproc",
                imp = sym exact_from_entry,
            )
        }
    };
}
pub(crate) use define_exact_entry;

/// Defines a naked entry that adds the caller's `ra`/`sp`/`s0` (as the
/// 2nd to 4th arguments) to a request pointer and tail-calls `$imp`.
/// Invoked in `unwind::local`, beside the functions it branches to.
macro_rules! request_entry {
    ($(#[$doc:meta])* $name:ident($req:ty) $(-> $ret:ty)? => $imp:path) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `req` must be a valid request.
        #[unsafe(naked)]
        pub(crate) unsafe extern "C" fn $name(req: $req) $(-> $ret)? {
            // SAFETY: as `exact_entry`, with the registers as the 2nd to
            // 4th arguments.
            core::arch::naked_asm!(
                ".cfi_startproc",
                "mv a1, ra",
                "mv a2, sp",
                "mv a3, s0",
                "tail {imp}",
                ".cfi_endproc",
                imp = sym $imp,
            )
        }
    };
}
pub(crate) use request_entry;

pub(crate) use super::rule::{from_wide_word, wide_word};
pub(crate) use crate::arch::aarch64::hot::run_exit;

/// Return addresses read from the stack are whole addresses (no pointer
/// authentication on RISC-V).
pub(crate) const RA_MASK: u64 = !0;

/// No caller predictions (the portable loop of `arch/aarch64/hot.rs`).
pub(crate) const PRED_SLOTS: usize = 0;

/// The hot loop of in-process exact capture: AArch64's portable loop, whose
/// packed forms RISC-V's rules take (see `rule.rs`).
///
/// # Safety
/// As [`crate::arch::aarch64::hot::run_hot_with`].
#[inline(always)]
pub(crate) unsafe fn run_hot(
    regs: &mut [u64; 3],
    o: &mut *mut usize,
    end: *mut usize,
    hi: u64,
    cache: *const u64,
) -> u64 {
    // SAFETY: the caller's promise.
    unsafe { crate::arch::aarch64::hot::run_hot_with(RA_MASK, regs, o, end, hi, cache) }
}

/// The in-process rule source does not recognise the signal trampoline by
/// its code here (the vDSO's CFI says it is one); the machine-code walk
/// does, with [`is_sigreturn_trampoline`].
pub(crate) const LOCAL_SIGRETURN_BYTES: usize = 0;

pub(crate) use super::signal::is_sigreturn_trampoline;

/// Marks a rule-cache word as a machine-code rule
/// (`arch::risc::settle_insn`).
pub(crate) use crate::arch::aarch64::INSN_MARK;

/// The signature of the function [`regs_entry`] hands over to: its three
/// arguments, then `[pc, sp, fp]` of the entry's caller as it will be after
/// the entry returns (`pc` is the return address into it).
pub type RegsEntryFn = unsafe extern "C" fn(*const u8, *mut u8, usize, *const u64) -> usize;

/// A naked entry that records the registers of its caller (`ra`, `sp` after the return, `s0`) and
/// calls `f` with them: where `unwind::insn::InProcess`, the walk by
/// machine code alone, starts.
///
/// # Safety
/// `f` must be safe to call with `a`, `b`, `c` and a pointer to three words.
#[unsafe(naked)]
pub unsafe extern "C" fn regs_entry(a: *const u8, b: *mut u8, c: usize, f: RegsEntryFn) -> usize {
    // SAFETY: saves ra/s0 in a 48-byte frame (sp stays 16-aligned),
    // stores [ra, caller's sp, caller's s0] in it, passes their address as
    // the 4th argument to `f` (taken from a3 first), and restores ra, s0 and
    // sp before returning.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "addi sp, sp, -48",
        ".cfi_def_cfa_offset 48",
        "sd ra, 40(sp)",
        "sd s0, 32(sp)",
        ".cfi_offset ra, -8",
        ".cfi_offset s0, -16",
        "sd ra, 0(sp)",
        "addi t0, sp, 48",
        "sd t0, 8(sp)",
        "sd s0, 16(sp)",
        "mv t1, a3",
        "mv a3, sp",
        "jalr t1",
        "ld ra, 40(sp)",
        "ld s0, 32(sp)",
        ".cfi_restore ra",
        ".cfi_restore s0",
        "addi sp, sp, 48",
        ".cfi_def_cfa_offset 0",
        "ret",
        ".cfi_endproc",
    )
}
