//! The registers of a signal context (a signal handler's `ucontext_t`) on
//! RISC-V 64: the one place they are read, for the crash handler and its
//! helper's context block (all general registers, as `user_regs_struct`
//! words), [`crate::capture_from_context`] (the unwinder's registers).
//!
//! `uc_mcontext.__gregs` holds the pc, then `x1` (`ra`) to `x31`: the same
//! 32 words, in the same order, as the kernel's `user_regs_struct` (and
//! `NT_PRSTATUS`).

use crate::types::UnwindRegs;

/// Words of RISC-V 64's `user_regs_struct`: pc, then `x1` to `x31`.
pub const USER_REGS_WORDS: usize = 32;

/// The interrupted general registers of a signal context as the words of
/// `user_regs_struct`.
#[inline]
pub fn user_regs(uc: &libc::ucontext_t) -> [u64; USER_REGS_WORDS] {
    uc.uc_mcontext.__gregs
}

/// The unwinder's registers (`pc`, `sp` = `x2`, `s0` = `x8`, `ra` = `x1`)
/// of `user_regs_struct` words.
#[inline]
pub fn regs_from_user_regs(w: &[u64; USER_REGS_WORDS]) -> UnwindRegs {
    UnwindRegs {
        pc: w[0],
        sp: w[2],
        fp: w[8],
        lr: w[1],
    }
}

/// The unwinder's registers of a signal context: the interrupted `pc`,
/// `sp`, `s0` and `ra`.
#[inline]
pub fn regs_from_ucontext(uc: &libc::ucontext_t) -> UnwindRegs {
    regs_from_user_regs(&user_regs(uc))
}

/// Sets the pc and the stack pointer of a signal context (for tests that
/// build one).
#[cfg(test)]
pub(crate) fn set_pc_sp(uc: &mut libc::ucontext_t, pc: u64, sp: u64) {
    uc.uc_mcontext.__gregs[0] = pc;
    uc.uc_mcontext.__gregs[2] = sp;
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
        uc.uc_mcontext.__gregs[1] = 0x5678;
        uc.uc_mcontext.__gregs[8] = 0x7f00;
        uc.uc_mcontext.__gregs[31] = 0x31;
        let w = user_regs(&uc);
        assert_eq!(
            (w[0], w[1], w[2], w[8], w[31]),
            (0x1234, 0x5678, 0x7ff0, 0x7f00, 0x31)
        );
        let r = regs_from_ucontext(&uc);
        assert_eq!((r.pc, r.sp, r.fp, r.lr), (0x1234, 0x7ff0, 0x7f00, 0x5678));
    }
}
