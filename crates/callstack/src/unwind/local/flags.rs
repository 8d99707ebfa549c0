//! The page of small state a capture reads and writes outside the rule
//! cache ([`FLAGS`]), and the types it holds: a leaf of `unwind/local`
//! (it imports none of its siblings, so that every one of them may read it).

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: AtomicU64 = AtomicU64::new(0);

/// Cache words the first capture of the process keeps (`FLAGS.pending`),
/// written into the cache by the next capture (`cache::flush_pending`): the
/// first capture then writes one small array instead of faulting in most of
/// the cache's 17 pages (each fault costs microseconds, more than the walk
/// itself).
pub(super) const PENDING_SIZE: usize = 256;
/// Wide-rule slots whose words the first capture keeps in
/// [`Flags::wide_early`] (slots are handed out in order from 1).
pub(super) const EARLY_WIDE: usize = 32;

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
    pub(super) cache_live: AtomicBool,
    /// Set by a capture that met a module the snapshot does not have.
    pub(super) stale: AtomicBool,
    /// Whether an exit hook was ever installed (see [`crate::exit_hook`]).
    pub(crate) exit_hooks: AtomicBool,
    /// The generation of the machine-code analysis cache the rule cache's
    /// machine-code rules were found under (`cache::insn_words_current`):
    /// when the analysis cache is cleared (the code may have changed) they
    /// are dropped.
    pub(super) insn_gen: AtomicU32,
    pub(super) pending_n: AtomicUsize,
    /// Written once when the library is loaded ([`TOUCH_FLAGS`]).
    pub(super) touched: AtomicBool,
    /// The published module snapshot (see [`prepare`](super::prepare)),
    /// never freed; untyped here (this module imports none of its
    /// siblings): `snapshot::published` reads it, `snapshot::publish`
    /// writes it.
    pub(super) snapshot: AtomicPtr<()>,
    /// Slots of the wide-rule table handed out (see `cache::cache_rule`).
    pub(super) wide_n: AtomicUsize,
    /// Cache words of the first capture of the process, written into the
    /// cache by the next capture (`cache::flush_pending`).
    pub(super) pending: [AtomicU64; PENDING_SIZE],
    /// The words of wide-rule slots below [`EARLY_WIDE`] given out while
    /// the cache is not live, copied into the cache's wide table before a
    /// cache word names them (`cache::cache_put_word`).
    pub(super) wide_early: [AtomicU64; EARLY_WIDE],
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
    // The analysis cache's first generation.
    insn_gen: AtomicU32::new(1),
    pending_n: AtomicUsize::new(0),
    touched: AtomicBool::new(false),
    snapshot: AtomicPtr::new(core::ptr::null_mut()),
    wide_n: AtomicUsize::new(0),
    pending: [EMPTY; PENDING_SIZE],
    wide_early: [EMPTY; EARLY_WIDE],
    seen: [SEEN_EMPTY; 64],
};

/// A module (not in the snapshot) whose rules the cache may hold, as
/// `_dl_find_object` found it; `start == 0` is a free slot, `end == 0` or
/// `hdr == 0` a slot being written (see `seen_module` in `source.rs`).
pub(super) struct SeenModule {
    pub(super) start: AtomicU64,
    pub(super) end: AtomicU64,
    pub(super) hdr: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const SEEN_EMPTY: SeenModule = SeenModule {
    start: AtomicU64::new(0),
    end: AtomicU64::new(0),
    hdr: AtomicU64::new(0),
};
