//! Bounds of the stack a walk runs on, so that no walk reads outside it.
//!
//! Only stacks that stay mapped for the life of their thread are cached,
//! and only as far as they are the thread's own:
//!
//! - the main thread's stack is `[stack]`, the `/proc/self/maps` line that
//!   holds `__libc_stack_end` (the kernel never merges it with another
//!   mapping, and never unmaps it);
//! - any other thread's stack is what glibc says it is: the range
//!   `pthread_getattr_np` reports, `[stackblock + guardsize, stackblock +
//!   stackblock_size)` from the thread's descriptor (also for a stack given
//!   with `pthread_attr_setstack`), cut at the descriptor, below which every
//!   frame lives, and at the maps line holding the walk's sp.
//!
//! The maps line that holds a thread's descriptor is *not* its stack: the
//! kernel merges neighbouring anonymous `rw-p` mappings into one line, and
//! the first stack a program maps for a coroutine or a `sigaltstack`
//! usually lands right below the main thread's descriptor mapping (or right
//! below a `pthread_attr_setstack` stack, which has no guard page). Such a
//! stack can be unmapped, and a smaller mapping made at its address, at any
//! time; a range cached over it would let a stale frame pointer fault the
//! walk.
//!
//! How the descriptor is read without a lock: `pthread_getattr_np` takes
//! the thread's own lock and allocates, so a capture (which may run in a
//! signal handler that interrupted that very thread) never calls it.
//! Instead the three words glibc keeps there are read directly, at an
//! offset learnt once per process: exactly by [`prepare_thread`] (the one
//! offset where the words give what `pthread_getattr_np` reports), or at a
//! first lookup by a search of the descriptor that only accepts one
//! unambiguous, maps-consistent candidate (see `glibc`). Until the offset
//! is known, the main thread is recognised by its descriptor, recorded
//! when the library is loaded on it (else, for a library `dlopen`ed on
//! another thread, by `gettid() == getpid()` on the cold path), and a
//! thread's stack that cannot be read with confidence is simply not cached.
//!
//! The lookup reads `/proc/self/maps` with `open`/`read`/`close` into a
//! buffer on the stack: async-signal-safe, no allocation, no lock. Its
//! result is then kept in a thread-local `Cell`, so every later capture on
//! that stack costs one thread-local load and two compares and makes no
//! system call.
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
//!
//! On Windows the thread's stack is what its TEB says (`StackLimit`, the
//! lowest committed address, to `StackBase`; `sys/windows/teb.rs`), read
//! at every capture (two loads, as cheap as a cached value, and right on a
//! fiber too, whose switch rewrites them); nothing is cached and a stack
//! pointer outside that range has no stack.

#[cfg(not(windows))]
use core::cell::Cell;

use crate::types::{Memory, ReadError};

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

#[cfg(not(windows))]
thread_local! {
    // The thread's own stack (see the module docs). A const initializer and
    // a type without `Drop` make this a plain `#[thread_local]` slot: no
    // lazy registration, no allocation on first use, one `fs`-relative load.
    static OWN: Cell<StackBounds> = const { Cell::new(StackBounds { lo: 0, hi: 0 }) };
}

/// The thread's own stack as known without a lookup (empty when not yet).
#[cfg(not(windows))]
#[inline(always)]
fn own() -> StackBounds {
    OWN.get()
}

/// The thread's (or the running fiber's) stack, from its TEB.
#[cfg(windows)]
#[inline(always)]
fn own() -> StackBounds {
    let (lo, hi) = crate::sys::windows::teb::stack();
    StackBounds { lo, hi }
}

/// The bounds of the stack that holds `sp` on the current thread.
///
/// Async-signal-safe. On the thread's own stack, the first call reads
/// `/proc/self/maps` and later calls are two compares; on any other stack
/// every call reads `/proc/self/maps`. Returns `None` if no readable,
/// writable, private mapping holds `sp`, or `/proc` cannot be read.
#[inline]
pub fn bounds_for(sp: usize) -> Option<StackBounds> {
    let own = own();
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
    let own = own();
    if own.contains(sp) {
        return own.hi;
    }
    stack_end_elsewhere(sp)
}

