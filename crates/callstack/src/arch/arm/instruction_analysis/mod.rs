//! 32-bit ARM instruction analysis (ARM and Thumb-2 state) for frames
//! without unwind tables.
//!
//! - [`prologue::analyze`]: the function's start (a symbol, or the nearest
//!   `push {..., lr}` before the pc), then the instructions from it to the
//!   pc: `push`/`push.w`/`str lr, [sp, #-4]!`, `sub sp, #N` (16- and 32-bit
//!   forms), `vpush`, `add r7, sp, #N` / `add fp, sp, #N`, and the state
//!   before a mid-function `pop {..., pc}` for code after it.
//! - [`call_before`]: `bl`/`blx` (Thumb 32-bit, Thumb `blx rN`, ARM `bl`,
//!   `blx`) right before a return address. A return address into Thumb code
//!   has bit 0 set.

pub mod prologue;

use crate::types::CallBefore;
use crate::types::CodeMemory;

/// Reads the halfword at `addr`.
pub(crate) fn half_at<C: CodeMemory + ?Sized>(code: &mut C, addr: u64) -> Option<u16> {
    let mut b = [0u8; 2];
    (code.read_code(addr, &mut b) == 2).then(|| u16::from_le_bytes(b))
}

pub(crate) use crate::arch::risc::insn_at as word_at;

/// Whether a Thumb halfword starts a 32-bit instruction.
pub(crate) fn is_thumb32(hw: u16) -> bool {
    matches!(hw >> 11, 0b11101..=0b11111)
}

/// The call that ends right before `ra` (bit 0 set: Thumb code).
///
/// ```text
/// Thumb:  f7ff ffe1   bl  target    -> Direct
///         f00f e912   blx target    -> Direct
///         4798        blx r3        -> Indirect
/// ARM:    ebxxxxxx    bl  target    -> Direct
///         e12fff33    blx r3        -> Indirect
/// ```
pub fn call_before<C: CodeMemory + ?Sized>(code: &mut C, ra: u64) -> Option<CallBefore> {
    if ra & 1 != 0 {
        let a = ra & !1;
        if let (Some(h1), Some(h2)) = (half_at(code, a.checked_sub(4)?), half_at(code, a - 2)) {
            // BL / BLX (immediate), T1/T2: 11110 S imm10 / 11 J1 1 J2 imm11 (BL) or 11 J1 0 J2 (BLX)
            if h1 & 0xf800 == 0xf000 && h2 & 0xc000 == 0xc000 {
                let s = ((h1 >> 10) & 1) as u32;
                let j1 = ((h2 >> 13) & 1) as u32;
                let j2 = ((h2 >> 11) & 1) as u32;
                let i1 = !(j1 ^ s) & 1;
                let i2 = !(j2 ^ s) & 1;
                let imm = (s << 24)
                    | (i1 << 23)
                    | (i2 << 22)
                    | (((h1 & 0x3ff) as u32) << 12)
                    | (((h2 & 0x7ff) as u32) << 1);
                let off = ((imm << 7) as i32 >> 7) as i64;
                if h2 & 0x1000 == 0 {
                    // BLX to ARM state: from Align(PC, 4).
                    return Some(CallBefore::Direct(
                        ((a & !3) as i64 + off) as u64 & 0xffff_ffff,
                    ));
                }
                return Some(CallBefore::Direct(
                    ((a as i64 + off) as u64 & 0xffff_ffff) | 1,
                ));
            }
        }
        // BLX rM (16-bit): 0100 0111 1 Rm 000
        let h = half_at(code, a.checked_sub(2)?)?;
        if h & 0xff87 == 0x4780 {
            return Some(CallBefore::Indirect);
        }
        return None;
    }
    let w = word_at(code, ra.checked_sub(4)?)?;
    let at = ra - 4;
    if w & 0x0f00_0000 == 0x0b00_0000 && w >> 28 != 0xf {
        let off = (((w & 0x00ff_ffff) << 8) as i32 >> 6) as i64;
        return Some(CallBefore::Direct(
            (at as i64 + 8 + off) as u64 & 0xffff_ffff,
        ));
    }
    if w & 0xfe00_0000 == 0xfa00_0000 {
        let h = ((w >> 24) & 1) << 1;
        let off = ((((w & 0x00ff_ffff) << 8) as i32 >> 6) | h as i32) as i64;
        return Some(CallBefore::Direct(
            ((at as i64 + 8 + off) as u64 & 0xffff_ffff) | 1,
        ));
    }
    if w & 0x0fff_fff0 == 0x012f_ff30 {
        return Some(CallBefore::Indirect);
    }
    None
}
