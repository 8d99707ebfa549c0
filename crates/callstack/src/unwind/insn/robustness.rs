//! Robustness: every analyzer and the EHABI parser on pseudo-random bytes
//! and random stacks. Nothing may panic, loop or read outside what it was
//! given; each answer comes back within the documented instruction bounds.
//! (The cargo-fuzz targets under `fuzz/` drive the same entry points.)

use super::*;
use crate::unwind::ReadError;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

struct RandomStack {
    base: u64,
    words: Vec<u64>,
}

impl crate::unwind::Memory for RandomStack {
    fn read_u64(&mut self, a: u64) -> Result<u64, ReadError> {
        let i = a.checked_sub(self.base).ok_or(ReadError::OutOfBounds(a))? / 8;
        self.words
            .get(i as usize)
            .copied()
            .ok_or(ReadError::OutOfBounds(a))
    }
}

fn stack(r: &mut Rng, code_base: u64, code_len: u64) -> RandomStack {
    let words = (0..256)
        .map(|_| match r.next() % 3 {
            0 => code_base + r.next() % code_len, // code-looking words
            1 => 0x7000_0000 + (r.next() % 2048) * 8,
            _ => r.next(),
        })
        .collect();
    RandomStack {
        base: 0x7000_0000,
        words,
    }
}

#[test]
fn x86_64_analyzers_on_random_code() {
    let mut r = Rng(0x1234_5678_9abc_def1);
    for round in 0..300 {
        let code = r.bytes(512);
        let funcs = [(0x1000u64, 0x1100u64), (0x1100, 0x1200)];
        let mut c = SliceCode {
            base: 0x1000,
            bytes: &code,
            functions: &funcs,
        };
        let pc = 0x1000 + r.next() % 512;
        let _ = x86_64::epilogue::analyze(&mut c, pc, None);
        let _ = x86_64::prologue::analyze(&mut c, 0x1000, pc, Some((0x1000, 0x1200)));
        let mut st = stack(&mut r, 0x1000, 512);
        let regs = UnwindRegs {
            pc,
            sp: 0x7000_0000 + (round % 64) * 8,
            fp: 0x7000_0000 + (r.next() % 256) * 8,
            lr: 0,
        };
        let mut out = [(0u64, Method::Context); 32];
        let (n, _) = super::walk::x86_64(regs, &mut st, &mut c, 0x7000_0000 + 2048, &mut out);
        assert!(n <= out.len());
        // Every frame after the first moved up the stack and follows a call.
        for f in &out[1..n] {
            assert!(x86_64::unwinder::call_before(&mut c, f.0).is_some() || f.1 == Method::Scan);
        }
    }
}

/// The cache changes no answer: on random code and stacks, each step taken
/// through a cold cache and then a warm one equals the uncached step.
#[test]
fn cached_steps_equal_uncached_on_random_code() {
    let cache = Box::new(cache::InsnCache::new());
    let mut r = Rng(0x0bad_cafe_1234_5678);
    let mut warm_hits = 0;
    for round in 0..200 {
        let code = r.bytes(512);
        let funcs = [(0x1000u64, 0x1100u64), (0x1100, 0x1200)];
        let mut c = SliceCode {
            base: 0x1000,
            bytes: &code,
            functions: if round % 2 == 0 { &funcs } else { &[] },
        };
        let mut st = stack(&mut r, 0x1000, 512);
        // New code at the same addresses: the old entries must go.
        cache.clear();
        for _ in 0..8 {
            let regs = UnwindRegs {
                pc: 0x1000 + r.next() % 512,
                sp: 0x7000_0000 + (r.next() % 64) * 8,
                fp: 0x7000_0000 + (r.next() % 256) * 8,
                lr: 0,
            };
            let first = r.next() % 2 == 0;
            let end = 0x7000_0000 + 2048;
            let plain = x86_64::unwinder::step(&regs, &mut st, &mut c, first, end);
            let fills = cache.fills();
            let cold =
                x86_64::unwinder::step_cached(&regs, &mut st, &mut c, first, end, Some(&cache));
            let filled = cache.fills();
            let warm =
                x86_64::unwinder::step_cached(&regs, &mut st, &mut c, first, end, Some(&cache));
            assert_eq!(plain, cold, "cold, round {round}, {regs:x?}");
            assert_eq!(plain, warm, "warm, round {round}, {regs:x?}");
            if filled > fills && cache.fills() == filled {
                warm_hits += 1;
            }
        }
    }
    assert!(warm_hits > 100, "{warm_hits} warm steps hit");
}

