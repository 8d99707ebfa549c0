//! The RISC-V 64 unwind rule: what a compiled CFI row becomes, how it is
//! applied, and its packed forms for the in-process rule cache. Compiled on
//! every host.
//!
//! The rows of real RISC-V code have the shape of AArch64's: the CFA is
//! `sp + n` (GCC and LLVM, with or without a frame pointer) or `s0 + n`
//! (after `addi s0, sp, n`, and in functions with a variable frame); `ra`
//! is saved at some offset from the CFA (`CFA - 8` for GCC's and LLVM's
//! `sd ra, n-8(sp)`), with `s0` just below it (`CFA - 16`) or unchanged;
//! leaves and prologues keep the return address in `ra`. So a rule has the
//! fields of `UnwindRuleAarch64`, with `x1`/`x2`/`x8` for `x30`/`sp`/`x29`,
//! and its packed and wide forms are AArch64's ([`Riscv64::pack`]): the
//! portable hot loop (`unwind/local/walk.rs`) applies them unchanged. Return
//! addresses carry no tag bits (no pointer authentication).

use crate::arch::aarch64::{Aarch64, UnwindRuleAarch64};
use crate::arch::{Applied, Arch, FrameRecordLayout};
use crate::types::{CfaView, RowView, RuleView};
use crate::types::{Memory, UnwindError, UnwindRegs};

use super::{DWARF_FP as S0, DWARF_RA as RA, DWARF_SP as SP};

/// The compiled unwind rule of a RISC-V 64 address range. Offsets in bytes
/// from the CFA; `ra == 0` means the return address is still in `ra` (a
/// leaf or a prologue), `fp == 0` that `s0` is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindRuleRiscv64 {
    /// No CFI covers the address.
    NoCfi,
    /// Evaluate the CFI directly.
    Evaluate,
    /// The outermost frame.
    End,
    /// `CFA = sp + cfa`.
    Sp {
        /// CFA offset from `sp`.
        cfa: u32,
        /// Where `ra` is saved (0: still in `ra`).
        ra: i32,
        /// Where `s0` is saved (0: unchanged).
        fp: i32,
    },
    /// `CFA = s0 + cfa`.
    Fp {
        /// CFA offset from `s0`.
        cfa: u32,
        /// Where `ra` is saved (0: still in `ra`).
        ra: i32,
        /// Where `s0` is saved (0: unchanged).
        fp: i32,
    },
    /// The kernel's `__vdso_rt_sigreturn`: `sp` points at the
    /// `rt_sigframe` (a `siginfo_t`, then the `ucontext_t`).
    SignalFrame,
}

/// The RISC-V 64 architecture, for the generic unwinder.
#[derive(Clone, Copy, Debug, Default)]
pub struct Riscv64;

fn saved(rule: RuleView<'_>) -> Option<i32> {
    match rule {
        RuleView::SameValue => Some(0),
        RuleView::Offset(o) if o != 0 => i32::try_from(o).ok(),
        _ => None,
    }
}

/// The AArch64 rule of the same shape (for the shared packed forms).
pub(crate) fn to_shared(rule: UnwindRuleRiscv64) -> UnwindRuleAarch64 {
    use UnwindRuleAarch64 as A;
    use UnwindRuleRiscv64 as R;
    match rule {
        R::NoCfi => A::NoCfi,
        R::Evaluate => A::Evaluate,
        R::End => A::End,
        R::Sp { cfa, ra, fp } => A::Sp { cfa, ra, fp },
        R::Fp { cfa, ra, fp } => A::Fp { cfa, ra, fp },
        R::SignalFrame => A::SignalFrame,
    }
}

/// The RISC-V rule of an AArch64 rule of the same shape.
pub(crate) fn from_shared(rule: UnwindRuleAarch64) -> UnwindRuleRiscv64 {
    use UnwindRuleAarch64 as A;
    use UnwindRuleRiscv64 as R;
    match rule {
        A::NoCfi => R::NoCfi,
        A::Evaluate => R::Evaluate,
        A::End => R::End,
        A::Sp { cfa, ra, fp } => R::Sp { cfa, ra, fp },
        A::Fp { cfa, ra, fp } => R::Fp { cfa, ra, fp },
        A::SignalFrame => R::SignalFrame,
    }
}

