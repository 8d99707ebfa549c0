//! The AArch64 unwind rule: what a compiled CFI row becomes, how it is
//! applied, and its packed forms for the in-process rule cache and its hot
//! loop. Compiled on every host (cores of AArch64 programs are unwound
//! offline anywhere).
//!
//! The rows of real AArch64 code: the CFA is `sp + n` (gcc, with or
//! without a frame pointer) or `x29 + n` (clang and gcc -O0 after
//! `mov x29, sp`); `x30` is saved at some offset from the CFA (at the
//! bottom of the frame for gcc's `stp x29, x30, [sp, #-n]!`, right under
//! the CFA for clang's frame record at the top), with `x29` just below it
//! or unchanged; leaves and prologues keep the return address in `x30`.
//! A saved return address is applied by the hot loop from a
//! [`FastForm`]: every frame whose return address is saved, with `x29`
//! unchanged or saved below it, as on x86-64. The common ones pack in
//! 16 bits ([`Aarch64::pack`]), the rest (big frames, `x29` saved away
//! from `x30`) in a wide word ([`wide_word`]).

use crate::arch::{Applied, Arch, FrameRecordLayout};
use crate::types::{CfaView, RowView, RuleView};
use crate::types::{Memory, UnwindError, UnwindRegs};

const X29: u16 = 29;
const X30: u16 = 30;
const SP: u16 = 31;

/// The compiled unwind rule of an AArch64 address range. Offsets in bytes
/// from the CFA; `ra == 0` means the return address is still in `x30` (a
/// leaf or a prologue), `fp == 0` that `x29` is unchanged. CFA offsets of
/// any frame size (frames of megabytes too).
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
        cfa: u32,
        /// Where `x30` is saved (0: still in `x30`).
        ra: i32,
        /// Where `x29` is saved (0: unchanged).
        fp: i32,
    },
    /// `CFA = x29 + cfa`.
    Fp {
        /// CFA offset from `x29`.
        cfa: u32,
        /// Where `x30` is saved (0: still in `x30`).
        ra: i32,
        /// Where `x29` is saved (0: unchanged).
        fp: i32,
    },
    /// The kernel's `__kernel_rt_sigreturn`: `sp` points at the
    /// `rt_sigframe` (a `siginfo_t`, then the `ucontext_t`).
    SignalFrame,
}

/// The AArch64 architecture, for the generic unwinder.
#[derive(Clone, Copy, Debug, Default)]
pub struct Aarch64;

