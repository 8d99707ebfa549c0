//! AArch64 prologue analysis.

use super::insn_at;
use crate::types::{Base, CodeMemory, FpRule, InsnRule};

/// How far back (in instructions) the start of a function is looked for.
pub const MAX_BACK: u64 = 4096;
/// How many instructions from the start to the pc are followed.
pub const MAX_FORWARD: u64 = 4096;

const SP: u32 = 31;
const FP: u32 = 29;
const LR: u32 = 30;

fn sext(v: u32, bits: u32) -> i64 {
    ((v << (32 - bits)) as i32 >> (32 - bits)) as i64
}

/// What one instruction does to the stack, as far as the prologue goes.
#[derive(Debug, PartialEq, Eq)]
enum Op {
    /// sp += delta (negative: allocation).
    Sp(i64),
    /// sp -= xN.
    SpMinusReg(u32),
    /// sp += xN.
    SpPlusReg(u32),
    /// sp -= or += a register extended or shifted (`sub sp, sp, w0,
    /// sxtw`): an amount the analysis does not follow. `true`: a `sub`.
    SpByExtended(bool),
    /// Stores of (reg, offset from sp after any writeback) with writeback
    /// delta first.
    Store {
        wb: i64,
        regs: [(u32, i64); 2],
        n: usize,
    },
    /// Loads (an epilogue restoring registers), with writeback.
    Load {
        wb: i64,
        regs: [(u32, i64); 2],
        n: usize,
    },
    /// xD = sp + imm.
    FpFromSp(i64),
    /// xN = constant (movz) or constant |= imm << shift (movk).
    MovZ(u32, i64),
    MovK(u32, u32, i64),
    /// ret.
    Ret,
    Other,
}

fn decode(i: u32) -> Op {
    let rn = (i >> 5) & 31;
    let rd = i & 31;
    // STP/LDP (64-bit): opc=10, 101 0 0xx L imm7 Rt2 Rn Rt
    if i & 0xfe00_0000 == 0xa800_0000 && rn == SP {
        let mode = (i >> 23) & 3; // 01 post, 10 offset, 11 pre
        let load = i & (1 << 22) != 0;
        let imm = sext((i >> 15) & 0x7f, 7) * 8;
        let rt2 = (i >> 10) & 31;
        let (wb, off) = match mode {
            1 => (imm, 0), // post-index: access at sp, then sp += imm
            2 => (0, imm), // signed offset
            3 => (imm, 0), // pre-index: sp += imm, access at new sp
            _ => return Op::Other,
        };
        let regs = [(rd, off), (rt2, off + 8)];
        if load {
            return Op::Load {
                wb: if mode == 1 { imm } else { wb },
                regs,
                n: 2,
            };
        }
        if mode == 1 {
            // post-index store: store at old sp then move.
            return Op::Store { wb: 0, regs, n: 2 };
        }
        return Op::Store { wb, regs, n: 2 };
    }
    // STR/LDR x (imm, unsigned offset): 1111 1001 0L imm12 Rn Rt
    if i & 0xff80_0000 == 0xf900_0000 && rn == SP {
        let load = i & (1 << 22) != 0;
        let off = (((i >> 10) & 0xfff) * 8) as i64;
        let regs = [(rd, off), (0, 0)];
        return if load {
            Op::Load { wb: 0, regs, n: 1 }
        } else {
            Op::Store { wb: 0, regs, n: 1 }
        };
    }
    // STR/LDR x pre/post-index: 1111 1000 0L0 imm9 p1 Rn Rt (p: 11 pre, 01 post)
    if i & 0xffa0_0400 == 0xf800_0400 && rn == SP {
        let load = i & (1 << 22) != 0;
        let imm = sext((i >> 12) & 0x1ff, 9);
        let pre = i & 0x800 != 0;
        let regs = [(rd, 0), (0, 0)];
        return if load {
            Op::Load {
                wb: imm,
                regs,
                n: 1,
            }
        } else if pre {
            Op::Store {
                wb: imm,
                regs,
                n: 1,
            }
        } else {
            Op::Other
        };
    }
    // ADD/SUB (immediate, 64-bit): sf 1, op, S 0, 100010, sh, imm12, Rn, Rd
    if i & 0xbf80_0000 == 0x9100_0000 {
        let sub = i & 0x4000_0000 != 0;
        let sh = (i >> 22) & 1;
        let imm = (((i >> 10) & 0xfff) as i64) << (12 * sh);
        if rn == SP && rd == SP {
            return Op::Sp(if sub { -imm } else { imm });
        }
        if rn == SP && rd == FP && !sub {
            return Op::FpFromSp(imm);
        }
        return Op::Other;
    }
    // ADD/SUB (extended register, 64-bit) sp, sp, xM (uxtx, no shift);
    // other extensions (`w0, sxtw`) or shifts: an amount not followed.
    if i & 0xbfe0_0000 == 0x8b20_0000 && rn == SP && rd == SP {
        let rm = (i >> 16) & 31;
        let sub = i & 0x4000_0000 != 0;
        if i & 0xfc00 != 0x6000 {
            return Op::SpByExtended(sub);
        }
        return if sub {
            Op::SpMinusReg(rm)
        } else {
            Op::SpPlusReg(rm)
        };
    }
    // MOVZ / MOVK (64-bit)
    if i & 0xff80_0000 == 0xd280_0000 {
        let hw = (i >> 21) & 3;
        return Op::MovZ(rd, (((i >> 5) & 0xffff) as i64) << (16 * hw));
    }
    if i & 0xff80_0000 == 0xf280_0000 {
        let hw = (i >> 21) & 3;
        return Op::MovK(rd, 16 * hw, ((i >> 5) & 0xffff) as i64);
    }
    if i == 0xd65f_03c0 || i == 0xd65f_0bff || i == 0xd65f_0fff {
        return Op::Ret;
    }
    Op::Other
}

