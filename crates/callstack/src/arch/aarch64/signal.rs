//! AArch64 signal frames (as the kernel and qemu-user lay them out).
//!
//! A handler returns to `mov x8, #139; svc #0` (`rt_sigreturn`). At the
//! trampoline, sp is the frame:
//!
//! ```text
//! rt_sigframe: siginfo (128); ucontext: flags, link, stack (24), sigmask +
//!              padding to 128, then sigcontext (16-aligned, at uc + 176):
//!              fault_address, x0..x30, sp, pc, pstate, then the extension
//!              records (FP/SIMD, SVE, ...), which are not needed here.
//! ```

use super::instruction_analysis::insn_at;
use crate::types::CodeMemory;
use crate::types::{Memory, ReadError, UnwindRegs};

/// Offset of saved x0 from sp at the trampoline.
pub const X0_OFFSET: u64 = 128 + 176 + 8;

/// Whether `pc` is the `rt_sigreturn` trampoline.
pub fn is_trampoline<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> bool {
    insn_at(code, pc) == Some(0xd280_1168) && insn_at(code, pc.wrapping_add(4)) == Some(0xd400_0001)
}

/// The interrupted registers saved by the signal frame whose trampoline
/// runs with stack pointer `sp`: the one place the frame is read, for the
/// CFI rule (`SignalFrame`, a trampoline with CFI such as the kernel's
/// `__kernel_rt_sigreturn`) and for the machine-code walk ([`frame`]).
/// The interrupted stack pointer is noted in `mem` (it may be another
/// stack: a handler on an alternate stack).
pub fn saved_regs<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> Result<UnwindRegs, ReadError> {
    let x = |mem: &mut M, i: u64| mem.read_u64(sp.wrapping_add(X0_OFFSET + 8 * i));
    let regs = UnwindRegs {
        fp: x(mem, 29)?,
        lr: x(mem, 30)?,
        sp: x(mem, 31)?,
        pc: x(mem, 32)?,
    };
    mem.note_stack(regs.sp);
    Ok(regs)
}

/// The interrupted registers saved by the signal frame at `regs.sp`
/// ([`saved_regs`]).
pub fn restore<M: Memory + ?Sized>(regs: &UnwindRegs, mem: &mut M) -> Option<UnwindRegs> {
    saved_regs(regs.sp, mem).ok()
}

/// The interrupted registers when `regs.pc` is the trampoline (a handler
/// returned there and `regs.sp` is its frame).
pub fn frame<C: CodeMemory + ?Sized, M: Memory + ?Sized>(
    code: &mut C,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Option<UnwindRegs> {
    if !is_trampoline(code, regs.pc) {
        return None;
    }
    restore(regs, mem)
}
