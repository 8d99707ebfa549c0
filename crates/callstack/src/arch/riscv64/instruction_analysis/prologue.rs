//! RISC-V 64 prologue analysis.
//!
//! GCC and LLVM open a frame with `addi sp, sp, -N` (or its compressed
//! forms), store `ra` and `s0` with `sd`/`c.sdsp` relative to the new sp,
//! and, with a frame pointer, set `s0` to the entry sp (`addi s0, sp, N`).
//! A frame over 2 KiB is opened in steps: `addi sp, sp, -2032`, the saves,
//! then `li t0, -M; add sp, sp, t0` (or `sub sp, sp, t0`); a variable frame
//! (`alloca`) moves sp by a register's value, and is then followed from
//! `s0`.

use super::{insn_at, sext};
use crate::types::{Base, CodeMemory, FpRule, InsnRule};

/// How far back (in bytes) the start of a function is looked for.
pub const MAX_BACK: u64 = 16384;
/// How many bytes from the start to the pc are followed.
pub const MAX_FORWARD: u64 = 32768;

const RA: u32 = 1;
const SP: u32 = 2;
const S0: u32 = 8;

/// What one instruction does, as far as the prologue goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `sp += imm`.
    SpAdd(i64),
    /// `sp = s0 + imm` (an epilogue of a frame followed from `s0`).
    SpFromFp(i64),
    /// `sp += xN` (`true`) or `sp -= xN` (`false`).
    SpReg(u32, bool),
    /// `s0 = sp + imm`.
    FpFromSp(i64),
    /// Stores register `.0` at `sp + .1`.
    Store(u32, i64),
    /// Loads register `.0` from `sp + .1`.
    Load(u32, i64),
    /// `xN = imm` (`lui`, `c.li`, `c.lui`).
    Const(u32, i64),
    /// `xD = xS + imm` (`addi`, `addiw`, `c.addi`, `c.addiw`): `.3` says
    /// the 32-bit form (the result sign-extended from 32 bits).
    AddImm(u32, u32, i64, bool),
    /// A return (`ret`, `c.jr ra`).
    Ret,
    /// Another jump that does not return here (`j`, `jr rs`, a tail call).
    Jump,
    /// A call (`jal ra`, `jalr ra`, `c.jalr`).
    Call,
    /// Writes register `.0` in a way not followed (`0`: writes nothing of
    /// ours).
    Write(u32),
}

/// Decodes the instruction `i` of length `len` (2 or 4).
fn decode(i: u32, len: u64) -> Op {
    if len == 4 {
        decode32(i)
    } else {
        decode16(i as u16)
    }
}

fn decode32(i: u32) -> Op {
    let rd = (i >> 7) & 31;
    let rs1 = (i >> 15) & 31;
    let rs2 = (i >> 20) & 31;
    let f3 = (i >> 12) & 7;
    let imm_i = sext(i >> 20, 12);
    match i & 0x7f {
        // LOAD: ld rd, imm(sp)
        0x03 if f3 == 3 && rs1 == SP => Op::Load(rd, imm_i),
        // OP-IMM: addi rd, rs1, imm
        0x13 if f3 == 0 => match (rd, rs1) {
            (SP, SP) => Op::SpAdd(imm_i),
            (SP, S0) => Op::SpFromFp(imm_i),
            (S0, SP) => Op::FpFromSp(imm_i),
            _ => Op::AddImm(rd, rs1, imm_i, false),
        },
        // OP-IMM-32: addiw rd, rs1, imm
        0x1b if f3 == 0 => Op::AddImm(rd, rs1, imm_i, true),
        // STORE: sd rs2, imm(sp)
        0x23 if f3 == 3 && rs1 == SP => {
            let imm = sext((i >> 25) << 5 | (i >> 7) & 31, 12);
            Op::Store(rs2, imm)
        }
        0x23 | 0x27 | 0x63 => Op::Write(0),
        // LUI
        0x37 => Op::Const(rd, (i & 0xffff_f000) as i32 as i64),
        // OP: add/sub sp, sp, rs2
        0x33 if rd == SP && rs1 == SP && f3 == 0 && i >> 25 == 0 => Op::SpReg(rs2, true),
        0x33 if rd == SP && rs1 == SP && f3 == 0 && i >> 25 == 0x20 => Op::SpReg(rs2, false),
        // JALR
        0x67 if rd == RA => Op::Call,
        0x67 if rd == 0 && rs1 == RA && imm_i == 0 => Op::Ret,
        0x67 if rd == 0 => Op::Jump,
        // JAL
        0x6f if rd == RA => Op::Call,
        0x6f if rd == 0 => Op::Jump,
        // Floating-point loads, fused multiply-adds: an FP register.
        0x07 | 0x43 | 0x47 | 0x4b | 0x4f => Op::Write(0),
        // OP-FP: compares, conversions to integer and moves write an
        // integer register.
        0x53 => match i >> 27 {
            0x14 | 0x18 | 0x1c => Op::Write(rd),
            _ => Op::Write(0),
        },
        0x0f => Op::Write(0),
        _ => Op::Write(rd),
    }
}

