//! Tests of the rule cache and the hot loop on fake stacks (x86-64).

use core::sync::atomic::Ordering;

use super::cache::{cache_get, cache_put, cache_rule, cache_set, flush_pending, CACHE, KEY_MASK};
use super::flags::{Flags, FLAGS};
use super::hot::{hot_loop, Hot};
use super::A;
use crate::arch::x86_64::UnwindRuleX86_64 as R;
use crate::arch::Arch;
use crate::unwind::FastEnd;

/// Fake code addresses: never mapped, so their rule-cache keys are
/// this test's own (the hot loop never reads code).
pub(super) const CODE: u64 = 0x0000_7e5a_0000_0000;

#[test]
fn the_flags_page_is_written_at_load() {
    assert!(FLAGS.touched.load(Ordering::Relaxed));
    assert_eq!(&FLAGS as *const Flags as usize % 4096, 0);
}

fn put(ra: u64, rule: R) {
    let p = cache_rule(rule);
    assert_ne!(p, 0, "{rule:?} packs");
    flush_pending();
    cache_put(ra - 1, p);
    assert_eq!(cache_get(ra - 1), p);
}

/// A fake stack of 256 words, its top `hi` one past the last.
pub(super) struct Fake {
    pub(super) words: Vec<u64>,
}

impl Fake {
    pub(super) fn new() -> Self {
        Self::with_words(256)
    }
    fn with_words(n: usize) -> Self {
        Fake { words: vec![0; n] }
    }
    pub(super) fn at(&self, i: usize) -> u64 {
        self.words.as_ptr() as u64 + 8 * i as u64
    }
    pub(super) fn hi(&self) -> u64 {
        self.at(self.words.len())
    }
    fn run(&self, hot: &mut Hot, len: usize) -> (Vec<u64>, FastEnd) {
        let mut out = vec![0usize; len];
        // SAFETY: `len` slots; `[hot.sp, hi)` is the fake stack.
        let (n, why) = unsafe { hot_loop(hot, self.hi(), out.as_mut_ptr(), len) };
        (out[..n].iter().map(|&x| x as u64).collect(), why)
    }
}

/// Return addresses of test `t` (tests run at once and share the cache).
fn ras(t: u64) -> [u64; 5] {
    let b = CODE + t * 0x10_0000;
    [b + 0x10, b + 0x1110, b + 0x2210, b + 0x3310, b + 0x4410]
}

/// Frames under a frame-record rule, two `rsp`-based rules (one saving
/// `rbp`), the frame-record rule again, and an outermost frame.
fn chain(t: u64) -> (Fake, Hot, [u64; 5]) {
    let RA = ras(t);
    put(RA[0], R::Bp { cfa: 16, bp: -16 });
    put(RA[1], R::Sp { cfa: 24, bp: 0 });
    put(RA[2], R::Sp { cfa: 32, bp: -24 });
    put(RA[3], R::Bp { cfa: 16, bp: -16 });
    put(RA[4], R::End);
    let mut f = Fake::new();
    let at = |f: &Fake, i| f.at(i);
    // Frame 0 at fp = word 12: saved fp (not used again), return address.
    f.words[12] = 0xdead_beef;
    f.words[13] = RA[1];
    // Frame 1: CFA = word 14 + 24 = word 17.
    f.words[16] = RA[2];
    // Frame 2: CFA = word 17 + 32 = word 21, rbp saved at CFA - 24.
    f.words[18] = at(&f, 30);
    f.words[20] = RA[3];
    // Frame 3: record at word 30.
    f.words[30] = 0;
    f.words[31] = RA[4];
    let hot = Hot {
        pc: RA[0],
        sp: at(&f, 10),
        fp: at(&f, 12),
    };
    (f, hot, RA)
}

#[test]
fn hot_loop_walks_mixed_rules_to_the_outermost_frame() {
    let (f, mut hot, RA) = chain(1);
    let (pcs, why) = f.run(&mut hot, 16);
    assert_eq!(pcs, &RA[1..]);
    assert!(why == FastEnd::Outermost);
}

#[test]
fn hot_loop_stops_when_full_and_resumes() {
    let (f, mut hot, RA) = chain(2);
    let (pcs, why) = f.run(&mut hot, 2);
    assert_eq!(pcs, &RA[1..3]);
    assert!(why == FastEnd::Full);
    assert_eq!((hot.pc, hot.sp, hot.fp), (RA[2], f.at(17), 0xdead_beef));
    let (pcs, why) = f.run(&mut hot, 16);
    assert_eq!(pcs, &RA[3..]);
    assert!(why == FastEnd::Outermost);
    let (pcs, why) = f.run(&mut Hot { pc: RA[0], ..hot }, 0);
    assert!(pcs.is_empty() && why == FastEnd::Full);
}

