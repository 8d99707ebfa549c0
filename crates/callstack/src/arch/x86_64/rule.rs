//! The x86-64 unwind rule: what a compiled CFI row becomes, and how the hot
//! loop applies it.
//!
//! Almost every row of real x86-64 code has one of three shapes: the CFA is
//! `rsp + n` (after `push`/`sub rsp`), or `rbp + n` (after `mov rbp, rsp`),
//! the return address is at `CFA - 8`, and `rbp` is either untouched or saved
//! at `CFA + m`. Those compile to [`UnwindRuleX86_64::Sp`] and
//! [`UnwindRuleX86_64::Bp`], which cost two or three loads to apply. The PLT's
//! DWARF expression and glibc's signal trampoline (`__restore_rt`) have their
//! own rules; anything else is [`UnwindRuleX86_64::Evaluate`], evaluated from
//! the CFI directly.

use crate::arch::{Applied, Arch, FrameRecordLayout};
use crate::types::{Base, FpRule, InsnRule};
use crate::types::{CfaView, RowView, RuleView};
use crate::types::{Memory, UnwindError, UnwindRegs};

/// DWARF register numbers of x86-64 (System V psABI).
const RBP: u16 = 6;
const RSP: u16 = 7;
const RIP: u16 = 16;

/// The compiled unwind rule of an x86-64 address range.
///
/// Offsets are in bytes. `bp == 0` means `rbp` is unchanged in the caller;
/// otherwise the caller's `rbp` is saved at `CFA + bp`. The return address
/// is always at `CFA - 8` (rows where it is not are [`Self::Evaluate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindRuleX86_64 {
    /// No CFI covers the address: use the frame-pointer rule or the
    /// fallback hook.
    NoCfi,
    /// Evaluate the CFI of this address directly (an expression or register
    /// the compiled forms do not cover).
    Evaluate,
    /// The outermost frame: the return address is undefined.
    End,
    /// `CFA = rsp + cfa`.
    Sp {
        /// CFA offset from `rsp` (any frame size: frames of megabytes too).
        cfa: u32,
        /// Where the caller's `rbp` is saved, from the CFA (0: unchanged).
        bp: i16,
    },
    /// `CFA = rbp + cfa`.
    Bp {
        /// CFA offset from `rbp`.
        cfa: u32,
        /// Where the caller's `rbp` is saved, from the CFA (0: unchanged).
        bp: i16,
    },
    /// A PLT entry: `CFA = rsp + 8`, plus 8 when `(rip & 15) >= threshold`
    /// (the entry has pushed its relocation index).
    Plt {
        /// 11 for the classic `.plt`, 10 for some linkers.
        threshold: u8,
    },
    /// glibc's signal trampoline `__restore_rt`: `rsp` points at the
    /// `ucontext_t` the kernel saved; the caller's registers are read there.
    SignalFrame,
}

/// The x86-64 architecture, for the generic unwinder.
#[derive(Clone, Copy, Debug, Default)]
pub struct X86_64;

/// `DW_OP_breg7 (rsp) 160; DW_OP_deref`: glibc's CFA of `__restore_rt`.
const SIGNAL_CFA_EXPR: &[u8] = &[0x77, 0xa0, 0x01, 0x06];

/// The PLT CFA expression: `DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15;
/// DW_OP_and; DW_OP_lit<t>; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`.
fn plt_threshold(expr: &[u8]) -> Option<u8> {
    match expr {
        [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22]
            if (0x30..0x40).contains(lit) =>
        {
            Some(lit - 0x30)
        }
        _ => None,
    }
}

fn bp_offset(rule: RuleView<'_>) -> Option<i16> {
    match rule {
        RuleView::SameValue => Some(0),
        RuleView::Offset(o) if o != 0 => i16::try_from(o).ok(),
        _ => None,
    }
}

