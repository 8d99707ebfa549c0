//! The portable hot loop of in-process exact capture, for the architectures
//! whose packed rules take AArch64's forms ([`FastForm`]: AArch64 and RISC-V
//! 64, whose `exact::run_hot` call [`run_hot_with`]). x86-64 has its own,
//! in assembly (`arch/x86_64/exact.rs`). Both read the rule cache through a
//! pointer to its words, laid out as [`super::super::rule_cache`] says, and
//! return the same [`run_exit`] codes.

use super::rule::{decode_fast, decode_wide, FastForm, PACKED_END};
use crate::arch::rule_cache::{set, CACHE_WORDS, KEY_MASK, WIDE_SLOTS};
use core::sync::atomic::{AtomicU64, Ordering};

/// How [`run_hot_with`] stopped (the same codes as x86-64's `run_hot`).
pub(crate) mod run_exit {
    /// The output is full.
    pub(crate) const FULL: u64 = 0;
    /// The packed `End` rule: the outermost frame.
    pub(crate) const OUTERMOST: u64 = 1;
    /// A frame missed the cache, has a rule the loop does not apply, or
    /// failed the range check: the generic unwinder takes it.
    pub(crate) const SLOW: u64 = 2;
    /// Internal: the next frame has another rule ([`super::run_same_rule`]).
    pub(super) const CHANGED: u64 = 3;
}

/// A fast rule ([`FastForm`]) as the hot loop applies it: `a = (fp if
/// from_fp else sp) + off_a` the lowest stack word the frame reads, the
/// return address at `a + ra_at`, the caller's frame pointer at `a` when
/// `ra_at != 0` (else unchanged), the caller's stack pointer (the CFA)
/// `a + cfa_at`, above both. So one check, `sp <= a <= a_max`, keeps every
/// read of the frame in `[sp, hi)`.
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

/// The cache word at index `i` of the cache at `cache`.
///
/// # Safety
/// `cache` is the rule cache (its words, then its wide slots) and
/// `i < CACHE_WORDS + WIDE_SLOTS`.
#[inline(always)]
unsafe fn word(cache: *const u64, i: usize) -> u64 {
    // SAFETY: the caller's promise; the cache's words are `AtomicU64`s,
    // which have `u64`'s layout.
    unsafe { (*cache.add(i).cast::<AtomicU64>()).load(Ordering::Relaxed) }
}

impl FastRule {
    /// The fast rule of the packed rule `p` (narrow, or the slot of a wide
    /// one), or `None` when the hot loop does not apply it.
    ///
    /// # Safety
    /// `cache` is the rule cache.
    #[inline(always)]
    unsafe fn new(p: u16, hi: u64, cache: *const u64) -> Option<FastRule> {
        let f: FastForm = if p >> 14 == 0 {
            // A wide rule's slot. A slot is written once, before any cache
            // word names it; 0 (not seen yet) is a miss.
            // SAFETY: the slot is below WIDE_SLOTS.
            let w = unsafe { word(cache, CACHE_WORDS + p as usize % WIDE_SLOTS) };
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

/// The run of frames under one fast rule `r`, while the next frame's cached
/// word (first way of its set) is its key with that rule. Returns a
/// [`run_exit`] code and, for `CHANGED`, the next frame's first-way word
/// xor its return address.
///
/// # Safety
/// `*o < end`, `*o..end` writable; `[regs[1], hi)` readable stack with
/// `r.a_max == hi - r.cfa_at`; `cache` the rule cache.
#[inline(always)]
unsafe fn run_same_rule(
    ra_mask: u64,
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
        let ra = unsafe { core::ptr::read_unaligned((a + r.ra_at) as *const u64) } & ra_mask;
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
        // SAFETY: the index is below CACHE_WORDS.
        let v = unsafe { core::ptr::read_volatile(cache.add(set(pc))) } ^ pc;
        if v != r.tag {
            break (run_exit::CHANGED, v);
        }
    };
    *regs = [pc, sp, fp];
    *o = out;
    (code, word)
}

/// The hot loop: from the frame whose return address is `regs[0]` (`[pc,
/// sp, fp]`), frames whose key (their return address, masked with
/// `ra_mask`: AArch64 strips pointer-authentication bits) is in the rule
/// cache with a fast rule (narrow or wide), applied with reads in `[sp,
/// hi)`, writing their return addresses at `*o` up to `end`. Returns a
/// [`run_exit`] code (`FULL`, `OUTERMOST` or `SLOW`), with `regs` at the
/// last frame written (or the start) and `*o` past the last slot written.
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
/// `*o < end` and `*o..end` writable; `[regs[1], hi)` readable stack;
/// `cache` the rule cache (words, then wide slots).
#[inline(always)]
pub(crate) unsafe fn run_hot_with(
    ra_mask: u64,
    regs: &mut [u64; 3],
    o: &mut *mut usize,
    end: *mut usize,
    hi: u64,
    cache: *const u64,
) -> u64 {
    let pc = regs[0];
    // SAFETY: the index is below CACHE_WORDS.
    let mut x = unsafe { word(cache, set(pc)) } ^ pc;
    loop {
        let pc = regs[0];
        // A new rule: find the key in either way, decode.
        if x & KEY_MASK != 0 {
            // SAFETY: the set's second word, below CACHE_WORDS.
            x = unsafe { word(cache, set(pc) + 1) } ^ pc;
            if x & KEY_MASK != 0 {
                return run_exit::SLOW;
            }
        }
        let p = (x >> 48) as u16;
        // SAFETY: `cache` is the rule cache.
        let Some(r) = (unsafe { FastRule::new(p, hi, cache) }) else {
            // `_start`, a thread's start: CFI says there is no caller.
            if p == PACKED_END && PACKED_END != 0 {
                return run_exit::OUTERMOST;
            }
            return run_exit::SLOW;
        };
        // SAFETY: the caller's promises (`*o < end`: checked by the caller
        // first, and `run_same_rule` returns `FULL` when it fills them);
        // `r.a_max` comes from `hi`.
        let (exit, w) = unsafe { run_same_rule(ra_mask, regs, o, end, &r, cache) };
        match exit {
            run_exit::CHANGED => x = w,
            run_exit::FULL => return run_exit::FULL,
            run_exit::OUTERMOST => return run_exit::OUTERMOST,
            _ => return run_exit::SLOW,
        }
    }
}
