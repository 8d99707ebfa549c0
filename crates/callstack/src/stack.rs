//! Bounds of the stack a walk runs on, so that no walk reads outside it.
//!
//! Only stacks that stay mapped for the life of their thread are cached:
//! the main thread's `[stack]` and a thread's own stack (the mapping that
//! holds its thread descriptor, which glibc puts at the top of the thread's
//! stack; the cached range ends at the descriptor, below which every frame
//! lives). The thread's own stack is looked up once, by reading
//! `/proc/self/maps` with `open`/`read`/`close` into a buffer on the stack:
//! async-signal-safe, no allocation, no lock. It is then kept in a
//! thread-local `Cell`, so every later capture on that stack costs two
//! compares and makes no system call.
//!
//! Any other stack (a `sigaltstack`, a `makecontext` coroutine, a fiber or
//! green thread) can be unmapped, and another mapping made at its address,
//! at any time, with no hook to tell: its bounds are never cached but looked
//! up again by every walk that starts on it (a few system calls; the price of
//! a walk on a switched stack).
//!
//! A mapping is used as a stack only when it is readable, writable and
//! private (`rw?p` in `/proc/self/maps`): a `sp` in a `PROT_NONE` page,
//! `[vsyscall]`, `[vvar]`, read-only or shared memory has no stack, and the
//! walk gives the pc alone. Everything from the stack pointer to the end of
//! the range is readable memory.

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
    // The thread's own stack (see the module docs). A const initializer and
    // a type without `Drop` make this a plain `#[thread_local]` slot: no
    // lazy registration, no allocation on first use, one `fs`-relative load.
    static OWN: Cell<StackBounds> = const { Cell::new(StackBounds { lo: 0, hi: 0 }) };
}

/// The bounds of the stack that holds `sp` on the current thread.
///
/// Async-signal-safe. On the thread's own stack, the first call reads
/// `/proc/self/maps` and later calls are two compares; on any other stack
/// every call reads `/proc/self/maps`. Returns `None` if no readable,
/// writable, private mapping holds `sp`, or `/proc` cannot be read.
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
    own.contains(sp).then_some(own)
}

#[cold]
#[inline(never)]
fn stack_end_elsewhere(sp: usize) -> usize {
    bounds_elsewhere(sp).map_or(0, |b| b.hi)
}

/// Not on the thread's own (cached) stack: a lookup; cached when it finds
/// the thread's own stack.
#[cold]
#[inline(never)]
fn bounds_elsewhere(sp: usize) -> Option<StackBounds> {
    let (lo, hi) = crate::sys::maps::stack_mapping_containing(sp)?;
    let b = StackBounds { lo, hi };
    match own_stack(b) {
        Some(own) if own.contains(sp) => {
            OWN.set(own);
            Some(own)
        }
        _ => Some(b),
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    /// Set by the dynamic loader: the stack pointer at the program's entry
    /// (the address of `argc`), near the top of the main thread's stack.
    static __libc_stack_end: *const libc::c_void;
}

/// The part of mapping `b` that is the current thread's own stack, if it is:
/// the main thread's `[stack]` (it holds `__libc_stack_end`), or the mapping
/// of a thread's stack, which holds the thread's descriptor at its top (glibc
/// puts it there, also on a stack given with `pthread_attr_setstack`); all
/// of the thread's frames lie below the descriptor, so that is where the
/// range ends. Both stay mapped while the thread runs.
fn own_stack(b: StackBounds) -> Option<StackBounds> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: a pointer-sized variable of the loader, written once before
        // any of our code runs.
        let end = unsafe { core::ptr::read_volatile(&raw const __libc_stack_end) } as usize;
        if b.contains(end) {
            return Some(b);
        }
        // SAFETY: pthread_self reads the thread pointer; async-signal-safe.
        let pd = unsafe { libc::pthread_self() } as usize;
        if b.lo < pd && pd < b.hi {
            return Some(StackBounds { lo: b.lo, hi: pd });
        }
        None
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = b;
        None
    }
}

/// Looks up and caches the current thread's own stack (see the module docs)
/// if it is not cached yet, from wherever the thread runs (also on another
/// stack): the mapping holding `__libc_stack_end` on the main thread, the
/// one holding the thread's descriptor on another. Async-signal-safe.
pub(crate) fn cache_own_stack() {
    if OWN.get().hi != 0 {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: getpid/gettid have no preconditions.
        let main = unsafe { libc::getpid() == libc::gettid() };
        let at = if main {
            // SAFETY: as in `own_stack`.
            unsafe { core::ptr::read_volatile(&raw const __libc_stack_end) as usize }
        } else {
            // SAFETY: pthread_self reads the thread pointer.
            (unsafe { libc::pthread_self() } as usize).wrapping_sub(1)
        };
        // Caches it when the mapping found is the thread's own stack.
        let _ = bounds_for(at);
    }
}

/// Looks up and caches the current thread's stack bounds now, so that the
/// first capture on this thread makes no system call at all.
pub fn prepare_thread() {
    let marker = 0u8;
    let _ = bounds_for(core::hint::black_box(&marker) as *const u8 as usize);
}