/// Only the cache of the thread's own stack: the end of the stack holding
/// `sp` if it is that one, else `None` (then call [`stack_end`]).
#[inline(always)]
pub(crate) fn cached_stack_end(sp: usize) -> Option<usize> {
    let own = own();
    own.contains(sp).then_some(own.hi)
}

/// The cached bounds of the stack that holds `sp`, without any lookup.
#[inline]
pub(crate) fn cached_bounds_for(sp: usize) -> Option<StackBounds> {
    let own = own();
    own.contains(sp).then_some(own)
}

/// The end of the stack holding `sp` when it is known without a lookup:
/// the thread's cached bounds, or the main thread's stack end
/// ([`main_stack_bounds`]). The warm path of exact capture.
#[inline(always)]
pub(crate) fn known_stack_end(sp: u64) -> Option<u64> {
    match cached_stack_end(sp as usize) {
        Some(hi) => Some(hi as u64),
        None => main_stack_bounds(sp).map(|b| b.hi as u64),
    }
}

/// Reads of this thread's stacks only: the stack the walk started on and
/// any stack a signal frame leads to. Async-signal-safe, never faults.
pub(crate) struct StackMemory {
    pub(crate) bounds: [StackBounds; 2],
}

/// The main thread's stack from `sp` up, without reading `/proc`: when this
/// function's own frame lies less than 8 MiB (the default `RLIMIT_STACK`)
/// below `__libc_stack_end`, it runs on the main thread's stack, which is one
/// mapping from here to its top (the kernel keeps other mappings a guard gap
/// away from it); a `sp` between here and the top is then on that mapping,
/// and `[sp, __libc_stack_end + 8)` is readable. (A `sp` merely near the
/// stack's top, from a crafted or foreign context, may lie below the
/// stack's mapping: it takes the lookup.)
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) fn main_stack_bounds(sp: u64) -> Option<StackBounds> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: a pointer-sized variable of the loader, written once before
        // any of our code runs.
        let end = unsafe { core::ptr::read_volatile(&raw const __libc_stack_end) } as u64;
        let marker = 0u8;
        let here = core::hint::black_box(&marker) as *const u8 as u64;
        if here <= sp && end > sp && end - here < 8 << 20 {
            return Some(StackBounds {
                lo: sp as usize,
                hi: end as usize + 8,
            });
        }
        None
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = sp;
        None
    }
}

impl StackMemory {
    /// One past the top of the stack the walk started on.
    #[inline]
    pub(crate) fn hi(&self) -> u64 {
        self.bounds[0].hi as u64
    }

    /// Reads of `[lo, hi)` only, a stack whose bounds the caller knows.
    #[inline(always)]
    pub(crate) fn with_bounds(lo: usize, hi: usize) -> Self {
        StackMemory {
            bounds: [StackBounds { lo, hi }, StackBounds::default()],
        }
    }

    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    pub(crate) fn for_sp(sp: u64) -> Option<Self> {
        // The thread's cached bounds when it has them; on the main thread,
        // the loader's stack end (no system call); else the one-time lookup.
        let b = match cached_bounds_for(sp as usize) {
            Some(b) => b,
            None => match main_stack_bounds(sp) {
                Some(b) => b,
                None => bounds_for(sp as usize)?,
            },
        };
        Some(StackMemory {
            bounds: [b, StackBounds::default()],
        })
    }

    #[cold]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn read_other(&self, addr: u64) -> Result<u64, ReadError> {
        let a = addr as usize;
        let b = &self.bounds[1];
        if a >= b.lo && a < b.hi && b.hi - a >= 8 {
            // SAFETY: [a, a + 8) lies inside a mapped, readable stack of
            // this thread (see the module docs): the read cannot fault.
            return Ok(unsafe { core::ptr::read_unaligned(a as *const u64) });
        }
        Err(ReadError::OutOfBounds(addr))
    }
}

