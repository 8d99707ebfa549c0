//! 32-bit ARM registers of another thread for `callstack core`: `pr_reg` of
//! `NT_PRSTATUS` (r0-r15, cpsr, orig_r0). The layout constants are
//! [`super::core_regs`]'s.

use super::core_regs::{CPSR, CPSR_T, NREGS, PC};
use crate::remote::{Arch, Registers};

/// Reads r0-r15 from a little-endian `pr_reg`; the pc gets bit 0 set in
/// Thumb state (the interworking convention the ARM unwinder expects).
pub fn from_user_regs(bytes: &[u8]) -> Option<Registers> {
    if bytes.len() < NREGS * 4 {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap()) as u64;
    let mut regs = Registers::new(Arch::Arm);
    for i in 0..16 {
        regs.set(i as u16, word(i));
    }
    if word(CPSR) & CPSR_T != 0 {
        regs.set(PC as u16, word(PC) | 1);
    }
    Some(regs)
}
