//! RISC-V 64 signal frames (as the Linux kernel and qemu-user lay them out).
//!
//! A handler returns to `li a7, 139; ecall` (`rt_sigreturn`): the vDSO's
//! `__vdso_rt_sigreturn` (with CFI marked as a signal frame), or qemu-user's
//! trampoline page. At the trampoline, sp is the frame:
//!
//! ```text
//! rt_sigframe: siginfo (128); ucontext: flags, link, stack (24), sigmask
//!              (8) + padding to 128, then sigcontext (16-aligned, at
//!              uc + 176): pc, x1 (ra) .. x31, then the FP state.
//! ```

use crate::types::CodeMemory;
use crate::types::{Memory, ReadError, UnwindRegs};

/// Offset of the saved pc (`sc_regs.pc`) from sp at the trampoline; `xN`
/// follows at `8 * N` from it.
pub const PC_OFFSET: u64 = 128 + 176;

/// `li a7, 139` (`addi a7, zero, 139`).
const LI_A7_SIGRETURN: u32 = 0x08b0_0893;
/// `ecall`.
const ECALL: u32 = 0x0000_0073;

/// Whether `code` (the bytes at a pc) is the `rt_sigreturn` trampoline.
pub fn is_sigreturn_trampoline(code: &[u8]) -> bool {
    let word = |i: usize| {
        code.get(i..i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    word(0) == Some(LI_A7_SIGRETURN) && word(4) == Some(ECALL)
}

/// Whether `pc` is the `rt_sigreturn` trampoline.
pub fn is_trampoline<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> bool {
    let mut b = [0u8; 8];
    code.read_code(pc, &mut b) == 8 && is_sigreturn_trampoline(&b)
}

/// The interrupted registers saved by the signal frame whose trampoline
/// runs with stack pointer `sp`: the one place the frame is read (for the
/// CFI rule `SignalFrame` and the fallback at a trampoline without CFI).
/// The interrupted stack pointer is noted in `mem` (it may be another
/// stack: a handler on an alternate stack).
pub fn saved_regs<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> Result<UnwindRegs, ReadError> {
    let x = |mem: &mut M, i: u64| mem.read_u64(sp.wrapping_add(PC_OFFSET + 8 * i));
    let regs = UnwindRegs {
        pc: x(mem, 0)?,
        lr: x(mem, 1)?,
        sp: x(mem, 2)?,
        fp: x(mem, 8)?,
    };
    mem.note_stack(regs.sp);
    Ok(regs)
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
    saved_regs(regs.sp, mem).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trampoline_bytes() {
        // As gas assembles `li a7, 139; ecall` for riscv64.
        let t = [0x93, 0x08, 0xb0, 0x08, 0x73, 0x00, 0x00, 0x00];
        assert!(is_sigreturn_trampoline(&t));
        assert!(!is_sigreturn_trampoline(&t[..6]));
        let mut other = t;
        other[2] = 0xa0; // li a7, 138
        assert!(!is_sigreturn_trampoline(&other));
    }
}