impl Arch for X86_64 {
    type Rule = UnwindRuleX86_64;
    const NAME: &'static str = "x86_64";
    const SP: u16 = RSP;
    const FP: u16 = RBP;
    const RA: u16 = RIP;
    const NO_CFI: UnwindRuleX86_64 = UnwindRuleX86_64::NoCfi;
    const EVALUATE: UnwindRuleX86_64 = UnwindRuleX86_64::Evaluate;
    const SIGNAL_FRAME: UnwindRuleX86_64 = UnwindRuleX86_64::SignalFrame;
    /// `CFA = rsp + 8`, the return address at `CFA - 8`, `rbp` unchanged.
    const ENTRY: UnwindRuleX86_64 = UnwindRuleX86_64::Sp { cfa: 8, bp: 0 };
    const FRAME_RECORD: FrameRecordLayout = super::FRAME_RECORD;

    #[inline]
    fn reg(regs: &UnwindRegs, reg: u16) -> Option<u64> {
        match reg {
            RSP => Some(regs.sp),
            RBP => Some(regs.fp),
            RIP => Some(regs.pc),
            _ => None,
        }
    }

    // Local copies in the cold capture's code (see `unwind::local`).
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn compile_row(row: &RowView<'_>, signal: bool) -> UnwindRuleX86_64 {
        use UnwindRuleX86_64 as R;
        if signal {
            return match row.cfa {
                CfaView::Expression(e) if e == SIGNAL_CFA_EXPR => R::SignalFrame,
                _ => R::Evaluate,
            };
        }
        match row.reg(RIP) {
            RuleView::Undefined => return R::End,
            RuleView::Offset(o) => {
                // The return address is pushed by `call`: always at CFA - 8.
                if o != -8 {
                    return R::Evaluate;
                }
            }
            _ => return R::Evaluate,
        }
        // A rule for rsp (the caller's rsp is not the CFA): evaluated.
        if !matches!(row.reg(RSP), RuleView::SameValue) {
            return R::Evaluate;
        }
        let bp = match bp_offset(row.reg(RBP)) {
            Some(b) => b,
            None => return R::Evaluate,
        };
        match row.cfa {
            CfaView::RegOffset(RSP, off) => match u32::try_from(off) {
                Ok(cfa) => R::Sp { cfa, bp },
                Err(_) => R::Evaluate,
            },
            CfaView::RegOffset(RBP, off) => match u32::try_from(off) {
                Ok(cfa) => R::Bp { cfa, bp },
                Err(_) => R::Evaluate,
            },
            CfaView::Expression(e) if bp == 0 => match plt_threshold(e) {
                Some(threshold) => R::Plt { threshold },
                None => R::Evaluate,
            },
            _ => R::Evaluate,
        }
    }

