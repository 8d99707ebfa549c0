//! The registers of a signal context (a signal handler's `ucontext_t`) on
//! x86-64: the one place they are read, for the crash handler and its
//! helper's context block (all general registers, as `user_regs_struct`
//! words), [`crate::capture_from_context`] and the exit hooks (the
//! unwinder's registers).

use crate::types::UnwindRegs;

use super::core_regs::{RBP, RIP, RSP};

/// Words of x86-64's `user_regs_struct` (the layout of `NT_PRSTATUS` and
/// `PTRACE_GETREGS`, read back by [`super::core_regs::from_user_regs`]).
pub const USER_REGS_WORDS: usize = super::core_regs::NREGS;

/// The interrupted general registers of a signal context as the words of
/// `user_regs_struct`. The segment bases and `ds`/`es` are not in the
/// signal frame and read 0; `orig_rax` is -1 (no system call interrupted).
#[inline]
pub fn user_regs(uc: &libc::ucontext_t) -> [u64; USER_REGS_WORDS] {
    use libc::*;
    let g = &uc.uc_mcontext.gregs;
    let r = |i: i32| g[i as usize] as u64;
    // csgsfs packs cs (bits 0-15), gs (16-31) and fs (32-47).
    let csgsfs = r(REG_CSGSFS);
    [
        r(REG_R15),
        r(REG_R14),
        r(REG_R13),
        r(REG_R12),
        r(REG_RBP),
        r(REG_RBX),
        r(REG_R11),
        r(REG_R10),
        r(REG_R9),
        r(REG_R8),
        r(REG_RAX),
        r(REG_RCX),
        r(REG_RDX),
        r(REG_RSI),
        r(REG_RDI),
        u64::MAX, // orig_rax: no system call was interrupted
        r(REG_RIP),
        csgsfs & 0xffff,
        r(REG_EFL),
        r(REG_RSP),
        0x2b, // ss of user mode on x86-64 Linux
        0,    // fs_base (not in the signal frame)
        0,    // gs_base
        0,    // ds
        0,    // es
        (csgsfs >> 32) & 0xffff,
        (csgsfs >> 16) & 0xffff,
    ]
}

/// The unwinder's registers (`rip`, `rsp`, `rbp`) of `user_regs_struct`
/// words.
#[inline]
pub fn regs_from_user_regs(w: &[u64; USER_REGS_WORDS]) -> UnwindRegs {
    UnwindRegs {
        pc: w[RIP],
        sp: w[RSP],
        fp: w[RBP],
        lr: 0,
    }
}

/// The unwinder's registers of a signal context: the interrupted `rip`,
/// `rsp` and `rbp`.
#[inline]
pub fn regs_from_ucontext(uc: &libc::ucontext_t) -> UnwindRegs {
    regs_from_user_regs(&user_regs(uc))
}

/// Sets the pc and the stack pointer of a signal context (for tests that
/// build one).
#[cfg(test)]
pub(crate) fn set_pc_sp(uc: &mut libc::ucontext_t, pc: u64, sp: u64) {
    uc.uc_mcontext.gregs[libc::REG_RIP as usize] = pc as i64;
    uc.uc_mcontext.gregs[libc::REG_RSP as usize] = sp as i64;
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
        uc.uc_mcontext.gregs[libc::REG_RBP as usize] = 0x7f00;
        uc.uc_mcontext.gregs[libc::REG_RBX as usize] = 0xb0;
        uc.uc_mcontext.gregs[libc::REG_CSGSFS as usize] = 0x0005_0004_0033;
        let w = user_regs(&uc);
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let regs = super::super::core_regs::from_user_regs(&bytes).unwrap();
        assert_eq!(regs.pc(), Some(0x1234));
        assert_eq!(regs.sp(), Some(0x7ff0));
        assert_eq!(w[5], 0xb0);
        assert_eq!((w[17], w[25], w[26]), (0x33, 5, 4));
        let r = regs_from_ucontext(&uc);
        assert_eq!((r.pc, r.sp, r.fp, r.lr), (0x1234, 0x7ff0, 0x7f00, 0));
    }
}