impl Memory for StackMemory {
    #[inline(always)]
    fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
        let a = addr as usize;
        let b = &self.bounds[0];
        if a >= b.lo && a < b.hi && b.hi - a >= 8 {
            // SAFETY: [a, a + 8) lies inside a mapped, readable stack of
            // this thread (see the module docs): the read cannot fault.
            return Ok(unsafe { core::ptr::read_unaligned(a as *const u64) });
        }
        self.read_other(addr)
    }

    fn note_stack(&mut self, sp: u64) {
        let a = sp as usize;
        if self.bounds.iter().any(|b| b.contains(a)) {
            return;
        }
        if let Some(b) = bounds_for(a) {
            self.bounds[1] = b;
        }
    }
}

/// Lookups of a stack's bounds (reads of `/proc/self/maps`) so far, in
/// this process: what tests check to see that warm captures make none.
static LOOKUPS: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// How many times a capture has looked a stack's bounds up (not found them
/// cached) in this process. For tests.
pub fn lookups() -> usize {
    LOOKUPS.load(core::sync::atomic::Ordering::Relaxed)
}

#[cold]
#[inline(never)]
fn stack_end_elsewhere(sp: usize) -> usize {
    bounds_elsewhere(sp).map_or(0, |b| b.hi)
}

/// Not on the thread's own (cached) stack: a lookup; cached when it finds
/// the thread's own stack.
#[cfg(not(windows))]
#[cold]
#[inline(never)]
fn bounds_elsewhere(sp: usize) -> Option<StackBounds> {
    LOOKUPS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
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

/// Not on the stack the TEB describes: no other stack is known on Windows.
#[cfg(windows)]
#[cold]
#[inline(never)]
fn bounds_elsewhere(_sp: usize) -> Option<StackBounds> {
    LOOKUPS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    None
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    /// Set by the dynamic loader: the stack pointer at the program's entry
    /// (the address of `argc`), near the top of the main thread's stack.
    static __libc_stack_end: *const libc::c_void;
}

/// The part of mapping `b` (the `rw?p` line holding the walk's sp) that is
/// the current thread's own stack, if any (see the module docs): the
/// main thread's `[stack]` (the line holding `__libc_stack_end`), or the
/// part of `b` inside the stack glibc's descriptor of this thread records,
/// up to the descriptor. Never a line merely because it holds the
/// descriptor: the kernel merges neighbouring anonymous mappings into one
/// line, so that line may hold a coroutine stack or a `sigaltstack` too.
/// Async-signal-safe.
#[cfg(not(windows))]
fn own_stack(b: StackBounds) -> Option<StackBounds> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: a pointer-sized variable of the loader, written once before
        // any of our code runs.
        let end = unsafe { core::ptr::read_volatile(&raw const __libc_stack_end) } as usize;
        if b.contains(end) {
            // `[stack]`: grows down, never unmapped (also after `fork` from
            // another thread, whose child keeps it).
            return Some(b);
        }
        // SAFETY: pthread_self reads the thread pointer; async-signal-safe.
        let pd = unsafe { libc::pthread_self() } as usize;
        let stack = glibc::thread_stack(pd, b)?;
        let own = StackBounds {
            lo: stack.lo.max(b.lo),
            hi: stack.hi.min(pd).min(b.hi),
        };
        (own.lo < own.hi).then_some(own)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = b;
        None
    }
}