/// Each cache word predicts its caller's word; a prediction is used
/// only when its key is the return address read, and the rule is the
/// word's as it is now.
#[test]
fn hot_loop_checks_its_predictions() {
    let (mut f, hot0, RA) = chain(5);
    let walk = |f: &Fake| {
        let mut hot = hot0;
        f.run(&mut hot, 16)
    };
    for _ in 0..3 {
        let (pcs, why) = walk(&f);
        assert_eq!(pcs, &RA[1..]);
        assert!(why == FastEnd::Outermost);
    }
    // Frame 1 now returns elsewhere (same rule as RA[2]): the
    // prediction made for it misses and is replaced, twice over.
    let other = ras(6)[2];
    put(other, R::Sp { cfa: 32, bp: -24 });
    f.words[16] = other;
    for _ in 0..2 {
        let (pcs, why) = walk(&f);
        assert_eq!(pcs, [RA[1], other, RA[3], RA[4]]);
        assert!(why == FastEnd::Outermost);
    }
    f.words[16] = RA[2];
    for _ in 0..2 {
        let (pcs, why) = walk(&f);
        assert_eq!(pcs, &RA[1..]);
        assert!(why == FastEnd::Outermost);
    }
    // The rule of a predicted word changes: the new one applies.
    put(RA[2], R::End);
    let (pcs, why) = walk(&f);
    assert_eq!(pcs, &RA[1..3]);
    assert!(why == FastEnd::Outermost);
    // Its key is gone (another key in its place): the generic
    // unwinder takes the frame.
    put(RA[2], R::Sp { cfa: 32, bp: -24 });
    let (pcs, _) = walk(&f);
    assert_eq!(pcs, &RA[1..]);
    let i = cache_set(RA[2]);
    let w = if CACHE.words[i].load(Ordering::Relaxed) & KEY_MASK == RA[2] {
        i
    } else {
        i + 1
    };
    let old = CACHE.words[w].swap(RA[2] ^ 0x40 | 1 << 62, Ordering::Relaxed);
    let (pcs, why) = walk(&f);
    assert_eq!(pcs, &RA[1..3]);
    assert!(why == FastEnd::Slow);
    CACHE.words[w].store(old, Ordering::Relaxed);
}

/// A corrupt saved frame pointer in frame 2: the walk stops at frame 3
/// (for the generic unwinder) without reading outside the stack.
#[test]
fn hot_loop_never_reads_outside_the_stack() {
    let (mut f, hot0, RA) = chain(3);
    let hi = f.hi();
    let lo = f.at(0);
    for bad in [
        u64::MAX - 15,
        u64::MAX - 7,
        0x10,
        lo,
        f.at(20), // below the frame's sp (word 21)
        hi - 8,
        hi,
        hi + 4096,
    ] {
        f.words[18] = bad;
        let mut hot = hot0;
        let (pcs, why) = f.run(&mut hot, 16);
        assert_eq!(pcs, &RA[1..4], "fp {bad:#x}");
        assert!(why == FastEnd::Slow, "fp {bad:#x}");
        assert_eq!((hot.pc, hot.fp), (RA[3], bad));
    }
    // The highest record that fits: read, and its zero return address
    // ends the walk.
    f.words[18] = hi - 16;
    let mut hot = hot0;
    let (pcs, why) = f.run(&mut hot, 16);
    assert_eq!(pcs, &RA[1..4]);
    assert!(why == FastEnd::Outermost);
}