    #[inline(always)]
    fn apply<M: Memory + ?Sized>(
        rule: UnwindRuleX86_64,
        regs: &UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, UnwindError> {
        use UnwindRuleX86_64 as R;
        let (cfa, bp) = match rule {
            R::Sp { cfa, bp } => (regs.sp.wrapping_add(cfa as u64), bp),
            R::Bp { cfa, bp } => (regs.fp.wrapping_add(cfa as u64), bp),
            R::Plt { threshold } => {
                let pushed = if (regs.pc & 15) >= threshold as u64 {
                    8
                } else {
                    0
                };
                (regs.sp.wrapping_add(8 + pushed), 0)
            }
            R::SignalFrame => {
                let regs = Self::signal_frame(regs.sp, mem)?;
                return Ok(Applied::Caller { regs, signal: true });
            }
            R::End => return Ok(Applied::End),
            R::NoCfi => return Ok(Applied::NoCfi),
            R::Evaluate => return Ok(Applied::Evaluate),
        };
        let ra = mem
            .read_u64(cfa.wrapping_sub(8))
            .map_err(UnwindError::Read)?;
        let slot = cfa.wrapping_add(bp as i64 as u64);
        // A slot below the stack pointer was popped already: at an
        // epilogue's `ret` (after `pop rbp` or `leave`, where gcc's CFI
        // still says where rbp was saved) rbp holds the caller's value.
        let fp = if bp == 0 || slot < regs.sp {
            regs.fp
        } else {
            mem.read_u64(slot).map_err(UnwindError::Read)?
        };
        Ok(Applied::Caller {
            regs: UnwindRegs {
                pc: ra,
                sp: cfa,
                fp,
                lr: 0,
            },
            signal: false,
        })
    }

    /// Packed `Sp`/`Bp` rules are in the form the exact capture's hot loop
    /// applies (see `arch::x86_64::exact::decode_packed`): bits 15-14 the
    /// base (1: `rsp`, 2: `rbp`), bits 13-5 `off_a / 8` and bits 4-0
    /// `ra_at / 8`, where `a = base + off_a` is the lowest stack word the
    /// frame reads, the return address is at `a + ra_at` and the caller's
    /// `rbp` at `a` when `ra_at != 0` (unchanged when `ra_at == 0`). So
    /// `bp == 0` packs as `(cfa - 8, 0)` and `bp <= -16` as
    /// `(cfa + bp, -bp - 8)`; frames up to about 4 KiB fit. Bits 15-14 = 3
    /// are the other rules (with bit 13 set: small `Sp`/`Bp` rules the hot
    /// loop does not apply); 0 in bits 15-14 is never produced here (the
    /// in-process rule cache uses it for wider rules).
    #[inline(always)]
    fn pack(rule: UnwindRuleX86_64) -> u16 {
        use UnwindRuleX86_64 as R;
        let offsets = |tag: u16, cfa: u32, bp: i16| -> u16 {
            match fast_form(cfa, bp) {
                Some((off_a, ra_at)) if off_a / 8 <= 0x1ff && ra_at / 8 <= 0x1f => {
                    tag << 14 | ((off_a / 8) as u16) << 5 | (ra_at / 8) as u16
                }
                Some(_) => 0,
                // Small rules the hot loop does not apply, packed apart (bit
                // 13 of the other rules) to keep tables small: above all
                // `CFA = rsp + 8` with `rbp` still at CFA - 16, the row
                // after an epilogue's `pop rbp`.
                None if cfa % 8 == 0
                    && cfa / 8 <= 0x7f
                    && bp % 8 == 0
                    && (-0xf8..=0).contains(&bp) =>
                {
                    3 << 14 | 1 << 13 | (tag - 1) << 12 | ((cfa / 8) as u16) << 5 | (-bp / 8) as u16
                }
                None => 0,
            }
        };
        match rule {
            R::Sp { cfa, bp } => offsets(1, cfa, bp),
            R::Bp { cfa, bp } => offsets(2, cfa, bp),
            R::End => 3 << 14 | 1,
            R::NoCfi => 3 << 14 | 2,
            R::Evaluate => 3 << 14 | 3,
            R::SignalFrame => 3 << 14 | 4,
            R::Plt { threshold } => 3 << 14 | 16 | (threshold as u16 & 15),
        }
    }

    #[inline(always)]
    fn unpack(p: u16) -> UnwindRuleX86_64 {
        use UnwindRuleX86_64 as R;
        let off_a = ((p >> 5) & 0x1ff) as u32 * 8;
        let ra_at = (p & 0x1f) as u32 * 8;
        let (cfa, bp) = from_fast_form(off_a, ra_at);
        match p >> 14 {
            1 => R::Sp { cfa, bp },
            2 => R::Bp { cfa, bp },
            // A machine-code rule (`exact::pack_insn`): for the CFI, an
            // address without CFI.
            _ if p & 0x2000 == 0 && p & 0x1000 != 0 => R::NoCfi,
            _ if p & 0x2000 != 0 => {
                let cfa = ((p >> 5) & 0x7f) as u32 * 8;
                let bp = -((p & 0x1f) as i16) * 8;
                if p & 0x1000 != 0 {
                    R::Bp { cfa, bp }
                } else {
                    R::Sp { cfa, bp }
                }
            }
            _ => match p & 0x3fff {
                1 => R::End,
                2 => R::NoCfi,
                4 => R::SignalFrame,
                t if t & 16 != 0 => R::Plt {
                    threshold: (t & 15) as u8,
                },
                _ => R::Evaluate,
            },
        }
    }

    fn signal_frame<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> Result<UnwindRegs, UnwindError> {
        super::signal::saved_regs(sp, mem).map_err(UnwindError::Read)
    }
}

/// The CFI rule that applies as machine-code analysis's `r` does, when one
/// does: `CFA = rsp + n` or `rbp + n` (`n > 0`), the return address at
/// `CFA - 8`, no extra pop (`ret imm16`), and `rbp` unchanged (or lost:
/// the analysis then keeps the current one too) or saved at a fixed place
/// from the CFA's base. For an `rsp`-based CFA the slot must lie at or
/// above `rsp` (where [`X86_64::apply`] reads it); for an `rbp`-based one
/// whoever applies the rule checks that at run time (`apply` takes a slot
/// below `rsp` as popped, which the analysis does not). `None` for the
/// other rules (a value rule for `rbp`, a slot relative to the other
/// register, a frame over 4 GiB).
// Used by the in-process capture (`unwind/local`) where it analyzes code.
#[cfg_attr(not(callstack_insn), allow(dead_code))]
pub(crate) fn from_insn(r: &InsnRule) -> Option<UnwindRuleX86_64> {
    if r.ra_at_cfa != Some(-8) || r.ret_pop != 0 || r.cfa_offset <= 0 {
        return None;
    }
    let cfa = u32::try_from(r.cfa_offset).ok()?;
    let bp = match r.fp {
        FpRule::Unchanged | FpRule::Unknown => 0,
        FpRule::At(b, off) if b == r.cfa_base => {
            if b == Base::Sp && off < 0 {
                return None;
            }
            let bp = i16::try_from(off as i64 - r.cfa_offset as i64).ok()?;
            if bp == 0 {
                return None;
            }
            bp
        }
        _ => return None,
    };
    Some(match r.cfa_base {
        Base::Sp => UnwindRuleX86_64::Sp { cfa, bp },
        Base::Fp => UnwindRuleX86_64::Bp { cfa, bp },
    })
}

/// An `Sp`/`Bp` rule as the hot loop applies it: `(off_a, ra_at)` with
/// `a = base + off_a` the lowest stack word the frame reads, the return
/// address at `a + ra_at`, the caller's `rbp` at `a` when `ra_at != 0`.
/// `None` for the shapes the hot loop does not apply: offsets not multiples
/// of 8, a CFA below 8, `rbp` saved at or above the return address.
#[inline(always)]
pub(crate) fn fast_form(cfa: u32, bp: i16) -> Option<(u32, u32)> {
    if cfa % 8 != 0 || bp % 8 != 0 || cfa < 8 {
        return None;
    }
    match bp {
        0 => Some((cfa - 8, 0)),
        b if b <= -16 => {
            let off_a = (cfa as i64 + b as i64).try_into().ok()?;
            Some((off_a, (-(b as i32) - 8) as u32))
        }
        _ => None,
    }
}

/// The `(cfa, bp)` of a [`fast_form`].
#[inline(always)]
pub(crate) fn from_fast_form(off_a: u32, ra_at: u32) -> (u32, i16) {
    if ra_at == 0 {
        (off_a.wrapping_add(8), 0)
    } else {
        (
            off_a.wrapping_add(ra_at).wrapping_add(8),
            (-(ra_at as i32) - 8) as i16,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognizes_the_plt_expression() {
        let e = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert_eq!(plt_threshold(&e), Some(11));
        assert_eq!(plt_threshold(&e[..10]), None);
    }

    #[test]
    fn machine_code_rules_become_cfi_rules() {
        use UnwindRuleX86_64 as R;
        let insn = |cfa_base, cfa_offset, fp| InsnRule {
            cfa_base,
            cfa_offset,
            ra_at_cfa: Some(-8),
            ret_pop: 0,
            fp,
        };
        assert_eq!(
            from_insn(&insn(Base::Sp, 0x28, FpRule::Unknown)),
            Some(R::Sp { cfa: 0x28, bp: 0 })
        );
        assert_eq!(
            from_insn(&insn(Base::Sp, 0x30, FpRule::At(Base::Sp, 0x10))),
            Some(R::Sp {
                cfa: 0x30,
                bp: -0x20
            })
        );
        assert_eq!(
            from_insn(&insn(Base::Fp, 16, FpRule::At(Base::Fp, 0))),
            Some(R::Bp { cfa: 16, bp: -16 })
        );
        // Not in the CFI rule's forms.
        assert_eq!(
            from_insn(&insn(Base::Sp, 0x30, FpRule::At(Base::Fp, 0))),
            None
        );
        assert_eq!(
            from_insn(&insn(Base::Sp, 0x30, FpRule::Value(Base::Sp, 8))),
            None
        );
        assert_eq!(
            from_insn(&insn(Base::Sp, 0x30, FpRule::At(Base::Sp, -8))),
            None
        );
        assert_eq!(from_insn(&insn(Base::Sp, -8, FpRule::Unchanged)), None);
        let mut r = insn(Base::Sp, 0x30, FpRule::Unchanged);
        r.ret_pop = 16;
        assert_eq!(from_insn(&r), None);
        r = insn(Base::Sp, 0x30, FpRule::Unchanged);
        r.ra_at_cfa = None;
        assert_eq!(from_insn(&r), None);
        // The CFI rule applies as the machine-code rule does.
        let stack: Vec<u64> = (0..16).map(|i| 0x1000 + i).collect();
        let base = stack.as_ptr() as u64;
        struct Words(u64, Vec<u64>);
        impl Memory for Words {
            fn read_u64(&mut self, a: u64) -> Result<u64, crate::types::ReadError> {
                let i = a.wrapping_sub(self.0) / 8;
                self.1
                    .get(i as usize)
                    .copied()
                    .ok_or(crate::types::ReadError::OutOfBounds(a))
            }
        }
        let mut mem = Words(base, stack.clone());
        let regs = UnwindRegs {
            pc: 0x40_1000,
            sp: base,
            fp: base + 0x20,
            lr: 0,
        };
        for r in [
            insn(Base::Sp, 0x28, FpRule::Unknown),
            insn(Base::Sp, 0x30, FpRule::At(Base::Sp, 0x10)),
            insn(Base::Fp, 16, FpRule::At(Base::Fp, 0)),
            insn(Base::Fp, 0x40, FpRule::At(Base::Fp, 0x8)),
        ] {
            let c = from_insn(&r).unwrap();
            let want = r.apply(&regs, &mut mem, 8).unwrap();
            assert_eq!(
                X86_64::apply(c, &regs, &mut mem),
                Ok(Applied::Caller {
                    regs: want,
                    signal: false
                }),
                "{r:?}"
            );
        }
    }

    #[test]
    fn pack_round_trips() {
        use UnwindRuleX86_64 as R;
        for r in [
            R::Sp { cfa: 8, bp: 0 },
            R::Sp {
                cfa: 2040,
                bp: -256,
            },
            R::Sp { cfa: 4096, bp: 0 },
            R::Sp { cfa: 8, bp: -16 },
            R::Bp { cfa: 16, bp: -8 },
            R::Bp {
                cfa: 4088 + 256,
                bp: -256,
            },
            R::Sp { cfa: 48, bp: -16 },
            R::Bp { cfa: 16, bp: -16 },
            R::End,
            R::NoCfi,
            R::Evaluate,
            R::SignalFrame,
            R::Plt { threshold: 11 },
        ] {
            let p = X86_64::pack(r);
            assert_ne!(p, 0, "{r:?}");
            assert_eq!(X86_64::unpack(p), r);
        }
        assert_eq!(X86_64::pack(R::Sp { cfa: 12, bp: 0 }), 0);
        assert_eq!(X86_64::pack(R::Sp { cfa: 4104, bp: 0 }), 0);
        assert_eq!(
            X86_64::pack(R::Sp {
                cfa: 1 << 20,
                bp: -16
            }),
            0
        );
        // rbp saved above the CFA or in the return address's slot.
        assert_eq!(X86_64::pack(R::Sp { cfa: 48, bp: 8 }), 0);
        assert_eq!(X86_64::pack(R::Sp { cfa: 1024, bp: -8 }), 0);
    }
}
