//! AArch64 `NT_PRSTATUS`: `pr_reg` (`struct user_pt_regs`: x0-x30, sp, pc,
//! pstate; 34 words) at offset 112.

use crate::unwind::insn::{PrstatusError, UnwindRegs};

/// Offset of `pr_reg` in the 64-bit `elf_prstatus`.
pub const PR_REG_OFFSET: usize = 112;
/// Words in `user_pt_regs`.
pub const NREGS: usize = 34;
/// Index of x29 (frame pointer).
pub const X29: usize = 29;
/// Index of x30 (link register).
pub const X30: usize = 30;
/// Index of sp.
pub const SP: usize = 31;
/// Index of pc.
pub const PC: usize = 32;

/// The registers an unwind needs, from an `NT_PRSTATUS` note's descriptor.
pub fn unwind_regs(desc: &[u8]) -> Result<UnwindRegs, PrstatusError> {
    let r = |i: usize| crate::unwind::insn::prstatus_word(desc, PR_REG_OFFSET, NREGS, 8, i);
    Ok(UnwindRegs {
        pc: r(PC)?,
        sp: r(SP)?,
        fp: r(X29)?,
        lr: r(X30)?,
    })
}
