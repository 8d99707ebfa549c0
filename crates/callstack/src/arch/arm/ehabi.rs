//! ARM EHABI unwind tables (`.ARM.exidx` / `.ARM.extab`): ARM's CFI.
//!
//! armhf binaries carry no `.eh_frame` for C code; their unwind information
//! is the exception index table, one 8-byte entry per function, sorted:
//!
//! ```text
//! word 0: prel31 offset to the function's start
//! word 1: 0x00000001                   EXIDX_CANTUNWIND
//!         1 ppp .... (bit 31 set)      the unwind opcodes inline (model 0)
//!         0 + prel31                   offset to an .ARM.extab entry
//! ```
//!
//! An `.ARM.extab` entry is a compact model word (bit 31 set: index 0 with
//! three opcodes, or 1/2 with a count of further words) or a generic
//! personality routine's prel31 followed by a word in the model-1 layout.
//! The opcodes (EHABI §10.3) pop registers and move the virtual stack
//! pointer; [`execute`] interprets them against a [`Memory`].
//!
//! No allocation: opcodes are gathered into a fixed buffer
//! ([`MAX_OPCODES`]); tables are borrowed.

use crate::types::Memory;

/// Most opcode bytes interpreted for one function.
pub const MAX_OPCODES: usize = 64;

/// What is wrong with an entry or its opcodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EhabiError {
    /// No entry covers the address.
    NotCovered,
    /// The entry says the function cannot be unwound (`EXIDX_CANTUNWIND`).
    CantUnwind,
    /// An `.ARM.extab` word could not be read at this address.
    BadExtab(u64),
    /// A personality index other than 0, 1, 2 (or a table too long).
    Unsupported(u32),
    /// A reserved or "refuse to unwind" opcode.
    Refused(u8),
    /// The stack could not be read at this address.
    Stack(u64),
}

impl core::fmt::Display for EhabiError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EhabiError::NotCovered => write!(f, "no .ARM.exidx entry covers the address"),
            EhabiError::CantUnwind => write!(f, "the .ARM.exidx entry is EXIDX_CANTUNWIND"),
            EhabiError::BadExtab(a) => write!(f, "cannot read .ARM.extab at {a:#x}"),
            EhabiError::Unsupported(w) => {
                write!(f, "unsupported EHABI personality or table ({w:#010x})")
            }
            EhabiError::Refused(op) => write!(f, "EHABI opcode {op:#04x} refuses to unwind"),
            EhabiError::Stack(a) => write!(f, "cannot read the stack at {a:#x}"),
        }
    }
}

/// A borrowed `.ARM.exidx` section at its runtime address.
#[derive(Clone, Copy, Debug)]
pub struct ExidxTable<'a> {
    /// The section's bytes.
    pub data: &'a [u8],
    /// Its address (where the prel31 offsets are relative to).
    pub addr: u64,
}

/// One function's unwind description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Not unwindable.
    CantUnwind,
    /// Model 0 opcodes inline in the index word.
    Inline(u32),
    /// An `.ARM.extab` entry at this address.
    Extab(u64),
}

fn prel31(word: u32, place: u64) -> u64 {
    let off = ((word << 1) as i32 >> 1) as i64;
    (place as i64).wrapping_add(off) as u64 & 0xffff_ffff
}

