//! x86-64 signal frames (Linux).
//!
//! A handler returns to glibc's `__restore_rt` (`mov rax, 15; syscall`,
//! `rt_sigreturn`). At the trampoline, rsp points at the frame the kernel
//! built:
//!
//! ```text
//! rt_sigframe: ucontext: flags, link, stack (24), then uc_mcontext.gregs
//!              (at uc + 40): r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx,
//!              rsp, rip, ...; then siginfo after the ucontext.
//! ```
//!
//! (The return address of the handler was popped, so rsp is the ucontext.)

use crate::types::CodeMemory;
use crate::types::{Memory, ReadError, UnwindRegs};

/// Offset of the saved `rbp` from rsp at the trampoline: `uc_mcontext.gregs`
/// starts at 40, `REG_RBP` = 10.
const UC_RBP: u64 = 40 + 10 * 8;
/// Offset of the saved `rsp` (`REG_RSP` = 15).
const UC_RSP: u64 = 40 + 15 * 8;
/// Offset of the saved `rip` (`REG_RIP` = 16).
const UC_RIP: u64 = 40 + 16 * 8;

/// Whether `code` (the bytes at a pc) is the Linux x86-64 signal return
/// trampoline: `mov rax, 15` (`rt_sigreturn`), `syscall`.
pub fn is_sigreturn_trampoline(code: &[u8]) -> bool {
    code.starts_with(&[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05])
}

/// Whether `pc` is the `rt_sigreturn` trampoline.
pub fn is_trampoline<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> bool {
    let mut tramp = [0u8; 9];
    code.read_code(pc, &mut tramp) == 9 && is_sigreturn_trampoline(&tramp)
}

/// The interrupted registers saved by the signal frame whose trampoline
/// runs with stack pointer `sp`: the one place the frame is read, for the
/// CFI rule (`SignalFrame`, glibc's `__restore_rt`) and for the
/// machine-code walk. The interrupted stack pointer is noted in `mem` (it
/// may be another stack: a handler on an alternate stack).
pub fn saved_regs<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> Result<UnwindRegs, ReadError> {
    let rd = |m: &mut M, off: u64| m.read_u64(sp.wrapping_add(off));
    let pc = rd(mem, UC_RIP)?;
    let new_sp = rd(mem, UC_RSP)?;
    let fp = rd(mem, UC_RBP)?;
    mem.note_stack(new_sp);
    Ok(UnwindRegs {
        pc,
        sp: new_sp,
        fp,
        lr: 0,
    })
}
