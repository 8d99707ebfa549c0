//! x86-64 `NT_PRSTATUS`: `struct elf_prstatus` with `pr_reg`
//! (`struct user_regs_struct`, 27 words) at offset 112.

use crate::unwind::insn::{PrstatusError, UnwindRegs};

/// Offset of `pr_reg` in the 64-bit `elf_prstatus`.
pub const PR_REG_OFFSET: usize = 112;
/// Words in `user_regs_struct`.
pub const NREGS: usize = 27;
/// Index of `rbp` in `pr_reg`.
pub const RBP: usize = 4;
/// Index of `rip` in `pr_reg`.
pub const RIP: usize = 16;
/// Index of `rsp` in `pr_reg`.
pub const RSP: usize = 19;

/// The registers an unwind needs, from an `NT_PRSTATUS` note's descriptor.
pub fn unwind_regs(desc: &[u8]) -> Result<UnwindRegs, PrstatusError> {
    let r = |i: usize| crate::unwind::insn::prstatus_word(desc, PR_REG_OFFSET, NREGS, 8, i);
    Ok(UnwindRegs {
        pc: r(RIP)?,
        sp: r(RSP)?,
        fp: r(RBP)?,
        lr: 0,
    })
}
