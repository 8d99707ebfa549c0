//! Bounds of the current thread's stack, so that no walk reads outside it.
//!
//! The bounds are looked up once per thread (and once per other stack the
//! thread runs on, such as a `sigaltstack`) by reading `/proc/self/maps` with
//! `open`/`read`/`close` into a buffer on the stack: async-signal-safe, no
//! allocation, no lock. They are then cached in a thread-local `Cell`, so every
//! later capture on that thread costs two compares and makes no system call.
//!
//! The mapping that contains the stack pointer is taken as the stack: for the
//! main thread that is `[stack]`, for a spawned thread the `mmap` that holds
//! its stack (the guard page below it is a separate mapping). Everything from
//! the stack pointer to the end of that mapping is readable memory.

use core::cell::Cell;

/// A half-open address range `[lo, hi)` of readable stack memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StackBounds {
    /// Lowest address of the mapping.
    pub lo: usize,
    /// One past the highest address of the mapping.
    pub hi: usize,
}

impl StackBounds {
    /// Whether `addr` lies in `[lo, hi)`.
    #[inline(always)]
    pub fn contains(&self, addr: usize) -> bool {
        self.lo <= addr && addr < self.hi
    }
}

thread_local! {
    // The thread's own stack, and the last other stack it ran on (an
    // alternate signal stack, a coroutine). Const initializers and types
    // without `Drop` make these plain `#[thread_local]` slots: no lazy
    // registration, no allocation on first use, one `fs`-relative load.
    static OWN: Cell<StackBounds> = const { Cell::new(StackBounds { lo: 0, hi: 0 }) };
    static OTHER: Cell<StackBounds> = const { Cell::new(StackBounds { lo: 0, hi: 0 }) };
}

/// The bounds of the stack that holds `sp` on the current thread.
///
/// Async-signal-safe. The first call on a thread (and the first call on each
/// other stack) reads `/proc/self/maps`; later calls are two compares.
/// Returns `None` if no mapping holds `sp` or `/proc` cannot be read.
#[inline]
pub fn bounds_for(sp: usize) -> Option<StackBounds> {
    let own = OWN.get();
    if own.contains(sp) {
        return Some(own);
    }
    bounds_elsewhere(sp)
}

/// The end of the stack that holds `sp` (so `[sp, end)` is readable), or 0
/// when unknown: the capture's hot path. Same rules as [`bounds_for`]; a
/// plain `usize` keeps the common case to one thread-local load and two
/// compares, with everything else out of line.
#[inline(always)]
pub(crate) fn stack_end(sp: usize) -> usize {
    let own = OWN.get();
    if own.contains(sp) {
        return own.hi;
    }
    stack_end_elsewhere(sp)
}

/// Only the cache of the thread's own stack: the end of the stack holding
/// `sp` if it is that one, else `None` (then call [`stack_end`]).
#[inline(always)]
pub(crate) fn cached_stack_end(sp: usize) -> Option<usize> {
    let own = OWN.get();
    own.contains(sp).then_some(own.hi)
}

/// The cached bounds of the stack that holds `sp`, without any lookup.
#[inline]
pub(crate) fn cached_bounds_for(sp: usize) -> Option<StackBounds> {
    let own = OWN.get();
    if own.contains(sp) {
        return Some(own);
    }
    let other = OTHER.get();
    other.contains(sp).then_some(other)
}

#[cold]
#[inline(never)]
fn stack_end_elsewhere(sp: usize) -> usize {
    bounds_elsewhere(sp).map_or(0, |b| b.hi)
}

/// Not on the thread's own (cached) stack: the other slot, or a lookup.
#[cold]
#[inline(never)]
fn bounds_elsewhere(sp: usize) -> Option<StackBounds> {
    let other = OTHER.get();
    if other.contains(sp) {
        return Some(other);
    }
    let found = crate::sys::maps::mapping_containing(sp)?;
    let b = StackBounds {
        lo: found.0,
        hi: found.1,
    };
    // The first stack seen on a thread is its own; later misses replace the
    // second slot only, so a signal handler on an alternate stack does not
    // evict the thread's stack.
    if OWN.get().hi == 0 {
        OWN.set(b);
    } else {
        OTHER.set(b);
    }
    Some(b)
}

/// Looks up and caches the current thread's stack bounds now, so that the
/// first capture on this thread makes no system call at all.
pub fn prepare_thread() {
    let marker = 0u8;
    let _ = bounds_for(&marker as *const u8 as usize);
}
