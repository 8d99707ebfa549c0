//! MIPS o32 `NT_PRSTATUS`: `pr_reg` (`elf_gregset_t`, 45 words: 6 words of
//! padding, r0-r31, lo, hi, cp0_epc, badvaddr, status, cause) at offset 72.

use crate::unwind::insn::{PrstatusError, UnwindRegs};

/// Offset of `pr_reg` in the 32-bit `elf_prstatus`.
pub const PR_REG_OFFSET: usize = 72;
/// Words in `elf_gregset_t`.
pub const NREGS: usize = 45;
/// Index of r0 in `pr_reg`.
pub const R0: usize = 6;
/// Index of sp (r29).
pub const SP: usize = R0 + 29;
/// Index of fp/s8 (r30).
pub const FP: usize = R0 + 30;
/// Index of ra (r31).
pub const RA: usize = R0 + 31;
/// Index of cp0_epc, the pc.
pub const EPC: usize = 40;

/// The registers an unwind needs, from an `NT_PRSTATUS` note's descriptor.
pub fn unwind_regs(desc: &[u8]) -> Result<UnwindRegs, PrstatusError> {
    let r = |i: usize| crate::unwind::insn::prstatus_word(desc, PR_REG_OFFSET, NREGS, 4, i);
    Ok(UnwindRegs {
        pc: r(EPC)?,
        sp: r(SP)?,
        fp: r(FP)?,
        lr: r(RA)?,
    })
}

/// Offset of `pr_pid` in the 32-bit `elf_prstatus`.
pub const PR_PID_OFFSET: usize = 24;
