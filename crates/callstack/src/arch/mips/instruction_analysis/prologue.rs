//! MIPS32 prologue analysis.

use super::insn_at;
use crate::types::{Base, CodeMemory, FpRule, InsnRule};

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

/// `subu sp, sp, rt` (a frame too big for `addiu`'s 16-bit immediate);
/// `Some(rt)`.
fn subu_sp_sp(i: u32) -> Option<u32> {
    (i & 0xffe0_ffff == 0x03a0_e823).then_some((i >> 16) & 31)
}

/// `addu sp, sp, rt` (a big frame's release); `Some(rt)`.
fn addu_sp_sp(i: u32) -> Option<u32> {
    (i & 0xffe0_ffff == 0x03a0_e821).then_some((i >> 16) & 31)
}

/// Whether `i` allocates stack: `addiu sp, sp, -N` or `subu sp, sp, rt`.
fn allocates(i: u32) -> bool {
    (i >> 16 == ADDIU_SP_SP && imm(i) < 0) || subu_sp_sp(i).is_some()
}

/// How far (in instructions) before an allocation a first one of the same
/// prologue may lie: a frame over 32 KiB is allocated in two steps
/// (`addiu sp, sp, -32752`, saves, then `addiu` again or `lui`/`ori` and
/// `subu sp, sp, rt`).
const SPLIT_ALLOCATION: u64 = 24;

/// The start of the frame allocation before `pc` (seed 000's scan): the
/// nearest `addiu sp, sp, -N` or `subu sp, sp, rt`, or the first step of
/// a big frame's two-step allocation just before it.
fn find_start<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> Option<u64> {
    let mut a = pc & !3;
    for _ in 0..MAX_BACK {
        a = a.checked_sub(4)?;
        let i = insn_at(code, a)?;
        if allocates(i) {
            // An earlier step of the same prologue (no return in between)?
            let mut b = a;
            for _ in 0..SPLIT_ALLOCATION {
                let Some(prev) = b.checked_sub(4) else { break };
                let Some(j) = insn_at(code, prev) else { break };
                // Any `jr` (a return or a tail call) ends the previous function.
                if j & 0xfc1f_ffff == 0x0000_0008 {
                    break;
                }
                b = prev;
                // The first step of a split allocation is near addiu's
                // limit (gcc: -32752); a small one is another function's.
                if j >> 16 == ADDIU_SP_SP && imm(j) < -16384 {
                    return Some(b);
                }
            }
            return Some(a);
        }
    }
    None
}

/// The register `i` writes, for the instructions that matter to tracking
/// constants: SPECIAL/SPECIAL2 (`rd`), immediate arithmetic and logic,
/// `lui`, loads (`rt`).
fn written(i: u32) -> Option<u32> {
    let op = i >> 26;
    match op {
        0 | 0x1c => Some((i >> 11) & 31),
        0x08..=0x0f | 0x20..=0x26 => Some((i >> 16) & 31),
        _ => None,
    }
}

/// Tracks `lui`/`ori`/`addiu` constants in registers (a big frame's size
/// before `subu sp, sp, rt`).
#[derive(Clone, Copy)]
struct Consts([Option<i64>; 32]);

impl Consts {
    fn get(&self, r: u32) -> Option<i64> {
        if r == 0 {
            Some(0)
        } else {
            self.0[r as usize & 31]
        }
    }

    fn step(&mut self, i: u32) {
        let op = i >> 26;
        let rs = (i >> 21) & 31;
        let v = match op {
            // lui rt, imm
            0x0f => Some(((i & 0xffff) as i64) << 16),
            // ori rt, rs, imm
            0x0d => self.get(rs).map(|x| x | (i & 0xffff) as i64),
            // addiu rt, rs, imm
            0x09 => self.get(rs).map(|x| x.wrapping_add(imm(i))),
            _ => None,
        };
        if let Some(w) = written(i) {
            if w != 0 {
                self.0[w as usize] = if matches!(op, 0x0f | 0x0d | 0x09) {
                    v.map(|x| x as i32 as i64)
                } else {
                    None
                };
            }
        }
    }
}

