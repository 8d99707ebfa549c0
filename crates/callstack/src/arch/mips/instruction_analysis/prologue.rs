//! MIPS32 prologue analysis.

use super::insn_at;
use crate::unwind::insn::{Base, CodeMemory, FpRule, InsnRule};

/// How far back (in instructions) the start of a function is looked for.
pub const MAX_BACK: u64 = 4096;
/// How many instructions from the start to the pc are followed.
pub const MAX_FORWARD: u64 = 8192;

const ADDIU_SP_SP: u32 = 0x27bd; // addiu sp, sp, imm
const SW_RA_SP: u32 = 0xafbf; // sw ra, imm(sp)
const SW_S8_SP: u32 = 0xafbe; // sw s8, imm(sp)
const LW_RA_SP: u32 = 0x8fbf; // lw ra, imm(sp)
const LW_S8_SP: u32 = 0x8fbe; // lw s8, imm(sp)
const JR_RA: u32 = 0x03e0_0008;

fn imm(i: u32) -> i64 {
    (i & 0xffff) as i16 as i64
}

fn is_call(i: u32) -> bool {
    i & 0xfc00_0000 == 0x0c00_0000
        || i & 0xffff_0000 == 0x0411_0000
        || i & 0xfc1f_f83f == 0x0000_f809
}

/// The nearest `addiu sp, sp, -N` before `pc` (seed 000's scan).
fn find_start<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> Option<u64> {
    let mut a = pc & !3;
    for _ in 0..MAX_BACK {
        a = a.checked_sub(4)?;
        let i = insn_at(code, a)?;
        if i >> 16 == ADDIU_SP_SP && imm(i) < 0 {
            return Some(a);
        }
    }
    None
}

/// The rule at `pc`, from the function's `entry` (or the allocation found
/// by scanning back). `first`: the pc is exact, so a function that has not
/// saved `ra` (a leaf) returns through the register.
///
/// ```text
/// entry: 27bdffe0   addiu sp, sp, -32
///        afbf001c   sw    ra, 28(sp)
/// pc:    ...        => CFA = sp + 32, ra at CFA - 4
/// ```
pub fn analyze<C: CodeMemory + ?Sized>(
    code: &mut C,
    pc: u64,
    entry: Option<u64>,
    first: bool,
) -> Option<InsnRule> {
    let start = crate::unwind::insn::risc::function_start(entry, pc, MAX_FORWARD * 4, || {
        find_start(code, pc)
    })?;
    let mut d: i64 = 0;
    let mut ra_slot: Option<i64> = None;
    let mut fp_slot: Option<i64> = None;
    let mut fp_val: Option<i64> = None; // s8 - entry sp
    let mut pre_epilogue: Option<(i64, Option<i64>, Option<i64>, Option<i64>)> = None;
    let mut restore_after_slot = false;
    let mut a = start;
    while a < pc {
        let i = insn_at(code, a)?;
        let hi = i >> 16;
        let epilogue_op = (hi == ADDIU_SP_SP && imm(i) > 0) || hi == LW_RA_SP || hi == LW_S8_SP;
        if epilogue_op && pre_epilogue.is_none() {
            pre_epilogue = Some((d, ra_slot, fp_slot, fp_val));
        }
        if is_call(i) {
            pre_epilogue = None;
        }
        match hi {
            ADDIU_SP_SP => d += imm(i),
            SW_RA_SP => ra_slot = Some(d + imm(i)),
            SW_S8_SP => fp_slot = Some(d + imm(i)),
            LW_RA_SP => ra_slot = None,
            LW_S8_SP => {
                fp_slot = None;
                fp_val = None;
            }
            _ => {}
        }
        // move s8, sp (or / addu s8, sp, zero)
        if i == 0x03a0_f025 || i == 0x03a0_f021 {
            fp_val = Some(d);
        }
        let was_restore = restore_after_slot;
        restore_after_slot = i == JR_RA;
        if was_restore {
            // The delay slot of `jr ra` ran: code after it is reached by a
            // branch, with the frame as before the epilogue.
            if let Some(st) = pre_epilogue.take() {
                (d, ra_slot, fp_slot, fp_val) = st;
            }
        }
        a += 4;
    }
    if ra_slot.is_none() && !first {
        return None;
    }
    let _ = fp_val;
    Some(InsnRule {
        cfa_base: Base::Sp,
        cfa_offset: (-d) as i32,
        ra_at_cfa: ra_slot.map(|s| s as i32),
        ret_pop: 0,
        fp: match fp_slot {
            Some(s) => FpRule::At(Base::Sp, (s - d) as i32),
            None => FpRule::Unchanged,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::insn::SliceCode;

    fn code(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn seed_000_prologue() {
        // 1000: 3c1c000a   lui   gp, 0xa
        // 1004: 27bdffe0   addiu sp, sp, -32
        // 1008: afb00018   sw    s0, 24(sp)
        // 100c: afbf001c   sw    ra, 28(sp)
        // 1010: 0320f809   jalr  t9
        // 1014: 00000000   nop
        // 1018: ...        <- pc (return address)
        let b = code(&[
            0x3c1c000a, 0x27bdffe0, 0xafb00018, 0xafbf001c, 0x0320f809, 0, 0,
        ]);
        let mut c = SliceCode::new(0x1000, &b);
        let r = analyze(&mut c, 0x1018, None, false).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (32, Some(-4)));
        assert_eq!(
            super::super::call_before(&mut c, 0x1018),
            Some(crate::unwind::insn::scan::CallBefore::Indirect)
        );
    }

    #[test]
    fn after_mid_function_return() {
        // 1000: 27bdffe8   addiu sp, sp, -24
        // 1004: afbf0014   sw    ra, 20(sp)
        // 1008: 8fbf0014   lw    ra, 20(sp)
        // 100c: 03e00008   jr    ra
        // 1010: 27bd0018   addiu sp, sp, 24    (delay slot)
        // 1014: 00000000   nop                 <- pc, frame still set up
        let b = code(&[
            0x27bdffe8, 0xafbf0014, 0x8fbf0014, 0x03e00008, 0x27bd0018, 0,
        ]);
        let r = analyze(&mut SliceCode::new(0x1000, &b), 0x1014, Some(0x1000), false).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (24, Some(-4)));
    }

    #[test]
    fn leaf() {
        // 1000: 00851021   addu v0, a0, a1   <- pc
        // 1004: 03e00008   jr   ra
        let b = code(&[0x00851021, 0x03e00008, 0]);
        let r = analyze(&mut SliceCode::new(0x1000, &b), 0x1000, Some(0x1000), true).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (0, None));
    }

    #[test]
    fn jal_and_bal_targets() {
        // 1000: 0c000500   jal  0x1400
        // 1004: 00000000   nop
        // 1008: 0411fffd   bal  0x1000 (1008 + 4 - 12)
        // 100c: 00000000   nop
        let b = code(&[0x0c000500, 0, 0x0411fffd, 0, 0]);
        let mut c = SliceCode::new(0x1000, &b);
        use crate::unwind::insn::scan::CallBefore::Direct;
        assert_eq!(
            super::super::call_before(&mut c, 0x1008),
            Some(Direct(0x1400))
        );
        assert_eq!(
            super::super::call_before(&mut c, 0x1010),
            Some(Direct(0x1000))
        );
    }
}
