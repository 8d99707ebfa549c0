//! 32-bit ARM prologue analysis, Thumb-2 and ARM state.

use super::{half_at, is_thumb32, word_at};
use crate::types::CodeMemory;

/// How far back (bytes) the start of a function is looked for.
pub const MAX_BACK: u64 = 8192;
/// How far (bytes) from the start to the pc the code is followed.
pub const MAX_FORWARD: u64 = 32768;

/// Where the caller's registers are, relative to the CFA (the sp at entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ArmRule {
    /// CFA = sp + `cfa_offset` (when `cfa_from_fp` is `None`).
    pub cfa_offset: i32,
    /// CFA = r7 (Thumb) or r11 (ARM) + offset, when sp moved by an unknown
    /// amount after the frame pointer was set.
    pub cfa_from_fp: Option<(u8, i32)>,
    /// lr saved at CFA + offset (`None`: still in lr, a leaf).
    pub lr_at: Option<i32>,
    /// r7 saved at CFA + offset.
    pub r7_at: Option<i32>,
    /// r11 saved at CFA + offset.
    pub r11_at: Option<i32>,
    /// r4..r6, r8..r10 saved (callee-saved registers the next frames may
    /// need as frame pointers are only r7/r11; others are not tracked).
    pub saved_other: u16,
}

#[derive(Clone, Copy, Default)]
struct St {
    d: i64,
    sp_known: bool,
    lr: Option<i64>,
    r7: Option<i64>,
    r11: Option<i64>,
    r7_val: Option<i64>,
    r11_val: Option<i64>,
}

impl St {
    fn push(&mut self, mask: u16) {
        let n = mask.count_ones() as i64;
        self.d -= 4 * n;
        let mut slot = self.d;
        for r in 0..16 {
            if mask & (1 << r) != 0 {
                match r {
                    7 => self.r7 = Some(slot),
                    11 => self.r11 = Some(slot),
                    14 => self.lr = Some(slot),
                    _ => {}
                }
                slot += 4;
            }
        }
    }

    fn pop(&mut self, mask: u16) {
        self.d += 4 * mask.count_ones() as i64;
        if mask & (1 << 7) != 0 {
            self.r7 = None;
            self.r7_val = None;
        }
        if mask & (1 << 11) != 0 {
            self.r11 = None;
            self.r11_val = None;
        }
        if mask & (1 << 14 | 1 << 15) != 0 {
            self.lr = None;
        }
    }
}

fn thumb_expand_imm(imm12: u32) -> u32 {
    if imm12 >> 10 == 0 {
        let b = imm12 & 0xff;
        match (imm12 >> 8) & 3 {
            0 => b,
            1 => (b << 16) | b,
            2 => (b << 24) | (b << 8),
            _ => b * 0x0101_0101,
        }
    } else {
        (0x80 | (imm12 & 0x7f)).rotate_right(imm12 >> 7)
    }
}

fn arm_expand_imm(imm12: u32) -> u32 {
    (imm12 & 0xff).rotate_right(2 * (imm12 >> 8))
}

/// What an instruction does, for the analysis.
enum Op {
    Push(u16),
    Pop(u16),
    /// sp += k
    Sp(i64),
    /// r7 or r11 = sp + k
    Fp(u8, i64),
    /// A return (`pop {pc}`, `bx lr`): a mid-function epilogue ends.
    Ret,
    /// sp changed by an unknown amount.
    SpUnknown,
    Call,
    Other,
}

