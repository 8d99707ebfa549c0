//! The walk in this process: the hot loop over the rule cache (x86-64's
//! `run_hot`, elsewhere the portable loop below, which AArch64 and RISC-V 64
//! run with the forms of `arch/aarch64/rule.rs`), which the generic
//! unwinder's loop calls as its fast path (`LocalSource::fast_walk`), and
//! the drivers that start that loop.

#[cfg(not(target_arch = "x86_64"))]
use core::sync::atomic::Ordering;

use super::cache::{cache_go_live, CACHE};
#[cfg(not(target_arch = "x86_64"))]
use super::cache::{cache_set, KEY_MASK, WIDE_SIZE};
use super::code::insn_fallback;
use super::memory::{main_stack_bounds, StackMemory};
use super::source::LocalSource;
use super::A;
use crate::stack;
use crate::unwind::{FastEnd, Frame, ReadError, StopReason, UnwindError, UnwindRegs, Unwinder};

#[cfg(target_arch = "x86_64")]
use crate::arch::x86_64::exact::{run_exit, run_hot};

#[cfg(all(callstack_native, not(target_arch = "x86_64")))]
use crate::arch::native::exact::{decode_fast, decode_wide, FastForm, PACKED_END, RA_MASK};

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

/// Other targets: no packed rules, every frame takes the generic unwinder.
#[cfg(not(callstack_native))]
mod no_fast {
    pub(super) use crate::arch::aarch64::FastForm;
    pub(super) const PACKED_END: u16 = 0;
    pub(super) const RA_MASK: u64 = !0;
    pub(super) fn decode_fast(_: u16) -> Option<FastForm> {
        None
    }
    /// Never called: no wide word is stored on these targets.
    pub(super) fn decode_wide(_: u64) -> FastForm {
        FastForm {
            from_fp: false,
            off_a: 0,
            ra_at: 0,
            cfa_at: 0,
        }
    }
}
#[cfg(not(callstack_native))]
use no_fast::{decode_fast, decode_wide, FastForm, PACKED_END, RA_MASK};

/// Exit codes of [`run_same_rule`].
#[cfg(not(target_arch = "x86_64"))]
mod run_exit {
    pub(crate) const FULL: u64 = 0;
    pub(crate) const OUTERMOST: u64 = 1;
    pub(crate) const SLOW: u64 = 2;
    pub(crate) const CHANGED: u64 = 3;
}

