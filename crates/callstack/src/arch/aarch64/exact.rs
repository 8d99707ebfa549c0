//! AArch64 entries of exact capture, and the rule forms its hot loop
//! applies (from `rule.rs`, under the names x86-64's `exact` gives them).

/// Defines the naked entry of `capture_exact` on AArch64, `exact_entry`,
/// in the module that invokes it (`unwind::local`, beside
/// `exact_from_entry`): it passes `x30` (the return address into the
/// caller), `sp` and `x29` and branches to the walk.
macro_rules! define_exact_entry {
    () => {
        /// The naked entry of `capture_exact` (and of the C
        /// `callstack_capture_exact`): see `arch::aarch64::exact`.
        ///
        /// # Safety
        /// `out` must be valid for `max` writes of `usize` (or `max` must be 0).
        #[unsafe(naked)]
        pub unsafe extern "C" fn exact_entry(skip: u32, max: u32, out: *mut usize) -> u32 {
            // SAFETY: only argument registers are written; the tail branch
            // keeps x30, so the walk returns straight to the caller.
            core::arch::naked_asm!(
                ".cfi_startproc",
                "mov x3, x30",
                "mov x4, sp",
                "mov x5, x29",
                "b {imp}",
                ".cfi_endproc",
                imp = sym exact_from_entry,
            )
        }
    };
}
pub(crate) use define_exact_entry;

/// Defines a naked entry that adds the caller's `x30`/`sp`/`x29` (as the
/// 2nd to 4th arguments) to a request pointer and branches to `$imp`.
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
                "mov x1, x30",
                "mov x2, sp",
                "mov x3, x29",
                "b {imp}",
                ".cfi_endproc",
                imp = sym $imp,
            )
        }
    };
}
pub(crate) use request_entry;

pub(crate) use super::hot::run_exit;
pub(crate) use super::rule::{from_wide_word, wide_word};

/// The bits of a return address read from the stack that are its address:
/// the rest are a pointer-authentication code (`-mbranch-protection`'s
/// `paciasp` signs `x30` before it is saved) or a tag, stripped as the
/// generic step strips them (`Aarch64::apply`).
pub(crate) const RA_MASK: u64 = 0x0000_ffff_ffff_ffff;

/// No caller predictions on AArch64 (the portable loop compares the rule
/// in place instead; see `hot.rs`).
pub(crate) const PRED_SLOTS: usize = 0;

/// The hot loop of in-process exact capture (see `hot.rs`), return
/// addresses stripped with [`RA_MASK`].
///
/// # Safety
/// As [`super::hot::run_hot_with`].
#[inline(always)]
pub(crate) unsafe fn run_hot(
    regs: &mut [u64; 3],
    o: &mut *mut usize,
    end: *mut usize,
    hi: u64,
    cache: *const u64,
) -> u64 {
    // SAFETY: the caller's promise.
    unsafe { super::hot::run_hot_with(RA_MASK, regs, o, end, hi, cache) }
}

/// The in-process rule source does not recognise the signal trampoline by
/// its code here: the vDSO's CFI (`__kernel_rt_sigreturn`, an `S` FDE)
/// says it is one.
pub(crate) const LOCAL_SIGRETURN_BYTES: usize = 0;

/// Never called (see [`LOCAL_SIGRETURN_BYTES`]).
pub(crate) fn is_sigreturn_trampoline(_code: &[u8]) -> bool {
    false
}

/// Marks a rule-cache word as a machine-code rule
/// (`arch::risc::settle_insn`).
pub(crate) use super::rule::INSN_MARK;

/// The signature of the function [`regs_entry`] hands over to: its three
/// arguments, then `[pc, sp, fp]` of the entry's caller as it will be after
/// the entry returns (`pc` is the return address into it).
pub type RegsEntryFn = unsafe extern "C" fn(*const u8, *mut u8, usize, *const u64) -> usize;

/// A naked entry that records the registers of its caller (`x30`, `sp` after the return, `x29`) and
/// calls `f` with them: where `unwind::insn::InProcess`, the walk by
/// machine code alone, starts.
///
/// # Safety
/// `f` must be safe to call with `a`, `b`, `c` and a pointer to three words.
#[unsafe(naked)]
pub unsafe extern "C" fn regs_entry(a: *const u8, b: *mut u8, c: usize, f: RegsEntryFn) -> usize {
    // SAFETY: saves x29/x30 in a 48-byte frame (sp stays 16-aligned),
    // stores [x30, caller's sp, caller's x29] in it, passes their address
    // as the 4th argument to `f` (taken from x3 first), and restores x29,
    // x30 and sp before returning.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "stp x29, x30, [sp, #-48]!",
        ".cfi_def_cfa_offset 48",
        ".cfi_offset x29, -48",
        ".cfi_offset x30, -40",
        "mov x29, sp",
        "str x30, [sp, #16]",
        "add x9, sp, #48",
        "str x9, [sp, #24]",
        "ldr x9, [sp]",
        "str x9, [sp, #32]",
        "mov x9, x3",
        "add x3, sp, #16",
        "blr x9",
        "ldp x29, x30, [sp], #48",
        ".cfi_def_cfa_offset 0",
        ".cfi_restore x29",
        ".cfi_restore x30",
        "ret",
        ".cfi_endproc",
    )
}