/// What glibc's descriptor of a thread (`struct pthread`, at
/// `pthread_self()`) says about its stack, read directly (async-signal-safe:
/// plain loads from the calling thread's own descriptor).
///
/// glibc keeps three words together there, in every version since 2.5:
/// `stackblock` (the lowest address of the stack's block, guard included;
/// null for the initial thread, whose stack glibc did not allocate),
/// `stackblock_size` and `guardsize`; `pthread_getattr_np` reports the
/// stack as `[stackblock + guardsize, stackblock + stackblock_size)`. Their
/// offset is private to glibc, so it is learnt once per process:
///
/// - exactly, in [`super::prepare_thread`] on a thread other than the
///   initial one, if no capture has learnt it before: the one offset where
///   the words give the bounds that `pthread_getattr_np` reports (that call
///   takes the thread's lock, allocates and makes system calls, which is
///   why it runs only there, and only once);
/// - else at the first lookup on such a thread, by looking for the one
///   place in the descriptor's first 2 KiB where three words describe a
///   stack consistent with what the kernel shows: a block whose usable
///   part starts in the descriptor's `/proc/self/maps` line and ends in it,
///   a little above the descriptor, and a whole number of pages of guard.
///   Two or no such places: nothing is learnt (nothing is cached then, and
///   every walk looks its stack up).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use super::StackBounds;
    use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// The offset of `stackblock` in `struct pthread`, plus one (0: not
    /// known yet).
    static STACKBLOCK_AT: AtomicUsize = AtomicUsize::new(0);

    /// How much of the descriptor is searched. `struct pthread` is larger
    /// (2.3 KiB on x86-64 with glibc 2.36; `stackblock` at 0x690) on every
    /// architecture, or followed by the thread's static TLS, so reading
    /// `pd + SEARCHED` never leaves mapped memory.
    const SEARCHED: usize = 2048;
    /// How far above the descriptor the stack's block may end when the
    /// offset is searched for (the descriptor, and on some architectures the
    /// static TLS, sit at its top).
    const TOP_SLACK: usize = 1 << 20;

    /// The initial thread's descriptor, recorded when the library is
    /// loaded on it (0: not known).
    static INITIAL_PD: AtomicUsize = AtomicUsize::new(0);

    /// Run by the loader when the library is loaded (an `.init_array`
    /// entry): records the initial thread's descriptor if this is that
    /// thread (not so when a `dlopen` on another thread loads us). Two
    /// system calls at load; none on any capture afterwards.
    #[used]
    #[unsafe(link_section = ".init_array")]
    static RECORD_INITIAL: extern "C" fn() = record_initial;

    extern "C" fn record_initial() {
        if ids_say_initial() {
            // SAFETY: pthread_self reads the thread pointer.
            INITIAL_PD.store(unsafe { libc::pthread_self() } as usize, Relaxed);
        }
    }

    /// Whether the calling thread is the process's initial thread, by the
    /// kernel's ids (two system calls). After a `fork` from another thread
    /// the child's thread passes too.
    fn ids_say_initial() -> bool {
        // SAFETY: plain system calls without arguments.
        unsafe { libc::syscall(libc::SYS_gettid) == libc::syscall(libc::SYS_getpid) }
    }

    /// Whether the thread whose descriptor is `pd` (the calling one) is the
    /// process's initial thread: its descriptor as recorded at load (no
    /// system call), else by the kernel's ids (on the cold path only; a
    /// thread of a `fork` child made from another thread is then treated
    /// as the initial one: its stack is not cached until the offset is
    /// known).
    fn initial_thread(pd: usize) -> bool {
        match INITIAL_PD.load(Relaxed) {
            0 => ids_say_initial(),
            initial => pd == initial,
        }
    }

    /// The size of a word, and of the three read together.
    const WORD: usize = core::mem::size_of::<usize>();
    const THREE: usize = 3 * WORD;

    /// Reads three words at `addr`.
    ///
    /// # Safety
    /// `[addr, addr + THREE)` must be readable.
    unsafe fn words(addr: usize) -> [usize; 3] {
        // SAFETY: as promised by the caller.
        unsafe {
            [
                core::ptr::read_volatile(addr as *const usize),
                core::ptr::read_volatile((addr + WORD) as *const usize),
                core::ptr::read_volatile((addr + 2 * WORD) as *const usize),
            ]
        }
    }

    /// The usable stack `[block + guard, block + size)` of three words,
    /// if they can describe the stack of a thread whose descriptor is `pd`.
    fn usable([block, size, guard]: [usize; 3], pd: usize) -> Option<StackBounds> {
        let top = block.checked_add(size)?;
        let lo = block.checked_add(guard)?;
        (block != 0 && guard % 4096 == 0 && lo < pd && pd < top)
            .then_some(StackBounds { lo, hi: top })
    }

    /// The calling thread's stack as glibc records it; `None` for the
    /// initial thread (its stack is `[stack]`) and when the record cannot
    /// be read with confidence. `line` is an `rw?p` line holding the walk's
    /// sp (the descriptor's own line when it holds the descriptor).
    pub(super) fn thread_stack(pd: usize, line: StackBounds) -> Option<StackBounds> {
        let off = match STACKBLOCK_AT.load(Relaxed) {
            0 => {
                if initial_thread(pd) {
                    return None;
                }
                search(pd, line)?
            }
            n => n - 1,
        };
        // SAFETY: `off + THREE <= SEARCHED`: inside the calling thread's
        // descriptor (or the static TLS after it), which is mapped.
        let w = unsafe { words(pd + off) };
        if w[0] == 0 {
            // The initial thread: glibc did not allocate its stack.
            return None;
        }
        usable(w, pd)
    }

    /// Looks for the offset in the descriptor (see the module docs) and
    /// keeps it if there is exactly one candidate. `line` must hold `pd`
    /// for anything to be found.
    #[cold]
    pub(super) fn search(pd: usize, line: StackBounds) -> Option<usize> {
        if !line.contains(pd) {
            return None;
        }
        let end = (pd + SEARCHED).min(line.hi);
        let mut found = None;
        let mut off = 0;
        while pd + off + THREE <= end {
            // SAFETY: inside `line`, a readable mapping holding `pd`.
            let w = unsafe { words(pd + off) };
            if let Some(s) = usable(w, pd) {
                if s.lo >= line.lo && s.hi <= line.hi && s.hi - pd <= TOP_SLACK {
                    if found.is_some() {
                        return None;
                    }
                    found = Some(off);
                }
            }
            off += WORD;
        }
        let off = found?;
        let _ = STACKBLOCK_AT.compare_exchange(0, off + 1, Relaxed, Relaxed);
        Some(off)
    }

    /// Learns the offset exactly from `pthread_getattr_np` (not in a signal
    /// handler: it takes the thread's lock and allocates, and makes system
    /// calls), if no capture has learnt it yet.
    pub(super) fn learn_exactly() {
        if STACKBLOCK_AT.load(Relaxed) != 0 {
            return;
        }
        if let Some(off) = exact_offset() {
            STACKBLOCK_AT.store(off + 1, Relaxed);
        }
    }

    /// The offset where the calling thread's descriptor holds the stack
    /// `pthread_getattr_np` reports, if there is exactly one. Nothing on the
    /// initial thread (glibc derives its stack from `/proc/self/maps`, not
    /// from the descriptor).
    pub(super) fn exact_offset() -> Option<usize> {
        // SAFETY: pthread_self reads the thread pointer.
        let pd = unsafe { libc::pthread_self() };
        if initial_thread(pd as usize) {
            return None;
        }
        // SAFETY: an attribute object filled by pthread_getattr_np for the
        // calling thread and destroyed here.
        let (lo, size) = unsafe {
            let mut attr: libc::pthread_attr_t = core::mem::zeroed();
            if libc::pthread_getattr_np(pd, &mut attr) != 0 {
                return None;
            }
            let mut addr: *mut libc::c_void = core::ptr::null_mut();
            let mut size = 0usize;
            let got = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
            libc::pthread_attr_destroy(&mut attr);
            if got != 0 {
                return None;
            }
            (addr as usize, size)
        };
        let pd = pd as usize;
        let top = lo.checked_add(size)?;
        if !(lo < pd && pd < top) {
            return None;
        }
        let end = (pd + SEARCHED).min(top);
        let mut found = None;
        let mut off = 0;
        while pd + off + THREE <= end {
            // SAFETY: inside the calling thread's stack block as glibc
            // reported it (its descriptor lies at the block's top).
            let [block, bsize, guard] = unsafe { words(pd + off) };
            if block.wrapping_add(bsize) == top && block.wrapping_add(guard) == lo {
                if found.is_some() {
                    return None;
                }
                found = Some(off);
            }
            off += WORD;
        }
        found
    }
}

