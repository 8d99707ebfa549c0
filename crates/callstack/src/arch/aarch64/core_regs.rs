//! AArch64 registers of another thread: the kernel's `user_pt_regs` (x0-x30,
//! sp, pc, pstate; 34 words), found as `pr_reg` at offset 112 of a core's
//! `NT_PRSTATUS` note and returned by `PTRACE_GETREGSET(NT_PRSTATUS)`.
//!
//! The one place that knows this layout: its field indices, the DWARF
//! numbers of the registers, and the two readers built on them
//! ([`unwind_regs`] for the instruction-analysis unwinder, [`from_user_regs`]
//! for cores and live processes).

use crate::arch::PrstatusError;
use crate::arch::{Machine, Registers};
use crate::types::UnwindRegs;

/// Offset of `pr_reg` in the 64-bit `elf_prstatus`.
pub const PR_REG_OFFSET: usize = 112;
/// Offset of `pr_pid` in the 64-bit `elf_prstatus`.
pub const PR_PID_OFFSET: usize = 32;
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

/// DWARF number of x29, the frame pointer (x0-x30 are 0-30).
pub const DWARF_FP: u16 = 29;
/// DWARF number of x30, the link register.
pub const DWARF_LR: u16 = 30;
/// DWARF number of sp.
pub const DWARF_SP: u16 = 31;
/// Our slot for the pc (DWARF has no number for it; 32 is unused by AArch64 DWARF).
pub const DWARF_PC: u16 = 32;

/// The registers an unwind needs, from an `NT_PRSTATUS` note's descriptor.
pub fn unwind_regs(desc: &[u8]) -> Result<UnwindRegs, PrstatusError> {
    let r = |i: usize| crate::arch::prstatus_word(desc, PR_REG_OFFSET, NREGS, 8, i);
    Ok(UnwindRegs {
        pc: r(PC)?,
        sp: r(SP)?,
        fp: r(X29)?,
        lr: r(X30)?,
    })
}

/// Reads the general registers from a little-endian `user_pt_regs`
/// (`pr_reg` itself, not the whole note). Returns `None` when `bytes` is too
/// short.
pub fn from_user_regs(bytes: &[u8]) -> Option<Registers> {
    let word = |i: usize| crate::arch::prstatus_word(bytes, 0, NREGS, 8, i).ok();
    let mut regs = Registers::new(Machine::Aarch64);
    for i in 0..=X30 {
        regs.set(i as u16, word(i)?);
    }
    regs.set(DWARF_SP, word(SP)?);
    regs.set(DWARF_PC, word(PC)?);
    Some(regs)
}