impl Arch for Riscv64 {
    type Rule = UnwindRuleRiscv64;
    const NAME: &'static str = "riscv64";
    const SP: u16 = SP;
    const FP: u16 = S0;
    const RA: u16 = RA;
    const NO_CFI: UnwindRuleRiscv64 = UnwindRuleRiscv64::NoCfi;
    const EVALUATE: UnwindRuleRiscv64 = UnwindRuleRiscv64::Evaluate;
    const SIGNAL_FRAME: UnwindRuleRiscv64 = UnwindRuleRiscv64::SignalFrame;
    /// `CFA = sp`, the return address still in `ra`, `s0` unchanged.
    const ENTRY: UnwindRuleRiscv64 = UnwindRuleRiscv64::Sp {
        cfa: 0,
        ra: 0,
        fp: 0,
    };
    const FRAME_RECORD: FrameRecordLayout = super::FRAME_RECORD;

    fn reg(regs: &UnwindRegs, reg: u16) -> Option<u64> {
        match reg {
            SP => Some(regs.sp),
            S0 => Some(regs.fp),
            RA => Some(regs.lr),
            _ => None,
        }
    }

    fn compile_row(row: &RowView<'_>, signal: bool) -> UnwindRuleRiscv64 {
        use UnwindRuleRiscv64 as R;
        if signal {
            return R::SignalFrame;
        }
        let ra = match row.reg(RA) {
            // A row that says nothing of ra leaves the return address in
            // ra (a leaf, or a prologue before the save); `_start` says
            // DW_CFA_undefined ra.
            RuleView::Undefined if !row.mentions(RA) => 0,
            RuleView::Undefined => return R::End,
            r => match saved(r) {
                Some(o) => o,
                None => return R::Evaluate,
            },
        };
        let Some(fp) = saved(row.reg(S0)) else {
            return R::Evaluate;
        };
        match row.cfa {
            CfaView::RegOffset(SP, off) => match u32::try_from(off) {
                Ok(cfa) => R::Sp { cfa, ra, fp },
                Err(_) => R::Evaluate,
            },
            CfaView::RegOffset(S0, off) => match u32::try_from(off) {
                Ok(cfa) => R::Fp { cfa, ra, fp },
                Err(_) => R::Evaluate,
            },
            _ => R::Evaluate,
        }
    }