fn decode16(h: u16) -> Op {
    let h = h as u32;
    let rd = (h >> 7) & 31;
    let rs2 = (h >> 2) & 31;
    let rdp = ((h >> 2) & 7) + 8; // rd' in bits 4:2
    let rsp = ((h >> 7) & 7) + 8; // rd'/rs1' in bits 9:7
    let imm6 = sext(((h >> 12) & 1) << 5 | (h >> 2) & 31, 6);
    match (h & 3, h >> 13) {
        // c.addi4spn rd', sp, nzuimm
        (0, 0) => {
            let imm = ((h >> 11) & 3) << 4
                | ((h >> 7) & 15) << 6
                | ((h >> 6) & 1) << 2
                | ((h >> 5) & 1) << 3;
            if h == 0 {
                Op::Write(0)
            } else if rdp == S0 {
                Op::FpFromSp(imm as i64)
            } else {
                Op::Write(rdp)
            }
        }
        // c.lw, c.ld
        (0, 2) | (0, 3) => Op::Write(rdp),
        (0, _) => Op::Write(0),
        // c.addi rd, imm
        (1, 0) if rd == SP => Op::SpAdd(imm6),
        (1, 0) => Op::AddImm(rd, rd, imm6, false),
        // c.addiw rd, imm
        (1, 1) => Op::AddImm(rd, rd, imm6, true),
        // c.li rd, imm
        (1, 2) => Op::Const(rd, imm6),
        // c.addi16sp / c.lui
        (1, 3) if rd == SP => {
            let imm = ((h >> 12) & 1) << 9
                | ((h >> 3) & 3) << 7
                | ((h >> 5) & 1) << 6
                | ((h >> 2) & 1) << 5
                | ((h >> 6) & 1) << 4;
            Op::SpAdd(sext(imm, 10))
        }
        (1, 3) => Op::Const(rd, sext(((h >> 12) & 1) << 17 | ((h >> 2) & 31) << 12, 18)),
        // c.srli .. c.and, c.subw, c.addw: rd' in bits 9:7
        (1, 4) => Op::Write(rsp),
        // c.j
        (1, 5) => Op::Jump,
        (1, _) => Op::Write(0),
        // c.slli rd
        (2, 0) => Op::Write(rd),
        // c.lwsp rd
        (2, 2) => Op::Write(rd),
        // c.ldsp rd, uimm(sp)
        (2, 3) => {
            let off = ((h >> 12) & 1) << 5 | ((h >> 5) & 3) << 3 | ((h >> 2) & 7) << 6;
            Op::Load(rd, off as i64)
        }
        (2, 4) => {
            let bit12 = (h >> 12) & 1;
            match (bit12, rs2) {
                (0, 0) if rd == RA => Op::Ret,
                (0, 0) => Op::Jump,
                // c.mv rd, rs2
                (0, _) if rd == SP && rs2 == S0 => Op::SpFromFp(0),
                (0, _) if rd == S0 && rs2 == SP => Op::FpFromSp(0),
                (0, _) => Op::Write(rd),
                (_, 0) if rd == 0 => Op::Write(0), // c.ebreak
                (_, 0) => Op::Call,                // c.jalr
                // c.add rd, rs2
                _ if rd == SP => Op::SpReg(rs2, true),
                _ => Op::Write(rd),
            }
        }
        // c.sdsp rs2, uimm(sp)
        (2, 7) => {
            let off = ((h >> 10) & 7) << 3 | ((h >> 7) & 7) << 6;
            Op::Store(rs2, off as i64)
        }
        _ => Op::Write(0),
    }
}