fn saved(rule: RuleView<'_>) -> Option<i32> {
    match rule {
        RuleView::SameValue => Some(0),
        RuleView::Offset(o) if o != 0 => i32::try_from(o).ok(),
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
    const CFI_VENDOR: gimli::Vendor = gimli::Vendor::AArch64;

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
            CfaView::RegOffset(SP, off) => match u32::try_from(off) {
                Ok(cfa) => R::Sp { cfa, ra, fp },
                Err(_) => R::Evaluate,
            },
            CfaView::RegOffset(X29, off) => match u32::try_from(off) {
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
        let rd = |m: &mut M, off: i32| {
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

    /// The slot of `x30` that a `Sp` or `Fp` rule reads (the frame
    /// record of a non-leaf function, wherever in its frame the compiler
    /// put it); `None` while the return address is in `x30` itself.
    fn saved_ra(rule: UnwindRuleAarch64, regs: &UnwindRegs) -> Option<(u64, u64)> {
        use UnwindRuleAarch64 as R;
        let (cfa, ra) = match rule {
            R::Sp { cfa, ra, .. } => (regs.sp.wrapping_add(cfa as u64), ra),
            R::Fp { cfa, ra, .. } => (regs.fp.wrapping_add(cfa as u64), ra),
            _ => return None,
        };
        if ra == 0 {
            return None;
        }
        Some((cfa, cfa.wrapping_add(ra as i64 as u64)))
    }

    /// Packed rules (see [`FastForm`] for what the hot loop applies):
    /// bits 15-14 the base of a fast form (1: `sp`, 2: `x29`); bit 13 set
    /// when `x29` is saved at `a` and `x30` at `a + 8` (the frame record),
    /// clear when `x30` is at `a` and `x29` unchanged; bits 9-0 `cfa / 8`
    /// (frames up to 8 KiB). Bit 12 set: the saved words right under the
    /// CFA (`a = CFA - 8` or `CFA - 16`: clang's frame record at the top);
    /// clear: `a = base + 8 * k`, `k` in bits 11-10 (gcc's `stp x29, x30,
    /// [sp, #-n]!` at the bottom of the frame, `k == 0`). Bits 15-14 = 3
    /// are the other rules: `End`, `NoCfi`, `Evaluate`, `SignalFrame` as on
    /// x86-64, and with bit 13 set the rows that keep the return address in
    /// `x30` with `x29` unchanged (leaves, prologues), bit 12 the base,
    /// bits 9-0 `cfa / 8`. 0 in bits 15-14 is never produced here (the
    /// in-process rule cache uses it for wider rules, [`wide_word`]).
    #[inline]
    fn pack(rule: UnwindRuleAarch64) -> u16 {
        use UnwindRuleAarch64 as R;
        match rule {
            R::End => 3 << 14 | 1,
            R::NoCfi => 3 << 14 | 2,
            R::Evaluate => 3 << 14 | 3,
            R::SignalFrame => 3 << 14 | 4,
            R::Sp { cfa, ra: 0, fp: 0 } | R::Fp { cfa, ra: 0, fp: 0 }
                if cfa % 8 == 0 && cfa / 8 <= 0x3ff =>
            {
                let base = matches!(rule, R::Fp { .. }) as u16;
                3 << 14 | 1 << 13 | base << 12 | (cfa / 8) as u16
            }
            _ => match fast_form(rule) {
                Some(f) => pack_fast(f),
                None => 0,
            },
        }
    }

    #[inline]
    fn unpack(p: u16) -> UnwindRuleAarch64 {
        use UnwindRuleAarch64 as R;
        if p >> 14 == 3 {
            if p & 1 << 13 != 0 {
                let cfa = (p & 0x3ff) as u32 * 8;
                return if p & 1 << 12 != 0 {
                    R::Fp { cfa, ra: 0, fp: 0 }
                } else {
                    R::Sp { cfa, ra: 0, fp: 0 }
                };
            }
            if p & 0xf000 == INSN_MARK {
                // A machine-code rule: no CFI here.
                return R::NoCfi;
            }
            return match p & 0x1fff {
                1 => R::End,
                2 => R::NoCfi,
                4 => R::SignalFrame,
                _ => R::Evaluate,
            };
        }
        match decode_fast(p) {
            Some(f) => from_fast_form(f),
            None => R::Evaluate,
        }
    }

    fn signal_frame<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> Result<UnwindRegs, UnwindError> {
        super::signal::saved_regs(sp, mem).map_err(UnwindError::Read)
    }

    fn looks_like_signal_frame<M: Memory + ?Sized>(sp: u64, mem: &mut M) -> bool {
        super::signal::looks_like_frame(sp, mem)
    }
}

/// A rule with its return address saved, as the in-process hot loop
/// applies it: `a = (x29 if from_fp else sp) + off_a` is the lowest stack
/// word the frame reads; the return address is at `a + ra_at`; when
/// `ra_at != 0` the caller's `x29` is at `a` (else it is unchanged); the
/// caller's `sp` (the CFA) is `a + cfa_at`, above both. So one check,
/// `sp <= a && a + cfa_at <= hi`, keeps every read in `[sp, hi)` (and the
/// caller's `sp` above the callee's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FastForm {
    /// The base is `x29` (else `sp`).
    pub(crate) from_fp: bool,
    /// `a` from the base, in bytes: negative only from `x29` (RISC-V's
    /// frame pointer points at the CFA, above its saved pair).
    pub(crate) off_a: i32,
    /// The return address from `a`, in bytes: 0, or 8 and more with the
    /// caller's `x29` at `a`.
    pub(crate) ra_at: u32,
    /// The CFA from `a`, in bytes: at least `ra_at + 8`.
    pub(crate) cfa_at: u32,
}

/// The [`FastForm`] of a rule, or `None` for the rules the hot loop does
/// not apply: not `Sp`/`Fp`, the return address in `x30`, offsets not
/// multiples of 8, a saved word at or above the CFA, `x29` saved above
/// `x30`, `a` below `sp`.
#[inline]
pub(crate) fn fast_form(rule: UnwindRuleAarch64) -> Option<FastForm> {
    let (from_fp, cfa, ra, fp) = match rule {
        UnwindRuleAarch64::Sp { cfa, ra, fp } => (false, cfa, ra, fp),
        UnwindRuleAarch64::Fp { cfa, ra, fp } => (true, cfa, ra, fp),
        _ => return None,
    };
    if cfa % 8 != 0 || ra % 8 != 0 || fp % 8 != 0 || ra >= 0 || fp > 0 {
        return None;
    }
    let low = if fp == 0 {
        ra
    } else if fp < ra {
        fp
    } else {
        return None;
    };
    let off_a = i32::try_from(cfa as i64 + low as i64).ok()?;
    if off_a < 0 && !from_fp {
        return None;
    }
    Some(FastForm {
        from_fp,
        off_a,
        ra_at: (ra - low) as u32,
        cfa_at: low.unsigned_abs(),
    })
}

/// The rule of a [`FastForm`].
#[inline]
pub(crate) fn from_fast_form(f: FastForm) -> UnwindRuleAarch64 {
    let cfa = (f.off_a as i64 + f.cfa_at as i64) as u32;
    let low = -(f.cfa_at as i64) as i32;
    let (ra, fp) = if f.ra_at == 0 {
        (low, 0)
    } else {
        (low.wrapping_add(f.ra_at as i32), low)
    };
    if f.from_fp {
        UnwindRuleAarch64::Fp { cfa, ra, fp }
    } else {
        UnwindRuleAarch64::Sp { cfa, ra, fp }
    }
}

/// The 16-bit form of a [`FastForm`] (see [`Aarch64::pack`]), or 0.
#[inline]
fn pack_fast(f: FastForm) -> u16 {
    let pair = match f.ra_at {
        0 => 0,
        8 => 1,
        _ => return 0,
    };
    let cfa = f.off_a as i64 + f.cfa_at as i64;
    if !(0..=0x3ff * 8).contains(&cfa) || cfa % 8 != 0 {
        return 0;
    }
    let base: u16 = if f.from_fp { 2 } else { 1 };
    let head = base << 14 | pair << 13 | (cfa / 8) as u16;
    if f.cfa_at == f.ra_at + 8 {
        head | 1 << 12
    } else if f.off_a >= 0 && f.off_a % 8 == 0 && f.off_a / 8 <= 3 {
        head | ((f.off_a / 8) as u16) << 10
    } else {
        0
    }
}

/// The [`FastForm`] of a packed rule whose bits 15-14 are 1 or 2 (`None`
/// for the others).
#[inline(always)]
pub(crate) fn decode_fast(p: u16) -> Option<FastForm> {
    let base = p >> 14;
    if base == 0 || base == 3 {
        return None;
    }
    let ra_at = ((p >> 13) & 1) as u32 * 8;
    let cfa = (p & 0x3ff) as u32 * 8;
    let (off_a, cfa_at) = if p & 1 << 12 != 0 {
        // Below the base only from x29 (see `fast_form`).
        let off_a = cfa as i32 - (ra_at + 8) as i32;
        if off_a < 0 && base != 2 {
            return None;
        }
        (off_a, ra_at + 8)
    } else {
        let off_a = ((p >> 10) & 3) as u32 * 8;
        (off_a as i32, cfa.checked_sub(off_a)?)
    };
    if cfa_at < ra_at + 8 {
        return None;
    }
    Some(FastForm {
        from_fp: base == 2,
        off_a,
        ra_at,
        cfa_at,
    })
}

#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
/// The packed `End` rule (`Aarch64::pack(UnwindRuleAarch64::End)`): the
/// outermost frame, which the hot loop ends on without the generic
/// unwinder.
pub(crate) const PACKED_END: u16 = 3 << 14 | 1;

#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
/// The wide form of a rule with a [`FastForm`] that does not fit 16 bits
/// (frames over 8 KiB, `x29` saved away from `x30`): bits 0-31 `off_a`,
/// bits 32-52 `cfa_at / 8` (16 MiB), bits 53-57 `ra_at / 8`, bit 58 set
/// when the base is `x29`, bit 62 always set (a wide word is never 0).
/// `None` for the rules the hot loop does not apply.
pub(crate) fn wide_word(rule: UnwindRuleAarch64) -> Option<u64> {
    let f = fast_form(rule)?;
    if f.ra_at / 8 > 0x1f || f.cfa_at / 8 >= 1 << 21 {
        return None;
    }
    Some(
        f.off_a as u32 as u64
            | ((f.cfa_at / 8) as u64) << 32
            | ((f.ra_at / 8) as u64) << 53
            | (f.from_fp as u64) << 58
            | 1 << 62,
    )
}

#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
/// The [`FastForm`] of a [`wide_word`].
#[inline(always)]
pub(crate) fn decode_wide(w: u64) -> FastForm {
    FastForm {
        from_fp: w & 1 << 58 != 0,
        off_a: w as u32 as i32,
        ra_at: ((w >> 53) & 0x1f) as u32 * 8,
        cfa_at: ((w >> 32) & 0x1f_ffff) as u32 * 8,
    }
}

#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
/// The rule of a [`wide_word`].
pub(crate) fn from_wide_word(w: u64) -> UnwindRuleAarch64 {
    from_fast_form(decode_wide(w))
}

/// Bits 15-12 of a rule-cache word that holds a rule machine-code
/// analysis settled for an address without CFI ([`pack_insn`]), as on
/// x86-64: the CFI reads it as `NoCfi` ([`Aarch64::unpack`]), the hot loop
/// as no rule of its own (bits 15-14 = 3, not `End`), so the frame goes to
/// the in-process walk's machine-code step, which checks what the stack
/// decides. RISC-V 64 shares this word space.
pub(crate) const INSN_MARK: u16 = 3 << 14 | 1 << 12;

/// The packed form of a rule prologue analysis gave for a return address
/// (`arch::risc::return_rule`), where it has one of the shapes of real
/// code: `CFA = sp + n` or `fp + n` (`n` a multiple of 16 up to 1008), the
/// return address saved 8 to 32 bytes under the CFA or 0 to 24 bytes above
/// the CFA's base register (the frame record at the top of the frame, or at
/// its bottom as gcc's `stp x29, x30, [sp, #-n]!` leaves it), the frame
/// pointer unchanged, lost, or saved right under the return address.
/// [`INSN_MARK`], then bit 11 an `fp` base, bits 10-5 `n / 16`, bit 4 the
/// return address's slot counted from the base (else from the CFA), bits
/// 3-2 that slot, bits 1-0 the frame pointer (0 unchanged, 1 lost, 2 saved
/// under the return address). `None` for any other rule.
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "riscv64")),
    allow(dead_code)
)]
pub(crate) fn pack_insn(r: &crate::types::InsnRule) -> Option<u16> {
    use crate::types::{Base, FpRule};
    let ra = r.ra_at_cfa?;
    if r.ret_pop != 0 || r.cfa_offset < 0 || r.cfa_offset % 16 != 0 || r.cfa_offset / 16 > 63 {
        return None;
    }
    let from_base = ra + r.cfa_offset;
    let (bottom, k) = if (-32..=-8).contains(&ra) && ra % 8 == 0 {
        (0u16, (-ra / 8 - 1) as u16)
    } else if (0..=24).contains(&from_base) && from_base % 8 == 0 {
        (1, (from_base / 8) as u16)
    } else {
        return None;
    };
    let fp = match r.fp {
        FpRule::Unchanged => 0u16,
        FpRule::Unknown => 1,
        FpRule::At(b, off) if b == r.cfa_base && off == from_base - 8 => 2,
        _ => return None,
    };
    let p = INSN_MARK
        | ((r.cfa_base == Base::Fp) as u16) << 11
        | ((r.cfa_offset / 16) as u16) << 5
        | bottom << 4
        | k << 2
        | fp;
    // Only a form that decodes to the very rule: the walk applies it as the
    // analysis would.
    (unpack_insn(p) == Some(*r)).then_some(p)
}

