//! 32-bit ARM registers of another thread: `pr_reg` (r0-r15, cpsr, orig_r0;
//! 18 words) at offset 72 of the 32-bit `elf_prstatus` of a core's
//! `NT_PRSTATUS` note, as `PTRACE_GETREGSET(NT_PRSTATUS)` returns it too.
//!
//! The one place that knows this layout: its field indices (which are also
//! the DWARF numbers of r0-r15), and the readers built on them
//! ([`all_regs`] and [`unwind_regs`] for the instruction-analysis unwinder,
//! [`from_user_regs`] for cores and live processes).

use crate::arch::PrstatusError;
use crate::arch::{Machine, Registers};
use crate::types::UnwindRegs;

/// Offset of `pr_reg` in the 32-bit `elf_prstatus`.
pub const PR_REG_OFFSET: usize = 72;
/// Offset of `pr_pid` in the 32-bit `elf_prstatus`.
pub const PR_PID_OFFSET: usize = 24;
/// Words in `pr_reg`.
pub const NREGS: usize = 18;
/// Index (and DWARF number) of r7 (the Thumb frame pointer).
pub const R7: usize = 7;
/// Index (and DWARF number) of r11 (the ARM-state frame pointer).
pub const R11: usize = 11;
/// Index (and DWARF number) of sp (r13).
pub const SP: usize = 13;
/// Index (and DWARF number) of lr (r14).
pub const LR: usize = 14;
/// Index (and DWARF number) of pc (r15).
pub const PC: usize = 15;
/// Index of cpsr.
pub const CPSR: usize = 16;
/// The Thumb bit of cpsr.
pub const CPSR_T: u64 = 1 << 5;

/// All 16 core registers and cpsr.
pub fn all_regs(desc: &[u8]) -> Result<[u32; 17], PrstatusError> {
    let mut out = [0u32; 17];
    for (i, o) in out.iter_mut().enumerate() {
        *o = crate::arch::prstatus_word(desc, PR_REG_OFFSET, NREGS, 4, i)? as u32;
    }
    Ok(out)
}

/// The registers an unwind needs. `fp` is r7 in Thumb state and r11 in ARM
/// state (gcc's frame pointers); the pc's low bit is set in Thumb state.
pub fn unwind_regs(desc: &[u8]) -> Result<UnwindRegs, PrstatusError> {
    let r = all_regs(desc)?;
    let thumb = r[CPSR] as u64 & CPSR_T != 0;
    Ok(UnwindRegs {
        pc: r[PC] as u64 | thumb as u64,
        sp: r[SP] as u64,
        fp: if thumb { r[R7] } else { r[R11] } as u64,
        lr: r[LR] as u64,
    })
}

/// Reads r0-r15 from a little-endian `pr_reg` (not the whole note); the pc
/// gets bit 0 set in Thumb state (the interworking convention the ARM
/// unwinder expects). Returns `None` when `bytes` is too short.
pub fn from_user_regs(bytes: &[u8]) -> Option<Registers> {
    let word = |i: usize| crate::arch::prstatus_word(bytes, 0, NREGS, 4, i).ok();
    let mut regs = Registers::new(Machine::Arm);
    for i in 0..=PC {
        regs.set(i as u16, word(i)?);
    }
    if word(CPSR)? & CPSR_T != 0 {
        regs.set(PC as u16, word(PC)? | 1);
    }
    Some(regs)
}
