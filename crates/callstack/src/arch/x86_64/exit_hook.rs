//! The x86-64 exit-hook trampoline (see [`crate::exit_hook`]).
//!
//! A hooked frame's return address is replaced by `TRAMPOLINE`. When the
//! hooked function returns there, `rsp` is its CFA (the caller's stack
//! pointer after the call), which keys the hook's entry in
//! [`crate::exit_hook`]'s table. The trampoline:
//!
//! 1. looks the entry up (scratch registers only: `rcx`, `r9`-`r11`, which a
//!    returning function leaves dead under the System V ABI),
//! 2. pushes the original return address, then a frame record
//!    (`push rbp; mov rbp, rsp`), so that frame-pointer walks and CFI both
//!    see an ordinary frame returning to the original caller,
//! 3. saves the return registers: `rax`, `rdx`, `xmm0`, `xmm1`, and the x87
//!    values on the register stack (`long double` results in `st0`/`st1`),
//! 4. calls [`crate::exit_hook`]'s dispatcher with the key, which runs the
//!    hooks and drops the entry,
//! 5. restores the registers and jumps to the original address (a jump,
//!    which keeps the CPU's return-address predictions in step).
//!
//! Its CFI makes it transparent to every DWARF unwinder, ours, libgcc's (a
//! Rust panic or a C++ exception through a hooked frame, a forced unwind,
//! glibc's `backtrace()`) and gdb's, at every instruction. With `S` the
//! hooked frame's CFA (`rsp` at `TRAMPOLINE`):
//!
//! - Where the trampoline's frame holds nothing above `rsp` (before the
//!   push of the original address, at the final jump) its CFA is `S + 4`:
//!   strictly between the hooked frame's (`S`) and the lowest its caller
//!   can have (`S + 8`). libgcc identifies the frame that catches an exception by the CFA it
//!   reports for it, which is its callee's CFA: with the trampoline's CFA at
//!   `S` (a frame of size zero) the trampoline and a catching direct caller
//!   were the same frame to it, and the process aborted. The caller's `rsp`
//!   is `S`, a rule of its own (`DW_CFA_val_expression rsp: CFA - 4`).
//! - Before the original address is pushed, the return address is "the
//!   table's entry for `S`": a DWARF expression ([`LOOKUP_EXPR`]) that
//!   hashes the key and probes the table exactly as [`crate::exit_hook`]
//!   does. It finds the table from an 8-byte link-time offset stored just
//!   before the code (so the FDE needs no relocation), whose address it
//!   gets from the word at `S - 8`: the hooked frame's return-address slot,
//!   which still holds `TRAMPOLINE` then. That holds at any pc of those
//!   instructions (the byte before `TRAMPOLINE` starts the FDE, so the frame
//!   "returning to `TRAMPOLINE`", looked up at the return address minus
//!   one, gets the same row as a signal at `TRAMPOLINE`).
//! - From the push on, the original address is at `S - 8` and stays there
//!   to the end. While it is at or above `rsp` the frame is an ordinary one
//!   (CFA = `S`, the return address at CFA - 8, `rbp` saved at CFA - 16),
//!   which compiled rules and the rule cache take: the frame below it is
//!   the dispatcher's (a capture inside a hook) or a signal frame, never
//!   the hooked one, so no two frames share that CFA. At the final
//!   `jmp r11` it is below `rsp`, in the red zone, which signal frames skip:
//!   the row is CFA = `S + 4` again, the return address at CFA - 12, so a
//!   signal there or a core taken there still finds it (the register `r11`
//!   is not something every unwinder tracks).

// The naked entries are defined (by these macros) only where this module is
// the native architecture; elsewhere it serves cores of x86-64.
#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(unused_macros, unused_imports, dead_code)
)]

/// Whether an exit hook finds the slot of a frame's return address from
/// the frame's own CFI rule: not on x86-64, where a return address is
/// always right under its caller's stack pointer (`call` pushed it there).
pub(crate) const SLOT_FROM_RULE: bool = false;