/// The portable run of frames under one fast rule `r`, while the next
/// frame's cached word (first way of its set) is its key with that rule
/// (x86-64 decodes every rule in its assembly loop, `run_hot`). Returns a
/// [`run_exit`] code and, for `CHANGED`, the next frame's first-way word
/// xor its return address.
///
/// # Safety
/// `*o < end`, `*o..end` writable; `[regs[1], hi)` readable stack with
/// `r.a_max == hi - r.cfa_at`; `cache` the rule cache's words.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
unsafe fn run_same_rule(
    regs: &mut [u64; 3],
    o: &mut *mut usize,
    end: *mut usize,
    r: &FastRule,
    cache: *const u64,
) -> (u64, u64) {
    let [mut pc, mut sp, mut fp] = *regs;
    let mut out = *o;
    let (code, word) = loop {
        let a = if r.from_fp { fp } else { sp }.wrapping_add(r.off_a);
        if a < sp || a > r.a_max {
            break (run_exit::SLOW, 0);
        }
        // SAFETY: sp <= a and a + ra_at + 8 <= a + cfa_at <= hi: inside
        // the readable stack.
        let ra = unsafe { core::ptr::read_unaligned((a + r.ra_at) as *const u64) } & RA_MASK;
        if r.ra_at != 0 {
            // SAFETY: as above, below the return address.
            fp = unsafe { core::ptr::read_unaligned(a as *const u64) };
        }
        if ra == 0 {
            break (run_exit::OUTERMOST, 0);
        }
        // SAFETY: out < end: a slot of the caller's.
        unsafe {
            *out = ra as usize;
            out = out.add(1);
        }
        pc = ra;
        sp = a + r.cfa_at;
        if out == end {
            break (run_exit::FULL, 0);
        }
        // SAFETY: the index is below CACHE_SIZE.
        let v = unsafe { core::ptr::read_volatile(cache.add(cache_set(pc))) } ^ pc;
        if v != r.tag {
            break (run_exit::CHANGED, v);
        }
    };
    *regs = [pc, sp, fp];
    *o = out;
    (code, word)
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
/// On x86-64 the whole loop, rule changes included, is `exact::run_hot`
/// (assembly). Each cache word predicts the word of its caller (the one
/// found after it last time, `RuleCache::pred`): a frame loads the
/// predicted word, decodes its rule (a few instructions; a wide one with one
/// more load) and checks its key against the return address read from the
/// stack, so the next frame's stack reads wait on the prediction, not on
/// this frame's stack read; a miss looks the address up by hash. Runs of
/// frame records (code with frame pointers) have a loop of their own, one
/// load a frame, with the hash lookup off the critical path. A
/// non-canonical return address could alias a cached key in the compare;
/// its frame is then unwound with a wrong rule, which stays inside the
/// checked stack range like any corrupt frame.
///
/// # Safety
/// `out` must be valid for `len` writes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn hot_loop(
    hot: &mut Hot,
    hi: u64,
    out: *mut usize,
    len: usize,
) -> (usize, FastEnd) {
    if len == 0 {
        return (0, FastEnd::Full);
    }
    let mut regs = [hot.pc, hot.sp, hot.fp];
    let mut o = out;
    // SAFETY: `out..out + len` are the caller's slots (len >= 1); `[sp, hi)`
    // is readable stack; `CACHE` is the rule cache, its wide table right
    // after its words and its predictions after that (`repr(C)`).
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
        // A zero return address: the outermost frame, which `run_hot`
        // writes and then stops at (no key is 0); not a frame.
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

/// A fast rule ([`FastForm`]) as the hot loop applies it: `a = (fp if
/// from_fp else sp) + off_a` the lowest stack word the frame reads, the
/// return address at `a + ra_at`, the caller's frame pointer at `a` when
/// `ra_at != 0` (else unchanged), the caller's stack pointer (the CFA)
/// `a + cfa_at`, above both. So one check, `sp <= a <= a_max`, keeps every
/// read of the frame in `[sp, hi)`.
#[cfg(not(target_arch = "x86_64"))]
#[derive(Clone, Copy)]
struct FastRule {
    /// The packed rule in place in a cache word (`p << 48`).
    tag: u64,
    from_fp: bool,
    off_a: u64,
    ra_at: u64,
    cfa_at: u64,
    /// `hi - cfa_at`.
    a_max: u64,
}

#[cfg(not(target_arch = "x86_64"))]
impl FastRule {
    /// The fast rule of the packed rule `p` (narrow, or the slot of a wide
    /// one), or `None` when the hot loop does not apply it.
    #[inline(always)]
    fn new(p: u16, hi: u64) -> Option<FastRule> {
        let f: FastForm = if p >> 14 == 0 {
            // A wide rule's slot. A slot is written once, before any cache
            // word names it; 0 (not seen yet) is a miss.
            let w = CACHE.wide[p as usize % WIDE_SIZE].load(Ordering::Relaxed);
            if w == 0 {
                return None;
            }
            decode_wide(w)
        } else {
            decode_fast(p)?
        };
        if f.cfa_at < f.ra_at + 8 {
            return None;
        }
        Some(FastRule {
            tag: (p as u64) << 48,
            from_fp: f.from_fp,
            off_a: f.off_a as i64 as u64,
            ra_at: f.ra_at as u64,
            cfa_at: f.cfa_at as u64,
            a_max: hi.checked_sub(f.cfa_at as u64)?,
        })
    }
}

/// The hot loop (AArch64, RISC-V 64; other targets cache no fast rule): frames whose
/// key (their return address, stripped of its pointer-authentication bits)
/// is in the rule cache with a fast rule (narrow or wide), applied with
/// reads in `[sp, hi)`. Writes up to
/// `len` return addresses at `out`; returns how many, and why it stopped,
/// with `hot` at the last frame written (or at the start). Requires
/// `hot.sp` inside the stack whose top is `hi`, and `hot.pc` a return
/// address.
///
/// A frame costs a cache load, one `xor` and compare of the loaded word
/// against the current rule (key and rule at once: consecutive frames
/// usually share a rule, and then nothing is decoded and the stack loads
/// need not wait for the cache load), one range check and the rule's one or
/// two stack loads. A non-canonical return address could alias a cached
/// key in the compare; its frame is then unwound with a wrong rule, which
/// stays inside the checked stack range like any corrupt frame.
///
/// # Safety
/// `out` must be valid for `len` writes.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(super) unsafe fn hot_loop(
    hot: &mut Hot,
    hi: u64,
    out: *mut usize,
    len: usize,
) -> (usize, FastEnd) {
    let (mut pc, mut sp, mut fp) = (hot.pc, hot.sp, hot.fp);
    let mut o = out;
    // SAFETY: one past the end of the caller's `len` slots.
    let end = unsafe { out.add(len) };
    let why = 'walk: {
        if o == end {
            break 'walk FastEnd::Full;
        }
        let mut x = CACHE.words[cache_set(pc)].load(Ordering::Relaxed) ^ pc;
        loop {
            // A new rule: find the key in either way, decode.
            if x & KEY_MASK != 0 {
                x = CACHE.words[cache_set(pc) + 1].load(Ordering::Relaxed) ^ pc;
                if x & KEY_MASK != 0 {
                    break 'walk FastEnd::Slow;
                }
            }
            let p = (x >> 48) as u16;
            let Some(r) = FastRule::new(p, hi) else {
                // `_start`, a thread's start: CFI says there is no caller.
                if p == PACKED_END && PACKED_END != 0 {
                    break 'walk FastEnd::Outermost;
                }
                break 'walk FastEnd::Slow;
            };
            // Frames under this rule.
            let mut regs = [pc, sp, fp];
            // SAFETY: `o..end` are the caller's slots (`o < end`: checked
            // before the loop, and `run_same_rule` returns `FULL` when it
            // fills them); `[sp, hi)` is readable stack and `r.a_max` comes
            // from `hi`; `CACHE.words` is the rule cache's words.
            let (exit, word) =
                unsafe { run_same_rule(&mut regs, &mut o, end, &r, CACHE.words.as_ptr().cast()) };
            [pc, sp, fp] = regs;
            match exit {
                run_exit::CHANGED => x = word,
                run_exit::FULL => break 'walk FastEnd::Full,
                run_exit::OUTERMOST => break 'walk FastEnd::Outermost,
                run_exit::SLOW => break 'walk FastEnd::Slow,
                _ => break 'walk FastEnd::Slow,
            }
        }
    };
    *hot = Hot { pc, sp, fp };
    // SAFETY: both in (or one past) the caller's slots.
    let n = unsafe { o.offset_from(out) } as usize;
    count_hot(n);
    (n, why)
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