/// Whether `i` allocates stack (a function's first frame instruction).
fn allocates(i: u32) -> bool {
    match decode(i) {
        Op::Sp(d) => d < 0,
        Op::SpMinusReg(_) | Op::SpByExtended(true) => true,
        Op::Store { wb, .. } => wb < 0,
        _ => false,
    }
}

/// Finds the start of the function holding `pc`: the nearest stack
/// allocation before it (and any allocation or constant load right before
/// that one). A `ret` on the way is not a stop: functions return from the
/// middle too; the caller checks the result (the return address must follow
/// a call).
fn find_start<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> Option<u64> {
    let mut a = pc & !3;
    for _ in 0..MAX_BACK {
        a = a.checked_sub(4)?;
        let i = insn_at(code, a)?;
        if allocates(i) {
            // Extend over a preceding allocation or `mov xN, #imm`.
            let mut s = a;
            for _ in 0..3 {
                let Some(p) = s.checked_sub(4) else { break };
                let Some(pi) = insn_at(code, p) else { break };
                if allocates(pi) || matches!(decode(pi), Op::MovZ(..) | Op::MovK(..)) {
                    s = p;
                } else {
                    break;
                }
            }
            return Some(s);
        }
    }
    None
}

/// Whether `pc` lies in a PLT entry (`Some(true)`: the one of PLT0, right
/// after its `stp x16, x30, [sp, #-16]!`), in the forms ld writes: the
/// standard one, with `bti c` first (`-z force-bti`), with the address
/// authenticated before the branch (`-z pac-plt`), or both:
///
/// ```text
/// (bti c)                 d503245f
/// adrp x16, page          90000010 | immediates
/// ldr  x17, [x16, #off]   f9400211 | offset
/// add  x16, x16, #off     91000210 | offset
/// (autia1716 | autib1716) d503219f | d50321df
/// br   x17                d61f0220
/// ```
///
/// At PLT0's own `bti c`, before its `stp`, nothing is pushed yet
/// (`Some(false)`).
fn plt_entry<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> Option<bool> {
    const BTI_C: u32 = 0xd503_245f;
    const PLT0_STP: u32 = 0xa9bf_7bf0;
    let pc = pc & !3;
    if insn_at(code, pc) == Some(BTI_C) && insn_at(code, pc + 4) == Some(PLT0_STP) {
        return plt_form(code, pc + 8).map(|_| false);
    }
    let start = (0..6u64).find_map(|k| {
        let start = pc.checked_sub(4 * k)?;
        plt_form(code, start)
            .is_some_and(|len| k < len)
            .then_some(start)
    })?;
    let plt0 = start
        .checked_sub(4)
        .and_then(|a| insn_at(code, a))
        .is_some_and(|i| i == PLT0_STP);
    Some(plt0)
}

