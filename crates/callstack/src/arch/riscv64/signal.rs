//! RISC-V 64 signal frames (as the Linux kernel and qemu-user lay them out).
//!
//! A handler returns to `li a7, 139; ecall` (`rt_sigreturn`): the vDSO's
//! `__vdso_rt_sigreturn` (with CFI marked as a signal frame), or qemu-user's
//! trampoline page. At the trampoline, sp is the frame:
//!
//! ```text
//! rt_sigframe: siginfo (128); ucontext: flags, link, stack (24), sigmask
//!              (8) + padding to 128, then sigcontext (16-aligned, at
//!              uc + 176): pc, x1 (ra) .. x31, then the FP state.
//! ```

use crate::types::CodeMemory;
use crate::types::{Memory, ReadError, UnwindRegs};

/// Offset of the saved pc (`sc_regs.pc`) from sp at the trampoline; `xN`
/// follows at `8 * N` from it.
pub const PC_OFFSET: u64 = 128 + 176;

/// `li a7, 139` (`addi a7, zero, 139`).
const LI_A7_SIGRETURN: u32 = 0x08b0_0893;
/// `ecall`.
const ECALL: u32 = 0x0000_0073;

/// Whether `code` (the bytes at a pc) is the `rt_sigreturn` trampoline.
pub fn is_sigreturn_trampoline(code: &[u8]) -> bool {
    let word = |i: usize| {
        code.get(i..i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    word(0) == Some(LI_A7_SIGRETURN) && word(4) == Some(ECALL)
}

/// Whether `pc` is the `rt_sigreturn` trampoline.
pub fn is_trampoline<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> bool {
    let mut b = [0u8; 8];
    code.read_code(pc, &mut b) == 8 && is_sigreturn_trampoline(&b)
}

/// The interrupted registers saved by the signal frame whose trampoline
/// runs with stack pointer `sp`: the one place the frame is read (for the
/// CFI rule `SignalFrame` and the fallback at a trampoline without CFI).
/// The interrupted stack pointer is noted in `mem` (it may be another
/// stack: a handler on an alternate stack).
pub fn saved_regs<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> Result<UnwindRegs, ReadError> {
    let x = |mem: &mut M, i: u64| mem.read_u64(sp.wrapping_add(PC_OFFSET + 8 * i));
    let regs = UnwindRegs {
        pc: x(mem, 0)?,
        lr: x(mem, 1)?,
        sp: x(mem, 2)?,
        fp: x(mem, 8)?,
    };
    mem.note_stack(regs.sp);
    Ok(regs)
}

/// The interrupted registers when `regs.pc` is the trampoline (a handler
/// returned there and `regs.sp` is its frame).
pub fn frame<C: CodeMemory + ?Sized, M: Memory + ?Sized>(
    code: &mut C,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Option<UnwindRegs> {
    if !is_trampoline(code, regs.pc) {
        return None;
    }
    saved_regs(regs.sp, mem).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trampoline_bytes() {
        // As gas assembles `li a7, 139; ecall` for riscv64.
        let t = [0x93, 0x08, 0xb0, 0x08, 0x73, 0x00, 0x00, 0x00];
        assert!(is_sigreturn_trampoline(&t));
        assert!(!is_sigreturn_trampoline(&t[..6]));
        let mut other = t;
        other[2] = 0xa0; // li a7, 138
        assert!(!is_sigreturn_trampoline(&other));
    }

    /// Memory over a byte buffer at `base`.
    struct Bytes {
        base: u64,
        bytes: Vec<u8>,
        noted: u64,
    }

    impl Memory for Bytes {
        fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
            let i = addr.wrapping_sub(self.base) as usize;
            match self.bytes.get(i..i.wrapping_add(8)) {
                Some(b) => Ok(u64::from_le_bytes(b.try_into().unwrap())),
                None => Err(ReadError::OutOfBounds(addr)),
            }
        }
        fn note_stack(&mut self, sp: u64) {
            self.noted = sp;
        }
    }

    /// The frame as the kernel lays it out: siginfo, then the ucontext
    /// with `sc_regs` at 176 (built from glibc's `ucontext_t` when
    /// compiled for riscv64, so the offsets are checked against its
    /// header).
    fn frame_with(pc: u64, ra: u64, sp: u64, s0: u64) -> Vec<u8> {
        let mut f = vec![0u8; 128 + 1024];
        #[cfg(target_arch = "riscv64")]
        {
            assert_eq!(core::mem::offset_of!(libc::ucontext_t, uc_mcontext), 176);
            // SAFETY: an all-zero ucontext is a valid value.
            let mut uc: libc::ucontext_t = unsafe { core::mem::zeroed() };
            uc.uc_mcontext.__gregs[0] = pc;
            uc.uc_mcontext.__gregs[1] = ra;
            uc.uc_mcontext.__gregs[2] = sp;
            uc.uc_mcontext.__gregs[8] = s0;
            let n = core::mem::size_of::<libc::ucontext_t>();
            f.resize(128 + n, 0);
            // SAFETY: `uc` is plain data of `n` bytes.
            let b = unsafe { core::slice::from_raw_parts((&raw const uc).cast::<u8>(), n) };
            f[128..].copy_from_slice(b);
        }
        #[cfg(not(target_arch = "riscv64"))]
        for (i, v) in [(0, pc), (1, ra), (2, sp), (8, s0)] {
            let at = PC_OFFSET as usize + 8 * i;
            f[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        f
    }

    #[test]
    fn the_frame_gives_the_interrupted_registers() {
        let base = 0x7000_0000;
        let mut mem = Bytes {
            base,
            bytes: frame_with(0x1_0000_1234, 0x1_0000_5678, 0x6fff_f000, 0x6fff_f040),
            noted: 0,
        };
        let r = saved_regs(base, &mut mem).unwrap();
        assert_eq!(
            r,
            UnwindRegs {
                pc: 0x1_0000_1234,
                sp: 0x6fff_f000,
                fp: 0x6fff_f040,
                lr: 0x1_0000_5678,
            }
        );
        assert_eq!(mem.noted, 0x6fff_f000);
        // The CFI rule of the vDSO's `__vdso_rt_sigreturn` (an FDE with the
        // `S` augmentation) reads the same frame.
        use crate::arch::{Applied, Arch};
        let got = super::super::Riscv64::apply(
            super::super::UnwindRuleRiscv64::SignalFrame,
            &UnwindRegs {
                pc: 0x2000,
                sp: base,
                fp: 0,
                lr: 0,
            },
            &mut mem,
        )
        .unwrap();
        assert_eq!(
            got,
            Applied::Caller {
                regs: r,
                signal: true
            }
        );
        // A frame cut short is an error, not a panic.
        mem.bytes.truncate(300);
        assert!(saved_regs(base, &mut mem).is_err());
    }
}