/// The stack memory and the rule source of a walk from `sp`, or why there
/// is no walk (the stack holding `sp` is unknown).
#[inline(always)]
pub(super) fn walk_setup(sp: u64) -> Result<(StackMemory, LocalSource), StopReason> {
    cache_go_live();
    match StackMemory::for_sp(sp) {
        Some(m) => {
            let source = LocalSource::new((m.bounds[0].lo as u64, m.hi()));
            Ok((m, source))
        }
        None => Err(StopReason::Error(UnwindError::Read(
            ReadError::OutOfBounds(sp),
        ))),
    }
}

/// The start of [`walk_pcs`] and [`walk_frames`]: nothing to do for an
/// empty `out`, else [`walk_setup`]; `Err` is what the walk returns. With
/// no readable stack at `regs.sp` (a crafted or broken context) the walk is
/// the pc alone, written as `lone(regs)` unless skipped.
#[inline(always)]
fn walk_start<T>(
    regs: &UnwindRegs,
    skip: usize,
    out: &mut [T],
    lone: impl FnOnce(&UnwindRegs) -> T,
) -> Result<(StackMemory, LocalSource), (usize, StopReason)> {
    if out.is_empty() {
        return Err((0, StopReason::BufferFull));
    }
    match walk_setup(regs.sp) {
        Ok(s) => Ok(s),
        Err(stop) if skip == 0 && regs.pc != 0 => {
            out[0] = lone(regs);
            Err((1, stop))
        }
        Err(stop) => Err((0, stop)),
    }
}