fn thumb_op(h1: u16, h2: u16) -> (Op, u64) {
    if !is_thumb32(h1) {
        let op = if h1 & 0xfe00 == 0xb400 {
            Op::Push((h1 & 0xff) | if h1 & 0x100 != 0 { 1 << 14 } else { 0 })
        } else if h1 & 0xfe00 == 0xbc00 {
            let m = (h1 & 0xff) | if h1 & 0x100 != 0 { 1 << 15 } else { 0 };
            if h1 & 0x100 != 0 {
                // pop {..., pc}: an epilogue's pop and return together.
                return (Op::Pop(m | 0x8000_u16), 2);
            }
            Op::Pop(m)
        } else if h1 & 0xff80 == 0xb080 {
            Op::Sp(-(((h1 & 0x7f) as i64) * 4))
        } else if h1 & 0xff80 == 0xb000 {
            Op::Sp(((h1 & 0x7f) as i64) * 4)
        } else if h1 & 0xff00 == 0xaf00 {
            Op::Fp(7, ((h1 & 0xff) as i64) * 4)
        } else if h1 == 0x466f {
            Op::Fp(7, 0) // mov r7, sp
        } else if h1 == 0x4770 {
            Op::Ret // bx lr
        } else if h1 & 0xff87 == 0x4780 {
            Op::Call
        } else if h1 & 0xff87 == 0x4685 || h1 & 0xff87 == 0x4485 {
            Op::SpUnknown // mov sp, rM / add sp, rM
        } else {
            Op::Other
        };
        return (op, 2);
    }
    let op = if h1 == 0xe92d && h2 & 0xa000 == 0 {
        Op::Push(h2)
    } else if h1 == 0xe8bd {
        Op::Pop(h2)
    } else if h1 == 0xf84d && h2 & 0x0fff == 0x0d04 {
        Op::Push(1 << (h2 >> 12))
    } else if h1 == 0xf85d && h2 & 0x0fff == 0x0b04 {
        Op::Pop(1 << (h2 >> 12))
    } else if (h1 & 0xfbef == 0xf1ad || h1 & 0xfbef == 0xf10d) && h2 & 0x8f00 == 0x0d00 {
        // sub.w / add.w sp, sp, #const (T3)
        let imm12 =
            (((h1 >> 10) & 1) as u32) << 11 | (((h2 >> 12) & 7) as u32) << 8 | (h2 & 0xff) as u32;
        let v = thumb_expand_imm(imm12) as i64;
        Op::Sp(if h1 & 0x00a0 == 0x00a0 { -v } else { v })
    } else if (h1 & 0xfbff == 0xf2ad || h1 & 0xfbff == 0xf20d) && h2 & 0x8f00 == 0x0d00 {
        // subw / addw sp, sp, #imm12 (T4)
        let v = ((((h1 >> 10) & 1) as i64) << 11)
            | ((((h2 >> 12) & 7) as i64) << 8)
            | (h2 & 0xff) as i64;
        Op::Sp(if h1 & 0x00a0 == 0x00a0 { -v } else { v })
    } else if h1 & 0xfbef == 0xf10d && h2 & 0x8000 == 0 && (h2 >> 8) & 0xf == 7 {
        let imm12 =
            (((h1 >> 10) & 1) as u32) << 11 | (((h2 >> 12) & 7) as u32) << 8 | (h2 & 0xff) as u32;
        Op::Fp(7, thumb_expand_imm(imm12) as i64)
    } else if h1 == 0xed2d && h2 & 0x0e00 == 0x0a00 {
        Op::Sp(-(((h2 & 0xff) as i64) * 4)) // vpush
    } else if h1 == 0xecbd && h2 & 0x0e00 == 0x0a00 {
        Op::Sp(((h2 & 0xff) as i64) * 4) // vpop
    } else if h1 & 0xf800 == 0xf000 && h2 & 0xc000 == 0xc000 {
        Op::Call
    } else {
        Op::Other
    };
    (op, 4)
}

fn arm_op(w: u32) -> Op {
    if w >> 28 == 0xf {
        return if w & 0xfe00_0000 == 0xfa00_0000 {
            Op::Call
        } else {
            Op::Other
        };
    }
    let w = w & 0x0fff_ffff; // condition: treat as executed
    if w & 0x0fff_0000 == 0x092d_0000 {
        Op::Push((w & 0xffff) as u16)
    } else if w & 0x0fff_0000 == 0x08bd_0000 {
        Op::Pop((w & 0xffff) as u16)
    } else if w & 0x0fff_0fff == 0x052d_0004 {
        Op::Push(1 << ((w >> 12) & 0xf))
    } else if w & 0x0fff_0fff == 0x049d_0004 {
        Op::Pop(1 << ((w >> 12) & 0xf))
    } else if w & 0x0fff_f000 == 0x024d_d000 {
        Op::Sp(-(arm_expand_imm(w & 0xfff) as i64))
    } else if w & 0x0fff_f000 == 0x028d_d000 {
        Op::Sp(arm_expand_imm(w & 0xfff) as i64)
    } else if w & 0x0fff_f000 == 0x028d_b000 {
        Op::Fp(11, arm_expand_imm(w & 0xfff) as i64)
    } else if w & 0x0fff_f000 == 0x024b_d000 || w & 0x0fff_ffff == 0x01a0_d00b {
        Op::SpUnknown // sub sp, fp, #N / mov sp, fp (epilogue from fp)
    } else if w & 0x0fff_0f00 == 0x0d2d_0b00 {
        Op::Sp(-(((w & 0xff) as i64) * 4))
    } else if w & 0x0fff_0f00 == 0x0cbd_0b00 {
        Op::Sp(((w & 0xff) as i64) * 4)
    } else if w & 0x0fff_ffff == 0x012f_ff1e {
        Op::Ret
    } else if w & 0x0f00_0000 == 0x0b00_0000 || w & 0x0fff_fff0 == 0x012f_ff30 {
        Op::Call
    } else {
        Op::Other
    }
}

