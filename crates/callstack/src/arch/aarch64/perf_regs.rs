//! AArch64 user registers of a `perf_event` sample (`PERF_SAMPLE_REGS_USER`):
//! the bits of `sample_regs_user` asked for, in the kernel's arm64
//! numbering (`arch/arm64/include/uapi/asm/perf_regs.h`: x0-x30 are 0-30,
//! sp 31, pc 32), and the words of a sample's register block turned into
//! [`Registers`] by DWARF number (x0-x30 and sp keep their numbers; the pc
//! goes to our slot [`DWARF_PC`]).
//!
//! Every architecture's `perf_regs.rs` has these two items under the same
//! names; [`Machine::registers_from_perf`](crate::arch::Machine::registers_from_perf)
//! selects one.

use super::core_regs::{DWARF_PC, DWARF_SP};
use crate::arch::Registers;

/// perf number of sp.
const PERF_SP: u32 = 31;
/// perf number of pc.
const PERF_PC: u32 = 32;

/// x0-x30, sp and pc (perf numbers 0-32): x29 and x30 for frame records and
/// leaves, the callee-saved x19-x28 for CFI that restores them. The kernel
/// gives the asked registers in increasing bit order.
pub const PERF_REGS_MASK: u64 = (1 << (PERF_PC + 1)) - 1;

/// The registers of a sample's register block: `words` are the values of
/// [`PERF_REGS_MASK`]'s registers in increasing bit order. `None` when
/// `words` has not one value per register.
pub fn from_perf_regs(words: &[u64]) -> Option<Registers> {
    if words.len() != PERF_REGS_MASK.count_ones() as usize {
        return None;
    }
    let mut regs = Registers::new(super::MACHINE);
    for (n, &v) in (0u32..).zip(words) {
        let dwarf = match n {
            PERF_SP => DWARF_SP,
            PERF_PC => DWARF_PC,
            x => x as u16,
        };
        regs.set(dwarf, v);
    }
    Some(regs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_order_to_dwarf() {
        assert_eq!(PERF_REGS_MASK, 0x1_ffff_ffff);
        let words: Vec<u64> = (0..33).map(|i| 0x1000 + i).collect();
        let r = from_perf_regs(&words).unwrap();
        assert_eq!(r.get(0), Some(0x1000));
        assert_eq!(r.fp(), Some(0x1000 + 29));
        assert_eq!(r.get(30), Some(0x1000 + 30)); // x30, the link register
        assert_eq!(r.sp(), Some(0x1000 + 31));
        assert_eq!(r.pc(), Some(0x1000 + 32));
        assert!(from_perf_regs(&words[..32]).is_none());
        assert!(from_perf_regs(&[0; 34]).is_none());
    }
}
