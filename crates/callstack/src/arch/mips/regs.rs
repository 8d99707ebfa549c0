//! MIPS o32 registers of another thread for `callstack core`: `pr_reg` of
//! `NT_PRSTATUS` (6 words of padding, r0-r31, lo, hi, cp0_epc, ...). The
//! layout constants are [`super::core_regs`]'s.

use super::core_regs::{EPC, NREGS, R0};
use crate::remote::{Arch, Registers};

/// Our register slot for the pc (`cp0_epc`); 0-31 are r0-r31.
pub const PC_SLOT: u16 = 37;

/// Reads r0-r31 and the pc from a little-endian `pr_reg`.
pub fn from_user_regs(bytes: &[u8]) -> Option<Registers> {
    if bytes.len() < NREGS * 4 {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap()) as u64;
    let mut regs = Registers::new(Arch::Mips);
    for i in 0..32 {
        regs.set(i as u16, word(R0 + i));
    }
    regs.set(PC_SLOT, word(EPC));
    Some(regs)
}
