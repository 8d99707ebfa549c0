//! x86-64 registers of another thread: the kernel's `user_regs_struct`
//! (27 words), found as `pr_reg` at offset 112 of a core's `NT_PRSTATUS`
//! note (`struct elf_prstatus`) and returned by `PTRACE_GETREGSET(NT_PRSTATUS)`.
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
/// Words in `user_regs_struct`.
pub const NREGS: usize = 27;
/// Index of `rbp` in `pr_reg`.
pub const RBP: usize = 4;
/// Index of `rip` in `pr_reg`.
pub const RIP: usize = 16;
/// Index of `rsp` in `pr_reg` (after cs and eflags).
pub const RSP: usize = 19;

/// DWARF number of rbp (System V psABI).
pub const DWARF_RBP: u16 = 6;
/// DWARF number of rsp.
pub const DWARF_RSP: u16 = 7;
/// DWARF number of the return-address column (rip).
pub const DWARF_RIP: u16 = 16;

/// `user_regs_struct` field order up to rip, mapped to DWARF numbers
/// (`None`: no DWARF number).
const USER_REGS_TO_DWARF: [Option<u16>; RIP + 1] = [
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

/// The registers an unwind needs, from an `NT_PRSTATUS` note's descriptor.
pub fn unwind_regs(desc: &[u8]) -> Result<UnwindRegs, PrstatusError> {
    let r = |i: usize| crate::arch::prstatus_word(desc, PR_REG_OFFSET, NREGS, 8, i);
    Ok(UnwindRegs {
        pc: r(RIP)?,
        sp: r(RSP)?,
        fp: r(RBP)?,
        lr: 0,
    })
}

/// Reads the general registers from a little-endian `user_regs_struct`
/// (`pr_reg` itself, not the whole note). Returns `None` when `bytes` is too
/// short.
pub fn from_user_regs(bytes: &[u8]) -> Option<Registers> {
    let word = |i: usize| crate::arch::prstatus_word(bytes, 0, NREGS, 8, i).ok();
    let mut regs = Registers::new(Machine::X86_64);
    for (i, d) in USER_REGS_TO_DWARF.iter().enumerate() {
        if let Some(d) = d {
            regs.set(*d, word(i)?);
        }
    }
    regs.set(DWARF_RSP, word(RSP)?);
    Some(regs)
}