/// The marked word of an address whose prologue rule was looked at and
/// has no packed form (or none at all): the CFI reads it as `NoCfi`,
/// [`unpack_insn`] as no rule, and the in-process walk does not analyse
/// the code again only to find that out (`unwind/local/code.rs` `settle`).
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "riscv64")),
    allow(dead_code)
)]
pub(crate) const INSN_UNPACKED: u16 = INSN_MARK | 3;

/// The rule of a [`pack_insn`] word, `None` for any other word.
#[inline]
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "riscv64")),
    allow(dead_code)
)]
pub(crate) fn unpack_insn(p: u16) -> Option<crate::types::InsnRule> {
    use crate::types::{Base, FpRule, InsnRule};
    if p & 0xf000 != INSN_MARK {
        return None;
    }
    let cfa_base = if p & 1 << 11 != 0 { Base::Fp } else { Base::Sp };
    let cfa_offset = ((p >> 5) & 0x3f) as i32 * 16;
    let k = ((p >> 2) & 3) as i32;
    let ra = if p & 1 << 4 != 0 {
        k * 8 - cfa_offset
    } else {
        -(k + 1) * 8
    };
    let fp = match p & 3 {
        0 => FpRule::Unchanged,
        1 => FpRule::Unknown,
        2 => FpRule::At(cfa_base, ra + cfa_offset - 8),
        _ => return None,
    };
    Some(InsnRule {
        cfa_base,
        cfa_offset,
        ra_at_cfa: Some(ra),
        ret_pop: 0,
        fp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_code_rules_pack_in_their_own_words() {
        use crate::types::{Base, FpRule, InsnRule};
        let rule = |cfa_base, cfa_offset, ra: i32, fp| InsnRule {
            cfa_base,
            cfa_offset,
            ra_at_cfa: Some(ra),
            ret_pop: 0,
            fp,
        };
        for r in [
            // gcc: `stp x29, x30, [sp, #-48]!` (then `mov x29, sp`).
            rule(Base::Sp, 48, -40, FpRule::At(Base::Sp, 0)),
            rule(Base::Fp, 48, -40, FpRule::At(Base::Fp, 0)),
            // RISC-V: `addi sp, sp, -32; sd ra, 24(sp); sd s0, 16(sp)`, then
            // `addi s0, sp, 32`.
            rule(Base::Sp, 32, -8, FpRule::At(Base::Sp, 16)),
            rule(Base::Fp, 0, -8, FpRule::At(Base::Fp, -16)),
            // `str x30, [sp, #-16]!` without a frame pointer; a leaf-ish
            // frame that clobbers the frame pointer.
            rule(Base::Sp, 16, -16, FpRule::Unchanged),
            rule(Base::Sp, 1008, -8, FpRule::Unknown),
        ] {
            let p = pack_insn(&r).unwrap_or_else(|| panic!("{r:?}"));
            assert_eq!(p & 0xf000, INSN_MARK);
            assert_eq!(unpack_insn(p), Some(r));
            // The CFI reads it as no CFI; the hot loop has no rule for it.
            assert_eq!(Aarch64::unpack(p), UnwindRuleAarch64::NoCfi);
            assert_eq!(decode_fast(p), None);
            assert_ne!(p, PACKED_END);
            assert_ne!(p, INSN_UNPACKED);
        }
        assert_eq!(unpack_insn(INSN_UNPACKED), None);
        assert_eq!(Aarch64::unpack(INSN_UNPACKED), UnwindRuleAarch64::NoCfi);
        for r in [
            rule(Base::Sp, 1024, -8, FpRule::Unchanged),
            rule(Base::Sp, 24, -8, FpRule::Unchanged),
            rule(Base::Sp, 96, -48, FpRule::Unchanged),
            rule(Base::Sp, 48, -40, FpRule::At(Base::Fp, 0)),
            rule(Base::Sp, 48, -40, FpRule::Value(Base::Sp, 0)),
        ] {
            assert_eq!(pack_insn(&r), None, "{r:?}");
        }
        let mut leaf = rule(Base::Sp, 0, -8, FpRule::Unchanged);
        leaf.ra_at_cfa = None;
        assert_eq!(pack_insn(&leaf), None);
        // No rule of the CFI packs as one.
        for r in [
            UnwindRuleAarch64::End,
            UnwindRuleAarch64::NoCfi,
            UnwindRuleAarch64::Evaluate,
            UnwindRuleAarch64::SignalFrame,
            UnwindRuleAarch64::Sp {
                cfa: 48,
                ra: -40,
                fp: -48,
            },
            UnwindRuleAarch64::Fp {
                cfa: 16,
                ra: 0,
                fp: 0,
            },
        ] {
            assert_eq!(unpack_insn(Aarch64::pack(r)), None, "{r:?}");
        }
    }

    #[test]
    fn pack_round_trips() {
        use UnwindRuleAarch64 as R;
        let narrow = [
            // gcc: `stp x29, x30, [sp, #-n]!` at the bottom of the frame.
            R::Sp {
                cfa: 48,
                ra: -40,
                fp: -48,
            },
            // gcc without a frame pointer: `str x30, [sp, #-16]!`.
            R::Sp {
                cfa: 16,
                ra: -16,
                fp: 0,
            },
            R::Sp {
                cfa: 432,
                ra: -432,
                fp: 0,
            },
            // clang: the frame record at the top, then `add x29, sp, #n`.
            R::Fp {
                cfa: 16,
                ra: -8,
                fp: -16,
            },
            R::Sp {
                cfa: 8000,
                ra: -8,
                fp: -16,
            },
            R::Sp {
                cfa: 5024,
                ra: -5016,
                fp: -5024,
            },
            // The frame record one word above sp.
            R::Sp {
                cfa: 96,
                ra: -80,
                fp: -88,
            },
            // Leaves and prologues: the return address still in x30.
            R::Sp {
                cfa: 0,
                ra: 0,
                fp: 0,
            },
            R::Sp {
                cfa: 64,
                ra: 0,
                fp: 0,
            },
            R::Fp {
                cfa: 32,
                ra: 0,
                fp: 0,
            },
            R::End,
            R::NoCfi,
            R::Evaluate,
            R::SignalFrame,
        ];
        for r in narrow {
            let p = Aarch64::pack(r);
            assert_ne!(p, 0, "{r:?}");
            assert_eq!(Aarch64::unpack(p), r, "{r:?} -> {p:#x}");
            // Saved return addresses are the hot loop's forms.
            let saved = matches!(r, R::Sp { ra, .. } | R::Fp { ra, .. } if ra != 0);
            assert_eq!(decode_fast(p).is_some(), saved, "{r:?}");
            if saved {
                assert_eq!(decode_fast(p), fast_form(r));
            }
        }
        // Too wide for 16 bits: wide words.
        let wide = [
            R::Sp {
                cfa: 70016,
                ra: -70008,
                fp: -70016,
            },
            R::Sp {
                cfa: 9024,
                ra: -9016,
                fp: -9024,
            },
            R::Sp {
                cfa: 128,
                ra: -8,
                fp: -64,
            },
            R::Sp {
                cfa: 9000 * 8,
                ra: -8,
                fp: 0,
            },
        ];
        for r in wide {
            assert_eq!(Aarch64::pack(r), 0, "{r:?}");
            let w = wide_word(r).unwrap_or_else(|| panic!("{r:?}"));
            assert_ne!(w, 0);
            assert_eq!(Some(decode_wide(w)), fast_form(r));
            assert_eq!(from_wide_word(w), r, "{w:#x}");
        }
        // Not applied by the hot loop: x29 above x30, a saved word at the
        // CFA, odd offsets, the return address in x30.
        for r in [
            R::Sp {
                cfa: 32,
                ra: -16,
                fp: -8,
            },
            R::Sp {
                cfa: 32,
                ra: 0,
                fp: -16,
            },
            R::Sp {
                cfa: 32,
                ra: 8,
                fp: 0,
            },
            R::Sp {
                cfa: 12,
                ra: -4,
                fp: 0,
            },
        ] {
            assert_eq!(fast_form(r), None, "{r:?}");
            assert_eq!(wide_word(r), None, "{r:?}");
        }
        assert_eq!(PACKED_END, Aarch64::pack(R::End));
    }
}
