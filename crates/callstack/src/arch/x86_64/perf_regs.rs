//! x86-64 user registers of a `perf_event` sample (`PERF_SAMPLE_REGS_USER`):
//! the bits of `sample_regs_user` asked for, in the kernel's x86 numbering
//! (`arch/x86/include/uapi/asm/perf_regs.h`), and the words of a sample's
//! register block turned into [`Registers`] by DWARF number.
//!
//! Every architecture's `perf_regs.rs` has these two items under the same
//! names; [`Machine::registers_from_perf`](crate::arch::Machine::registers_from_perf)
//! selects one.

use crate::arch::Registers;

/// AX BX CX DX SI DI BP SP IP (perf numbers 0-8) and R8-R15 (16-23). The
/// kernel gives the asked registers in increasing bit order.
pub const PERF_REGS_MASK: u64 = 0x1ff | (0xff << 16);

/// The DWARF number of each register of [`PERF_REGS_MASK`], in the order
/// a sample gives them.
const PERF_TO_DWARF: [u16; 17] = [0, 3, 2, 1, 4, 5, 6, 7, 16, 8, 9, 10, 11, 12, 13, 14, 15];

/// The registers of a sample's register block: `words` are the values of
/// [`PERF_REGS_MASK`]'s registers in increasing bit order. `None` when
/// `words` has not one value per register.
pub fn from_perf_regs(words: &[u64]) -> Option<Registers> {
    if words.len() != PERF_TO_DWARF.len() {
        return None;
    }
    let mut regs = Registers::new(super::MACHINE);
    for (&d, &v) in PERF_TO_DWARF.iter().zip(words) {
        regs.set(d, v);
    }
    Some(regs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_order_to_dwarf() {
        assert_eq!(PERF_REGS_MASK.count_ones() as usize, PERF_TO_DWARF.len());
        let words: Vec<u64> = (0..17).map(|i| 0x100 + i).collect();
        let r = from_perf_regs(&words).unwrap();
        // perf 6 (BP), 7 (SP), 8 (IP); then R8 (perf 16) is word 9.
        assert_eq!(r.fp(), Some(0x106));
        assert_eq!(r.sp(), Some(0x107));
        assert_eq!(r.pc(), Some(0x108));
        assert_eq!(r.get(8), Some(0x109));
        assert_eq!(r.get(3), Some(0x101)); // BX
        assert!(from_perf_regs(&words[..16]).is_none());
    }
}
