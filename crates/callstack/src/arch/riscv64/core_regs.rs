//! RISC-V 64 registers of another thread: the kernel's `user_regs_struct`
//! (`pc`, then `x1` (`ra`) .. `x31`; 32 words), found as `pr_reg` at offset
//! 112 of a core's `NT_PRSTATUS` note (the generic 64-bit `elf_prstatus`)
//! and returned by `PTRACE_GETREGSET(NT_PRSTATUS)`.
//!
//! The one place that knows this layout: its field indices, the DWARF
//! numbers of the registers, and the readers built on them ([`unwind_regs`]
//! for the instruction-analysis unwinder, [`from_user_regs`] for cores and
//! live processes).

use crate::arch::PrstatusError;
use crate::arch::{Machine, Registers};
use crate::types::UnwindRegs;

/// Offset of `pr_reg` in the 64-bit `elf_prstatus`.
pub const PR_REG_OFFSET: usize = 112;
/// Offset of `pr_pid` in the 64-bit `elf_prstatus`.
pub const PR_PID_OFFSET: usize = 32;
/// Words in `user_regs_struct`.
pub const NREGS: usize = 32;
/// Index of the pc (word 0: `x0` is hard-wired to zero and not saved, its
/// slot holds the pc).
pub const PC: usize = 0;
/// Index of `ra` (`x1`); `xN` is word `N`.
pub const RA: usize = 1;
/// Index of `sp` (`x2`).
pub const SP: usize = 2;
/// Index of `s0`/`fp` (`x8`).
pub const S0: usize = 8;

/// DWARF number of `ra` (`x0`-`x31` are 0-31).
pub const DWARF_RA: u16 = super::DWARF_RA;
/// DWARF number of `sp`.
pub const DWARF_SP: u16 = super::DWARF_SP;
/// DWARF number of `s0`, the frame pointer.
pub const DWARF_FP: u16 = super::DWARF_FP;
/// Our slot for the pc (DWARF has no number for it; 32 is `f0`, which
/// [`Registers`] never holds for this architecture).
pub const DWARF_PC: u16 = 32;

/// The registers an unwind needs, from an `NT_PRSTATUS` note's descriptor.
pub fn unwind_regs(desc: &[u8]) -> Result<UnwindRegs, PrstatusError> {
    let r = |i: usize| crate::arch::prstatus_word(desc, PR_REG_OFFSET, NREGS, 8, i);
    Ok(UnwindRegs {
        pc: r(PC)?,
        sp: r(SP)?,
        fp: r(S0)?,
        lr: r(RA)?,
    })
}

/// Reads `x1`-`x31` and the pc from a little-endian `user_regs_struct`
/// (`pr_reg` itself, not the whole note); `x0` reads as zero. Returns
/// `None` when `bytes` is too short.
pub fn from_user_regs(bytes: &[u8]) -> Option<Registers> {
    let word = |i: usize| crate::arch::prstatus_word(bytes, 0, NREGS, 8, i).ok();
    let mut regs = Registers::new(Machine::Riscv64);
    regs.set(0, 0);
    for i in 1..NREGS {
        regs.set(i as u16, word(i)?);
    }
    regs.set(DWARF_PC, word(PC)?);
    Some(regs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        // pr_reg: pc, then x1..x31 as 1000 + N.
        let mut desc = vec![0u8; PR_REG_OFFSET + NREGS * 8 + 8];
        for i in 0..NREGS {
            let v = if i == PC {
                0x1_0000_4000u64
            } else {
                1000 + i as u64
            };
            let at = PR_REG_OFFSET + i * 8;
            desc[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        let u = unwind_regs(&desc).unwrap();
        assert_eq!(
            u,
            UnwindRegs {
                pc: 0x1_0000_4000,
                sp: 1002,
                fp: 1008,
                lr: 1001
            }
        );
        let r = from_user_regs(&desc[PR_REG_OFFSET..]).unwrap();
        assert_eq!(r.pc(), Some(0x1_0000_4000));
        assert_eq!(r.sp(), Some(1002));
        assert_eq!(r.fp(), Some(1008));
        assert_eq!(r.get(DWARF_RA), Some(1001));
        assert_eq!(r.get(31), Some(1031));
        assert_eq!(r.get(0), Some(0));
        // Cut short: an error, not a panic.
        assert!(unwind_regs(&desc[..PR_REG_OFFSET + 100]).is_err());
        assert!(from_user_regs(&desc[PR_REG_OFFSET..PR_REG_OFFSET + 100]).is_none());
    }
}
