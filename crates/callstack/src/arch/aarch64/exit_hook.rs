//! The AArch64 exit-hook trampoline (see [`crate::exit_hook`]).
//!
//! A hooked frame's saved `x30` (the slot its CFI names, in its frame
//! record for the code compilers emit) is replaced by `TRAMPOLINE`. The
//! hooked function reloads it and returns there with `sp` its CFA (the
//! caller's stack pointer after the call) and `x30 == TRAMPOLINE`. The key
//! of the hook's entry is that CFA, as on x86-64. The trampoline:
//!
//! 1. looks the entry up (scratch registers only: `x9`-`x13`, dead after a
//!    return under AAPCS64),
//! 2. stores a frame record below the CFA (`stp x29, <original>, [sp,
//!    #-16]!; mov x29, sp`), so that frame-record walks and CFI both see an
//!    ordinary frame returning to the original caller,
//! 3. saves the result registers: `x0`-`x7` (integer results, small
//!    structures), `x8` (the indirect result address) and `q0`-`q7` (float
//!    and vector results, homogeneous aggregates of up to four of them),
//! 4. calls [`crate::exit_hook`]'s dispatcher with the key,
//! 5. restores them, reloads `x29` and `x30` (the original address) from
//!    its record and returns with `ret` (which BTI never checks; a `br` to
//!    a return address would need a landing pad there).
//!
//! Its CFI, with `S` the hooked frame's CFA:
//!
//! - Before the record is stored (and at the final `ret`) the frame is
//!   empty; its CFA is `S + 8`, not `S`, because libgcc tells frames apart
//!   by the CFA it reports for them (a frame's callee's CFA): with the
//!   trampoline's CFA at `S`, a catching direct caller and the trampoline
//!   would be one frame to it. The caller's `sp` is `S`, a rule of its own
//!   (`DW_CFA_val_expression sp: CFA - 8`); its CFA is `S + 16` at least (a
//!   caller that made a call has a frame record), so `S + 8` is nobody's.
//! - Before the record, the return address is "the table's entry for `S`"
//!   ([`LOOKUP_EXPR`]): the expression hashes the key and probes the table
//!   as [`crate::exit_hook`] does. It finds the table through an 8-byte
//!   link-time offset stored just before the code, whose address it gets
//!   from `x30`: `TRAMPOLINE` both for a signal there (the register) and
//!   for an unwinder coming up from the hooked frame (which restores `x30`
//!   from the patched slot). `TRAMPOLINE` is 4 bytes into the symbol, so
//!   that a return address minus one looks up the same row.
//! - With the record stored, an ordinary frame: `CFA = x29 + 16`, `x29` at
//!   `CFA - 16`, `x30` at `CFA - 8`, which compiled rules and the rule
//!   cache take (the frame below it is the dispatcher's or a signal frame,
//!   never the hooked one, which has returned).
//! - At the final `ret`, `x30` holds the original address (same value),
//!   and the CFA is `S + 8` again. A signal frame on AArch64 is written
//!   right below `sp` (there is no red zone), so the record below `S` is
//!   not something to read there.

// The trampoline is defined (by this macro) only where this module is the
// native architecture; elsewhere the expression serves its tests.
#![cfg_attr(
    not(all(target_arch = "aarch64", target_os = "linux")),
    allow(unused_macros, unused_imports, dead_code)
)]

/// Whether an exit hook finds the slot of a frame's return address from
/// the frame's own CFI rule (the return address is saved anywhere in the
/// frame, or not at all in a leaf), rather than at a fixed place under its
/// caller's stack pointer.
pub(crate) const SLOT_FROM_RULE: bool = true;

/// Applies `$m` to the bytes of the CFI expression that computes the
/// original return address of a frame returning to the trampoline, with the
/// trampoline's CFA on the stack (`DW_CFA_val_expression` pushes it). Stack
/// comments show the expression stack, top last; `C` is the CFA, `K` the
/// key (the hooked frame's CFA, `C - 8`), `T` the value of `x30`
/// (`TRAMPOLINE`), `A` the address of the offset word before the
/// trampoline (`T - 12`). Past the table's address, the same bytes as
/// x86-64's expression (same table, same hash).
// Byte groups with their comments: kept as written.
#[rustfmt::skip]
macro_rules! with_lookup_expr {
    ($($m:ident)::+) => {
        $($m)::+!(
            // lit8 minus -> [K]; dup -> [K, K]. libgcc's DW_OP_pick refuses
            // to reach the bottom element, so the bottom copy of the key
            // stays put and the expression works above it (not shown).
            0x38, 0x1c, 0x12,
            // breg30 0 -> [K, T]; lit12 minus -> [K, A]
            0x8e, 0x00, 0x3c, 0x1c,
            // dup, deref -> [K, A, TABLE - A], plus -> [K, TABLE]
            0x12, 0x06, 0x22,
            // over -> [K, TABLE, K]; lit4 shr -> [.., K >> 4]
            0x14, 0x34, 0x25,
            // pick 2 -> K; const1u 14; shr; xor
            0x15, 0x02, 0x08, 0x0e, 0x25, 0x27,
            // pick 2 -> K; const1u 24; shr; xor
            0x15, 0x02, 0x08, 0x18, 0x25, 0x27,
            // const2u 1023; and -> [K, TABLE, hash]
            0x0a, 0xff, 0x03, 0x1a,
            // lit16 mul; plus -> [K, e] (entries are 16 bytes)
            0x40, 0x1e, 0x22,
            // dup; plus_uconst 128 (8 probes); swap -> [K, end, e]
            0x12, 0x23, 0x80, 0x01, 0x16,
            // loop: dup deref -> [K, end, e, key(e)]; pick 3; eq;
            // bra found (+16)
            0x12, 0x06, 0x15, 0x03, 0x29, 0x28, 0x10, 0x00,
            // plus_uconst 16 -> next entry
            0x23, 0x10,
            // dup; pick 2 (end); eq; bra not_found (+3)
            0x12, 0x15, 0x02, 0x29, 0x28, 0x03, 0x00,
            // skip loop (-20)
            0x2f, 0xec, 0xff,
            // not_found: lit0; skip done (+3)
            0x30, 0x2f, 0x03, 0x00,
            // found: plus_uconst 8; deref -> the original address
            0x23, 0x08, 0x06
        )
    };
}

