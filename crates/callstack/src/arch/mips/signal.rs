//! MIPS o32 signal frames (as the kernel and qemu-user lay them out).
//!
//! A handler returns to a trampoline `li v0, NR; syscall`: 4119
//! (`sigreturn`, a frame set up without `SA_SIGINFO`) or 4193
//! (`rt_sigreturn`). At the trampoline, sp is the frame:
//!
//! ```text
//! sigframe:     u32 ass[4]; u32 code[2]; struct sigcontext sc;      sc at +24
//! rt_sigframe:  u32 ass[4]; u32 code[2]; siginfo (128); ucontext;   sc at +176
//! sigcontext:   u32 regmask; u32 status; u64 pc; u64 regs[32]; ...
//! ```

use crate::types::CodeMemory;
use crate::types::{Memory, UnwindRegs};

/// `li v0, 4119; syscall`.
pub const SIGRETURN: [u32; 2] = [0x2402_1017, 0x0000_000c];
/// `li v0, 4193; syscall`.
pub const RT_SIGRETURN: [u32; 2] = [0x2402_1061, 0x0000_000c];

/// Offset of the sigcontext from sp at the trampoline (`rt`: `rt_sigframe`).
pub fn sigcontext_offset(rt: bool) -> u64 {
    if rt {
        24 + 128 + 24
    } else {
        24
    }
}

/// `Some(rt)` when `pc` is a sigreturn trampoline.
pub fn is_trampoline<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> Option<bool> {
    let w0 = super::instruction_analysis::insn_at(code, pc)?;
    let w1 = super::instruction_analysis::insn_at(code, pc.wrapping_add(4))?;
    match [w0, w1] {
        SIGRETURN => Some(false),
        RT_SIGRETURN => Some(true),
        _ => None,
    }
}

/// The interrupted registers saved by the signal frame at `regs.sp`.
pub fn restore<M: Memory + ?Sized>(regs: &UnwindRegs, mem: &mut M, rt: bool) -> Option<UnwindRegs> {
    let sc = regs.sp.wrapping_add(sigcontext_offset(rt));
    let rd = |mem: &mut M, off: u64| mem.read_u32(sc.wrapping_add(off)).ok().map(u64::from);
    Some(UnwindRegs {
        pc: rd(mem, 8)?,
        sp: rd(mem, 16 + 8 * 29)?,
        fp: rd(mem, 16 + 8 * 30)?,
        lr: rd(mem, 16 + 8 * 31)?,
    })
}

/// Whether `pc` is either sigreturn trampoline.
pub fn at_trampoline<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> bool {
    is_trampoline(code, pc).is_some()
}

/// The interrupted registers when `regs.pc` is a trampoline (a handler
/// returned there and `regs.sp` is its frame, of the kind the trampoline
/// says).
pub fn frame<C: CodeMemory + ?Sized, M: Memory + ?Sized>(
    code: &mut C,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Option<UnwindRegs> {
    let rt = is_trampoline(code, regs.pc)?;
    restore(regs, mem, rt)
}
