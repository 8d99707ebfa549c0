//! The hot loop over the rule cache: frames whose return address has a
//! cached rule the loop applies, walked without the generic unwinder. The
//! loop itself is the architecture's (`arch::native::exact::run_hot`:
//! assembly on x86-64, the portable loop of `arch/aarch64/hot.rs` on
//! AArch64 and RISC-V 64); this module hands it the cache and the output,
//! and is what the rule source's fast path (`LocalSource::fast_walk`) and
//! the capture entries call.

#[cfg(callstack_native)]
use super::cache::CACHE;
use crate::unwind::FastEnd;

#[cfg(test)]
std::thread_local! {
    /// Frames the hot loop walked on this thread (unit tests check that a
    /// warm capture takes it).
    pub(super) static HOT_FRAMES: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// Counts `n` frames walked by the hot loop (tests only).
#[inline(always)]
fn count_hot(n: usize) {
    #[cfg(test)]
    HOT_FRAMES.with(|c| c.set(c.get() + n));
    let _ = n;
}

/// The registers of the frame a walk is at; `pc` is a return address (its
/// lookup address is `pc - 1`) unless the walk says it is exact.
#[derive(Clone, Copy)]
pub(super) struct Hot {
    pub(super) pc: u64,
    pub(super) sp: u64,
    pub(super) fp: u64,
}

impl Hot {
    /// The frame whose registers a naked entry passed.
    #[inline(always)]
    pub(super) fn at(pc: usize, sp: usize, fp: usize) -> Hot {
        Hot {
            pc: pc as u64,
            sp: sp as u64,
            fp: fp as u64,
        }
    }
}

/// The hot loop: frames whose key (their return address) is in the rule
/// cache with a rule it applies (`Sp`/`Bp` shapes, narrow or wide), applied
/// with reads in `[sp, hi)`. Writes up to `len` return addresses at `out`;
/// returns how many, and why it stopped, with `hot` at the last frame
/// written (or at the start). Requires `hot.sp` inside the stack whose top
/// is `hi`, and `hot.pc` a return address.
///
/// The loop is `arch::native::exact::run_hot`. On x86-64 each cache word
/// predicts the word of its caller (the one found after it last time,
/// `RuleCache::pred`), and runs of frame records have a loop of their own;
/// on AArch64 and RISC-V 64 consecutive frames under one rule cost one
/// compare of key and rule at once. A non-canonical return address could
/// alias a cached key in the compare; its frame is then unwound with a
/// wrong rule, which stays inside the checked stack range like any corrupt
/// frame.
///
/// # Safety
/// `out` must be valid for `len` writes.
#[cfg(callstack_native)]
#[inline(always)]
pub(super) unsafe fn hot_loop(
    hot: &mut Hot,
    hi: u64,
    out: *mut usize,
    len: usize,
) -> (usize, FastEnd) {
    use crate::arch::native::exact::{run_exit, run_hot};
    if len == 0 {
        return (0, FastEnd::Full);
    }
    let mut regs = [hot.pc, hot.sp, hot.fp];
    let mut o = out;
    // SAFETY: `out..out + len` are the caller's slots (len >= 1); `[sp, hi)`
    // is readable stack; `CACHE` is the rule cache, its wide table right
    // after its words and its predictions after that (`repr(C)`), as
    // `arch::rule_cache` lays it out.
    let exit = unsafe {
        run_hot(
            &mut regs,
            &mut o,
            out.add(len),
            hi,
            (&raw const CACHE).cast(),
        )
    };
    [hot.pc, hot.sp, hot.fp] = regs;
    if hot.pc == 0 && o != out {
        // A zero return address: the outermost frame, which x86-64's
        // `run_hot` writes and then stops at (no key is 0); not a frame.
        // SAFETY: one back, still in the caller's slots (`o != out`).
        o = unsafe { o.sub(1) };
        // SAFETY: both in the caller's slots.
        return (unsafe { o.offset_from(out) } as usize, FastEnd::Outermost);
    }
    let why = match exit {
        run_exit::FULL => FastEnd::Full,
        run_exit::OUTERMOST => FastEnd::Outermost,
        run_exit::SLOW => FastEnd::Slow,
        _ => FastEnd::Slow,
    };
    // SAFETY: both in (or one past) the caller's slots.
    let n = unsafe { o.offset_from(out) } as usize;
    count_hot(n);
    (n, why)
}

/// No hot loop on a target without an in-process module: every frame takes
/// the generic step.
///
/// # Safety
/// None needed; `unsafe` as on the other targets.
#[cfg(not(callstack_native))]
#[inline(always)]
pub(super) unsafe fn hot_loop(
    _hot: &mut Hot,
    _hi: u64,
    _out: *mut usize,
    len: usize,
) -> (usize, FastEnd) {
    count_hot(0);
    if len == 0 {
        (0, FastEnd::Full)
    } else {
        (0, FastEnd::Slow)
    }
}

/// [`hot_loop`] out of line, for the unwinder's fast path
/// (`LocalSource::fast_walk`).
///
/// # Safety
/// As [`hot_loop`].
#[inline(never)]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(super) unsafe fn hot_run(
    hot: &mut Hot,
    hi: u64,
    out: *mut usize,
    len: usize,
) -> (usize, FastEnd) {
    // SAFETY: the caller's promise.
    unsafe { hot_loop(hot, hi, out, len) }
}

