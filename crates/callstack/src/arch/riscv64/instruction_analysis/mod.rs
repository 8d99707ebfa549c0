//! RISC-V 64 instruction analysis for frames without CFI (RV64GC: the
//! 32-bit instructions and the 16-bit compressed ones mixed, so code is
//! 2-byte aligned and a call is 4 or 2 bytes long).
//!
//! - [`prologue::analyze`]: the function's start (a symbol, or the nearest
//!   instruction before the pc that allocates stack: `addi sp, sp, -N`,
//!   `c.addi16sp sp, -N`, `c.addi sp, -N`), then the instructions from it
//!   to the pc: the stack adjustment (with big frames' `li t0, -N; add sp,
//!   sp, t0` or `sub sp, sp, t0`), where `ra` and `s0` were stored (`sd`,
//!   `c.sdsp`), `addi s0, sp, N` (or `c.addi4spn s0, sp, N`), and past a
//!   mid-function return, the frame as it was before that epilogue. A leaf
//!   keeps the return address in `ra`.
//! - [`call_before`]: `jal ra, f`, `jalr ra, N(rs)` (with the `auipc`
//!   of a `call` before it, a direct call) and `c.jalr rs` right before a
//!   return address. (`c.jal` exists only on RV32: its encoding is
//!   `c.addiw` on RV64.)
//! - [`frame_record`]: the GCC/LLVM frame record below `s0` (`s0` points
//!   just above the saved `s0`, `ra` pair: see [`super::FRAME_RECORD`]).
//! - [`Arch`]: the [`RiscArch`](crate::arch::risc::RiscArch) glue.

pub mod prologue;

use crate::types::{CallBefore, CodeMemory, Memory, UnwindRegs};

/// Reads the halfword at `addr`.
pub(crate) fn half_at<C: CodeMemory + ?Sized>(code: &mut C, addr: u64) -> Option<u16> {
    let mut b = [0u8; 2];
    (code.read_code(addr, &mut b) == 2).then(|| u16::from_le_bytes(b))
}

/// The instruction at `addr`: its bits and its length (2 or 4 bytes).
/// `None` when unreadable or longer than 4 bytes (no standard extension
/// the compilers emit uses those).
pub(crate) fn insn_at<C: CodeMemory + ?Sized>(code: &mut C, addr: u64) -> Option<(u32, u64)> {
    let lo = half_at(code, addr)?;
    if lo & 3 != 3 {
        return Some((lo as u32, 2));
    }
    if lo & 0x1f == 0x1f {
        return None;
    }
    let hi = half_at(code, addr.wrapping_add(2))?;
    Some(((hi as u32) << 16 | lo as u32, 4))
}

/// The 32-bit instruction word at `addr`, if one starts there (its low
/// bits say it is not compressed).
fn word_at<C: CodeMemory + ?Sized>(code: &mut C, addr: u64) -> Option<u32> {
    match insn_at(code, addr)? {
        (i, 4) => Some(i),
        _ => None,
    }
}

/// Sign-extends the low `bits` bits of `v`.
pub(crate) fn sext(v: u32, bits: u32) -> i64 {
    ((v << (32 - bits)) as i32 >> (32 - bits)) as i64
}

/// The target offset of a `jal` (J-type immediate).
pub(crate) fn jal_offset(i: u32) -> i64 {
    let imm = ((i >> 31) & 1) << 20
        | ((i >> 21) & 0x3ff) << 1
        | ((i >> 20) & 1) << 11
        | ((i >> 12) & 0xff) << 12;
    sext(imm, 21)
}

/// The call that ends right before `ra`.
///
/// ```text
/// xxxxx0ef   jal  ra, f          -> Direct(f)
/// xxxxx097   auipc ra, hi        -> Direct(auipc's pc + hi + lo)
/// xxx080e7   jalr ra, lo(ra)
/// xxxx80e7   jalr ra, 0(rs)      -> Indirect
/// 9x82       c.jalr rs           -> Indirect (2 bytes)
/// ```
pub fn call_before<C: CodeMemory + ?Sized>(code: &mut C, ra: u64) -> Option<CallBefore> {
    if let Some(at) = ra.checked_sub(4) {
        if let Some(i) = word_at(code, at) {
            // jal ra, imm
            if i & 0xfff == 0x0ef {
                return Some(CallBefore::Direct(at.wrapping_add(jal_offset(i) as u64)));
            }
            // jalr ra, imm(rs1)
            if i & 0x7fff == 0x00e7 {
                let rs1 = (i >> 15) & 31;
                // `call f` unrelaxed: auipc rs1, hi; jalr ra, lo(rs1).
                if let Some(p) = at.checked_sub(4).and_then(|p| Some((p, word_at(code, p)?))) {
                    let (p, u) = p;
                    if u & 0x7f == 0x17 && (u >> 7) & 31 == rs1 && rs1 != 0 {
                        let hi = (u & 0xffff_f000) as i32 as i64;
                        let lo = sext(i >> 20, 12);
                        return Some(CallBefore::Direct(p.wrapping_add((hi + lo) as u64)));
                    }
                }
                return Some(CallBefore::Indirect);
            }
        }
    }
    let at = ra.checked_sub(2)?;
    let h = half_at(code, at)?;
    // c.jalr rs1 (rs1 != 0)
    if h & 0xf07f == 0x9002 && (h >> 7) & 31 != 0 {
        return Some(CallBefore::Indirect);
    }
    None
}

