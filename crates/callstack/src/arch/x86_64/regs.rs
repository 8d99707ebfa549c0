//! x86-64 registers of another thread: the kernel's `user_regs_struct`, as
//! found in a core's `NT_PRSTATUS` note and returned by
//! `PTRACE_GETREGSET(NT_PRSTATUS)`.

use crate::remote::{Arch, Registers};

/// DWARF register numbers (System V psABI).
pub const DWARF_RBP: u16 = 6;
/// DWARF number of rsp.
pub const DWARF_RSP: u16 = 7;
/// DWARF number of the return-address column (rip).
pub const DWARF_RIP: u16 = 16;

/// Offset of `pr_reg` inside the 64-bit `struct elf_prstatus`.
pub const PRSTATUS_REGS_OFFSET: usize = 112;
/// Offset of `pr_pid` inside the 64-bit `struct elf_prstatus`.
pub const PRSTATUS_PID_OFFSET: usize = 32;

/// `user_regs_struct` field order, mapped to DWARF numbers (`None`: no DWARF number).
const USER_REGS_TO_DWARF: [Option<u16>; 17] = [
    Some(15),        // r15
    Some(14),        // r14
    Some(13),        // r13
    Some(12),        // r12
    Some(DWARF_RBP), // rbp
    Some(3),         // rbx
    Some(11),        // r11
    Some(10),        // r10
    Some(9),         // r9
    Some(8),         // r8
    Some(0),         // rax
    Some(2),         // rcx
    Some(1),         // rdx
    Some(4),         // rsi
    Some(5),         // rdi
    None,            // orig_rax
    Some(DWARF_RIP), // rip
];
/// Index of rsp in `user_regs_struct` (after cs and eflags).
const USER_REGS_RSP: usize = 19;
/// Size of `user_regs_struct`: 27 words.
pub const USER_REGS_SIZE: usize = 27 * 8;

/// Reads the general registers from a little-endian `user_regs_struct`.
/// Returns `None` when `bytes` is too short.
pub fn from_user_regs(bytes: &[u8]) -> Option<Registers> {
    if bytes.len() < USER_REGS_SIZE {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
    let mut regs = Registers::new(Arch::X86_64);
    for (i, d) in USER_REGS_TO_DWARF.iter().enumerate() {
        if let Some(d) = d {
            regs.set(*d, word(i));
        }
    }
    regs.set(DWARF_RSP, word(USER_REGS_RSP));
    Some(regs)
}