/// Walks `n` frames through the hot loop without keeping them (through a
/// small scratch buffer). Returns how many were left unwalked (0: all) and
/// how the last run ended (`Full` when it walked them all).
#[inline(always)]
pub(super) fn hot_skip(hot: &mut Hot, hi: u64, mut n: usize) -> (usize, FastEnd) {
    let mut scratch = [core::mem::MaybeUninit::<usize>::uninit(); 16];
    let mut why = FastEnd::Full;
    while n > 0 && why == FastEnd::Full {
        let m = n.min(scratch.len());
        // SAFETY: `m` slots of `scratch`.
        let (k, e) = unsafe { hot_loop(hot, hi, scratch.as_mut_ptr().cast(), m) };
        n -= k;
        why = e;
    }
    (n, why)
}

#[cfg(all(test, callstack_native))]
mod tests {
    use super::HOT_FRAMES;
    use std::hint::black_box;

    /// `depth` frames of `recurse`, then a capture.
    #[inline(never)]
    fn recurse(depth: usize, out: &mut [usize]) -> usize {
        if depth == 0 {
            return black_box(crate::capture_exact(0, black_box(out)));
        }
        // Work after the call keeps it from being a tail call.
        black_box(recurse(depth - 1, out)) + black_box(0)
    }

    /// A warm capture walks its frames from the rule cache: the same chain
    /// as the capture that filled it, every frame of the recursion taken by
    /// the hot loop (on AArch64 too, where `pack` once returned 0 and every
    /// frame took the generic step).
    #[test]
    fn a_warm_capture_walks_from_the_rule_cache() {
        const DEPTH: usize = 24;
        let mut cold = [0usize; 128];
        let n = recurse(DEPTH, &mut cold);
        assert!(n > DEPTH + 1, "{n} frames");
        // The recursion's return address, the same in every frame.
        let site = cold[1];
        assert!(
            cold[1..DEPTH + 1].iter().all(|&a| a == site),
            "{:x?}",
            &cold[..n]
        );
        for _ in 0..3 {
            let before = HOT_FRAMES.with(|c| c.get());
            let mut warm = [0usize; 128];
            let m = recurse(DEPTH, &mut warm);
            let hot = HOT_FRAMES.with(|c| c.get()) - before;
            // The same chain but for the test's own call site, another
            // line of this function.
            assert_eq!(m, n);
            assert_eq!(&warm[..DEPTH + 1], &cold[..DEPTH + 1]);
            assert_eq!(&warm[DEPTH + 2..m], &cold[DEPTH + 2..n]);
            assert!(hot >= DEPTH, "{hot} of {m} frames from the hot loop");
        }
    }
}

