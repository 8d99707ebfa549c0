//! The registers of a signal context (a signal handler's `ucontext_t`) on
//! AArch64: the one place they are read, for the crash handler and its
//! helper's context block (all general registers, as `user_regs_struct`
//! words), [`crate::capture_from_context`] and the exit hooks (the
//! unwinder's registers).

use super::core_regs::{PC, SP, X29, X30};
use crate::types::UnwindRegs;

/// Words of AArch64's `user_regs_struct` (x0-x30, sp, pc, pstate: the
/// layout of `NT_PRSTATUS`, read back by [`super::core_regs::from_user_regs`]).
pub const USER_REGS_WORDS: usize = super::core_regs::NREGS;

/// The interrupted general registers of a signal context as the words of
/// `user_regs_struct`.
#[inline]
pub fn user_regs(uc: &libc::ucontext_t) -> [u64; USER_REGS_WORDS] {
    let m = &uc.uc_mcontext;
    let mut w = [0u64; USER_REGS_WORDS];
    w[..31].copy_from_slice(&m.regs);
    w[SP] = m.sp;
    w[PC] = m.pc;
    w[PC + 1] = m.pstate;
    w
}

/// The unwinder's registers (`pc`, `sp`, `x29`, `x30`) of
/// `user_regs_struct` words.
#[inline]
pub fn regs_from_user_regs(w: &[u64; USER_REGS_WORDS]) -> UnwindRegs {
    UnwindRegs {
        pc: w[PC],
        sp: w[SP],
        fp: w[X29],
        lr: w[X30],
    }
}

/// The unwinder's registers of a signal context: the interrupted `pc`,
/// `sp`, `x29` and `x30`.
#[inline]
pub fn regs_from_ucontext(uc: &libc::ucontext_t) -> UnwindRegs {
    regs_from_user_regs(&user_regs(uc))
}

/// Sets the pc and the stack pointer of a signal context (for tests that
/// build one).
#[cfg(test)]
pub(crate) fn set_pc_sp(uc: &mut libc::ucontext_t, pc: u64, sp: u64) {
    uc.uc_mcontext.pc = pc;
    uc.uc_mcontext.sp = sp;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_context_words_are_user_regs_struct() {
        // SAFETY: an all-zero ucontext is a valid value to read registers
        // from.
        let mut uc: libc::ucontext_t = unsafe { core::mem::zeroed() };
        set_pc_sp(&mut uc, 0x1234, 0x7ff0);
        uc.uc_mcontext.regs[29] = 0x7f00;
        uc.uc_mcontext.regs[30] = 0x5678;
        uc.uc_mcontext.regs[19] = 0x19;
        uc.uc_mcontext.pstate = 0x6000_0000;
        let w = user_regs(&uc);
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let regs = super::super::core_regs::from_user_regs(&bytes).unwrap();
        assert_eq!(regs.pc(), Some(0x1234));
        assert_eq!(regs.sp(), Some(0x7ff0));
        assert_eq!((w[19], w[33]), (0x19, 0x6000_0000));
        let r = regs_from_ucontext(&uc);
        assert_eq!((r.pc, r.sp, r.fp, r.lr), (0x1234, 0x7ff0, 0x7f00, 0x5678));
    }
}
