//! The rule cache (return address -> packed rule, and the wide rules beside
//! it) and the page of flags a capture reads and writes ([`FLAGS`]), with
//! everything that fills, flushes or clears them.

#[cfg(target_arch = "x86_64")]
use core::sync::atomic::AtomicU16;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use super::snapshot::Snapshot;
use super::source::{SeenModule, SEEN_EMPTY};
use super::A;
use crate::arch::Arch;

#[cfg(callstack_native)]
use crate::arch::native::exact::{from_wide_word, wide_word};

/// Whether the target has wide rules (x86-64 and AArch64).
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

const CACHE_BITS: u32 = 13;
const CACHE_SIZE: usize = 1 << CACHE_BITS;
/// Slots of the wide-rule table (slot 0 unused).
pub(super) const WIDE_SIZE: usize = 512;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(
    CACHE_SIZE == crate::arch::x86_64::exact::CACHE_WORDS
        && WIDE_SIZE == crate::arch::x86_64::exact::WIDE_SLOTS
);
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: AtomicU64 = AtomicU64::new(0);
/// The key bits of a cache word.
pub(super) const KEY_MASK: u64 = (1 << 48) - 1;

/// The rule cache: `words` maps return addresses to packed rules, `wide`
/// holds the rules too wide for 16 bits, which a packed rule with bits
/// 15-14 clear names by slot.
#[repr(C, align(64))]
pub(super) struct RuleCache {
    /// Cache words: `key | packed rule << 48`, where the key is the lookup
    /// address plus one (so a return address is its own key: the hot loop
    /// hashes the value it loaded, with no arithmetic first). 0 is empty.
    /// Rules are never 0, so with the rule in the high bits a frame-record
    /// run checks key and rule with one `xor` and one compare (see
    /// [`hot_loop`](super::walk::hot_loop)).
    pub(super) words: [AtomicU64; CACHE_SIZE],
    /// Interned wide rules (`exact::wide_word`): values only, not
    /// tied to any address, so a slot once set never changes and is never
    /// cleared (a cleared cache word cannot leave it stale).
    pub(super) wide: [AtomicU64; WIDE_SIZE],
    /// Per word, the index of the word its caller's return address was
    /// found at by the last walk through it (`exact::run_hot` on x86-64,
    /// which alone reads and writes it): a prediction, checked against the
    /// key before use, so any value is safe.
    #[cfg(target_arch = "x86_64")]
    pred: [AtomicU16; crate::arch::x86_64::exact::PRED_SLOTS],
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::declare_interior_mutable_const)]
const PRED_EMPTY: AtomicU16 = AtomicU16::new(0);

pub(super) static CACHE: RuleCache = RuleCache {
    words: [EMPTY; CACHE_SIZE],
    wide: [EMPTY; WIDE_SIZE],
    #[cfg(target_arch = "x86_64")]
    pred: [PRED_EMPTY; crate::arch::x86_64::exact::PRED_SLOTS],
};

/// The cache is 2-way set associative: a key may sit in either word of its
/// pair, which starts at this (even) index.
#[inline(always)]
pub(super) fn cache_set(key: u64) -> usize {
    ((key ^ (key >> CACHE_BITS)) as usize) & (CACHE_SIZE - 2)
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

/// Set once the cache's pages are written to: before that, rules to cache
/// wait in `FLAGS.pending`.
const PENDING_SIZE: usize = 256;
/// Cache words of the first capture of the process, written into the cache
/// by the next capture ([`flush_pending`]): the first capture then writes
/// one small array instead of faulting in most of the cache's 17 pages
/// (each fault costs microseconds, more than the walk itself).
/// Wide-rule slots whose words the first capture keeps in
/// [`Flags::wide_early`] (slots are handed out in order from 1).
const EARLY_WIDE: usize = 32;

/// The small state a capture reads or writes outside the rule cache, kept
/// together on one page (aligned, at most a page): each page a process's
/// first capture touches costs a page fault, two when it is read before it
/// is written, about 2 us each, as much as unwinding 5 frames.
#[repr(C, align(4096))]
pub(crate) struct Flags {
    /// Whether the rule cache ever held a rule (until then the warm path
    /// does not even read it).
    pub(super) cache_used: AtomicBool,
    /// Whether rules go straight into the cache (else into `pending`).
    cache_live: AtomicBool,
    /// Set by a capture that met a module the snapshot does not have.
    pub(super) stale: AtomicBool,
    /// Whether an exit hook was ever installed (see [`crate::exit_hook`]).
    pub(crate) exit_hooks: AtomicBool,
    pending_n: core::sync::atomic::AtomicUsize,
    /// Written once when the library is loaded ([`TOUCH_FLAGS`]).
    pub(super) touched: AtomicBool,
    /// The published module snapshot (see [`prepare`](super::prepare)); never freed.
    pub(super) snapshot: AtomicPtr<Snapshot>,
    /// Slots of the wide-rule table handed out (see [`cache_rule`]).
    wide_n: core::sync::atomic::AtomicUsize,
    /// Cache words of the first capture of the process, written into the
    /// cache by the next capture ([`flush_pending`]).
    pending: [AtomicU64; PENDING_SIZE],
    /// The words of wide-rule slots below [`EARLY_WIDE`] given out while
    /// the cache is not live, copied into the cache's wide table before a
    /// cache word names them ([`cache_put_word`]).
    wide_early: [AtomicU64; EARLY_WIDE],
    /// Modules found by `_dl_find_object` whose rules went into the cache
    /// (see `seen_module` in `source.rs`).
    pub(super) seen: [SeenModule; 64],
}

const _: () = assert!(core::mem::size_of::<Flags>() == 4096);

/// Run by the loader when the library is loaded (an `.init_array` entry):
/// writes [`FLAGS`]' page once, so that a process's first capture, which
/// reads it and then writes it, faults on it neither time (a read of an
/// untouched zero page faults, and the first write after it faults again:
/// together 2-4 us, a tenth of a cold capture of 17 frames); and the
/// executable ranges' table of `unwind/code.rs` likewise. A page fault or
/// two at load, no system call, nothing else.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static TOUCH_FLAGS: extern "C" fn() = touch_flags;

#[cfg(target_os = "linux")]
extern "C" fn touch_flags() {
    FLAGS.touched.store(true, Ordering::Relaxed);
    crate::unwind::code::touch_at_load();
}

pub(crate) static FLAGS: Flags = Flags {
    cache_used: AtomicBool::new(false),
    cache_live: AtomicBool::new(false),
    stale: AtomicBool::new(false),
    exit_hooks: AtomicBool::new(false),
    pending_n: core::sync::atomic::AtomicUsize::new(0),
    touched: AtomicBool::new(false),
    snapshot: AtomicPtr::new(core::ptr::null_mut()),
    wide_n: core::sync::atomic::AtomicUsize::new(0),
    pending: [EMPTY; PENDING_SIZE],
    wide_early: [EMPTY; EARLY_WIDE],
    seen: [SEEN_EMPTY; 64],
};

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