crate::arch::risc::risc_arch! {
    /// The RISC-V 64 glue for the RISC unwinder.
    Arch {
        word: 8,
        call_to_ra: 4,
        analyze: prologue::analyze,
        call_before: call_before,
        is_trampoline: super::signal::is_trampoline,
        signal_frame: super::signal::frame,
        frame_record: frame_record,
    }
}

/// The caller's registers from the frame record below `s0` (the saved
/// `s0` at `s0 - 16`, `ra` at `s0 - 8`; the caller's sp is `s0`), when
/// `s0` is 16-aligned and a whole record above sp.
pub fn frame_record<M: Memory + ?Sized>(regs: &UnwindRegs, mem: &mut M) -> Option<UnwindRegs> {
    let rec = super::FRAME_RECORD;
    if regs.fp % rec.align as u64 != 0 || regs.fp < regs.sp.checked_add(rec.below as u64)? {
        return None;
    }
    let base = regs.fp - rec.below as u64;
    let prev = mem.read_u64(base + rec.fp_offset as u64).ok()?;
    let ra = mem.read_u64(base + rec.ra_offset as u64).ok()?;
    Some(UnwindRegs {
        pc: ra,
        sp: regs.fp,
        fp: prev,
        lr: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SliceCode;

    #[test]
    fn calls_before_return_addresses() {
        // 1000: jal ra, +0x100 (100000ef)
        // 1004: auipc ra, 0x1 (00001097); 1008: jalr ra, -16(ra) (ff0080e7)
        // 100c: c.jalr a5 (9782)
        // 100e: jalr ra, 0(a5) (000780e7)
        // 1012: c.nop
        let mut b = Vec::new();
        b.extend(0x1000_00efu32.to_le_bytes());
        b.extend(0x0000_1097u32.to_le_bytes());
        b.extend(0xff00_80e7u32.to_le_bytes());
        b.extend(0x9782u16.to_le_bytes());
        b.extend(0x0007_80e7u32.to_le_bytes());
        b.extend(0x0001u16.to_le_bytes());
        let mut c = SliceCode::new(0x1000, &b);
        assert_eq!(
            call_before(&mut c, 0x1004),
            Some(CallBefore::Direct(0x1100))
        );
        assert_eq!(
            call_before(&mut c, 0x100c),
            Some(CallBefore::Direct(0x1004 + 0x1000 - 16))
        );
        assert_eq!(call_before(&mut c, 0x100e), Some(CallBefore::Indirect));
        assert_eq!(call_before(&mut c, 0x1012), Some(CallBefore::Indirect));
        // After the c.nop: no call.
        assert_eq!(call_before(&mut c, 0x1014), None);
        // Out of the code: no call, no panic.
        assert_eq!(call_before(&mut c, 0), None);
        assert_eq!(call_before(&mut c, 1), None);
    }

    /// Memory: 8-byte words from `base`.
    struct Words(u64, Vec<u64>);

    impl Memory for Words {
        fn read_u64(&mut self, addr: u64) -> Result<u64, crate::types::ReadError> {
            let i = addr.wrapping_sub(self.0) / 8;
            match self.1.get(i as usize) {
                Some(&w) if addr % 8 == 0 => Ok(w),
                _ => Err(crate::types::ReadError::OutOfBounds(addr)),
            }
        }
    }

    #[test]
    fn frame_record_below_s0() {
        // [0x1000] caller's s0, [0x1008] ra; s0 = 0x1010 (the CFA).
        let mut mem = Words(0x1000, vec![0x2000, 0x4000_1234]);
        let regs = UnwindRegs {
            pc: 0x4000_0000,
            sp: 0x1000,
            fp: 0x1010,
            lr: 0,
        };
        assert_eq!(
            frame_record(&regs, &mut mem),
            Some(UnwindRegs {
                pc: 0x4000_1234,
                sp: 0x1010,
                fp: 0x2000,
                lr: 0
            })
        );
        // s0 not 16-aligned, or not a whole record above sp: none.
        assert_eq!(
            frame_record(&UnwindRegs { fp: 0x1018, ..regs }, &mut mem),
            None
        );
        assert_eq!(
            frame_record(&UnwindRegs { sp: 0x1008, ..regs }, &mut mem),
            None
        );
        // Unreadable: none, no panic.
        assert_eq!(
            frame_record(
                &UnwindRegs {
                    fp: 0x9010,
                    sp: 0x9000,
                    ..regs
                },
                &mut mem
            ),
            None
        );
        assert_eq!(
            frame_record(
                &UnwindRegs {
                    fp: 0,
                    sp: 0,
                    ..regs
                },
                &mut mem
            ),
            None
        );
    }

    #[test]
    fn negative_jal() {
        // jal ra, -0x20 at 0x2000: imm[20]=1, imm[10:1]=0x3f0, imm[19:12]=0xff
        let i: u32 = (1 << 31) | (0x3f0 << 21) | (1 << 20) | (0xff << 12) | 0x0ef;
        assert_eq!(jal_offset(i), -0x20);
    }
}
