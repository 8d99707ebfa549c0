//! AArch64 registers of another thread: the kernel's `user_pt_regs`
//! (`x0..x30, sp, pc, pstate`), as found in a core's `NT_PRSTATUS` note and
//! returned by `PTRACE_GETREGSET(NT_PRSTATUS)`.

use crate::remote::{Arch, Registers};

/// DWARF number of x29, the frame pointer.
pub const DWARF_FP: u16 = 29;
/// DWARF number of x30, the link register.
#[allow(dead_code)]
pub const DWARF_LR: u16 = 30;
/// DWARF number of sp.
pub const DWARF_SP: u16 = 31;
/// Our slot for the pc (DWARF has no number for it; 32 is unused by AArch64 DWARF).
pub const DWARF_PC: u16 = 32;

/// Offset of `pr_reg` inside the 64-bit `struct elf_prstatus`.
pub const PRSTATUS_REGS_OFFSET: usize = 112;
/// Offset of `pr_pid` inside the 64-bit `struct elf_prstatus`.
pub const PRSTATUS_PID_OFFSET: usize = 32;
/// Size of `user_pt_regs`: 34 words.
pub const USER_REGS_SIZE: usize = 34 * 8;

/// Reads the general registers from a little-endian `user_pt_regs`.
/// Returns `None` when `bytes` is too short.
pub fn from_user_regs(bytes: &[u8]) -> Option<Registers> {
    if bytes.len() < USER_REGS_SIZE {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
    let mut regs = Registers::new(Arch::Aarch64);
    for i in 0..31 {
        regs.set(i as u16, word(i));
    }
    regs.set(DWARF_SP, word(31));
    regs.set(DWARF_PC, word(32));
    Some(regs)
}