/// Decodes the instruction at `a` (Thumb when `thumb`): the op and its size.
fn op_at<C: CodeMemory + ?Sized>(code: &mut C, a: u64, thumb: bool) -> Option<(Op, u64)> {
    if thumb {
        let h1 = half_at(code, a)?;
        let h2 = if is_thumb32(h1) {
            half_at(code, a + 2)?
        } else {
            0
        };
        Some(thumb_op(h1, h2))
    } else {
        Some((arm_op(word_at(code, a)?), 4))
    }
}

fn saves_lr(op: &Op) -> bool {
    matches!(op, Op::Push(m) if m & (1 << 14) != 0)
}

/// The nearest instruction before `pc` that pushes lr (`push {.., lr}`,
/// `push.w`, `str lr, [sp, #-4]!`; ARM `stmdb sp!` or `str`). Thumb code
/// is scanned by halfwords, so a match may be the second half of another
/// instruction: a rare false start that the caller's checks catch.
fn find_start<C: CodeMemory + ?Sized>(code: &mut C, pc: u64, thumb: bool) -> Option<u64> {
    let step = if thumb { 2 } else { 4 };
    let mut a = pc;
    let mut back = 0;
    while back < MAX_BACK {
        a = a.checked_sub(step)?;
        back += step;
        if let Some((op, _)) = op_at(code, a, thumb) {
            if saves_lr(&op) {
                return Some(a);
            }
        }
    }
    None
}