/// The number of instructions of a PLT entry's form (see [`plt_entry`])
/// starting at `start`, if one does.
fn plt_form<C: CodeMemory + ?Sized>(code: &mut C, start: u64) -> Option<u64> {
    const BTI_C: u32 = 0xd503_245f;
    const AUT_1716: [u32; 2] = [0xd503_219f, 0xd503_21df];
    const CORE: [(u32, u32); 3] = [
        (0x9f00_001f, 0x9000_0010),
        (0xffc0_03ff, 0xf940_0211),
        (0xffc0_03ff, 0x9100_0210),
    ];
    const BR_X17: u32 = 0xd61f_0220;
    let mut at = start;
    if insn_at(code, at) == Some(BTI_C) {
        at += 4;
    }
    for (mask, bits) in CORE {
        if insn_at(code, at)? & mask != bits {
            return None;
        }
        at += 4;
    }
    if insn_at(code, at).is_some_and(|i| AUT_1716.contains(&i)) {
        at += 4;
    }
    (insn_at(code, at)? == BR_X17).then_some((at + 4 - start) / 4)
}

/// What the analysis tracks: sp - entry sp, whether sp is known, x29 -
/// entry sp, and the slots of x30 and x29 (relative to the entry sp).
type Tracked = (i64, bool, Option<i64>, Option<i64>, Option<i64>);

/// The rule at `pc`, from the function's `entry` (or the start found by
/// scanning back). `first`: the pc is exact (an innermost frame), so a
/// function that has not saved x30 yet returns through the register.
///
/// ```text
/// entry: a9be7bfd   stp x29, x30, [sp, #-32]!
///        910003fd   mov x29, sp
/// pc:    ...        => CFA = sp + 32, x30 at CFA - 32 + 8, x29 at CFA - 32
/// ```
pub fn analyze<C: CodeMemory + ?Sized>(
    code: &mut C,
    pc: u64,
    entry: Option<u64>,
    first: bool,
) -> Option<InsnRule> {
    // A PLT entry has no CFI (the linker writes none on AArch64) and no
    // prologue, and scanning back from it finds PLT0's `stp x16, x30`,
    // whose frame is not this one's: at any pc of an entry, sp and x30 are
    // still the caller's (a signal in `memcpy@plt`, say). PLT0 (lazy
    // binding) runs the same four instructions after that `stp`, which has
    // pushed 16 bytes with x30 in the upper half.
    if first {
        match plt_entry(code, pc) {
            Some(false) => {
                return Some(InsnRule {
                    cfa_base: Base::Sp,
                    cfa_offset: 0,
                    ra_at_cfa: None,
                    ret_pop: 0,
                    fp: FpRule::Unchanged,
                })
            }
            Some(true) => {
                return Some(InsnRule {
                    cfa_base: Base::Sp,
                    cfa_offset: 16,
                    ra_at_cfa: Some(-8),
                    ret_pop: 0,
                    fp: FpRule::Unchanged,
                })
            }
            None => {}
        }
    }
    let start =
        crate::arch::risc::function_start(entry, pc, MAX_FORWARD * 4, || find_start(code, pc))?;
    let found = from_start(code, start, pc, first, entry.is_none());
    if entry.is_some() || found.as_ref().is_some_and(|r| r.ra_at_cfa.is_some()) {
        return found;
    }
    // Without a symbol, the start is the nearest allocation before the pc,
    // which may be a later one of the same function: `sub sp, sp, xN` for
    // a variable-length array or `alloca` (x29 then locates the frame), or
    // locals allocated after `stp x29, x30, [sp, #-N]!` and other work. No
    // x30 saved on the path from it: look further back, to an allocation
    // that saves it, as long as no `ret` lies between (another function's
    // end). A frame that saves nothing keeps the first answer (a leaf, at
    // an exact pc, returns through x30).
    let mut at = start;
    for _ in 0..MAX_EARLIER_STARTS {
        let Some(earlier) = find_start(code, at).filter(|&e| pc - e <= MAX_FORWARD * 4) else {
            break;
        };
        if (earlier..at)
            .step_by(4)
            .any(|a| insn_at(code, a).is_some_and(is_ret))
        {
            break;
        }
        let r = from_start(code, earlier, pc, first, true);
        if r.as_ref().is_some_and(|r| r.ra_at_cfa.is_some()) {
            return r;
        }
        at = earlier;
    }
    found
}