#[test]
fn hot_loop_declines_rules_that_leave_the_stack() {
    let (mut f, hot0, RA) = chain(4);
    // CFA past the top of the stack.
    put(RA[1], R::Sp { cfa: 2040, bp: 0 });
    let mut hot = hot0;
    let (pcs, why) = f.run(&mut hot, 16);
    assert_eq!(pcs, &RA[1..2]);
    assert!(why == FastEnd::Slow && hot.pc == RA[1]);
    // Wide rules past the top of the stack.
    for rule in [
        R::Sp {
            cfa: 1 << 20,
            bp: 0,
        },
        R::Sp {
            cfa: 1 << 20,
            bp: -16,
        },
        R::Bp {
            cfa: 70_000,
            bp: -16,
        },
    ] {
        put(RA[1], rule);
        let mut hot = hot0;
        let (_, why) = f.run(&mut hot, 16);
        assert!(why == FastEnd::Slow && hot.pc == RA[1], "{rule:?}");
    }
    // A CFA from rbp that wraps around: fp + 16 overflows.
    put(RA[1], R::Sp { cfa: 24, bp: 0 });
    put(RA[3], R::Bp { cfa: 32, bp: -16 });
    f.words[18] = u64::MAX - 7;
    let mut hot = hot0;
    let (pcs, why) = f.run(&mut hot, 16);
    assert_eq!(pcs, &RA[1..4]);
    assert!(why == FastEnd::Slow && hot.pc == RA[3]);
    // Rules the hot loop does not apply, and a key not in the cache.
    for rule in [
        R::Evaluate,
        R::NoCfi,
        R::SignalFrame,
        R::Plt { threshold: 11 },
    ] {
        put(RA[1], rule);
        let mut hot = hot0;
        let (pcs, why) = f.run(&mut hot, 16);
        assert_eq!(pcs, &RA[1..2]);
        assert!(why == FastEnd::Slow && hot.pc == RA[1], "{rule:?}");
    }
    let mut hot = Hot {
        pc: CODE + 0x5550,
        ..hot0
    };
    let (pcs, why) = f.run(&mut hot, 16);
    assert!(pcs.is_empty() && why == FastEnd::Slow);
}

/// Frames of every size: narrow rules, 4 KiB and 40 KiB frames (wide
/// rules) from `rsp` and `rbp`, in one run.
#[test]
fn hot_loop_walks_big_frames() {
    let b = CODE + 9 * 0x10_0000;
    let RA = [
        b + 0x10,
        b + 0x1110,
        b + 0x2210,
        b + 0x3310,
        b + 0x4410,
        b + 0x5510,
    ];
    // Frame 1: 40 KiB from rsp, rbp saved at CFA - 16.
    put(
        RA[1],
        R::Sp {
            cfa: 40 * 1024 + 8,
            bp: -16,
        },
    );
    // Frame 2: 4 KiB + 8 from rsp, rbp unchanged.
    put(RA[2], R::Sp { cfa: 4104, bp: 0 });
    // Frame 3: from rbp, 20 KiB above it.
    put(
        RA[3],
        R::Bp {
            cfa: 20 * 1024 + 16,
            bp: -32,
        },
    );
    put(RA[4], R::Sp { cfa: 16, bp: 0 });
    put(RA[5], R::End);
    assert_eq!(A::pack(R::Sp { cfa: 4104, bp: 0 }), 0, "4104 is wide");
    let mut f = Fake::with_words(10_000);
    let w = |f: &Fake, a: u64| ((a - f.at(0)) / 8) as usize;
    let sp0 = f.at(8);
    // Frame 1 at sp0: CFA = sp0 + 40 KiB + 8.
    let cfa1 = sp0 + 40 * 1024 + 8;
    // The caller's rbp, which frame 3 is based on: frame 2's CFA.
    let rbp_for_3 = cfa1 + 4104;
    let i = w(&f, cfa1 - 16);
    f.words[i] = rbp_for_3;
    let i = w(&f, cfa1 - 8);
    f.words[i] = RA[2];
    // Frame 2 at cfa1: CFA = cfa1 + 4104.
    let cfa2 = cfa1 + 4104;
    let i = w(&f, cfa2 - 8);
    f.words[i] = RA[3];
    // Frame 3: CFA = rbp + 20 KiB + 16, rbp = cfa2.
    assert_eq!(rbp_for_3, cfa2);
    let cfa3 = rbp_for_3 + 20 * 1024 + 16;
    let i = w(&f, cfa3 - 32);
    f.words[i] = 0x1234_5678;
    let i = w(&f, cfa3 - 8);
    f.words[i] = RA[4];
    // Frame 4: CFA = cfa3 + 16.
    let i = w(&f, cfa3 + 8);
    f.words[i] = RA[5];
    assert!(cfa3 + 16 < f.hi());
    let mut hot = Hot {
        pc: RA[1],
        sp: sp0,
        fp: 7,
    };
    let (pcs, why) = f.run(&mut hot, 16);
    assert_eq!(pcs, &RA[2..]);
    assert!(why == FastEnd::Outermost);
    assert_eq!((hot.pc, hot.sp, hot.fp), (RA[5], cfa3 + 16, 0x1234_5678));
}