/// The hot loop on a fake AArch64 stack: the forms of `arch/aarch64/rule.rs`
/// (gcc's return address at the bottom of the frame, clang's frame record
/// from x29, a wide rule), a return address with a pointer-authentication
/// code, the outermost frame, and a frame that would read past the stack.
#[cfg(all(test, target_arch = "aarch64"))]
mod aarch64_fake_stack {
    use super::super::cache::{cache_get, cache_put, cache_rule, flush_pending};
    use super::{hot_loop, Hot};
    use crate::arch::aarch64::UnwindRuleAarch64 as R;
    use crate::unwind::FastEnd;

    fn put(ra: u64, rule: R) {
        let p = cache_rule(rule);
        assert_ne!(p, 0, "{rule:?} is cached");
        flush_pending();
        cache_put(ra - 1, p);
        assert_eq!(cache_get(ra - 1), p);
    }

    #[test]
    fn hot_loop_walks_aarch64_forms() {
        // Fake code addresses, never mapped: the keys are this test's own.
        let b = 0x0000_6d5a_0000_0000u64;
        let ra = [b + 0x10, b + 0x1110, b + 0x2210, b + 0x3310];
        // gcc without a frame pointer: `str x30, [sp, #-32]!`.
        put(
            ra[0],
            R::Sp {
                cfa: 32,
                ra: -32,
                fp: 0,
            },
        );
        // clang: `CFA = x29 + 16`, the frame record under the CFA.
        put(
            ra[1],
            R::Fp {
                cfa: 16,
                ra: -8,
                fp: -16,
            },
        );
        // A frame of 9 KiB: a wide rule.
        put(
            ra[2],
            R::Sp {
                cfa: 9024,
                ra: -9016,
                fp: -9024,
            },
        );
        put(ra[3], R::End);
        let mut words = vec![0u64; 2048];
        let at = |w: &Vec<u64>, i: usize| w.as_ptr() as u64 + 8 * i as u64;
        // Frame 0 at word 0: its return address signed (a PAC in bits 48+).
        words[0] = ra[1] | 0x002a_0000_0000_0000;
        // Frame 1 at word 4, x29 at word 10: the frame record.
        words[10] = 0x1234_5670;
        words[11] = ra[2];
        // Frame 2 at word 12: x29 and x30 at the bottom of 9 KiB.
        words[12] = 0x7654_3210;
        words[13] = ra[3];
        let fp0 = at(&words, 10);
        let run = |words: &Vec<u64>, hi: u64| {
            let mut hot = Hot {
                pc: ra[0],
                sp: at(words, 0),
                fp: fp0,
            };
            let mut out = [0usize; 8];
            // SAFETY: 8 slots; `[sp, hi)` lies in `words`.
            let (n, why) = unsafe { hot_loop(&mut hot, hi, out.as_mut_ptr(), 8) };
            (
                out[..n].iter().map(|&x| x as u64).collect::<Vec<_>>(),
                why,
                hot,
            )
        };
        let (got, why, hot) = run(&words, at(&words, 2048));
        assert_eq!(got, [ra[1], ra[2], ra[3]]);
        assert_eq!(why, FastEnd::Outermost);
        assert_eq!(
            (hot.pc, hot.sp, hot.fp),
            (ra[3], at(&words, 12 + 9024 / 8), 0x7654_3210)
        );
        // The stack ends before frame 2's CFA: that frame is left to the
        // generic step, nothing past the end is read.
        let (got, why, hot) = run(&words, at(&words, 1100));
        assert_eq!(got, [ra[1], ra[2]]);
        assert_eq!(why, FastEnd::Slow);
        assert_eq!(
            (hot.pc, hot.sp, hot.fp),
            (ra[2], at(&words, 12), 0x1234_5670)
        );
    }
}