/// Applies `$m` to the bytes of the CFI expression that computes the
/// original return address of a frame returning to the trampoline, with the
/// trampoline's CFA on the stack (`DW_CFA_val_expression` pushes it). Stack
/// comments show the expression stack, top last; `C` is the CFA, `K` the
/// key (the hooked frame's CFA, `C - 4`), `A` the address of the offset
/// word before the trampoline.
///
/// The table is found through the word at `K - 8`: the hooked frame's
/// return-address slot, which holds `TRAMPOLINE` until the trampoline
/// pushes the original address there (`ret` leaves the popped word in
/// memory, and nothing writes below the stack pointer in between: a signal
/// frame skips the red zone). So the expression holds at every instruction
/// before that push, whatever the pc, for every consumer (a `DW_OP_breg16`
/// would only hold where `rip` is the trampoline's first address).
// Byte groups with their comments: kept as written.
#[rustfmt::skip]
macro_rules! with_lookup_expr {
    ($($m:ident)::+) => {
        $($m)::+!(
            // lit4 minus -> [K]; dup -> [K, K]. libgcc's DW_OP_pick refuses
            // to reach the bottom element (it asserts `index < depth - 1`),
            // so the bottom copy of the key stays put and the expression
            // works above it (not shown below).
            0x34, 0x1c, 0x12,
            // dup; lit8 minus; deref -> [K, TRAMPOLINE]; lit9 minus -> [K, A]
            0x12, 0x38, 0x1c, 0x06, 0x39, 0x1c,
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
/// module docs), for tests that evaluate it with the crate's own evaluator.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const LOOKUP_EXPR: [u8; 66] = with_lookup_expr!(bytes_array);

/// The CFI directive of the trampoline's return-address rule: the lookup
/// expression as a `DW_CFA_val_expression` of rip.
macro_rules! cfi_escape {
    ($($b:literal),* $(,)?) => {
        // DW_CFA_val_expression (0x16), register 16 (rip), length 66.
        concat!(".cfi_escape 0x16, 0x10, 66", $(", ", stringify!($b)),*)
    };
}
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use {cfi_escape, with_lookup_expr};

/// Defines the trampoline (global assembly) in the module that invokes it,
/// `crate::exit_hook`, with the hook table, the dispatcher it calls with a
/// key and the function it calls when a key is lost. `TRAMPOLINE` (the
/// address stored in hooked frames) is `__callstack_exit_hook_trampoline +
/// 1`; the quad before the symbol holds `TABLE - (its own address)` for the
/// CFI expression.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
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
            // The symbol starts one byte early, so that the address symbolizers
            // look up for a return address (the address minus one) names it.
            "__callstack_exit_hook_trampoline:",
            ".cfi_startproc",
            // S is rsp at TRAMPOLINE (the hooked frame's CFA, the key). The
            // trampoline's CFA is S + 4 at every instruction: above S, so
            // that libgcc, which tells frames apart by CFA, never takes the
            // trampoline's frame for its caller's (whose CFA libgcc reports
            // as S + 4, the trampoline's), and below S + 8, the lowest CFA
            // the caller can have (its return address is at S at least).
            // The caller's rsp is S, the CFA - 4, as a rule of its own.
            ".cfi_def_cfa_offset 4",
            // DW_CFA_val_expression rsp: lit4 minus.
            ".cfi_escape 0x16, 0x07, 2, 0x34, 0x1c",
            // The return address: the table's entry for S.
            $crate::arch::x86_64::exit_hook::with_lookup_expr!(crate::arch::x86_64::exit_hook::cfi_escape),
            // The byte a return address minus one looks up: never executed.
            "int3",
            // TRAMPOLINE: hooked frames return here.
            // r11 = key (the CFA); r10 = first entry of its probe window.
            "mov r11, rsp",
            "mov r10, r11",
            "shr r10, 4",
            "mov rcx, r11",
            "shr rcx, 14",
            "xor r10, rcx",
            "mov rcx, r11",
            "shr rcx, 24",
            "xor r10, rcx",
            "and r10, {mask}",
            "shl r10, 4",
            "lea rcx, [rip + {table}]",
            "add r10, rcx",
            "lea r9, [r10 + {window}]",
            "3:",
            "cmp [r10], r11",
            "je 4f",
            "add r10, 16",
            "cmp r10, r9",
            "jne 3b",
            // No entry: the table was corrupted. Nothing sane to return to.
            "jmp {lost}",
            "4:",
            ".globl __callstack_exit_hook_found",
            ".hidden __callstack_exit_hook_found",
            "__callstack_exit_hook_found:",
            // The original return address, over the hooked frame's return
            // address slot (S - 8), where it stays to the end.
            "push qword ptr [r10 + 8]",
            // From here to the final pop, an ordinary frame (which the
            // unwinders' compiled rules and caches take): CFA = S, the
            // return address at CFA - 8, the caller's rsp the CFA. The
            // frame below is the dispatcher's or a signal frame, never the
            // hooked one (it has returned), so the CFA may be S again.
            ".cfi_def_cfa_offset 8",
            ".cfi_offset 16, -8",
            ".cfi_restore 7",
            // A frame record, so that frame-pointer walks see an ordinary
            // frame returning to the original caller.
            "push rbp",
            ".cfi_def_cfa_offset 16",
            ".cfi_offset 6, -16",
            "mov rbp, rsp",
            ".cfi_def_cfa_register 6",
            "push rax",
            "push rdx",
            // xmm0 [rsp], xmm1 [rsp + 16], st0 [rsp + 32], st1 [rsp + 48],
            // x87 count [rsp + 64]; rsp is 16-byte aligned after this.
            "sub rsp, 80",
            "movdqu [rsp], xmm0",
            "movdqu [rsp + 16], xmm1",
            // The x87 register stack holds 0, 1 or 2 values after a return
            // (TOP = 0, 7 or 6 in the status word).
            "fnstsw ax",
            "shr eax, 11",
            "and eax, 7",
            "neg eax",
            "and eax, 7",
            "mov [rsp + 64], rax",
            "test eax, eax",
            "jz 5f",
            "fstp tbyte ptr [rsp + 32]",
            "cmp eax, 1",
            "je 5f",
            "fstp tbyte ptr [rsp + 48]",
            "5:",
            "lea rdi, [rbp + 16]",
            "call {dispatch}",
            "mov rax, [rsp + 64]",
            "test eax, eax",
            "jz 6f",
            "cmp eax, 1",
            "je 7f",
            "fld tbyte ptr [rsp + 48]",
            "7:",
            "fld tbyte ptr [rsp + 32]",
            "6:",
            "movdqu xmm0, [rsp]",
            "movdqu xmm1, [rsp + 16]",
            "add rsp, 80",
            "pop rdx",
            "pop rax",
            "pop rbp",
            ".cfi_def_cfa 7, 8",
            ".cfi_same_value 6",
            // Jump, not `ret`: the hooked function's `ret` already consumed its
            // entry of the return stack buffer (mispredicted, it went here), so a
            // `ret` now would take the caller's entry and every return above
            // would mispredict in turn.
            "pop r11",
            // rsp = S again. The return address is in r11 and still at
            // S - 8 (below rsp, in the red zone, which a signal frame
            // skips), which every unwinder can read: CFA = S + 4 as at the
            // start, the return address at CFA - 12 (DW_CFA_expression rip:
            // lit12 minus), the caller's rsp CFA - 4.
            ".cfi_def_cfa_offset 4",
            ".cfi_escape 0x10, 0x10, 2, 0x3c, 0x1c",
            ".cfi_escape 0x16, 0x07, 2, 0x34, 0x1c",
            ".globl __callstack_exit_hook_tail",
            ".hidden __callstack_exit_hook_tail",
            "__callstack_exit_hook_tail:",
            "jmp r11",
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
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use define_trampoline;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use crate::arch::HookWindow;

    unsafe extern "C" {
        fn __callstack_exit_hook_trampoline();
        fn __callstack_exit_hook_found();
        fn __callstack_exit_hook_tail();
        fn __callstack_exit_hook_end();
    }

    /// Where the trampoline's frame holds nothing of the original return
    /// address above `rsp` at an exact pc `pc` (`rsp` is then the hooked
    /// frame's CFA, which is also the caller's `rsp`): `[TRAMPOLINE,
    /// found]`, before the push of the original address (it is only in the
    /// table), and `[tail, end)`, the final `jmp r11` (it is in `r11`, and
    /// at `rsp - 8`, below the stack pointer).
    #[inline(always)]
    pub(crate) fn window(pc: u64) -> Option<HookWindow> {
        let found = __callstack_exit_hook_found as *const () as u64;
        let tail = __callstack_exit_hook_tail as *const () as u64;
        let end = __callstack_exit_hook_end as *const () as u64;
        if pc >= trampoline() && pc <= found {
            Some(HookWindow::Table)
        } else if pc >= tail && pc < end {
            Some(HookWindow::BelowSp)
        } else {
            None
        }
    }

    /// Where a `makecontext` coroutine's first function returns (glibc's
    /// `__start_context`), from a context `makecontext` just filled on
    /// `stack`: the word at its `rsp`, pushed there like a return address.
    pub(crate) fn start_context_pc(uc: &libc::ucontext_t, stack: &[u64]) -> u64 {
        let sp = super::super::context::regs_from_ucontext(uc).sp as usize;
        let base = stack.as_ptr() as usize;
        if sp >= base && sp % 8 == 0 && sp + 8 <= base + core::mem::size_of_val(stack) {
            stack[(sp - base) / 8]
        } else {
            0
        }
    }

    /// Whether a saved return address is a plain address: always on x86-64.
    #[inline(always)]
    pub(crate) fn is_plain(_ra: u64) -> bool {
        true
    }

    /// The address hooked frames return to: one byte into the symbol.
    #[inline(always)]
    pub(crate) fn trampoline() -> u64 {
        __callstack_exit_hook_trampoline as *const () as u64 + 1
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use imp::{is_plain, start_context_pc, trampoline, window};