/// Whether the instructions from `from` decode, one after the other, to
/// exactly `to` (`from` is an instruction boundary of the code at `to`).
fn reaches<C: CodeMemory + ?Sized>(code: &mut C, from: u64, to: u64) -> bool {
    let mut a = from;
    while a < to {
        match insn_at(code, a) {
            Some((_, len)) => a += len,
            None => return false,
        }
    }
    a == to
}

/// Where an instruction may send control other than to the next one, for
/// telling a guessed start's function from the one after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// Only to the next instruction (or a call, which comes back).
    Next,
    /// A branch or jump to a known address (also, for a conditional
    /// branch, to the next instruction).
    To(u64),
    /// A jump through a register that is not a return (a jump table, a
    /// tail call through a register): anywhere.
    Anywhere,
}

/// The [`Flow`] of the instruction `i` of length `len` at `a`.
fn flow(i: u32, len: u64, a: u64) -> Flow {
    let to = |off: i64| Flow::To(a.wrapping_add(off as u64));
    if len == 4 {
        let rd = (i >> 7) & 31;
        return match i & 0x7f {
            // BRANCH: imm[12|10:5] in 31:25, imm[4:1|11] in 11:7.
            0x63 => to(sext(
                (i >> 31) << 12
                    | ((i >> 7) & 1) << 11
                    | ((i >> 25) & 0x3f) << 5
                    | ((i >> 8) & 15) << 1,
                13,
            )),
            // JAL x0 (`j`): imm[20|10:1|11|19:12] in 31:12.
            0x6f if rd == 0 => to(sext(
                (i >> 31) << 20
                    | ((i >> 12) & 0xff) << 12
                    | ((i >> 20) & 1) << 11
                    | ((i >> 21) & 0x3ff) << 1,
                21,
            )),
            // JALR x0 that is not `ret`.
            0x67 if rd == 0 && !matches!(decode32(i), Op::Ret) => Flow::Anywhere,
            _ => Flow::Next,
        };
    }
    let h = i;
    match (h & 3, (h >> 13) & 7) {
        // c.j: offset[11|4|9:8|10|6|7|3:1|5] in 12:2.
        (1, 5) => to(sext(
            ((h >> 12) & 1) << 11
                | ((h >> 11) & 1) << 4
                | ((h >> 9) & 3) << 8
                | ((h >> 8) & 1) << 10
                | ((h >> 7) & 1) << 6
                | ((h >> 6) & 1) << 7
                | ((h >> 3) & 7) << 1
                | ((h >> 2) & 1) << 5,
            12,
        )),
        // c.beqz, c.bnez: offset[8|4:3] in 12:10, offset[7:6|2:1|5] in 6:2.
        (1, 6) | (1, 7) => to(sext(
            ((h >> 12) & 1) << 8
                | ((h >> 10) & 3) << 3
                | ((h >> 5) & 3) << 6
                | ((h >> 3) & 3) << 1
                | ((h >> 2) & 1) << 5,
            9,
        )),
        // c.jr rs1 that is not `ret`.
        (2, 4) if (h >> 12) & 1 == 0 && (h >> 2) & 31 == 0 && (h >> 7) & 31 != RA => Flow::Anywhere,
        _ => Flow::Next,
    }
}

/// How far (in bytes) before an allocation a first one of the same
/// prologue may lie: a frame over 2 KiB is allocated in two steps
/// (`addi sp, sp, -2032`, the saves, then `addi sp, sp, -M` again or `li`
/// and `add`/`sub`).
const SPLIT_ALLOCATION: u64 = 64;

/// The allocation `op` at `a` if it starts an instruction on the way to `pc`.
fn allocation_at<C: CodeMemory + ?Sized>(code: &mut C, a: u64, pc: u64) -> Option<i64> {
    let (i, len) = insn_at(code, a)?;
    match decode(i, len) {
        Op::SpAdd(v) if v < 0 && reaches(code, a, pc) => Some(v),
        _ => None,
    }
}