/// How many allocations before the nearest one [`analyze`] tries as the
/// function's start when the nearest saves no return address.
const MAX_EARLIER_STARTS: usize = 4;

/// Whether `i` is `ret` (to x30, or `retaa`/`retab`).
fn is_ret(i: u32) -> bool {
    matches!(decode(i), Op::Ret)
}

/// Where an instruction may send control other than to the next one, for
/// telling a guessed start's function from the one after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// Only to the next instruction (or a call, which comes back).
    Next,
    /// A branch to a known address (`b`, `b.cond`, `cbz`/`cbnz`,
    /// `tbz`/`tbnz`).
    To(u64),
    /// A jump through a register (`br`, `braa`...): anywhere.
    Anywhere,
}

/// The [`Flow`] of the instruction `i` at `a`.
fn flow(i: u32, a: u64) -> Flow {
    let to = |off: i64| Flow::To(a.wrapping_add(off as u64));
    if i & 0xfc00_0000 == 0x1400_0000 {
        to(sext(i & 0x03ff_ffff, 26) * 4) // b
    } else if i & 0xff00_0010 == 0x5400_0000 || i & 0x7e00_0000 == 0x3400_0000 {
        to(sext((i >> 5) & 0x7_ffff, 19) * 4) // b.cond, cbz, cbnz
    } else if i & 0x7e00_0000 == 0x3600_0000 {
        to(sext((i >> 5) & 0x3fff, 14) * 4) // tbz, tbnz
    } else if i & 0xffff_fc1f == 0xd61f_0000 || i & 0xfeff_f800 == 0xd61f_0800 {
        Flow::Anywhere // br xN; braa/brab/braaz/brabz
    } else {
        Flow::Next
    }
}

