//! AArch64 signal frames (as the kernel and qemu-user lay them out).
//!
//! A handler returns to `mov x8, #139; svc #0` (`rt_sigreturn`). At the
//! trampoline, sp is the frame:
//!
//! ```text
//! rt_sigframe: siginfo (128); ucontext: flags, link, stack (24), sigmask +
//!              padding to 128, then sigcontext (16-aligned, at uc + 176):
//!              fault_address, x0..x30, sp, pc, pstate, then the extension
//!              records (FP/SIMD, SVE, ...), which are not needed here.
//! ```

use super::instruction_analysis::insn_at;
use crate::types::CodeMemory;
use crate::types::{Memory, ReadError, UnwindRegs};

/// Offset of saved x0 from sp at the trampoline.
pub const X0_OFFSET: u64 = 128 + 176 + 8;

/// Whether `pc` is the `rt_sigreturn` trampoline.
pub fn is_trampoline<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> bool {
    insn_at(code, pc) == Some(0xd280_1168) && insn_at(code, pc.wrapping_add(4)) == Some(0xd400_0001)
}

/// The interrupted registers saved by the signal frame whose trampoline
/// runs with stack pointer `sp`: the one place the frame is read, for the
/// CFI rule (`SignalFrame`, a trampoline with CFI such as the kernel's
/// `__kernel_rt_sigreturn`) and for the machine-code walk ([`frame`]).
/// The interrupted stack pointer is noted in `mem` (it may be another
/// stack: a handler on an alternate stack).
pub fn saved_regs<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> Result<UnwindRegs, ReadError> {
    let x = |mem: &mut M, i: u64| mem.read_u64(sp.wrapping_add(X0_OFFSET + 8 * i));
    let regs = UnwindRegs {
        fp: x(mem, 29)?,
        lr: x(mem, 30)?,
        sp: x(mem, 31)?,
        pc: x(mem, 32)?,
    };
    mem.note_stack(regs.sp);
    Ok(regs)
}

/// The interrupted registers saved by the signal frame at `regs.sp`
/// ([`saved_regs`]).
pub fn restore<M: Memory + ?Sized>(regs: &UnwindRegs, mem: &mut M) -> Option<UnwindRegs> {
    saved_regs(regs.sp, mem).ok()
}

/// Offset from the trampoline's sp of the sigcontext's first extension
/// record (`__reserved`, 16-aligned after `pstate`): the FP/SIMD record,
/// which the kernel and qemu-user both write first.
const FIRST_RECORD_OFFSET: u64 = 128 + 176 + 8 + 31 * 8 + 3 * 8 + 8;

/// The FP/SIMD record's header: its magic, then its size (528).
const FPSIMD_HEADER: u64 = 0x4650_8001 | (528 << 32);

/// Whether the stack at `sp` holds a signal frame as the kernel and
/// qemu-user lay it out: `uc_flags` and `uc_link` zero (both write them;
/// `siginfo` is no mark, qemu-user leaves it unwritten for a handler
/// without `SA_SIGINFO`), and the FP/SIMD record's header right after the
/// saved registers. For a trampoline whose
/// code cannot be read: qemu-user's (7.x) is an anonymous page that no
/// module covers, so a walk in process (which reads only loaded objects'
/// code) cannot see its instructions, and has no vDSO CFI to go by.
pub fn looks_like_frame<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> bool {
    if sp & 15 != 0 {
        return false;
    }
    let uc = sp.wrapping_add(128);
    mem.read_u64(uc) == Ok(0)
        && mem.read_u64(uc.wrapping_add(8)) == Ok(0)
        && mem.read_u64(sp.wrapping_add(FIRST_RECORD_OFFSET)) == Ok(FPSIMD_HEADER)
}

/// The interrupted registers when `regs.pc` is the trampoline (a handler
/// returned there and `regs.sp` is its frame): by its code, or, where the
/// code at `regs.pc` cannot be read, by the frame itself
/// ([`looks_like_frame`]).
pub fn frame<C: CodeMemory + ?Sized, M: Memory + ?Sized>(
    code: &mut C,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Option<UnwindRegs> {
    let readable = insn_at(code, regs.pc).is_some();
    if readable && !is_trampoline(code, regs.pc) {
        return None;
    }
    if !readable && !looks_like_frame(regs.sp, mem) {
        return None;
    }
    restore(regs, mem)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stack words from `base`.
    struct Words {
        base: u64,
        words: Vec<u64>,
    }

    impl Memory for Words {
        fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
            let i = addr.wrapping_sub(self.base) / 8;
            if addr % 8 != 0 {
                return Err(ReadError::OutOfBounds(addr));
            }
            self.words
                .get(i as usize)
                .copied()
                .ok_or(ReadError::OutOfBounds(addr))
        }
    }

    /// A frame as the kernel and qemu-user write it: siginfo's signal
    /// number, the saved x29/x30/sp/pc, the FP/SIMD record's header.
    fn frame(uc_link: u64, header: u64) -> Words {
        let base = 0x7000_0000;
        let mut words = vec![0u64; 1200 / 8];
        words[0] = 27 | (1 << 32); // si_signo, si_errno, si_code
        words[(128 + 8) / 8] = uc_link;
        let x = |i: u64| ((X0_OFFSET + 8 * i) / 8) as usize;
        words[x(29)] = 0x7000_2000;
        words[x(30)] = 0x40_1000;
        words[x(31)] = 0x7000_1000;
        words[x(32)] = 0x40_2000;
        words[(FIRST_RECORD_OFFSET / 8) as usize] = header;
        Words { base, words }
    }

    #[test]
    fn the_first_record_follows_the_saved_registers() {
        // x0 at 312, x0..x30, sp, pc, pstate, then 16-aligned.
        assert_eq!(FIRST_RECORD_OFFSET, 592);
        assert_eq!(FIRST_RECORD_OFFSET % 16, 0);
        assert_eq!(FIRST_RECORD_OFFSET, (X0_OFFSET + 34 * 8 + 15) & !15);
    }

    #[test]
    fn a_frame_is_known_by_its_fpsimd_record() {
        let mut m = frame(0, FPSIMD_HEADER);
        assert!(looks_like_frame(0x7000_0000, &mut m));
        let r = saved_regs(0x7000_0000, &mut m).unwrap();
        assert_eq!(
            (r.pc, r.sp, r.fp, r.lr),
            (0x40_2000, 0x7000_1000, 0x7000_2000, 0x40_1000)
        );
        // Misaligned sp, a `uc_link`, another record first (or none), a
        // stack too short to hold the record: not a signal frame.
        assert!(!looks_like_frame(0x7000_0008, &mut m));
        assert!(!looks_like_frame(
            0x7000_0000,
            &mut frame(0x7000_4000, FPSIMD_HEADER)
        ));
        assert!(!looks_like_frame(0x7000_0000, &mut frame(0, 0x4650_8001)));
        assert!(!looks_like_frame(0x7000_0000, &mut frame(0, 0)));
        let mut short = frame(0, FPSIMD_HEADER);
        short.words.truncate((FIRST_RECORD_OFFSET / 8) as usize);
        assert!(!looks_like_frame(0x7000_0000, &mut short));
    }
}