/// Looks up and caches the current thread's own stack (see the module docs)
/// if it is not cached yet, from wherever the thread runs (also on another
/// stack): the mapping holding `__libc_stack_end` on the main thread, the
/// one holding the thread's descriptor on another. Async-signal-safe.
#[cfg(not(windows))]
pub(crate) fn cache_own_stack() {
    if own().hi != 0 {
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
///
/// Not for signal handlers: on a thread other than the main one, the first
/// time in the process (unless a capture has learnt it already), it asks
/// glibc for the thread's stack (`pthread_getattr_np`, which takes the
/// thread's lock, allocates and makes system calls) to learn where glibc
/// records a thread's stack (see the module docs).
pub fn prepare_thread() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    glibc::learn_exactly();
    let marker = 0u8;
    let _ = bounds_for(core::hint::black_box(&marker) as *const u8 as usize);
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// The calling thread's stack as `pthread_getattr_np` reports it.
    fn reported() -> StackBounds {
        // SAFETY: an attribute object filled for the calling thread and
        // destroyed here.
        unsafe {
            let mut attr: libc::pthread_attr_t = core::mem::zeroed();
            assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
            let mut addr: *mut libc::c_void = core::ptr::null_mut();
            let mut size = 0usize;
            assert_eq!(libc::pthread_attr_getstack(&attr, &mut addr, &mut size), 0);
            libc::pthread_attr_destroy(&mut attr);
            StackBounds {
                lo: addr as usize,
                hi: addr as usize + size,
            }
        }
    }

    fn descriptor_line() -> (usize, StackBounds) {
        // SAFETY: reads the thread pointer.
        let pd = unsafe { libc::pthread_self() } as usize;
        let (lo, hi) = crate::sys::maps::stack_mapping_containing(pd).expect("descriptor line");
        (pd, StackBounds { lo, hi })
    }

    /// On threads with a guard page, none, and a stack of their own
    /// memory: the descriptor's record, found by the search and by the
    /// exact way, is what `pthread_getattr_np` reports; the cached range
    /// ends at the descriptor.
    #[test]
    fn a_threads_stack_is_what_glibc_reports() {
        let check = || {
            let (pd, line) = descriptor_line();
            let want = reported();
            let off = glibc::search(pd, line).expect("one candidate");
            assert_eq!(glibc::thread_stack(pd, line), Some(want));
            assert_eq!(glibc::exact_offset(), Some(off));
            let marker = 0u8;
            let sp = &marker as *const u8 as usize;
            let own = bounds_for(sp).expect("own stack");
            assert_eq!(
                own,
                StackBounds {
                    lo: want.lo.max(line.lo),
                    hi: pd
                }
            );
            assert_eq!(cached_bounds_for(sp), Some(own));
        };
        std::thread::spawn(check).join().unwrap();
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(check)
            .unwrap()
            .join()
            .unwrap();
        // No guard page, and a stack of the test's own memory.
        extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
            // SAFETY: `arg` is the boxed closure passed below.
            let f = unsafe { Box::from_raw(arg as *mut Box<dyn Fn()>) };
            f();
            core::ptr::null_mut()
        }
        let mut mem = vec![0u8; 512 << 10];
        for own_memory in [false, true] {
            // SAFETY: an attribute object used for one thread, joined
            // before `mem` is dropped.
            unsafe {
                let mut attr: libc::pthread_attr_t = core::mem::zeroed();
                assert_eq!(libc::pthread_attr_init(&mut attr), 0);
                if own_memory {
                    let base = (mem.as_mut_ptr() as usize + 4095) & !4095;
                    let len = (mem.len() - 4096) & !4095;
                    assert_eq!(
                        libc::pthread_attr_setstack(&mut attr, base as *mut _, len),
                        0
                    );
                } else {
                    assert_eq!(libc::pthread_attr_setguardsize(&mut attr, 0), 0);
                }
                let f: Box<Box<dyn Fn()>> = Box::new(Box::new(check));
                let mut t: libc::pthread_t = 0;
                assert_eq!(
                    libc::pthread_create(&mut t, &attr, start, Box::into_raw(f) as *mut _),
                    0
                );
                assert_eq!(libc::pthread_join(t, core::ptr::null_mut()), 0);
                libc::pthread_attr_destroy(&mut attr);
            }
        }
        drop(mem);
    }
}
