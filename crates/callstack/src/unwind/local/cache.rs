//! The rule cache (return address -> packed rule, and the wide rules beside
//! it), with everything that fills, flushes or clears it (the first
//! capture's pending words and early wide slots sit on the `FLAGS` page of
//! `flags.rs`).

use core::sync::atomic::{AtomicU16, AtomicU64, Ordering};

use super::flags::{EARLY_WIDE, FLAGS, PENDING_SIZE};
use super::A;
use crate::arch::rule_cache::{self, CACHE_WORDS as CACHE_SIZE};
use crate::arch::Arch;

#[cfg(callstack_native)]
use crate::arch::native::exact::{from_wide_word, wide_word, PRED_SLOTS};

/// Whether the target has wide rules (every in-process architecture).
const HAS_WIDE: bool = cfg!(callstack_native);

/// No wide rules on other targets.
#[cfg(not(callstack_native))]
fn wide_word(_: <A as Arch>::Rule) -> Option<u64> {
    None
}

/// No wide rules on other targets (never called: no wide word is stored).
#[cfg(not(callstack_native))]
fn from_wide_word(_: u64) -> <A as Arch>::Rule {
    A::EVALUATE
}

/// No hot loop, so no predictions, on other targets.
#[cfg(not(callstack_native))]
const PRED_SLOTS: usize = 0;

/// Slots of the wide-rule table (slot 0 unused).
pub(super) const WIDE_SIZE: usize = rule_cache::WIDE_SLOTS;
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: AtomicU64 = AtomicU64::new(0);
/// The key bits of a cache word.
pub(super) const KEY_MASK: u64 = rule_cache::KEY_MASK;

/// The rule cache: `words` maps return addresses to packed rules, `wide`
/// holds the rules too wide for 16 bits, which a packed rule with bits
/// 15-14 clear names by slot. Laid out as `arch::rule_cache` says: the
/// architecture's hot loop reads it through a pointer.
#[repr(C, align(64))]
pub(super) struct RuleCache {
    /// Cache words: `key | packed rule << 48`, where the key is the lookup
    /// address plus one (so a return address is its own key: the hot loop
    /// hashes the value it loaded, with no arithmetic first). 0 is empty.
    /// Rules are never 0, so with the rule in the high bits a run of frames
    /// under one rule checks key and rule with one `xor` and one compare
    /// (see [`hot_loop`](super::hot::hot_loop)).
    pub(super) words: [AtomicU64; CACHE_SIZE],
    /// Interned wide rules (`exact::wide_word`): values only, not
    /// tied to any address, so a slot once set never changes and is never
    /// cleared (a cleared cache word cannot leave it stale).
    pub(super) wide: [AtomicU64; WIDE_SIZE],
    /// Per word, the index of the word its caller's return address was
    /// found at by the last walk through it (the architecture's `run_hot`,
    /// which alone reads and writes it; none but on x86-64): a prediction,
    /// checked against the key before use, so any value is safe.
    pred: [AtomicU16; PRED_SLOTS],
}

#[allow(clippy::declare_interior_mutable_const)]
const PRED_EMPTY: AtomicU16 = AtomicU16::new(0);

pub(super) static CACHE: RuleCache = RuleCache {
    words: [EMPTY; CACHE_SIZE],
    wide: [EMPTY; WIDE_SIZE],
    pred: [PRED_EMPTY; PRED_SLOTS],
};

/// The cache is 2-way set associative: a key may sit in either word of its
/// pair, which starts at this (even) index.
#[inline(always)]
pub(super) fn cache_set(key: u64) -> usize {
    rule_cache::set(key)
}

/// The packed rule cached for the lookup address `addr`, or 0.
#[inline(always)]
pub(super) fn cache_get(addr: u64) -> u16 {
    let key = addr.wrapping_add(1);
    let i = cache_set(key);
    for w in [i, i + 1] {
        let x = CACHE.words[w].load(Ordering::Relaxed) ^ key;
        if x & KEY_MASK == 0 {
            return (x >> 48) as u16;
        }
    }
    0
}

/// Moves `FLAGS.pending` into the cache when it waits there; called at the
/// start of a walk. One relaxed load once the cache is live.
#[inline(always)]
pub(super) fn cache_go_live() {
    if !FLAGS.cache_live.load(Ordering::Relaxed) && FLAGS.pending_n.load(Ordering::Relaxed) != 0 {
        flush_pending();
    }
}

#[cold]
#[inline(never)]
pub(super) fn flush_pending() {
    FLAGS.cache_live.store(true, Ordering::Relaxed);
    let n = FLAGS.pending_n.swap(0, Ordering::Relaxed).min(PENDING_SIZE);
    for slot in &FLAGS.pending[..n] {
        let w = slot.swap(0, Ordering::Relaxed);
        if w != 0 {
            cache_put_word(w);
        }
    }
}

/// Caches a packed rule: in the first way if it is empty or holds the same
/// key, else in the second way, so two hot addresses of one set both stay.
/// Before the cache is live (the first capture), into `FLAGS.pending`.
pub(super) fn cache_put(addr: u64, packed: u16) {
    let key = addr.wrapping_add(1);
    if packed == 0 || key == 0 || key & !KEY_MASK != 0 {
        return;
    }
    let word = key | (packed as u64) << 48;
    if !FLAGS.cache_live.load(Ordering::Relaxed) {
        let i = FLAGS.pending_n.fetch_add(1, Ordering::Relaxed);
        if i < PENDING_SIZE {
            FLAGS.pending[i].store(word, Ordering::Relaxed);
        }
        return;
    }
    cache_put_word(word);
}