    fn apply<M: Memory + ?Sized>(
        rule: UnwindRuleRiscv64,
        regs: &UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, UnwindError> {
        use UnwindRuleRiscv64 as R;
        let (cfa, ra, fp) = match rule {
            R::Sp { cfa, ra, fp } => (regs.sp.wrapping_add(cfa as u64), ra, fp),
            R::Fp { cfa, ra, fp } => (regs.fp.wrapping_add(cfa as u64), ra, fp),
            R::SignalFrame => {
                let regs = Self::signal_frame(regs.sp, mem)?;
                return Ok(Applied::Caller { regs, signal: true });
            }
            R::End => return Ok(Applied::End),
            R::NoCfi => return Ok(Applied::NoCfi),
            R::Evaluate => return Ok(Applied::Evaluate),
        };
        let rd = |m: &mut M, off: i32| {
            m.read_u64(cfa.wrapping_add(off as i64 as u64))
                .map_err(UnwindError::Read)
        };
        let pc = if ra == 0 { regs.lr } else { rd(mem, ra)? };
        let new_fp = if fp == 0 { regs.fp } else { rd(mem, fp)? };
        Ok(Applied::Caller {
            regs: UnwindRegs {
                pc,
                sp: cfa,
                fp: new_fp,
                lr: 0,
            },
            signal: false,
        })
    }

    /// AArch64's packed forms (`Aarch64::pack`), with `s0`/`ra` in the
    /// places of `x29`/`x30`.
    #[inline]
    fn pack(rule: UnwindRuleRiscv64) -> u16 {
        Aarch64::pack(to_shared(rule))
    }

    #[inline]
    fn unpack(p: u16) -> UnwindRuleRiscv64 {
        from_shared(Aarch64::unpack(p))
    }

    fn signal_frame<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> Result<UnwindRegs, UnwindError> {
        super::signal::saved_regs(sp, mem).map_err(UnwindError::Read)
    }
}

/// The wide form of a rule too wide for 16 bits (AArch64's `wide_word`).
#[cfg_attr(not(target_arch = "riscv64"), allow(dead_code))]
pub(crate) fn wide_word(rule: UnwindRuleRiscv64) -> Option<u64> {
    crate::arch::aarch64::wide_word(to_shared(rule))
}

/// The rule of a [`wide_word`].
#[cfg_attr(not(target_arch = "riscv64"), allow(dead_code))]
pub(crate) fn from_wide_word(w: u64) -> UnwindRuleRiscv64 {
    from_shared(crate::arch::aarch64::from_wide_word(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ReadError;

    /// Memory: 8-byte words from `base`.
    struct Words {
        base: u64,
        words: Vec<u64>,
    }

    impl Memory for Words {
        fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
            let i = addr.wrapping_sub(self.base) / 8;
            match self.words.get(i as usize) {
                Some(&w) if addr % 8 == 0 => Ok(w),
                _ => Err(ReadError::OutOfBounds(addr)),
            }
        }
    }

    #[test]
    fn gcc_frame_record_rule_applies_and_packs() {
        use UnwindRuleRiscv64 as R;
        // gcc -O2 -fno-omit-frame-pointer: addi sp,sp,-16; sd s0,0(sp);
        // sd ra,8(sp); addi s0,sp,16: CFA = s0 + 0 (or sp + 16), ra at
        // CFA - 8, s0 at CFA - 16.
        let rules = [
            R::Sp {
                cfa: 16,
                ra: -8,
                fp: -16,
            },
            R::Fp {
                cfa: 0,
                ra: -8,
                fp: -16,
            },
        ];
        let mut mem = Words {
            base: 0x1000,
            words: vec![0x2000, 0x4000_1234],
        };
        for r in rules {
            let regs = UnwindRegs {
                pc: 0x4000_0000,
                sp: 0x1000,
                fp: 0x1010,
                lr: 0x4000_0100,
            };
            let got = Riscv64::apply(r, &regs, &mut mem).unwrap();
            assert_eq!(
                got,
                Applied::Caller {
                    regs: UnwindRegs {
                        pc: 0x4000_1234,
                        sp: 0x1010,
                        fp: 0x2000,
                        lr: 0,
                    },
                    signal: false
                },
                "{r:?}"
            );
            let p = Riscv64::pack(r);
            assert_ne!(p, 0, "{r:?}");
            assert_eq!(Riscv64::unpack(p), r);
        }
        // A leaf: the return address still in ra.
        let leaf = R::Sp {
            cfa: 0,
            ra: 0,
            fp: 0,
        };
        let regs = UnwindRegs {
            pc: 0x4000_0000,
            sp: 0x1000,
            fp: 0x1010,
            lr: 0x4000_0100,
        };
        assert_eq!(
            Riscv64::apply(leaf, &regs, &mut mem).unwrap(),
            Applied::Caller {
                regs: UnwindRegs {
                    pc: 0x4000_0100,
                    sp: 0x1000,
                    fp: 0x1010,
                    lr: 0,
                },
                signal: false
            }
        );
        for r in [R::End, R::NoCfi, R::Evaluate, R::SignalFrame, leaf] {
            assert_eq!(Riscv64::unpack(Riscv64::pack(r)), r);
        }
        let big = R::Sp {
            cfa: 70016,
            ra: -8,
            fp: -16,
        };
        assert_eq!(Riscv64::pack(big), 0);
        assert_eq!(from_wide_word(wide_word(big).unwrap()), big);
    }
}