#[test]
fn risc_analyzers_on_random_code() {
    let mut r = Rng(0xfeed_face_cafe_beef);
    for _ in 0..300 {
        let code = r.bytes(1024);
        let mut c = SliceCode::new(0x1000, &code);
        let pc = (0x1000 + r.next() % 1024) & !3;
        let _ = aarch64::prologue::analyze(&mut c, pc, None, true);
        let _ = mips::prologue::analyze(&mut c, pc, Some(0x1000), false);
        let _ = arm::prologue::analyze(&mut c, pc | 1, None, false);
        let _ = arm::prologue::analyze(&mut c, pc, Some(0x1000), true);
        let mut st = stack(&mut r, 0x1000, 1024);
        let regs = UnwindRegs {
            pc,
            sp: 0x7000_0000,
            fp: 0x7000_0100,
            lr: 0x1000 + r.next() % 1024,
        };
        let mut out = [(0u64, Method::Context); 32];
        let _ =
            super::walk::risc::<aarch64::Arch, _, _>(regs, &mut st, &mut c, 0x7000_0800, &mut out);
        let _ = super::walk::risc::<mips::Arch, _, _>(regs, &mut st, &mut c, 0x7000_0800, &mut out);
        let mut arm_regs = [0u32; 16];
        for (i, x) in arm_regs.iter_mut().enumerate() {
            *x = (r.next() as u32) ^ i as u32;
        }
        arm_regs[13] = 0x7000_0000;
        arm_regs[15] = (pc as u32) | (r.next() as u32 & 1);
        let mut nt = arm::unwinder::NoTables(SliceCode::new(0x1000, &code));
        let _ = super::walk::arm(arm_regs, &mut st, &mut nt, 0x7000_0800, &mut out);
    }
}

#[test]
fn ehabi_on_random_tables() {
    let mut r = Rng(0x0bad_5eed_0bad_5eed);
    for _ in 0..500 {
        let data = r.bytes(64);
        let t = arm::ehabi::ExidxTable {
            data: &data,
            addr: 0x8000,
        };
        let words = r.bytes(256);
        let read = |a: u64| -> Option<u32> {
            let o = a.checked_sub(0x9000)? as usize;
            words
                .get(o..o + 4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        };
        let mut buf = [0u8; arm::ehabi::MAX_OPCODES];
        for pc in [0u64, 0x1000, 0x8000, 0x9000, r.next() & 0xffff_ffff] {
            if let Ok((_, e)) = t.lookup(pc) {
                if let Ok(n) = arm::ehabi::opcodes(e, read, &mut buf) {
                    let mut regs = [0x7000_0000u32; 16];
                    let mut st = stack(&mut r, 0x1000, 64);
                    let _ = arm::ehabi::execute(&buf[..n], &mut regs, &mut st);
                }
            }
        }
        let ops = r.bytes(32);
        let mut regs = [0x7000_0000u32; 16];
        let mut st = stack(&mut r, 0x1000, 64);
        let _ = arm::ehabi::execute(&ops, &mut regs, &mut st);
    }
}

#[test]
fn prstatus_too_short_is_an_error() {
    for n in [0usize, 10, 100, 200] {
        let d = vec![0u8; n];
        assert!(core_regs::x86_64::unwind_regs(&d).is_err() || n >= 112 + 27 * 8);
        assert!(core_regs::aarch64::unwind_regs(&d).is_err() || n >= 112 + 34 * 8);
        assert!(core_regs::arm::unwind_regs(&d).is_err() || n >= 72 + 18 * 4);
        assert!(core_regs::mips::unwind_regs(&d).is_err() || n >= 72 + 45 * 4);
    }
    let e = core_regs::mips::unwind_regs(&[0; 10]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "NT_PRSTATUS note too short: 10 bytes, need 252"
    );
}