/// The rule at `pc` (bit 0: Thumb). `entry` is the function's start when
/// known; `first` says the pc is exact (a function that has not saved lr
/// returns through it).
///
/// ```text
/// entry: b530        push  {r4, r5, lr}
///        f5ad 5d00   sub.w sp, sp, #8192
///        b081        sub   sp, #4
/// pc:    ...         => CFA = sp + 8208, lr at CFA - 4
/// ```
pub fn analyze<C: CodeMemory + ?Sized>(
    code: &mut C,
    pc: u64,
    entry: Option<u64>,
    first: bool,
) -> Option<ArmRule> {
    let thumb = pc & 1 != 0;
    let pc = pc & !1;
    let start = crate::arch::risc::function_start(entry.map(|e| e & !1), pc, MAX_FORWARD, || {
        find_start(code, pc, thumb)
    })?;
    let mut st = St {
        sp_known: true,
        ..St::default()
    };
    let mut pre: Option<St> = None;
    let mut a = start;
    while a < pc {
        let (op, len) = op_at(code, a, thumb)?;
        let epi = match &op {
            Op::Pop(_) => true,
            Op::Sp(k) => *k > 0,
            _ => false,
        };
        if epi && pre.is_none() {
            pre = Some(st);
        }
        match op {
            Op::Push(m) => st.push(m),
            Op::Pop(m) => {
                st.pop(m & 0x7fff);
                if m & 0x8000 != 0 {
                    // pop {.., pc}: returned; code after is reached by a
                    // branch with the frame still set up.
                    if let Some(p) = pre.take() {
                        st = p;
                    }
                }
            }
            Op::Sp(k) => st.d += k,
            Op::Fp(7, k) => st.r7_val = Some(st.d + k),
            Op::Fp(_, k) => st.r11_val = Some(st.d + k),
            Op::SpUnknown => st.sp_known = false,
            Op::Ret => {
                if let Some(p) = pre.take() {
                    st = p;
                }
            }
            Op::Call => pre = None,
            Op::Other => {}
        }
        a += len;
    }
    if st.lr.is_none() && !first {
        return None;
    }
    let cfa_from_fp = if st.sp_known {
        None
    } else if let Some(v) = st.r7_val.filter(|_| thumb) {
        Some((7u8, (-v) as i32))
    } else {
        st.r11_val.map(|v| (11u8, (-v) as i32))
    };
    if !st.sp_known && cfa_from_fp.is_none() {
        return None;
    }
    Some(ArmRule {
        cfa_offset: (-st.d) as i32,
        cfa_from_fp,
        lr_at: st.lr.map(|s| s as i32),
        r7_at: st.r7.map(|s| s as i32),
        r11_at: st.r11.map(|s| s as i32),
        saved_other: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SliceCode;

    fn halves(h: &[u16]) -> Vec<u8> {
        h.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn thumb_large_frame() {
        // 1000: b530        push  {r4, r5, lr}
        // 1002: 4601        mov   r1, r0
        // 1004: f5ad 5d00   sub.w sp, sp, #8192
        // 1008: b081        sub   sp, #4
        // 100a: 466d        mov   r5, sp      <- pc
        let b = halves(&[0xb530, 0x4601, 0xf5ad, 0x5d00, 0xb081, 0x466d]);
        let r = analyze(&mut SliceCode::new(0x1000, &b), 0x100b, None, false).unwrap();
        assert_eq!(r.cfa_offset, 12 + 8192 + 4);
        assert_eq!(r.lr_at, Some(-4));
        assert_eq!(r.r7_at, None);
    }

    #[test]
    fn thumb_push_r7_lr_and_frame_pointer() {
        // 1000: b580        push  {r7, lr}
        // 1002: af00        add   r7, sp, #0
        // 1004: b082        sub   sp, #8        <- pc after
        // 1006: bf00        nop
        let b = halves(&[0xb580, 0xaf00, 0xb082, 0xbf00]);
        let r = analyze(&mut SliceCode::new(0x1000, &b), 0x1007, Some(0x1001), false).unwrap();
        assert_eq!((r.cfa_offset, r.lr_at, r.r7_at), (16, Some(-4), Some(-8)));
    }

    #[test]
    fn thumb_after_mid_function_pop_pc() {
        // 1000: b510   push {r4, lr}
        // 1002: b900   cbnz r0, 1006
        // 1004: bd10   pop  {r4, pc}
        // 1006: bf00   nop            <- pc
        let b = halves(&[0xb510, 0xb900, 0xbd10, 0xbf00]);
        let r = analyze(&mut SliceCode::new(0x1000, &b), 0x1007, Some(0x1001), false).unwrap();
        assert_eq!((r.cfa_offset, r.lr_at), (8, Some(-4)));
    }

    #[test]
    fn arm_state_fp_lr() {
        // 1000: e92d4800   push {fp, lr}
        // 1004: e28db004   add  fp, sp, #4
        // 1008: e24dd010   sub  sp, sp, #16
        // 100c: e1a00000   nop            <- pc
        let w: Vec<u8> = [0xe92d4800u32, 0xe28db004, 0xe24dd010, 0xe1a00000]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let r = analyze(&mut SliceCode::new(0x1000, &w), 0x100c, None, false).unwrap();
        assert_eq!((r.cfa_offset, r.lr_at, r.r11_at), (24, Some(-4), Some(-8)));
    }

    #[test]
    fn calls() {
        use crate::types::CallBefore::*;
        // 104d6: f7ff ffe1   bl 0x1049c   (Thumb)
        let b = halves(&[0xf7ff, 0xffe1]);
        let mut c = SliceCode::new(0x104d6, &b);
        assert_eq!(
            super::super::call_before(&mut c, 0x104db),
            Some(Direct(0x1049d))
        );
        // 10472: 4798   blx r3
        let b = halves(&[0x4798]);
        let mut c = SliceCode::new(0x10472, &b);
        assert_eq!(super::super::call_before(&mut c, 0x10475), Some(Indirect));
        // ARM: 2000: ebfffffe   bl 0x2000
        let w = 0xebfffffeu32.to_le_bytes();
        let mut c = SliceCode::new(0x2000, &w);
        assert_eq!(
            super::super::call_before(&mut c, 0x2004),
            Some(Direct(0x2000))
        );
    }

    #[test]
    fn expand_imm() {
        assert_eq!(thumb_expand_imm(0xd00), 0x2000);
        assert_eq!(thumb_expand_imm(0x0ff), 0xff);
        assert_eq!(arm_expand_imm(0xb02), 0x800);
    }
}