/// The start of the frame allocation before `pc`: the nearest allocating
/// instruction from which the code decodes to `pc`, or the first step of a
/// big frame's two-step allocation just before it. Code is 2-byte aligned,
/// so every halfword is tried as an instruction's start.
fn find_start<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> Option<u64> {
    let mut a = pc & !1;
    for _ in 0..MAX_BACK / 2 {
        a = a.checked_sub(2)?;
        if allocation_at(code, a, pc).is_none() {
            continue;
        }
        // An earlier step of the same prologue (no return in between)?
        let mut b = a;
        for _ in 0..SPLIT_ALLOCATION / 2 {
            let Some(prev) = b.checked_sub(2) else { break };
            b = prev;
            let Some((i, len)) = insn_at(code, b) else {
                break;
            };
            if !reaches(code, b, a) {
                continue;
            }
            match decode(i, len) {
                Op::Ret | Op::Jump => break,
                // The first step of a split allocation is near addi's
                // limit (gcc: -2032); a small one is another function's.
                Op::SpAdd(v) if v <= -1024 => return Some(b),
                _ => {}
            }
        }
        return Some(a);
    }
    None
}

/// What the analysis tracks: offsets from the entry sp (the CFA).
#[derive(Clone, Copy, Debug)]
struct State {
    /// sp - entry sp, when known.
    sp: Option<i64>,
    /// Where `ra` was saved.
    ra: Option<i64>,
    /// Where `s0` was saved.
    s0_slot: Option<i64>,
    /// s0 - entry sp, while `s0` is the frame pointer.
    s0: Option<i64>,
}