/// A tracked offset from the entry sp, if known.
type Tracked = Option<i64>;

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
    let start =
        crate::arch::risc::function_start(entry, pc, MAX_FORWARD * 4, || find_start(code, pc))?;
    let mut d: i64 = 0;
    let mut ra_slot: Option<i64> = None;
    let mut fp_slot: Option<i64> = None;
    let mut fp_val: Option<i64> = None; // s8 - entry sp
                                        // sp - entry sp, the slots of ra and s8, s8 - entry sp.
    let mut pre_epilogue: Option<(i64, Tracked, Tracked, Tracked)> = None;
    let mut restore_after_slot = false;
    let mut consts = Consts([None; 32]);
    let mut a = start;
    while a < pc {
        let i = insn_at(code, a)?;
        let hi = i >> 16;
        // A big frame's size, from a register: `subu sp, sp, rt` allocates,
        // `addu sp, sp, rt` releases.
        let by_reg = subu_sp_sp(i)
            .and_then(|r| consts.get(r))
            .map(|v| -v)
            .or_else(|| addu_sp_sp(i).and_then(|r| consts.get(r)));
        if (subu_sp_sp(i).is_some() || addu_sp_sp(i).is_some()) && by_reg.is_none() {
            // The stack moves by an amount not known here.
            return None;
        }
        let epilogue_op = (hi == ADDIU_SP_SP && imm(i) > 0)
            || by_reg.is_some_and(|v| v > 0)
            || hi == LW_RA_SP
            || hi == LW_S8_SP;
        if epilogue_op && pre_epilogue.is_none() {
            pre_epilogue = Some((d, ra_slot, fp_slot, fp_val));
        }
        if is_call(i) {
            pre_epilogue = None;
        }
        if let Some(v) = by_reg {
            d += v;
        }
        consts.step(i);
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
    use crate::types::SliceCode;

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
            Some(crate::types::CallBefore::Indirect)
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

    /// gcc -O2's prologue of a frame over 64 KiB (`char b[100000]`).
    const HUGE: [u32; 29] = [
        0x3c1c0000, // 00 lui   gp, 0x0
        0x279c0000, // 04 addiu gp, gp, 0
        0x0399e021, // 08 addu  gp, gp, t9
        0x27bd8010, // 0c addiu sp, sp, -32752
        0x8f990000, // 10 lw    t9, 0(gp)
        0x3c030001, // 14 lui   v1, 0x1
        0x3c060001, // 18 lui   a2, 0x1
        0x346306d8, // 1c ori   v1, v1, 0x6d8
        0xafbf7fec, // 20 sw    ra, 32748(sp)
        0xafb17fe8, // 24 sw    s1, 32744(sp)
        0x00808825, // 28 move  s1, a0
        0xafb07fe4, // 2c sw    s0, 32740(sp)
        0x03a3e823, // 30 subu  sp, sp, v1
        0x02202825, // 34 move  a1, s1
        0x27b00018, // 38 addiu s0, sp, 24
        0xafbc0010, // 3c sw    gp, 16(sp)
        0x34c686a0, // 40 ori   a2, a2, 0x86a0
        0x0320f809, // 44 jalr  t9
        0x02002025, // 48 move  a0, s0
        0x02002025, // 4c move  a0, s0       <- return address
        0x8fbc0010, // 50 lw    gp, 16(sp)
        0x8f990000, // 54 lw    t9, 0(gp)
        0x0320f809, // 58 jalr  t9
        0x02118021, // 5c addu  s0, s0, s1
        0x3c080001, // 60 lui   t0, 0x1
        0x82030000, // 64 lb    v1, 0(s0)
        0x350806d8, // 68 ori   t0, t0, 0x6d8
        0x03a8e821, // 6c addu  sp, sp, t0
        0x8fbf7fec, // 70 lw    ra, 32748(sp)   <- pc: frame down to 32752
    ];

    #[test]
    fn big_frame_lui_ori_subu() {
        let b = code(&HUGE);
        let mut c = SliceCode::new(0x1000, &b);
        // 32752 + 0x106d8 = 100040; ra at 32748 - 32752 = -4.
        for entry in [Some(0x1000), None] {
            let r = analyze(&mut c, 0x104c, entry, false).unwrap();
            assert_eq!(
                (r.cfa_offset, r.ra_at_cfa),
                (100_040, Some(-4)),
                "{entry:?}"
            );
        }
        // Found by scanning back: the first step of the allocation.
        assert_eq!(find_start(&mut c, 0x104c), Some(0x100c));
        // In the epilogue, after `addu sp, sp, t0`.
        let r = analyze(&mut c, 0x1070, Some(0x1000), true).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (32752, Some(-4)));
    }

    #[test]
    fn big_frame_two_addiu() {
        // gcc -O0, `char buf[40000]`:
        let b = code(&[
            0x27bd8010, // 00 addiu sp, sp, -32752
            0xafbf7fec, // 04 sw    ra, 32748(sp)
            0xafbe7fe8, // 08 sw    s8, 32744(sp)
            0x27bde388, // 0c addiu sp, sp, -7288
            0x03a0f025, // 10 move  s8, sp
            0x0c000400, // 14 jal   0x1000
            0x00000000, // 18 nop
            0x00000000, // 1c                   <- return address
        ]);
        let mut c = SliceCode::new(0x1000, &b);
        assert_eq!(find_start(&mut c, 0x101c), Some(0x1000));
        let r = analyze(&mut c, 0x101c, None, false).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (40040, Some(-4)));
        assert_eq!(r.fp, FpRule::At(Base::Sp, 40040 - 8));
    }

    #[test]
    fn li_then_subu() {
        // li v0, 0x9c68 (ori v0, zero, 0x9c68); subu sp, sp, v0;
        // sw ra, 0x1000(sp)
        let b = code(&[0x34029c68, 0x03a2e823, 0xafbf1000, 0, 0]);
        let r = analyze(&mut SliceCode::new(0x1000, &b), 0x1010, Some(0x1000), false).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (0x9c68, Some(0x1000 - 0x9c68)));
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
        use crate::types::CallBefore::Direct;
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