/// Copies the word of early wide slot `slot` into the cache's wide table
/// if it is not there yet.
fn publish_early_wide(slot: usize) {
    if slot < EARLY_WIDE && CACHE.wide[slot].load(Ordering::Relaxed) == 0 {
        let w = FLAGS.wide_early[slot].load(Ordering::Acquire);
        if w != 0 {
            CACHE.wide[slot].store(w, Ordering::Release);
        }
    }
}

/// [`cache_put`] of a whole cache word, into the live cache.
fn cache_put_word(word: u64) {
    let key = word & KEY_MASK;
    // A wide slot given out before the cache went live (its word in
    // `FLAGS.wide_early`) is published before a cache word names it; the
    // flush of the first capture's words comes through here too.
    let packed = (word >> 48) as u16;
    if packed >> 14 == 0 && HAS_WIDE {
        publish_early_wide(packed as usize);
    }
    let i = cache_set(key);
    // An empty first way is taken with one write access (on a page of the
    // cache not touched yet, a read first would fault twice).
    if let Err(w0) = CACHE.words[i].compare_exchange(0, word, Ordering::Relaxed, Ordering::Relaxed)
    {
        let w = if w0 & KEY_MASK == key { i } else { i + 1 };
        CACHE.words[w].store(word, Ordering::Relaxed);
    }
    if !FLAGS.cache_used.load(Ordering::Relaxed) {
        FLAGS.cache_used.store(true, Ordering::Relaxed);
    }
}

/// The rule as the cache holds it: [`Arch::pack`], or for an `Sp`/`Bp` rule
/// too wide for it, the slot of its wide word (interned lock-free; 0 when
/// the table is full or the rule is not one the hot loop applies).
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(super) fn cache_rule(rule: <A as Arch>::Rule) -> u16 {
    let p = A::pack(rule);
    if p != 0 {
        return p;
    }
    let Some(w) = wide_word(rule) else {
        return 0;
    };
    // Slots are handed out in order (not hashed), so that the few wide
    // rules of a process sit on the table's first page: a first capture
    // faults in one page of it, not one per rule. Two threads adding the
    // same rule at once take two slots; both are right.
    // Before the cache is live (the first capture), the words of the first
    // slots wait in `FLAGS.wide_early`, on the page the capture writes
    // anyway, and the wide table's page is not touched.
    let early = !FLAGS.cache_live.load(Ordering::Relaxed);
    let word_at = |s: usize| {
        if early && s < EARLY_WIDE {
            &FLAGS.wide_early[s]
        } else {
            &CACHE.wide[s]
        }
    };
    let n = FLAGS.wide_n.load(Ordering::Acquire).min(WIDE_SIZE - 1);
    if let Some(slot) = (1..=n).find(|&s| word_at(s).load(Ordering::Acquire) == w) {
        return slot as u16;
    }
    let slot = FLAGS.wide_n.fetch_add(1, Ordering::AcqRel) + 1;
    if slot >= WIDE_SIZE {
        return 0;
    }
    // Published before any cache word names the slot (the caller caches the
    // packed rule after this returns).
    word_at(slot).store(w, Ordering::Release);
    slot as u16
}

/// The rule of a cached packed rule (see [`cache_rule`]).
#[inline]
pub(super) fn unpack_cached(p: u16) -> <A as Arch>::Rule {
    if p >> 14 == 0 && HAS_WIDE {
        let w = CACHE.wide[p as usize % WIDE_SIZE].load(Ordering::Acquire);
        if w == 0 {
            return A::EVALUATE;
        }
        return from_wide_word(w);
    }
    A::unpack(p)
}

pub(super) fn clear_cache() {
    for c in FLAGS.pending.iter() {
        c.store(0, Ordering::Relaxed);
    }
    for c in CACHE.words.iter() {
        c.store(0, Ordering::Relaxed);
    }
}

/// Whether the rule cache's machine-code rules (`code::settle`) were found
/// under generation `g` of the analysis cache (its current one, read by
/// the caller). When the analysis cache was cleared since (`prepare()` on
/// a new snapshot, `InProcess::new`, `unwind::insn::cache::invalidate`:
/// the code may have changed), they are dropped first, the CFI's words
/// left alone, and false is returned. Lock-free, async-signal-safe; the
/// sweep (8192 words, once per clear) runs in the first capture that meets
/// a machine-code rule after the clear.
#[cfg(any(callstack_insn, callstack_risc_insn))]
#[inline]
pub(super) fn insn_words_current(g: u32) -> bool {
    if FLAGS.insn_gen.load(Ordering::Acquire) == g {
        return true;
    }
    drop_insn_words(g);
    false
}

#[cfg(any(callstack_insn, callstack_risc_insn))]
#[cold]
#[inline(never)]
fn drop_insn_words(g: u32) {
    use crate::arch::native::exact::INSN_MARK;
    for c in CACHE.words.iter() {
        let w = c.load(Ordering::Relaxed);
        if w != 0 && (w >> 48) as u16 & 0xf000 == INSN_MARK {
            let _ = c.compare_exchange(w, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
    FLAGS.insn_gen.store(g, Ordering::Release);
}