macro_rules! bytes_array {
    ($($b:literal),* $(,)?) => {
        [$($b),*]
    };
}

/// The CFI expression of the frame returning to the trampoline (see the
/// module docs), for tests that evaluate it with the crate's own evaluator
/// (on every host).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const LOOKUP_EXPR: [u8; 64] = with_lookup_expr!(bytes_array);

/// The CFI directive of the trampoline's return-address rule: the lookup
/// expression as a `DW_CFA_val_expression` of x30.
macro_rules! cfi_escape {
    ($($b:literal),* $(,)?) => {
        // DW_CFA_val_expression (0x16), register 30 (x30), length 64.
        concat!(".cfi_escape 0x16, 30, 64", $(", ", stringify!($b)),*)
    };
}
#[cfg(all(target_arch = "aarch64", target_os = "linux"))]
pub(crate) use {cfi_escape, with_lookup_expr};

/// Defines the trampoline (global assembly) in the module that invokes it,
/// `crate::exit_hook`, with the hook table, the dispatcher it calls with a
/// key and the function it calls when a key is lost. `TRAMPOLINE` (the
/// address stored in hooked frames) is `__callstack_exit_hook_trampoline +
/// 4`; the quad before the symbol holds `TABLE - (its own address)` for the
/// CFI expression.
#[cfg(all(target_arch = "aarch64", target_os = "linux"))]
macro_rules! define_trampoline {
    ($table:path, $dispatch:path, $lost:path) => {
        core::arch::global_asm!(
            ".pushsection .text.callstack_exit_hook,\"ax\",@progbits",
            ".p2align 4",
            "2:",
            ".quad {table} - 2b",
            ".globl __callstack_exit_hook_trampoline",
            ".hidden __callstack_exit_hook_trampoline",
            ".type __callstack_exit_hook_trampoline, @function",
            // The symbol starts one instruction early, so that the address
            // symbolizers and unwinders look up for a return address (the
            // address minus one) names it and has its first row.
            "__callstack_exit_hook_trampoline:",
            ".cfi_startproc",
            // S is sp at TRAMPOLINE (the hooked frame's CFA, the key). The
            // trampoline's CFA is S + 8 where its frame is empty (see the
            // module docs); the caller's sp is S, a rule of its own.
            ".cfi_def_cfa_offset 8",
            // DW_CFA_val_expression sp (31): lit8 minus.
            ".cfi_escape 0x16, 31, 2, 0x38, 0x1c",
            // The return address: the table's entry for S.
            $crate::arch::aarch64::exit_hook::with_lookup_expr!(crate::arch::aarch64::exit_hook::cfi_escape),
            ".cfi_same_value x29",
            // Never executed.
            "brk #0x3e8",
            // TRAMPOLINE: hooked frames return here.
            // x9 = key (the CFA); x10 = first entry of its probe window.
            "mov x9, sp",
            "lsr x10, x9, #4",
            "eor x10, x10, x9, lsr #14",
            "eor x10, x10, x9, lsr #24",
            "and x10, x10, #{mask}",
            "adrp x11, {table}",
            "add x11, x11, :lo12:{table}",
            "add x10, x11, x10, lsl #4",
            "add x12, x10, #{window}",
            "3:",
            "ldr x13, [x10]",
            "cmp x13, x9",
            "b.eq 4f",
            "add x10, x10, #16",
            "cmp x10, x12",
            "b.ne 3b",
            // No entry: the table was corrupted. Nothing sane to return to.
            "b {lost}",
            "4:",
            "ldr x11, [x10, #8]",
            ".globl __callstack_exit_hook_found",
            ".hidden __callstack_exit_hook_found",
            "__callstack_exit_hook_found:",
            // The frame record: the caller's x29 and the original return
            // address, right under S.
            "stp x29, x11, [sp, #-16]!",
            // From here to the final load, an ordinary frame.
            ".cfi_def_cfa_offset 16",
            ".cfi_offset x29, -16",
            ".cfi_offset x30, -8",
            ".cfi_restore 31",
            "mov x29, sp",
            ".cfi_def_cfa x29, 16",
            // x0-x7 [sp], x8 [sp + 64], q0-q7 [sp + 80]: 208 bytes, which
            // keeps sp 16-byte aligned.
            "sub sp, sp, #208",
            "stp x0, x1, [sp]",
            "stp x2, x3, [sp, #16]",
            "stp x4, x5, [sp, #32]",
            "stp x6, x7, [sp, #48]",
            "str x8, [sp, #64]",
            "stp q0, q1, [sp, #80]",
            "stp q2, q3, [sp, #112]",
            "stp q4, q5, [sp, #144]",
            "stp q6, q7, [sp, #176]",
            "add x0, x29, #16",
            "bl {dispatch}",
            "ldp q6, q7, [sp, #176]",
            "ldp q4, q5, [sp, #144]",
            "ldp q2, q3, [sp, #112]",
            "ldp q0, q1, [sp, #80]",
            "ldr x8, [sp, #64]",
            "ldp x6, x7, [sp, #48]",
            "ldp x4, x5, [sp, #32]",
            "ldp x2, x3, [sp, #16]",
            "ldp x0, x1, [sp]",
            "mov sp, x29",
            "ldp x29, x30, [sp], #16",
            // sp = S again; the original address is in x30 (the record
            // below sp is fair game for a signal frame now): CFA = S + 8 as
            // at the start, the caller's sp CFA - 8.
            ".cfi_def_cfa sp, 8",
            ".cfi_escape 0x16, 31, 2, 0x38, 0x1c",
            ".cfi_same_value x29",
            ".cfi_same_value x30",
            ".globl __callstack_exit_hook_tail",
            ".hidden __callstack_exit_hook_tail",
            "__callstack_exit_hook_tail:",
            "ret",
            ".globl __callstack_exit_hook_end",
            ".hidden __callstack_exit_hook_end",
            "__callstack_exit_hook_end:",
            ".cfi_endproc",
            ".size __callstack_exit_hook_trampoline, . - __callstack_exit_hook_trampoline",
            ".popsection",
            table = sym $table,
            dispatch = sym $dispatch,
            lost = sym $lost,
            mask = const $crate::arch::SLOTS - 1,
            window = const $crate::arch::PROBES * 16,
        );
    };
}
#[cfg(all(target_arch = "aarch64", target_os = "linux"))]
pub(crate) use define_trampoline;