/// [`analyze`] from a given start: the path from `start` to `pc`.
/// `guessed`: the start was found by scanning back, not given by a
/// symbol, and may be another function's.
fn from_start<C: CodeMemory + ?Sized>(
    code: &mut C,
    start: u64,
    pc: u64,
    first: bool,
    guessed: bool,
) -> Option<InsnRule> {
    let mut d: i64 = 0; // sp - entry sp
    let mut sp_known = true;
    let mut fp_val: Option<i64> = None; // x29 - entry sp
    let mut ra_slot: Option<i64> = None; // relative to entry sp
    let mut fp_slot: Option<i64> = None;
    let mut consts = [None::<i64>; 32];
    // The state before a tentative epilogue (loads of x29/x30, sp going
    // up): if a `ret` follows, the code after it is reached by a branch
    // with the frame still set up, so the state is restored from here.
    let mut pre_epilogue: Option<Tracked> = None;
    // Code after a return is entered, if it belongs to the same function,
    // by a forward branch from before the return (any later backward
    // branch into it is itself reached that way first): when no branch
    // seen so far goes past a return (`reach`, the furthest forward
    // target), a guessed start was another function's, and the walk begins
    // again after that return (or after a jump back, which ends a path the
    // same way). After a jump through a register (a table) every return
    // keeps the mid-function reading.
    let mut reach = 0u64;
    let mut anywhere = false;
    let mut a = start;
    while a < pc {
        let i = insn_at(code, a)?;
        let op = decode(i);
        let fl = flow(i, a);
        let ends = match (&op, fl) {
            (Op::Ret, _) => true,
            (_, Flow::To(t)) => i & 0xfc00_0000 == 0x1400_0000 && t <= a,
            _ => false,
        };
        if ends && guessed && !anywhere && reach <= a {
            (d, sp_known, fp_val, ra_slot, fp_slot) = (0, true, None, None, None);
            consts = [None; 32];
            pre_epilogue = None;
            reach = 0;
            a += 4;
            continue;
        }
        match fl {
            Flow::To(t) if t > a => reach = reach.max(t),
            Flow::Anywhere => anywhere = true,
            _ => {}
        }
        let epilogue_op = match &op {
            Op::Sp(k) => *k > 0,
            Op::SpPlusReg(_) | Op::SpByExtended(false) => true,
            Op::Load { wb, regs, n } => {
                *wb > 0 || regs[..*n].iter().any(|r| r.0 == LR || r.0 == FP)
            }
            _ => false,
        };
        if epilogue_op && pre_epilogue.is_none() {
            pre_epilogue = Some((d, sp_known, fp_val, ra_slot, fp_slot));
        }
        if i & 0xfc00_0000 == 0x9400_0000 || i & 0xffff_fc1f == 0xd63f_0000 {
            pre_epilogue = None; // a call: not in an epilogue
        }
        match op {
            Op::Sp(k) => d += k,
            Op::SpMinusReg(r) => match consts[r as usize] {
                Some(k) => d -= k,
                None => sp_known = false,
            },
            Op::SpPlusReg(r) => match consts[r as usize] {
                Some(k) => d += k,
                None => sp_known = false,
            },
            Op::SpByExtended(_) => sp_known = false,
            Op::Store { wb, regs, n } => {
                d += wb;
                for &(r, off) in &regs[..n] {
                    if r == LR {
                        ra_slot = Some(d + off);
                    } else if r == FP {
                        fp_slot = Some(d + off);
                    }
                }
            }
            Op::Load { wb, regs, n } => {
                for &(r, _) in &regs[..n] {
                    if r == LR {
                        ra_slot = None;
                    } else if r == FP {
                        fp_slot = None;
                        fp_val = None;
                    }
                }
                d += wb;
            }
            Op::FpFromSp(k) => fp_val = Some(d + k),
            Op::MovZ(r, v) => consts[r as usize] = Some(v),
            Op::MovK(r, sh, v) => {
                if let Some(c) = consts[r as usize].as_mut() {
                    *c = (*c & !(0xffff << sh)) | (v << sh);
                }
            }
            Op::Ret => {
                // A mid-function epilogue: the code after it runs with the
                // frame still set up. (A `ret` with no frame to undo, on a
                // frameless path: the same state goes on.)
                if let Some(st) = pre_epilogue.take() {
                    (d, sp_known, fp_val, ra_slot, fp_slot) = st;
                }
            }
            Op::Other => {
                let rd = (i & 31) as usize;
                // Writes to a tracked constant register make it unknown.
                consts[rd] = None;
            }
        }
        a += 4;
    }
    if ra_slot.is_none() && !first {
        return None;
    }
    let (cfa_base, cfa_offset, base_delta) = if sp_known {
        (Base::Sp, -d, d)
    } else if let Some(f) = fp_val {
        (Base::Fp, -f, f)
    } else {
        return None;
    };
    let fp = match fp_slot {
        Some(s) => FpRule::At(cfa_base, (s - base_delta) as i32),
        None => FpRule::Unchanged,
    };
    Some(InsnRule {
        cfa_base,
        cfa_offset: cfa_offset as i32,
        ra_at_cfa: ra_slot.map(|s| s as i32),
        ret_pop: 0,
        fp,
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
    fn stp_pre_index() {
        // 1000: a9be7bfd   stp x29, x30, [sp, #-32]!
        // 1004: 910003fd   mov x29, sp
        // 1008: 94000000   bl ...        <- pc
        let b = code(&[0xa9be7bfd, 0x910003fd, 0x94000000]);
        let r = analyze(&mut SliceCode::new(0x1000, &b), 0x1008, None, false).unwrap();
        assert_eq!(r.cfa_base, Base::Sp);
        assert_eq!(r.cfa_offset, 32);
        assert_eq!(r.ra_at_cfa, Some(-24));
        assert_eq!(r.fp, FpRule::At(Base::Sp, 0));
    }

    #[test]
    fn large_frame_record_at_bottom() {
        // gcc -O2 for an 8 KiB frame:
        // 1000: d284040c   mov x12, #0x2020
        // 1004: cb2c63ff   sub sp, sp, x12
        // 1008: d2840002   mov x2, #0x2000
        // 100c: a9007bfd   stp x29, x30, [sp]
        // 1010: 910003fd   mov x29, sp
        // 1014: f9000bf3   str x19, [sp, #16]
        // 1018: 94000000   bl ...        <- pc
        let b = code(&[
            0xd284040c, 0xcb2c63ff, 0xd2840002, 0xa9007bfd, 0x910003fd, 0xf9000bf3, 0x94000000,
        ]);
        // Found by scanning back from the pc (no symbol):
        let r = analyze(&mut SliceCode::new(0x1000, &b), 0x1018, None, false).unwrap();
        assert_eq!(r.cfa_offset, 0x2020);
        assert_eq!(r.ra_at_cfa, Some(-0x2020 + 8));
        assert_eq!(r.fp, FpRule::At(Base::Sp, 0));
    }

    #[test]
    fn sub_then_stp_offset() {
        // 1000: d10083ff   sub sp, sp, #0x20
        // 1004: a9017bfd   stp x29, x30, [sp, #16]
        // 1008: 910043fd   add x29, sp, #0x10
        // 100c: d503201f   nop      <- pc
        let b = code(&[0xd10083ff, 0xa9017bfd, 0x910043fd, 0xd503201f]);
        let r = analyze(&mut SliceCode::new(0x1000, &b), 0x100c, Some(0x1000), false).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (0x20, Some(-8)));
        assert_eq!(r.fp, FpRule::At(Base::Sp, 0x10));
    }

    /// gcc -O2 `main` with a variable-length array, then with `alloca`:
    /// the array is allocated by `sub sp, sp, xN` (or `w0, sxtw`) after the
    /// prologue, the frame is located through x29. Without a symbol, the
    /// nearest allocation before the return address is that `sub`: the
    /// analysis must go back to the `stp x29, x30` that saved x30.
    #[test]
    fn dynamic_allocation_after_the_prologue_without_a_symbol() {
        let previous = [0x9400_0000u32, 0xd65f_03c0, 0xd503_201f]; // bl; ret; nop
        let vla = [
            0x52800c82, // mov w2, #100
            0xa9be7bfd, // stp x29, x30, [sp, #-32]!
            0x52800021, // mov w1, #1
            0x1b027c02, // mul w2, w0, w2
            0x910003fd, // mov x29, sp
            0x11004042, // add w2, w2, #0x10
            0xf9000bf3, // str x19, [sp, #16]
            0x2a0003f3, // mov w19, w0
            0x93407c42, // sxtw x2, w2
            0x91003c40, // add x0, x2, #0xf
            0x927cec00, // and x0, x0, #~15
            0xcb2063ff, // sub sp, sp, x0
            0x910003e0, // mov x0, sp
            0x97ffff57, // bl memset
            0x2a1303e1, // mov w1, w19
            0x910003e0, // mov x0, sp
            0x94000078, // bl f
            0xd0000482, // adrp x2, ...   <- return address
        ];
        let alloca = [
            0xa9be7bfd, // stp x29, x30, [sp, #-32]!
            0x2a0003e1, // mov w1, w0
            0x531a6400, // lsl w0, w0, #6
            0x11004000, // add w0, w0, #0x10
            0x910003fd, // mov x29, sp
            0x4f00e440, // movi v0.16b, #2
            0xf9000bf3, // str x19, [sp, #16]
            0xcb20c3ff, // sub sp, sp, w0, sxtw
            0x910003f3, // mov x19, sp
            0xaa1303e0, // mov x0, x19
            0x3d800260, // str q0, [x19]
            0x9400007d, // bl f
            0xd0000482, // adrp x2, ...   <- return address
        ];
        for main in [&vla[..], &alloca[..]] {
            let words: Vec<u32> = previous.iter().chain(main).copied().collect();
            let b = code(&words);
            let ra = 0x1000 + 4 * (words.len() as u64 - 1);
            let r = analyze(&mut SliceCode::new(0x1000, &b), ra, None, false).unwrap();
            assert_eq!(r.cfa_base, Base::Fp);
            assert_eq!((r.cfa_offset, r.ra_at_cfa), (32, Some(-24)));
            assert_eq!(r.fp, FpRule::At(Base::Fp, 0));
        }
        // A `ret` between the nearest allocation and an earlier one: the
        // earlier one is another function's, the answer stays the first.
        let words = [
            0xa9bf7bfd, // stp x29, x30, [sp, #-16]! (another function)
            0xd65f03c0, // ret
            0xcb2063ff, // sub sp, sp, x0
            0x94000000, // bl
            0xd503201f, // nop   <- return address
        ];
        let b = code(&words);
        assert_eq!(
            analyze(&mut SliceCode::new(0x1000, &b), 0x1010, None, false),
            None
        );
    }

    #[test]
    fn plt_entries_return_through_lr() {
        // PLT0, then `memcpy@plt` as ld writes them (an aarch64 PIE):
        // 1000: a9bf7bf0   stp x16, x30, [sp, #-16]!
        // 1004..101c: adrp, ldr, add, br x17, nops
        // 1020: 90001a30   adrp x16, ...
        // 1024: f944f611   ldr x17, [x16, #2536]
        // 1028: 9127a210   add x16, x16, #0x9e8
        // 102c: d61f0220   br x17
        let b = code(&[
            0xa9bf7bf0, 0x90001a30, 0xf944f211, 0x91278210, 0xd61f0220, 0xd503201f, 0xd503201f,
            0xd503201f, 0x90001a30, 0xf944f611, 0x9127a210, 0xd61f0220,
        ]);
        for pc in [0x1020, 0x1024, 0x1028, 0x102c] {
            let r = analyze(&mut SliceCode::new(0x1000, &b), pc, None, true).unwrap();
            assert_eq!(
                (r.cfa_base, r.cfa_offset, r.ra_at_cfa),
                (Base::Sp, 0, None),
                "{pc:#x}"
            );
            assert_eq!(r.fp, FpRule::Unchanged);
        }
        // PLT0, after its `stp`: 16 bytes pushed, x30 in the upper half.
        for pc in [0x1004, 0x1010] {
            let r = analyze(&mut SliceCode::new(0x1000, &b), pc, None, true).unwrap();
            assert_eq!((r.cfa_offset, r.ra_at_cfa), (16, Some(-8)), "{pc:#x}");
        }
        assert_eq!(plt_entry(&mut SliceCode::new(0x1000, &b), 0x1000), None);
    }

    #[test]
    fn bti_and_pac_plt_entries_return_through_lr() {
        const BTI: u32 = 0xd503245f;
        const AUTIA: u32 = 0xd503219f;
        const AUTIB: u32 = 0xd50321df;
        const NOP: u32 = 0xd503201f;
        let (adrp, ldr, add, br) = (0x90001a30, 0xf944f611, 0x9127a210, 0xd61f0220);
        // An entry of each form after a PLT0 of the same form, as ld writes
        // them with `-z force-bti` and `-z pac-plt`.
        let forms: [(&[u32], &[u32]); 3] = [(&[BTI], &[]), (&[], &[AUTIA]), (&[BTI], &[AUTIB])];
        for (pre, aut) in forms {
            let mut words = Vec::new();
            words.extend_from_slice(pre);
            words.push(0xa9bf7bf0); // stp x16, x30, [sp, #-16]!
            words.extend([adrp, ldr, add]);
            words.extend_from_slice(aut);
            words.push(br);
            while words.len() % 8 != 0 {
                words.push(NOP);
            }
            let entry = words.len();
            words.extend_from_slice(pre);
            words.extend([adrp, ldr, add]);
            words.extend_from_slice(aut);
            words.push(br);
            let end = words.len();
            let b = code(&words);
            let at = |i: usize| 0x1000 + 4 * i as u64;
            for i in entry..end {
                let r = analyze(&mut SliceCode::new(0x1000, &b), at(i), None, true).unwrap();
                assert_eq!(
                    (r.cfa_base, r.cfa_offset, r.ra_at_cfa),
                    (Base::Sp, 0, None),
                    "{pre:x?} {aut:x?} entry word {i}"
                );
            }
            // PLT0: at its `bti c` nothing is pushed; after its `stp`, 16
            // bytes with x30 in the upper half.
            let stp = pre.len();
            let mut c = SliceCode::new(0x1000, &b);
            if stp == 1 {
                assert_eq!(plt_entry(&mut c, at(0)), Some(false), "{pre:x?} {aut:x?}");
            }
            for i in stp + 1..stp + 5 + aut.len() {
                let r = analyze(&mut c, at(i), None, true).unwrap();
                assert_eq!(
                    (r.cfa_offset, r.ra_at_cfa),
                    (16, Some(-8)),
                    "{pre:x?} {aut:x?} PLT0 word {i}"
                );
            }
        }
    }

    #[test]
    fn leaf_returns_through_lr() {
        // 1000: 8b010000   add x0, x0, x1   <- pc (first frame)
        // 1004: d65f03c0   ret
        let b = code(&[0x8b010000, 0xd65f03c0]);
        let r = analyze(&mut SliceCode::new(0x1000, &b), 0x1000, Some(0x1000), true).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (0, None));
        assert!(analyze(&mut SliceCode::new(0x1000, &b), 0x1000, Some(0x1000), false).is_none());
    }

    #[test]
    fn call_forms() {
        // 1000: 94000010   bl 0x1040
        // 1004: d63f0100   blr x8
        let b = code(&[0x94000010, 0xd63f0100, 0]);
        let mut c = SliceCode::new(0x1000, &b);
        assert_eq!(
            super::super::call_before(&mut c, 0x1004),
            Some(crate::types::CallBefore::Direct(0x1040))
        );
        assert_eq!(
            super::super::call_before(&mut c, 0x1008),
            Some(crate::types::CallBefore::Indirect)
        );
        assert_eq!(super::super::call_before(&mut c, 0x100c), None);
    }

    fn words(insns: &[u32]) -> Vec<u8> {
        insns.iter().flat_map(|i| i.to_le_bytes()).collect()
    }

    #[test]
    fn a_leaf_after_another_functions_return_is_a_leaf() {
        let b = words(&[
            0xa9bf_7bfd, // 0x00 stp x29, x30, [sp, #-16]!
            0x9100_03fd, // 0x04 mov x29, sp
            0x9400_0000, // 0x08 bl
            0xa8c1_7bfd, // 0x0c ldp x29, x30, [sp], #16
            0xd65f_03c0, // 0x10 ret
            0xaa00_03e8, // 0x14 mov x8, x0   (a leaf without symbol)
            0xd400_0001, // 0x18 svc #0
            0xd503_201f, // 0x1c nop          <- pc
        ]);
        let mut c = crate::types::SliceCode::new(0x1000, &b);
        let r = analyze(&mut c, 0x101c, None, true).unwrap();
        assert_eq!((r.cfa_base, r.cfa_offset, r.ra_at_cfa), (Base::Sp, 0, None));
        // A branch over the epilogue into the code after the return: that
        // code runs in the frame.
        let b = words(&[
            0xa9bf_7bfd, // 0x00 stp x29, x30, [sp, #-16]!
            0x9100_03fd, // 0x04 mov x29, sp
            0xb400_00a0, // 0x08 cbz x0, 0x1c
            0x9400_0000, // 0x0c bl
            0xa8c1_7bfd, // 0x10 ldp x29, x30, [sp], #16
            0xd65f_03c0, // 0x14 ret
            0xd503_201f, // 0x18 nop
            0x9400_0000, // 0x1c bl          (in the frame)
            0xd503_201f, // 0x20 nop         <- return address
        ]);
        let mut c = crate::types::SliceCode::new(0x1000, &b);
        let r = analyze(&mut c, 0x1020, None, false).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (16, Some(-8)));
    }
}
