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
    // Two slots: the thread's own stack and the last other stack it ran on
    // (an alternate signal stack, a coroutine). A const initializer and a
    // type without `Drop` make this a plain `#[thread_local]` slot: no lazy
    // registration, no allocation on first use.
    static CACHE: Cell<[StackBounds; 2]> = const { Cell::new([StackBounds { lo: 0, hi: 0 }; 2]) };
}

/// The bounds of the stack that holds `sp` on the current thread.
///
/// Async-signal-safe. The first call on a thread (and the first call on each
/// other stack) reads `/proc/self/maps`; later calls are two compares.
/// Returns `None` if no mapping holds `sp` or `/proc` cannot be read.
#[inline]
pub fn bounds_for(sp: usize) -> Option<StackBounds> {
    let cached = CACHE.with(|c| c.get());
    if cached[0].contains(sp) {
        return Some(cached[0]);
    }
    if cached[1].contains(sp) {
        return Some(cached[1]);
    }
    bounds_slow(sp, cached)
}

/// The cached bounds of the stack that holds `sp`, without any lookup.
#[inline]
pub(crate) fn cached_bounds_for(sp: usize) -> Option<StackBounds> {
    let cached = CACHE.with(|c| c.get());
    cached.into_iter().find(|b| b.contains(sp))
}

#[cold]
#[inline(never)]
fn bounds_slow(sp: usize, cached: [StackBounds; 2]) -> Option<StackBounds> {
    let found = crate::sys::maps::mapping_containing(sp)?;
    let b = StackBounds {
        lo: found.0,
        hi: found.1,
    };
    // The first stack seen on a thread is its own; later misses replace the
    // second slot only, so a signal handler on an alternate stack does not
    // evict the thread's stack.
    let next = if cached[0].hi == 0 {
        [b, cached[1]]
    } else {
        [cached[0], b]
    };
    CACHE.with(|c| c.set(next));
    Some(b)
}

/// Looks up and caches the current thread's stack bounds now, so that the
/// first capture on this thread makes no system call at all.
pub fn prepare_thread() {
    let marker = 0u8;
    let _ = bounds_for(&marker as *const u8 as usize);
}
