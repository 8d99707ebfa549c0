//! MIPS o32 registers of another thread: `pr_reg` (`elf_gregset_t`, 45
//! words: 6 words of padding, r0-r31, lo, hi, cp0_epc, badvaddr, status,
//! cause) at offset 72 of the 32-bit `elf_prstatus` of a core's
//! `NT_PRSTATUS` note.
//!
//! The one place that knows this layout: its field indices, the DWARF
//! numbers of the registers, and the readers built on them ([`unwind_regs`]
//! for the instruction-analysis unwinder, [`from_user_regs`] for
//! cores and live processes).

use crate::arch::PrstatusError;
use crate::arch::{Machine, Registers};
use crate::types::UnwindRegs;

/// Offset of `pr_reg` in the 32-bit `elf_prstatus`.
pub const PR_REG_OFFSET: usize = 72;
/// Offset of `pr_pid` in the 32-bit `elf_prstatus`.
pub const PR_PID_OFFSET: usize = 24;
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

/// DWARF number of sp (r29; r0-r31 are 0-31).
pub const DWARF_SP: u16 = 29;
/// DWARF number of fp/s8 (r30).
pub const DWARF_FP: u16 = 30;
/// Our register slot for the pc (`cp0_epc`), past DWARF's r0-r31.
pub const PC_SLOT: u16 = 37;

/// The registers an unwind needs, from an `NT_PRSTATUS` note's descriptor.
pub fn unwind_regs(desc: &[u8]) -> Result<UnwindRegs, PrstatusError> {
    let r = |i: usize| crate::arch::prstatus_word(desc, PR_REG_OFFSET, NREGS, 4, i);
    Ok(UnwindRegs {
        pc: r(EPC)?,
        sp: r(SP)?,
        fp: r(FP)?,
        lr: r(RA)?,
    })
}

/// Reads r0-r31 and the pc from a little-endian `pr_reg` (not the whole
/// note). Returns `None` when `bytes` is too short.
pub fn from_user_regs(bytes: &[u8]) -> Option<Registers> {
    let word = |i: usize| crate::arch::prstatus_word(bytes, 0, NREGS, 4, i).ok();
    let mut regs = Registers::new(Machine::Mips);
    for i in 0..32 {
        regs.set(i as u16, word(R0 + i)?);
    }
    regs.set(PC_SLOT, word(EPC)?);
    Some(regs)
}