/// The rule at `pc`, from the function's `entry` (or the allocation found
/// by scanning back). `first`: the pc is exact, so a function that has not
/// saved `ra` (a leaf, or a prologue before the save) returns through
/// the register.
///
/// ```text
/// entry: 1101       c.addi     sp, -32
///        ec06       c.sdsp     ra, 24(sp)
///        e822       c.sdsp     s0, 16(sp)
///        1000       c.addi4spn s0, sp, 32
/// pc:    ...        => CFA = sp + 32, ra at CFA - 8, s0 at CFA - 16
/// ```
pub fn analyze<C: CodeMemory + ?Sized>(
    code: &mut C,
    pc: u64,
    entry: Option<u64>,
    first: bool,
) -> Option<InsnRule> {
    let start = crate::arch::risc::function_start(entry, pc, MAX_FORWARD, || find_start(code, pc))?;
    let mut st = State {
        sp: Some(0),
        ra: None,
        s0_slot: None,
        s0: None,
    };
    let mut consts: [Option<i64>; 32] = [None; 32];
    let mut pre_epilogue: Option<State> = None;
    // A guessed start (no symbol) may lie in the function before the
    // pc's. Code after a return is entered, if it belongs to the same
    // function, by a forward branch from before the return (any later
    // backward branch into it is itself reached that way first): when no
    // branch seen so far goes past the return (`reach`, the furthest
    // forward target), the code after it is the next function's, and the
    // walk begins again there. A jump through a register may reach
    // anything: after one, every return keeps the mid-function reading.
    // With a symbol the start is known and nothing is begun again.
    let guessed = entry.is_none();
    let mut reach = 0u64;
    let mut anywhere = false;
    let mut a = start;
    while a < pc {
        let (i, len) = insn_at(code, a)?;
        let op = decode(i, len);
        let fl = flow(i, len, a);
        // A return, or a jump back (a forward jump may skip to code that
        // jumps back to right after it: a loop's entry).
        let ends = match (op, fl) {
            (Op::Ret, _) => true,
            (Op::Jump, Flow::To(t)) => t <= a,
            _ => false,
        };
        if ends && guessed && !anywhere && reach <= a {
            // The guessed function ends here: begin again after it.
            st = State {
                sp: Some(0),
                ra: None,
                s0_slot: None,
                s0: None,
            };
            consts = [None; 32];
            pre_epilogue = None;
            reach = 0;
            a += len;
            continue;
        }
        match fl {
            Flow::To(t) if t > a => reach = reach.max(t),
            Flow::Anywhere => anywhere = true,
            _ => {}
        }
        let epilogue_op = match op {
            Op::SpAdd(v) => v > 0,
            Op::SpFromFp(_) => true,
            Op::Load(r, _) => r == RA || r == S0,
            _ => false,
        };
        if epilogue_op && pre_epilogue.is_none() {
            pre_epilogue = Some(st);
        }
        // The register the instruction writes (0: none followed), and
        // the constant it then holds.
        let mut written = 0;
        let mut value = None;
        match op {
            Op::SpAdd(v) => st.sp = st.sp.map(|d| d + v),
            Op::SpFromFp(v) => st.sp = st.s0.map(|f| f + v),
            Op::SpReg(r, add) => {
                let v = if r == 0 { Some(0) } else { consts[r as usize] };
                st.sp = match (st.sp, v) {
                    (Some(d), Some(v)) => Some(if add { d + v } else { d - v }),
                    _ => None,
                };
                if st.sp.is_none() && st.s0.is_none() {
                    // The stack moves by an amount not known here, and no
                    // frame pointer keeps the frame's place.
                    return None;
                }
            }
            Op::FpFromSp(v) => {
                st.s0 = st.sp.map(|d| d + v);
                written = S0;
            }
            Op::Store(r, off) => {
                if let Some(d) = st.sp {
                    if r == RA && st.ra.is_none() {
                        st.ra = Some(d + off);
                    } else if r == S0 && st.s0_slot.is_none() {
                        st.s0_slot = Some(d + off);
                    }
                }
            }
            Op::Load(r, _) => {
                if r == RA {
                    st.ra = None;
                } else if r == S0 {
                    st.s0_slot = None;
                }
                written = r;
            }
            Op::Const(r, v) => {
                written = r;
                value = Some(v);
            }
            Op::AddImm(r, s, v, w) => {
                let base = if s == 0 { Some(0) } else { consts[s as usize] };
                written = r;
                value = base.map(|b| {
                    let x = b.wrapping_add(v);
                    if w {
                        x as i32 as i64
                    } else {
                        x
                    }
                });
            }
            Op::Ret | Op::Jump => {
                // The path through the epilogue ended: code after it is
                // reached by a branch, with the frame as before it.
                if let Some(s) = pre_epilogue.take() {
                    st = s;
                }
            }
            Op::Call => {
                pre_epilogue = None;
                // The callee may change any caller-saved register.
                consts = [None; 32];
            }
            Op::Write(r) => written = r,
        }
        if written != 0 {
            consts[written as usize] = value;
            if written == S0 && !matches!(op, Op::FpFromSp(_)) {
                st.s0 = None;
            }
            if written == SP && !matches!(op, Op::SpAdd(_) | Op::SpFromFp(_) | Op::SpReg(..)) {
                st.sp = None;
                // Without a frame pointer the frame's place is lost.
                st.s0?;
            }
        }
        a += len;
    }
    if a != pc {
        // The start is not an instruction boundary of the code at pc.
        return None;
    }
    if st.ra.is_none() && !first {
        return None;
    }
    let (cfa_base, cfa_offset, at) = match (st.sp, st.s0) {
        (Some(d), _) => (Base::Sp, -d, d),
        (None, Some(f)) => (Base::Fp, -f, f),
        (None, None) => return None,
    };
    Some(InsnRule {
        cfa_base,
        cfa_offset: i32::try_from(cfa_offset).ok()?,
        ra_at_cfa: match st.ra {
            Some(r) => Some(i32::try_from(r).ok()?),
            None => None,
        },
        ret_pop: 0,
        fp: match st.s0_slot {
            Some(s) => FpRule::At(cfa_base, i32::try_from(s - at).ok()?),
            None => FpRule::Unchanged,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SliceCode;

    /// As gas assembles them for rv64gc (`objdump -d` in the comments).
    const CODE: &[(u64, u32, u64)] = &[
        // f1:
        (0x00, 0x1101, 2),      // addi sp, sp, -32
        (0x02, 0xec06, 2),      // sd   ra, 24(sp)
        (0x04, 0xe822, 2),      // sd   s0, 16(sp)
        (0x06, 0x1000, 2),      // addi s0, sp, 32
        (0x08, 0x0000_0097, 4), // auipc ra, 0x0
        (0x0c, 0x0000_80e7, 4), // jalr ra   (call f1)
        (0x10, 0x0001, 2),      // nop       <- return address
        (0x12, 0x60e2, 2),      // ld   ra, 24(sp)
        (0x14, 0x6442, 2),      // ld   s0, 16(sp)
        (0x16, 0x6105, 2),      // addi sp, sp, 32
        (0x18, 0x8082, 2),      // ret
        (0x1a, 0x0001, 2),      // nop       (reached by a branch)
        // f2: a frame over 2 KiB
        (0x1c, 0x72f9, 2),      // lui  t0, 0xffffe
        (0x1e, 0x8101_0113, 4), // addi sp, sp, -2032
        (0x22, 0x7e11_3423, 4), // sd   ra, 2024(sp)
        (0x26, 0x7e81_3023, 4), // sd   s0, 2016(sp)
        (0x2a, 0x7f01_0413, 4), // addi s0, sp, 2032
        (0x2e, 0x9116, 2),      // add  sp, sp, t0
        (0x30, 0x9782, 2),      // jalr a5
        (0x32, 0x0001, 2),      // nop       <- return address
        // f3: a variable frame
        (0x34, 0x7179, 2),      // addi sp, sp, -48
        (0x36, 0xf406, 2),      // sd   ra, 40(sp)
        (0x38, 0xf022, 2),      // sd   s0, 32(sp)
        (0x3a, 0x1800, 2),      // addi s0, sp, 48
        (0x3c, 0x40a1_0133, 4), // sub  sp, sp, a0
        (0x40, 0x9782, 2),      // jalr a5
        (0x42, 0x0001, 2),      // nop       <- return address
    ];

    fn bytes() -> Vec<u8> {
        let mut b = Vec::new();
        for &(at, i, len) in CODE {
            assert_eq!(at as usize, b.len());
            b.extend(&i.to_le_bytes()[..len as usize]);
        }
        b
    }

    #[test]
    fn compressed_prologue_and_call() {
        let b = bytes();
        let mut c = SliceCode::new(0x1000, &b);
        for entry in [Some(0x1000), None] {
            let r = analyze(&mut c, 0x1010, entry, false).unwrap();
            assert_eq!(
                (r.cfa_base, r.cfa_offset, r.ra_at_cfa, r.fp),
                (Base::Sp, 32, Some(-8), FpRule::At(Base::Sp, 16)),
                "{entry:?}"
            );
        }
        assert_eq!(
            super::super::call_before(&mut c, 0x1010),
            Some(crate::types::CallBefore::Direct(0x1008))
        );
        // Mid-prologue, exact pc: ra still in its register.
        let r = analyze(&mut c, 0x1002, Some(0x1000), true).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (32, None));
        assert!(analyze(&mut c, 0x1002, Some(0x1000), false).is_none());
        // After the return: the frame as before the epilogue.
        let r = analyze(&mut c, 0x101a, Some(0x1000), true).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (32, Some(-8)));
        // In the epilogue, after the loads: ra in its register.
        let r = analyze(&mut c, 0x1016, Some(0x1000), true).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (32, None));
    }

    #[test]
    fn big_frame() {
        let b = bytes();
        let mut c = SliceCode::new(0x1000, &b);
        // From the symbol: lui t0 is followed, the frame is 2032 + 8192.
        let r = analyze(&mut c, 0x1032, Some(0x101c), false).unwrap();
        assert_eq!(
            (r.cfa_base, r.cfa_offset, r.ra_at_cfa),
            (Base::Sp, 2032 + 8192, Some(-8))
        );
        // Found by scanning back (the lui is before the allocation): the
        // frame from s0.
        assert_eq!(find_start(&mut c, 0x1032), Some(0x101e));
        let r = analyze(&mut c, 0x1032, None, false).unwrap();
        assert_eq!(
            (r.cfa_base, r.cfa_offset, r.ra_at_cfa, r.fp),
            (Base::Fp, 0, Some(-8), FpRule::At(Base::Fp, -16))
        );
    }

    #[test]
    fn variable_frame_from_s0() {
        let b = bytes();
        let mut c = SliceCode::new(0x1000, &b);
        let r = analyze(&mut c, 0x1042, Some(0x1034), false).unwrap();
        assert_eq!(
            (r.cfa_base, r.cfa_offset, r.ra_at_cfa, r.fp),
            (Base::Fp, 0, Some(-8), FpRule::At(Base::Fp, -16))
        );
    }

    #[test]
    fn leaf_and_bad_input() {
        // add a0, a0, a1; ret
        let b = [0x2e, 0x95, 0x82, 0x80];
        let mut c = SliceCode::new(0x1000, &b);
        let r = analyze(&mut c, 0x1002, Some(0x1000), true).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (0, None));
        // A start that is not an instruction boundary of the code at pc.
        assert!(analyze(&mut c, 0x1003, Some(0x1000), true).is_none());
        // Nothing readable: no rule, no panic.
        let mut empty = SliceCode::new(0x1000, &[]);
        assert!(analyze(&mut empty, 0x1010, None, true).is_none());
        assert!(analyze(&mut empty, 2, None, false).is_none());
    }

    /// Encodes `beq rs1, x0, off`.
    fn beqz(rs1: u32, off: i32) -> u32 {
        let o = off as u32;
        ((o >> 12) & 1) << 31
            | ((o >> 5) & 0x3f) << 25
            | rs1 << 15
            | ((o >> 1) & 15) << 8
            | ((o >> 11) & 1) << 7
            | 0x63
    }

    fn code_of(insns: &[(u32, u64)]) -> Vec<u8> {
        let mut b = Vec::new();
        for &(i, len) in insns {
            b.extend(&i.to_le_bytes()[..len as usize]);
        }
        b
    }

    #[test]
    fn a_leaf_after_another_functions_return_is_a_leaf() {
        // f: a frame, its return; then a leaf without symbol (glibc's
        // `syscall`): mv t1, a0; ecall; <pc>.
        let b = code_of(&[
            (0x1101, 2),      // 0x00 addi sp, sp, -32
            (0xec06, 2),      // 0x02 sd   ra, 24(sp)
            (0x0000_0097, 4), // 0x04 auipc ra, 0
            (0x0000_80e7, 4), // 0x08 jalr ra
            (0x60e2, 2),      // 0x0c ld   ra, 24(sp)
            (0x6105, 2),      // 0x0e addi sp, sp, 32
            (0x8082, 2),      // 0x10 ret
            (0x832a, 2),      // 0x12 mv   t1, a0     (the leaf)
            (0x0000_0073, 4), // 0x14 ecall
            (0x0001, 2),      // 0x18 nop           <- pc
        ]);
        let mut c = SliceCode::new(0x1000, &b);
        let r = analyze(&mut c, 0x1018, None, true).unwrap();
        assert_eq!((r.cfa_base, r.cfa_offset, r.ra_at_cfa), (Base::Sp, 0, None));
        // Not the innermost frame: a frameless function's return address
        // is in no slot, so there is no rule.
        assert!(analyze(&mut c, 0x1018, None, false).is_none());
    }

    #[test]
    fn code_after_a_return_that_a_branch_reaches_keeps_the_frame() {
        // beqz a0 jumps over the epilogue to code that runs in the frame.
        let b = code_of(&[
            (0x1101, 2),         // 0x00 addi sp, sp, -32
            (0xec06, 2),         // 0x02 sd   ra, 24(sp)
            (beqz(10, 0x0e), 4), // 0x04 beqz a0, 0x12
            (0x0000_80e7, 4),    // 0x08 jalr ra
            (0x60e2, 2),         // 0x0c ld   ra, 24(sp)
            (0x6105, 2),         // 0x0e addi sp, sp, 32
            (0x8082, 2),         // 0x10 ret
            (0x0000_80e7, 4),    // 0x12 jalr ra (in the frame)
            (0x0001, 2),         // 0x16 nop    <- return address
        ]);
        let mut c = SliceCode::new(0x1000, &b);
        for first in [true, false] {
            let r = analyze(&mut c, 0x1016, None, first).unwrap();
            assert_eq!(
                (r.cfa_base, r.cfa_offset, r.ra_at_cfa),
                (Base::Sp, 32, Some(-8))
            );
        }
        // The same code after a jump through a register (a table): kept.
        let b = code_of(&[
            (0x1101, 2),      // 0x00 addi sp, sp, -32
            (0xec06, 2),      // 0x02 sd   ra, 24(sp)
            (0x8782, 2),      // 0x04 c.jr a5
            (0x60e2, 2),      // 0x06 ld   ra, 24(sp)
            (0x6105, 2),      // 0x08 addi sp, sp, 32
            (0x8082, 2),      // 0x0a ret
            (0x0000_80e7, 4), // 0x0c jalr ra
            (0x0001, 2),      // 0x10 nop    <- return address
        ]);
        let mut c = SliceCode::new(0x1000, &b);
        let r = analyze(&mut c, 0x1010, None, false).unwrap();
        assert_eq!((r.cfa_offset, r.ra_at_cfa), (32, Some(-8)));
    }
}