#[cfg(all(target_arch = "aarch64", target_os = "linux"))]
mod imp {
    use crate::arch::HookWindow;

    unsafe extern "C" {
        fn __callstack_exit_hook_trampoline();
        fn __callstack_exit_hook_found();
        fn __callstack_exit_hook_tail();
        fn __callstack_exit_hook_end();
    }

    /// The address hooked frames return to: one instruction into the
    /// symbol.
    #[inline(always)]
    pub(crate) fn trampoline() -> u64 {
        __callstack_exit_hook_trampoline as *const () as u64 + 4
    }

    /// Where the trampoline's frame holds no record at an exact pc `pc`:
    /// `[TRAMPOLINE, found]` (the original return address is only in the
    /// table, the caller's sp is `sp`) and the final `ret` (it is in
    /// `x30`).
    #[inline(always)]
    pub(crate) fn window(pc: u64) -> Option<HookWindow> {
        let found = __callstack_exit_hook_found as *const () as u64;
        let tail = __callstack_exit_hook_tail as *const () as u64;
        let end = __callstack_exit_hook_end as *const () as u64;
        if pc >= trampoline() && pc <= found {
            Some(HookWindow::Table)
        } else if pc >= tail && pc < end {
            Some(HookWindow::Lr)
        } else {
            None
        }
    }

    /// Where a `makecontext` coroutine's first function returns (glibc's
    /// `__start_context`), from a context `makecontext` just filled: on
    /// AArch64 it is in `x30`, not on the coroutine's stack.
    pub(crate) fn start_context_pc(uc: &libc::ucontext_t, _stack: &[u64]) -> u64 {
        super::super::context::regs_from_ucontext(uc).lr
    }

    /// Whether a saved return address is a plain address: not signed by
    /// pointer authentication (`paciasp`: a code in the bits above the
    /// virtual address) nor tagged. An exit hook refuses a signed one: the
    /// hooked function would authenticate the trampoline's address against
    /// the signature and fault.
    #[inline(always)]
    pub(crate) fn is_plain(ra: u64) -> bool {
        ra & !crate::arch::aarch64::exact::RA_MASK == 0
    }
}

#[cfg(all(target_arch = "aarch64", target_os = "linux"))]
pub(crate) use imp::{is_plain, start_context_pc, trampoline, window};
