//! The AArch64 unwind rule. Compiled on every host (cores of AArch64
//! programs are unwound offline anywhere); the in-process capture is
//! compiled behind `cfg(target_arch = "aarch64")` and not run in tests yet
//! (CI is x86-64 and the gdb oracle needs a native host). Rows are not
//! cached in the in-process rule cache on AArch64 (`pack` returns 0).

use crate::arch::{Applied, Arch, FrameRecordLayout};
use crate::types::{CfaView, RowView, RuleView};
use crate::types::{Memory, UnwindError, UnwindRegs};

const X29: u16 = 29;
const X30: u16 = 30;
const SP: u16 = 31;

/// The compiled unwind rule of an AArch64 address range. Offsets in bytes
/// from the CFA; `ra == 0` means the return address is still in `x30` (a
/// leaf or a prologue), `fp == 0` that `x29` is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindRuleAarch64 {
    /// No CFI covers the address.
    NoCfi,
    /// Evaluate the CFI directly.
    Evaluate,
    /// The outermost frame.
    End,
    /// `CFA = sp + cfa`.
    Sp {
        /// CFA offset from `sp`.
        cfa: u16,
        /// Where `x30` is saved (0: still in `x30`).
        ra: i16,
        /// Where `x29` is saved (0: unchanged).
        fp: i16,
    },
    /// `CFA = x29 + cfa`.
    Fp {
        /// CFA offset from `x29`.
        cfa: u16,
        /// Where `x30` is saved (0: still in `x30`).
        ra: i16,
        /// Where `x29` is saved (0: unchanged).
        fp: i16,
    },
    /// The kernel's `__kernel_rt_sigreturn`: `sp` points at the
    /// `rt_sigframe` (a `siginfo_t`, then the `ucontext_t`).
    SignalFrame,
}

/// The AArch64 architecture, for the generic unwinder.
#[derive(Clone, Copy, Debug, Default)]
pub struct Aarch64;

/// `ucontext_t` in the `rt_sigframe` (after the 128-byte `siginfo_t`):
/// `uc_mcontext` at 176, whose `regs[31]` start after `fault_address`.
const UC_REGS: u64 = 128 + 176 + 8;

fn saved(rule: RuleView<'_>) -> Option<i16> {
    match rule {
        RuleView::SameValue => Some(0),
        RuleView::Offset(o) if o != 0 => i16::try_from(o).ok(),
        _ => None,
    }
}

impl Arch for Aarch64 {
    type Rule = UnwindRuleAarch64;
    const NAME: &'static str = "aarch64";
    const SP: u16 = SP;
    const FP: u16 = X29;
    const RA: u16 = X30;
    const NO_CFI: UnwindRuleAarch64 = UnwindRuleAarch64::NoCfi;
    const EVALUATE: UnwindRuleAarch64 = UnwindRuleAarch64::Evaluate;
    const SIGNAL_FRAME: UnwindRuleAarch64 = UnwindRuleAarch64::SignalFrame;
    /// `CFA = sp`, the return address still in `x30`, `x29` unchanged.
    const ENTRY: UnwindRuleAarch64 = UnwindRuleAarch64::Sp {
        cfa: 0,
        ra: 0,
        fp: 0,
    };
    const FRAME_RECORD: FrameRecordLayout = super::FRAME_RECORD;

    fn reg(regs: &UnwindRegs, reg: u16) -> Option<u64> {
        match reg {
            SP => Some(regs.sp),
            X29 => Some(regs.fp),
            X30 => Some(regs.lr),
            _ => None,
        }
    }

    fn compile_row(row: &RowView<'_>, signal: bool) -> UnwindRuleAarch64 {
        use UnwindRuleAarch64 as R;
        if signal {
            return R::SignalFrame;
        }
        let ra = match row.reg(X30) {
            // A row that says nothing of x30 leaves the return address in
            // x30 (a leaf, or a prologue before the save), as gdb reads it;
            // the outermost frames say DW_CFA_undefined x30.
            RuleView::Undefined if !row.mentions(X30) => 0,
            RuleView::Undefined => return R::End,
            r => match saved(r) {
                Some(o) => o,
                None => return R::Evaluate,
            },
        };
        let Some(fp) = saved(row.reg(X29)) else {
            return R::Evaluate;
        };
        match row.cfa {
            CfaView::RegOffset(SP, off) => match u16::try_from(off) {
                Ok(cfa) => R::Sp { cfa, ra, fp },
                Err(_) => R::Evaluate,
            },
            CfaView::RegOffset(X29, off) => match u16::try_from(off) {
                Ok(cfa) => R::Fp { cfa, ra, fp },
                Err(_) => R::Evaluate,
            },
            _ => R::Evaluate,
        }
    }

    fn apply<M: Memory + ?Sized>(
        rule: UnwindRuleAarch64,
        regs: &UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, UnwindError> {
        use UnwindRuleAarch64 as R;
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
        let rd = |m: &mut M, off: i16| {
            m.read_u64(cfa.wrapping_add(off as i64 as u64))
                .map_err(UnwindError::Read)
        };
        let pc = if ra == 0 { regs.lr } else { rd(mem, ra)? };
        let new_fp = if fp == 0 { regs.fp } else { rd(mem, fp)? };
        Ok(Applied::Caller {
            regs: UnwindRegs {
                // Strip pointer-authentication bits of a signed return address.
                pc: pc & 0x0000_ffff_ffff_ffff,
                sp: cfa,
                fp: new_fp,
                lr: 0,
            },
            signal: false,
        })
    }

    fn pack(_: UnwindRuleAarch64) -> u16 {
        0
    }

    fn unpack(_: u16) -> UnwindRuleAarch64 {
        UnwindRuleAarch64::Evaluate
    }

    fn signal_frame<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> Result<UnwindRegs, UnwindError> {
        let rd = |m: &mut M, i: u64| {
            m.read_u64(sp.wrapping_add(UC_REGS + 8 * i))
                .map_err(UnwindError::Read)
        };
        let fp = rd(mem, 29)?;
        let lr = rd(mem, 30)?;
        let new_sp = rd(mem, 31)?;
        let pc = rd(mem, 32)?;
        mem.note_stack(new_sp);
        Ok(UnwindRegs {
            pc,
            sp: new_sp,
            fp,
            lr,
        })
    }
}