impl<'a> ExidxTable<'a> {
    fn word(&self, i: usize) -> Option<u32> {
        self.data
            .get(i * 4..i * 4 + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.data.len() / 8
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The start address of entry `i`'s function.
    pub fn function_start(&self, i: usize) -> Option<u64> {
        Some(prel31(self.word(2 * i)?, self.addr + (8 * i) as u64))
    }

    /// The entry covering `pc` (Thumb bit ignored) and its function start.
    pub fn lookup(&self, pc: u64) -> Result<(u64, Entry), EhabiError> {
        let pc = pc & !1;
        let n = self.len();
        // Binary search for the last entry whose start <= pc.
        let (mut lo, mut hi) = (0usize, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.function_start(mid).ok_or(EhabiError::NotCovered)? <= pc {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == 0 {
            return Err(EhabiError::NotCovered);
        }
        let i = lo - 1;
        let start = self.function_start(i).ok_or(EhabiError::NotCovered)?;
        let w = self.word(2 * i + 1).ok_or(EhabiError::NotCovered)?;
        let e = if w == 1 {
            Entry::CantUnwind
        } else if w & 0x8000_0000 != 0 {
            Entry::Inline(w)
        } else {
            Entry::Extab(prel31(w, self.addr + (8 * i + 4) as u64))
        };
        Ok((start, e))
    }
}

/// The opcode bytes of an entry, gathered into `buf`; returns how many.
/// `read_word` reads a 32-bit word of the module (for `.ARM.extab`).
pub fn opcodes(
    entry: Entry,
    mut read_word: impl FnMut(u64) -> Option<u32>,
    buf: &mut [u8; MAX_OPCODES],
) -> Result<usize, EhabiError> {
    let mut n = 0;
    let mut push = |b: u8, n: &mut usize| {
        if *n < MAX_OPCODES {
            buf[*n] = b;
            *n += 1;
        }
    };
    let (w0, more_at) = match entry {
        Entry::CantUnwind => return Err(EhabiError::CantUnwind),
        Entry::Inline(w) => (w, None),
        Entry::Extab(a) => {
            let w = read_word(a).ok_or(EhabiError::BadExtab(a))?;
            if w & 0x8000_0000 != 0 {
                (w, Some(a + 4))
            } else {
                // Generic personality: the next word has the model-1 layout
                // (count in bits 31..24, then three opcode bytes).
                let w1 = read_word(a + 4).ok_or(EhabiError::BadExtab(a + 4))?;
                let count = (w1 >> 24) as usize;
                for sh in [16, 8, 0] {
                    push((w1 >> sh) as u8, &mut n);
                }
                for k in 0..count.min(MAX_OPCODES / 4) {
                    let at = a + 8 + 4 * k as u64;
                    let w = read_word(at).ok_or(EhabiError::BadExtab(at))?;
                    for sh in [24, 16, 8, 0] {
                        push((w >> sh) as u8, &mut n);
                    }
                }
                return Ok(n);
            }
        }
    };
    match (w0 >> 24) & 0x0f {
        0 => {
            for sh in [16, 8, 0] {
                push((w0 >> sh) as u8, &mut n);
            }
        }
        1 | 2 => {
            let count = ((w0 >> 16) & 0xff) as usize;
            for sh in [8, 0] {
                push((w0 >> sh) as u8, &mut n);
            }
            let Some(mut at) = more_at else {
                return Err(EhabiError::Unsupported(w0));
            };
            for _ in 0..count.min(MAX_OPCODES / 4) {
                let w = read_word(at).ok_or(EhabiError::BadExtab(at))?;
                for sh in [24, 16, 8, 0] {
                    push((w >> sh) as u8, &mut n);
                }
                at += 4;
            }
        }
        _ => return Err(EhabiError::Unsupported(w0)),
    }
    Ok(n)
}

/// Runs the unwind opcodes on `regs` (r0..r15): pops read through `mem`
/// from the virtual stack pointer, which starts at r13 and ends as the
/// caller's sp. If no opcode set r15, the caller's pc is r14.
pub fn execute<M: Memory + ?Sized>(
    ops: &[u8],
    regs: &mut [u32; 16],
    mem: &mut M,
) -> Result<(), EhabiError> {
    let mut vsp = regs[13];
    let mut pc_set = false;
    let mut i = 0;
    let mut pop = |regs: &mut [u32; 16],
                   vsp: &mut u32,
                   mask: u16,
                   pc_set: &mut bool|
     -> Result<(), EhabiError> {
        let mut sp_popped = None;
        for (r, reg) in regs.iter_mut().enumerate() {
            if mask & (1 << r) != 0 {
                let v = mem
                    .read_u32(*vsp as u64)
                    .map_err(|_| EhabiError::Stack(*vsp as u64))?;
                if r == 13 {
                    sp_popped = Some(v);
                } else {
                    *reg = v;
                }
                if r == 15 {
                    *pc_set = true;
                }
                *vsp = vsp.wrapping_add(4);
            }
        }
        if let Some(v) = sp_popped {
            *vsp = v;
        }
        Ok(())
    };
    while i < ops.len() {
        let op = ops[i];
        i += 1;
        let next = |i: &mut usize| -> u8 {
            let b = ops.get(*i).copied().unwrap_or(0xb0);
            *i += 1;
            b
        };
        match op {
            0x00..=0x3f => vsp = vsp.wrapping_add(((op as u32 & 0x3f) << 2) + 4),
            0x40..=0x7f => vsp = vsp.wrapping_sub(((op as u32 & 0x3f) << 2) + 4),
            0x80..=0x8f => {
                let b = next(&mut i);
                let mask = (((op as u16 & 0x0f) << 8) | b as u16) << 4;
                if mask == 0 {
                    return Err(EhabiError::Refused(op));
                }
                pop(regs, &mut vsp, mask, &mut pc_set)?;
            }
            0x90..=0x9f => {
                let r = (op & 0x0f) as usize;
                if r == 13 || r == 15 {
                    return Err(EhabiError::Refused(op));
                }
                vsp = regs[r];
            }
            0xa0..=0xaf => {
                let n = (op & 0x07) as u16;
                let mut mask: u16 = ((1u16 << (n + 1)) - 1) << 4;
                if op & 0x08 != 0 {
                    mask |= 1 << 14;
                }
                pop(regs, &mut vsp, mask, &mut pc_set)?;
            }
            0xb0 => break,
            0xb1 => {
                let b = next(&mut i);
                if b == 0 || b & 0xf0 != 0 {
                    return Err(EhabiError::Refused(op));
                }
                pop(regs, &mut vsp, b as u16, &mut pc_set)?;
            }
            0xb2 => {
                let mut v: u32 = 0;
                let mut shift = 0;
                loop {
                    let b = next(&mut i);
                    v |= ((b & 0x7f) as u32).wrapping_shl(shift);
                    shift += 7;
                    if b & 0x80 == 0 || shift > 28 {
                        break;
                    }
                }
                vsp = vsp.wrapping_add((v << 2).wrapping_add(0x204));
            }
            0xb3 => {
                let b = next(&mut i);
                vsp = vsp.wrapping_add(8 * ((b & 0x0f) as u32 + 1) + 4);
            }
            0xb8..=0xbf => vsp = vsp.wrapping_add(8 * ((op & 0x07) as u32 + 1) + 4),
            0xc0..=0xc5 => vsp = vsp.wrapping_add(8 * ((op & 0x07) as u32 + 1)),
            0xc6 => {
                let b = next(&mut i);
                vsp = vsp.wrapping_add(8 * ((b & 0x0f) as u32 + 1));
            }
            0xc7 => {
                let b = next(&mut i);
                if b == 0 || b & 0xf0 != 0 {
                    return Err(EhabiError::Refused(op));
                }
                vsp = vsp.wrapping_add(4 * b.count_ones());
            }
            0xc8 | 0xc9 => {
                let b = next(&mut i);
                vsp = vsp.wrapping_add(8 * ((b & 0x0f) as u32 + 1));
            }
            0xd0..=0xd7 => vsp = vsp.wrapping_add(8 * ((op & 0x07) as u32 + 1)),
            _ => return Err(EhabiError::Refused(op)),
        }
    }
    if !pc_set {
        regs[15] = regs[14];
    }
    regs[13] = vsp;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ReadError;

    struct Stack {
        base: u64,
        words: Vec<u32>,
    }
    impl Memory for Stack {
        fn read_u64(&mut self, _a: u64) -> Result<u64, ReadError> {
            Err(ReadError::Unreadable(0))
        }
        fn read_u32(&mut self, a: u64) -> Result<u32, ReadError> {
            let i = a.checked_sub(self.base).ok_or(ReadError::OutOfBounds(a))? / 4;
            self.words
                .get(i as usize)
                .copied()
                .ok_or(ReadError::OutOfBounds(a))
        }
    }

    #[test]
    fn pthread_kill_like() {
        // 0x8004abb0: model 0, opcodes 04 ab b0:
        //   04  vsp += 20
        //   ab  pop {r4-r7, r14}
        //   b0  finish
        let mut buf = [0u8; MAX_OPCODES];
        let n = opcodes(Entry::Inline(0x8004abb0), |_| None, &mut buf).unwrap();
        assert_eq!(&buf[..n], &[0x04, 0xab, 0xb0]);
        let mut st = Stack {
            base: 0x1000,
            words: vec![0; 5]
                .into_iter()
                .chain([4, 5, 6, 7, 0x20001])
                .collect(),
        };
        let mut regs = [0u32; 16];
        regs[13] = 0x1000;
        execute(&buf[..n], &mut regs, &mut st).unwrap();
        assert_eq!(regs[13], 0x1000 + 40);
        assert_eq!(
            (regs[4], regs[7], regs[14], regs[15]),
            (4, 7, 0x20001, 0x20001)
        );
    }

    #[test]
    fn compact_model_1_in_extab() {
        // extab at 0x5000: 81 02 0a 3f, 84 00 b0 b0 (model 1, 1 more word):
        //   0a     vsp += 44
        //   3f     vsp += 256
        //   84 00  pop {r14}
        let mut buf = [0u8; MAX_OPCODES];
        let words = |a: u64| match a {
            0x5000 => Some(0x8101_0a3f),
            0x5004 => Some(0x8400_b0b0),
            _ => None,
        };
        let n = opcodes(Entry::Extab(0x5000), words, &mut buf).unwrap();
        assert_eq!(&buf[..n], &[0x0a, 0x3f, 0x84, 0x00, 0xb0, 0xb0]);
    }

    #[test]
    fn lookup_and_cantunwind() {
        // Two entries at 0x8000: fn 0x1000 inline 0x80b0b0b0; fn 0x2000 cantunwind.
        let mut d = Vec::new();
        let e0 = (0x1000u32.wrapping_sub(0x8000)) & 0x7fff_ffff;
        let e1 = (0x2000u32.wrapping_sub(0x8008)) & 0x7fff_ffff;
        for w in [e0, 0x80b0_b0b0, e1, 1] {
            d.extend_from_slice(&w.to_le_bytes());
        }
        let t = ExidxTable {
            data: &d,
            addr: 0x8000,
        };
        assert_eq!(t.lookup(0x1001), Ok((0x1000, Entry::Inline(0x80b0_b0b0))));
        assert_eq!(t.lookup(0x2004), Ok((0x2000, Entry::CantUnwind)));
        assert_eq!(t.lookup(0x0fff), Err(EhabiError::NotCovered));
        let mut buf = [0u8; MAX_OPCODES];
        assert_eq!(
            opcodes(Entry::CantUnwind, |_| None, &mut buf),
            Err(EhabiError::CantUnwind)
        );
    }

    #[test]
    fn refuse_and_truncated() {
        let mut regs = [0u32; 16];
        let mut st = Stack {
            base: 0,
            words: vec![],
        };
        assert_eq!(
            execute(&[0x80, 0x00], &mut regs, &mut st),
            Err(EhabiError::Refused(0x80))
        );
        // pop from an unreadable stack
        regs[13] = 0x10;
        assert_eq!(
            execute(&[0xa8], &mut regs, &mut st),
            Err(EhabiError::Stack(0x10))
        );
    }
}