/// Walks from `regs`, writing pcs after dropping `skip`. Returns the count
/// and why the walk ended.
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) fn walk_pcs(
    regs: UnwindRegs,
    exact: bool,
    skip: usize,
    out: &mut [usize],
) -> (usize, StopReason) {
    let (mut mem, source) = match walk_start(&regs, skip, out, |r| r.pc as usize) {
        Ok(s) => s,
        Err(end) => return end,
    };
    let fallback = insn_fallback(&mem);
    Unwinder::<A, _, _>::with_fallback(&source, regs, exact, fallback).run_pcs(&mut mem, skip, out)
}

/// The rest of a walk from `hot`, whose frame is already written (or
/// skipped) among the `n` first pcs in `out`: the warm path's way out when
/// a frame is not in the rule cache.
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(super) fn walk_pcs_after(hot: Hot, skip: usize, n: usize, out: &mut [usize]) -> usize {
    let regs = UnwindRegs {
        pc: hot.pc,
        sp: hot.sp,
        fp: hot.fp,
        lr: 0,
    };
    match walk_setup(hot.sp) {
        Ok((mut mem, source)) => {
            let fallback = insn_fallback(&mem);
            Unwinder::<A, _, _>::with_fallback(&source, regs, false, fallback)
                .resume_pcs(&mut mem, skip, out, n)
                .0
        }
        Err(_) => n,
    }
}

/// The end of the stack holding `sp` when it is known without a lookup:
/// the thread's cached bounds, or the main thread's stack end.
#[inline(always)]
pub(super) fn known_stack_end(sp: u64) -> Option<u64> {
    match stack::cached_stack_end(sp as usize) {
        Some(hi) => Some(hi as u64),
        None => main_stack_bounds(sp).map(|b| b.hi as u64),
    }
}

/// The stack's end for the warm path, where there is one: some rule has
/// been cached (before that the cache is not even read, so that its pages
/// stay unfaulted) and the end of the stack holding `sp` is known without
/// a lookup.
#[inline(always)]
pub(super) fn warm_stack_end(sp: u64) -> Option<u64> {
    if super::cache::FLAGS
        .cache_used
        .load(core::sync::atomic::Ordering::Relaxed)
    {
        known_stack_end(sp)
    } else {
        None
    }
}

/// Like [`walk_pcs`], keeping the whole frames.
pub(crate) fn walk_frames(
    regs: UnwindRegs,
    exact: bool,
    mut skip: usize,
    out: &mut [Frame],
) -> (usize, StopReason) {
    let lone = |r: &UnwindRegs| Frame {
        pc: r.pc,
        sp: r.sp,
        fp: r.fp,
        method: crate::unwind::Method::Context,
    };
    let (mut mem, source) = match walk_start(&regs, skip, out, lone) {
        Ok(s) => s,
        Err(end) => return end,
    };
    let fallback = insn_fallback(&mem);
    let mut u = Unwinder::<A, _, _>::with_fallback(&source, regs, exact, fallback);
    let mut n = 0;
    let mut stop = None;
    let why = u.run(&mut mem, |f| {
        if skip > 0 {
            skip -= 1;
            return true;
        }
        out[n] = *f;
        n += 1;
        if n == out.len() {
            stop = Some(StopReason::BufferFull);
            return false;
        }
        true
    });
    (n, stop.unwrap_or(why))
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
