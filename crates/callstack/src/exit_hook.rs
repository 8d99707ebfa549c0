//! Exit hooks: run code right after a chosen frame returns, by patching its
//! return address (seed 003's "exit thunks"; uretprobes do the same in the
//! kernel).
//!
//! [`install`] replaces the return address of the frame `depth` levels up
//! with a trampoline. When that frame returns, the trampoline saves the
//! return registers, runs the hook, restores them and jumps to the original
//! address. Profilers use it to time a function without instrumenting it.
//!
//! ```
//! # #[cfg(callstack_exit_hooks)] {
//! use std::sync::atomic::{AtomicU32, Ordering};
//! static RETURNED: AtomicU32 = AtomicU32::new(0);
//!
//! #[inline(never)]
//! fn work() -> u64 {
//!     // Run a hook when `work` returns (depth 0: the caller of `install`).
//!     callstack::exit_hook::install(0, || {
//!         RETURNED.fetch_add(1, Ordering::Relaxed);
//!     })
//!     .unwrap();
//!     std::hint::black_box(42)
//! }
//! assert_eq!(work(), 42); // the return value passes through untouched
//! assert_eq!(RETURNED.load(Ordering::Relaxed), 1);
//! # }
//! ```
//!
//! # Captures stay truthful
//!
//! Every unwinder of this crate reports the original return address where
//! it meets the trampoline: [`crate::capture_fast`], [`crate::capture_exact`],
//! [`crate::capture_from_context`], the crash handler. The trampoline has
//! CFI whose return-address rule looks the original address up in the hook
//! table, so DWARF unwinders outside this crate pass through it too: libgcc
//! (a Rust panic or a C++ exception unwinding through a hooked frame, caught
//! by its direct caller or further up; `pthread_exit` and `pthread_cancel`;
//! glibc's `backtrace()`), gdb (which shows the trampoline as a frame of its
//! own, `__callstack_exit_hook_trampoline`, between the hooked function and
//! its caller), and `callstack pstack`/`core` (which read the table from the
//! target). On AArch64, libgcc (a Rust panic through a hooked frame, caught
//! by the direct caller or further up) and this crate's captures are
//! tested, under qemu-user; gdb and `callstack pstack`/`core` are not (the
//! CFI finds the table through `x30`, which this crate's offline unwinder
//! does not carry from a frame to its caller: `callstack core` of such a
//! process would stop at the trampoline).
//!
//! A signal may stop the thread at any instruction of the trampoline:
//! `capture_from_context`, `capture_exact` from the handler, the crash
//! handler, libgcc from the handler, gdb and `callstack core`/`pstack` of a
//! process stopped there all give the trampoline's pc then the hooked
//! frame's real caller (its CFI holds at every instruction: tested by
//! single-stepping it on x86-64; on AArch64, for this crate's captures,
//! by contexts made at each instruction where its frame holds no record,
//! and by a SIGPROF storm under qemu-user, which delivers signals between
//! its translated blocks only; gdb was checked by hand at its entry, in
//! its lookup, with its record up and at its final `ret`).
//! `capture_fast` from a handler, which follows frame
//! records, gives the real caller while the trampoline's frame record is
//! up, and the caller's callers elsewhere in it, as for any function
//! stopped outside its frame record.
//!
//! # Limits
//!
//! - x86-64 and AArch64 Linux only (other targets: [`install`] returns
//!   [`ExitHookError::Unsupported`]). The trampoline of each lives in its
//!   architecture's folder (`arch/<name>/exit_hook.rs`).
//! - The frame to hook is found by this crate's exact unwinder (CFI, or
//!   instruction analysis in code without CFI); its return address must be
//!   where the unwinder read it, or the install is refused. On AArch64 the
//!   return address is patched where the hooked frame's CFI says `x30` is
//!   saved (its frame record, at the top or the bottom of the frame), so
//!   the frame needs CFI there; a frame that keeps `x30` in a register (no
//!   slot to patch) or whose saved `x30` is signed by pointer
//!   authentication (`-mbranch-protection=pac-ret` on a CPU that
//!   authenticates: bits above the virtual address) is refused with
//!   [`ExitHookError::NotPatchable`]. A signed value whose code happens to
//!   be all zeros cannot be told from a plain one: patched, the function's
//!   `autiasp` would fail on the trampoline's address.
//! - A panic or C++ exception through a hooked frame (caught anywhere
//!   above, rethrown or not), or `longjmp` over it, skips its hook: the
//!   frame never returns. This is detected the next time a hook is
//!   installed or runs on a frame of the same stack above the stale entry,
//!   or when the thread ends: the entry is dropped, its hook's state dropped
//!   without running it, and counted in [`skipped`] (once).
//! - A thread that ends with hooks pending (`pthread_exit`, cancellation,
//!   its start function returning after a `longjmp` or a caught panic)
//!   drops them as it ends (a thread-exit destructor registered at the
//!   thread's first install, its one allocation): counted in [`skipped`],
//!   their table slots freed for other threads.
//! - Hooks may be pending on several stacks of one thread at once (the
//!   thread's own, `makecontext` coroutines or fibers, an alternate signal
//!   stack) and return in any order: an entry is taken for stale only by a
//!   later frame of its own stack. Each entry records its stack at install:
//!   the thread's own stack (two compares), the alternate signal stack the
//!   thread runs on (`sigaltstack(2)`, also one carved from the thread's own
//!   stack), or else the top of the run of frames that holds it (a walk up
//!   to the coroutine's first frame, which reads `/proc/self/maps`: an
//!   install on a coroutine's stack reads it twice, once to find the frame
//!   and once to find its stack, a hundred microseconds or more; a hooked
//!   return looks nothing up unless it may drop an entry). A `makecontext`
//!   coroutine whose stack is carved from the thread's own stack (an array
//!   in one of its frames) is told apart by its first frame (returning to
//!   glibc's `__start_context`); a fiber of another library carved from the
//!   thread's own stack is taken for that stack: with hooks pending on both
//!   at once, an entry may be dropped early and the process aborts when its
//!   frame returns.
//! - At most [`MAX_PER_THREAD`] hooked frames per thread at once, and the
//!   process-wide table has 1024 slots (an install that finds no free slot
//!   near its key fails with [`ExitHookError::TableFull`]).
//! - Up to [`MAX_PER_FRAME`] hooks on one frame; they run in the reverse
//!   order of installation (the last installed first), like nested frames.
//! - The trampoline preserves `rax`, `rdx`, `xmm0`, `xmm1` and the x87
//!   values of a `long double` result; the upper halves of `ymm`/`zmm`
//!   results (`__m256` returned in registers) are not saved. On AArch64 it
//!   preserves `x0`-`x7`, `x8` and `q0`-`q7` (integer, indirect, float,
//!   vector and homogeneous-aggregate results); SVE results (`z`/`p`
//!   registers beyond their low 128 bits) are not saved.
//! - A hook must not panic (it runs on a frame that has already returned:
//!   the process aborts) and runs with the hooked function's return value
//!   still pending in the saved registers.
//! - Intel CET shadow stacks (when a program enables them), and AArch64's
//!   Guarded Control Stack, reject a patched return address. (BTI does
//!   not: the trampoline is entered and left by `ret`.)
//! - Where the trampoline's frame is empty (returned to, before it pushes
//!   the original address, at its final jump) its CFA is 4 bytes above the
//!   hooked frame's, so that no two frames share a CFA (see
//!   `arch/x86_64/exit_hook.rs`; on AArch64 8 bytes above, see
//!   `arch/aarch64/exit_hook.rs`): a DWARF consumer that takes the CFA for
//!   the caller's stack pointer, rather than applying the rule the CFI
//!   gives `rsp` (`sp`), would put the caller's stack pointer 4 (8) bytes
//!   off. libgcc, gdb and this crate apply it.

// Exit hooks run on Linux where the architecture's folder has an
// `exit_hook` trampoline (`cfg(callstack_exit_hooks)`, set by build.rs):
// elsewhere `install` refuses, and the table it would fill is unused.
#![cfg_attr(not(all(callstack_exit_hooks, target_os = "linux")), allow(dead_code))]

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(all(callstack_exit_hooks, target_os = "linux"))]
use crate::unwind::hook_table::ever;
use crate::unwind::hook_table::{
    find, hash, trampoline, CLAIMED, EMPTY, FREE, PROBES, SLOTS, SLOT_ADDRS, TABLE,
};

/// The most hooked frames one thread may have at once.
pub const MAX_PER_THREAD: usize = 64;
/// The most hooks on one frame.
pub const MAX_PER_FRAME: usize = 4;

// The trampoline, which calls `dispatch` with a hooked frame's key (and
// `lost` when its entry is gone), defined here beside them.
#[cfg(all(callstack_exit_hooks, target_os = "linux"))]
crate::arch::native::exit_hook::define_trampoline!(
    crate::unwind::hook_table::TABLE,
    dispatch,
    lost
);

/// Why [`install`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitHookError {
    /// Exit hooks are implemented for x86-64 and AArch64 Linux only.
    Unsupported,
    /// The stack has fewer than `depth + 1` frames above the caller, or the
    /// frame at `depth` could not be unwound exactly (no CFI).
    NoSuchFrame(u32),
    /// The return address of the frame is not where its CFI says, is not
    /// saved in memory at all (AArch64: still in `x30`, a leaf or a
    /// prologue), or is signed by pointer authentication (AArch64's
    /// `paciasp`): the frame cannot be hooked.
    NotPatchable(u32),
    /// This thread already has [`MAX_PER_THREAD`] hooked frames, or the
    /// frame already has [`MAX_PER_FRAME`] hooks.
    TooMany,
    /// No free slot in the process-wide table near the frame's key.
    TableFull,
}

impl core::fmt::Display for ExitHookError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Unsupported => f.write_str("exit hooks are not supported on this target"),
            Self::NoSuchFrame(d) => write!(f, "no frame at depth {d} can be unwound exactly"),
            Self::NotPatchable(d) => {
                write!(
                    f,
                    "the return address of the frame at depth {d} is not on the stack \
                     (not saved where its CFI says, only in a register, or signed)"
                )
            }
            Self::TooMany => f.write_str("too many exit hooks on this thread or frame"),
            Self::TableFull => f.write_str("the exit-hook table has no free slot for this frame"),
        }
    }
}

impl std::error::Error for ExitHookError {}

/// A hook's code and its captured state, stored inline (no allocation).
#[derive(Clone, Copy)]
struct Hook {
    /// Runs the hook, consuming its state.
    call: unsafe fn(*mut [usize; 3]),
    /// Drops the state of a hook that will never run.
    drop: unsafe fn(*mut [usize; 3]),
    data: [MaybeUninit<usize>; 3],
    /// False once cancelled (its state already dropped).
    live: bool,
}

/// A hook installed by [`install`], until its frame returns: keep it to
/// [`cancel`](Installed::cancel) the hook, or drop it (dropping does not
/// cancel: the hook still runs when the frame returns).
#[derive(Debug)]
pub struct Installed {
    slot: u32,
    hook: u8,
    key: u64,
    generation: u64,
}

impl Installed {
    /// Cancels the hook if its frame has not returned yet: its state is
    /// dropped and it will not run; when no other hook stands on the frame,
    /// the frame's original return address is put back. Returns whether it
    /// was still pending. Must be called on the thread that installed it
    /// (on another thread, returns false).
    ///
    /// ```
    /// # #[cfg(callstack_exit_hooks)] {
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// static RAN: AtomicBool = AtomicBool::new(false);
    /// #[inline(never)]
    /// fn f(keep: bool) {
    ///     let h = callstack::exit_hook::install(0, || RAN.store(true, Ordering::Relaxed)).unwrap();
    ///     if !keep {
    ///         assert!(h.cancel());
    ///     }
    /// }
    /// f(false);
    /// assert!(!RAN.load(Ordering::Relaxed));
    /// f(true);
    /// assert!(RAN.load(Ordering::Relaxed));
    /// # }
    /// ```
    pub fn cancel(self) -> bool {
        let i = self.slot as usize;
        if TABLE[i].key.load(Ordering::Acquire) != self.key
            || GENERATIONS[i].load(Ordering::Relaxed) != self.generation
        {
            return false;
        }
        PENDING.with(|p| {
            // SAFETY: only this thread touches its own list.
            let p = unsafe { &mut *p.get() };
            let Some(at) = p.keys[..p.n].iter().position(|&k| k == self.key) else {
                // Another thread's frame.
                return false;
            };
            let n = COUNTS[i].load(Ordering::Relaxed);
            // SAFETY: this thread owns slot `i` (its key is in this thread's
            // list); hooks `0..n` were written by `install`.
            let hooks = unsafe { &mut (&mut *HOOKS.0.get())[i] };
            let Some(h) = hooks[..n].get_mut(self.hook as usize) else {
                return false;
            };
            // SAFETY: initialized by `install`.
            let h = unsafe { h.assume_init_mut() };
            if !h.live {
                return false;
            }
            // SAFETY: the state was written by `install` and not consumed.
            unsafe { (h.drop)(h.data.as_mut_ptr().cast()) };
            h.live = false;
            // SAFETY: as above.
            if hooks[..n]
                .iter()
                .all(|h| unsafe { !h.assume_init_ref().live })
            {
                // Nothing left to run: the frame returns where it always did.
                let slot = SLOT_ADDRS[i].load(Ordering::Relaxed) as *mut u64;
                let orig = TABLE[i].orig.load(Ordering::Relaxed);
                // SAFETY: the frame is live (its key is pending on this
                // thread, above the current frame) and its return address
                // slot was written by `install`.
                unsafe {
                    if trampoline() == Some(slot.read_volatile()) {
                        slot.write_volatile(orig);
                    }
                }
                free_slot(i);
                p.remove_at(at);
            }
            true
        })
    }
}

/// The hooks of each slot. Only the thread whose stack holds a slot's key
/// touches that slot's hooks (install and dispatch run on that thread).
struct Hooks(UnsafeCell<[[MaybeUninit<Hook>; MAX_PER_FRAME]; SLOTS + PROBES]>);
// SAFETY: see `Hooks`: a slot's hooks are only accessed by the thread that
// claimed the slot, between claiming and freeing it.
unsafe impl Sync for Hooks {}
static HOOKS: Hooks = Hooks(UnsafeCell::new(
    [[MaybeUninit::uninit(); MAX_PER_FRAME]; SLOTS + PROBES],
));
static COUNTS: [AtomicUsize; SLOTS + PROBES] = [const { AtomicUsize::new(0) }; SLOTS + PROBES];
/// Bumped each time a slot is claimed, so that an [`Installed`] of an
/// earlier frame with the same CFA cancels nothing.
static GENERATIONS: [AtomicU64; SLOTS + PROBES] = [const { AtomicU64::new(0) }; SLOTS + PROBES];

static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// Hooks never run because their frame was left without returning
/// (`longjmp`, a panic caught further up, `pthread_exit`, the end of the
/// thread), since the process started; each counted once. See the module's
/// limits.
pub fn skipped() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
}

/// This thread's hooked frames, by key (highest first, so the innermost
/// frame of a single stack is last), each with the stack it lives on.
struct Pending {
    n: usize,
    keys: [u64; MAX_PER_THREAD],
    /// The stack of each entry's frame: [`OWN_STACK`], or the tag of another
    /// stack (see [`stack_tags`]). An entry is left behind (stale) only by
    /// a frame of its own stack.
    stacks: [u64; MAX_PER_THREAD],
    /// Whether the thread-exit cleanup ([`ExitCleanup`]) is registered.
    registered: bool,
}

impl Pending {
    /// Removes entry `at` from the list (not from the table).
    fn remove_at(&mut self, at: usize) {
        self.keys.copy_within(at + 1..self.n, at);
        self.stacks.copy_within(at + 1..self.n, at);
        self.n -= 1;
    }
}

thread_local! {
    // Const and without `Drop`: a plain `#[thread_local]` slot that
    // `dispatch` reaches with one `fs`-relative address, never torn down.
    static PENDING: UnsafeCell<Pending> = const {
        UnsafeCell::new(Pending {
            n: 0,
            keys: [0; MAX_PER_THREAD],
            stacks: [0; MAX_PER_THREAD],
            registered: false,
        })
    };
    // Registered at the thread's first install (its one allocation, in the
    // C library's list of thread-exit destructors).
    static CLEANUP: ExitCleanup = const { ExitCleanup };
}

/// The stack tag of frames on the thread's own stack (the one it was
/// created with, whose bounds `crate::stack` caches).
const OWN_STACK: u64 = 0;

/// Dropped when its thread exits: the hooks still pending then never run
/// (the thread ended by `pthread_exit`, cancellation, or returned from its
/// start function after a `longjmp` or a caught panic over hooked frames).
/// Their state is dropped, they are counted in [`skipped`], and their table
/// slots freed.
struct ExitCleanup;

impl Drop for ExitCleanup {
    fn drop(&mut self) {
        PENDING.with(|p| {
            // SAFETY: only this thread touches its own list; no hook runs
            // while this does.
            let p = unsafe { &mut *p.get() };
            while p.n > 0 {
                p.n -= 1;
                // An entry whose frame the unwinder passed may be gone
                // already: each is dropped (and counted) once.
                if let Some(i) = find(p.keys[p.n]) {
                    drop_entry(i);
                }
            }
            // An install later in this thread's teardown registers again
            // (or, past the destructors, finds the key gone and leaves its
            // entries to be dropped where a frame reuses their keys).
            p.registered = false;
        });
    }
}

/// Registers this thread's [`ExitCleanup`] (once per thread, at its first
/// install: it may allocate).
#[cold]
#[inline(never)]
fn register_cleanup(p: &mut Pending) {
    // So that `on_own_stack` never needs a lookup, even on a thread whose
    // first install is on another stack.
    crate::stack::cache_own_stack();
    if CLEANUP.try_with(|_| ()).is_ok() {
        p.registered = true;
    }
}

/// Whether `sp` is on this thread's own stack: two compares (its bounds are
/// cached at the thread's first install, [`register_cleanup`]).
#[inline(always)]
fn on_own_stack(sp: u64) -> bool {
    crate::stack::cached_bounds_for(sp as usize).is_some()
}

/// Whether an entry at or below `sp` may be of a stack that holds `sp`
/// when `sp` is on the thread's own stack: tagged [`OWN_STACK`], or with a
/// tag inside it (an alternate stack or coroutine carved from it).
#[cold]
#[inline(never)]
fn own_tagged_at_or_below(p: &Pending, sp: u64) -> bool {
    (0..p.n).rev().take_while(|&i| p.keys[i] <= sp).any(|i| {
        let t = p.stacks[i];
        t == OWN_STACK || crate::stack::cached_bounds_for(t as usize).is_some()
    })
}

/// The alternate signal stack `[lo, hi)` when this thread runs on it now.
fn current_altstack() -> Option<(u64, u64)> {
    // SAFETY: sigaltstack(2) with no new stack only writes `ss`.
    let mut ss: libc::stack_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sigaltstack(core::ptr::null(), &mut ss) } != 0
        || ss.ss_flags & libc::SS_ONSTACK == 0
    {
        return None;
    }
    let lo = ss.ss_sp as u64;
    Some((lo, lo + ss.ss_size as u64))
}

/// The stack tags of `here` (a stack pointer of the caller's frame) and of
/// `key` (a hooked frame's CFA, on the caller's chain), when they are not
/// both on the thread's own stack, or when an entry may be dropped. Tags:
/// - the alternate signal stack the thread runs on (its end), for an
///   address on it: nested handlers grow it like any stack, and it may sit
///   anywhere, also inside the thread's own stack;
/// - [`OWN_STACK`] for the thread's own stack, unless the address is on a
///   `makecontext` coroutine carved from it (an array in one of its frames:
///   a run, as below, that starts from `__start_context`);
/// - otherwise (a `makecontext` coroutine, a fiber: any number of them in
///   one mapping, a heap or an array) the top of the run of frames that
///   holds the address: frames found by walking up from here while each
///   caller's stack pointer is above its callee's (a walk ends at a
///   coroutine's first frame; a jump down, through a signal frame, leaves
///   the run). Two coroutines have two tops.
///
/// Not async-signal-safe (the walk may read `/proc/self/maps`); only
/// installs on switched stacks, and installs that may drop entries, pay it.
#[cold]
#[inline(never)]
fn stack_tags(here: u64, key: u64) -> (u64, u64) {
    let alt = current_altstack();
    let want = [here, key];
    let mut runs = None;
    let mut tags = [0u64; 2];
    for (t, &a) in tags.iter_mut().zip(&want) {
        if let Some((lo, hi)) = alt {
            if lo <= a && a < hi {
                *t = hi;
                continue;
            }
        }
        let run = runs.get_or_insert_with(|| runs_of(&want))[(a == key) as usize];
        *t = match run {
            Some(r) if on_own_stack(a) && !r.coroutine => OWN_STACK,
            Some(r) => r.top,
            // On no run found (a walk cut short): a tag of its own, so that
            // nothing else is ever taken for its stack.
            None => a | 1,
        };
    }
    (tags[0], tags[1])
}

/// A run of frames (see [`stack_tags`]).
#[derive(Clone, Copy)]
struct Run {
    /// Its highest stack pointer.
    top: u64,
    /// Whether it starts from `__start_context`: a `makecontext` coroutine.
    coroutine: bool,
}

/// The runs of frames (see [`stack_tags`]) that hold each of `want`,
/// walking from the caller.
#[inline(never)]
fn runs_of(want: &[u64; 2]) -> [Option<Run>; 2] {
    const CHUNK: usize = 32;
    const MAX_FRAMES: usize = 1024;
    let start = start_context_pc();
    let blank = crate::unwind::Frame {
        pc: 0,
        sp: 0,
        fp: 0,
        method: crate::unwind::Method::Cfi,
    };
    let mut frames = [blank; CHUNK];
    let mut found = [None; 2];
    // The run being read: its lowest stack pointer.
    let mut lo = 0u64;
    let mut run: Option<Run> = None;
    let close = |lo: u64, r: Run, found: &mut [Option<Run>; 2]| {
        for (t, &a) in found.iter_mut().zip(want) {
            if t.is_none() && lo <= a && a <= r.top {
                *t = Some(r);
            }
        }
    };
    let mut skip = 0;
    'walk: while skip < MAX_FRAMES {
        let (n, stop) = crate::capture_exact_with_info(skip, &mut frames);
        for f in &frames[..n] {
            if f.sp == 0 {
                break 'walk;
            }
            let r = match run {
                Some(r) if f.sp >= r.top => r,
                _ => {
                    if let Some(r) = run {
                        close(lo, r, &mut found);
                    }
                    lo = f.sp;
                    Run {
                        top: f.sp,
                        coroutine: false,
                    }
                }
            };
            run = Some(Run {
                top: f.sp,
                coroutine: r.coroutine || (start != 0 && f.pc == start),
            });
        }
        if n < CHUNK || stop != crate::StopReason::BufferFull {
            break;
        }
        skip += n;
    }
    if let Some(r) = run {
        close(lo, r, &mut found);
    }
    found
}

/// The address of glibc's `__start_context` (where a `makecontext`
/// coroutine's function returns to: its first frame's return address), or
/// 0 when unknown. Found once, by reading the return address `makecontext`
/// writes on a stack of our own.
fn start_context_pc() -> u64 {
    static PC: AtomicU64 = AtomicU64::new(u64::MAX);
    let pc = PC.load(Ordering::Relaxed);
    if pc != u64::MAX {
        return pc;
    }
    #[allow(unused_mut)]
    let mut pc = 0;
    // Where exit hooks run (elsewhere nothing is hooked, and the C library
    // may have no `makecontext`).
    #[cfg(all(callstack_exit_hooks, target_os = "linux"))]
    {
        extern "C" fn never() {}
        let mut stack = [0u64; 256];
        // SAFETY: a zeroed context filled by getcontext, given a stack of
        // ours for makecontext to write its first frame on; nothing
        // switches to it.
        unsafe {
            let mut uc: libc::ucontext_t = core::mem::zeroed();
            if libc::getcontext(&mut uc) == 0 {
                uc.uc_stack.ss_sp = stack.as_mut_ptr().cast();
                uc.uc_stack.ss_size = core::mem::size_of_val(&stack);
                uc.uc_link = core::ptr::null_mut();
                libc::makecontext(&mut uc, never, 0);
                pc = crate::arch::native::exit_hook::start_context_pc(&uc, &stack);
            }
        }
    }
    PC.store(pc, Ordering::Relaxed);
    pc
}

/// The address a hooked frame returns to while its hook is pending (`None`
/// where exit hooks are not supported), for unwinders of your own: the
/// original return address of a frame is then in the hook table, which
/// this crate's captures consult for you.
pub fn trampoline_address() -> Option<usize> {
    trampoline().map(|t| t as usize)
}

/// Frees slot `i` (its hooks already taken or dropped).
fn free_slot(i: usize) {
    COUNTS[i].store(0, Ordering::Relaxed);
    TABLE[i].key.store(FREE, Ordering::Release);
}

/// Drops entry `i`, whose frame was left without returning: its hooks never
/// run (their state is dropped) and are counted in [`skipped`].
fn drop_entry(i: usize) {
    let n = COUNTS[i].load(Ordering::Relaxed);
    for h in 0..n {
        // SAFETY: this thread claimed slot `i` (its key is on this thread's
        // stack); hooks `0..n` were written by `install`, the live ones not
        // consumed.
        unsafe {
            let h = (*HOOKS.0.get())[i][h].assume_init_mut();
            if h.live {
                SKIPPED.fetch_add(1, Ordering::Relaxed);
                (h.drop)(h.data.as_mut_ptr().cast());
            }
        }
    }
    free_slot(i);
}

/// Drops this thread's entries for frames on stack `stack` whose CFA is at
/// or below `sp` (the stack pointer of a live frame of that stack): they
/// were left without returning. Entries of other stacks stay.
fn drop_stale(p: &mut Pending, stack: u64, sp: u64) {
    // Entries are sorted by key, highest first: those at or below `sp` are
    // the last ones.
    let mut w = p.n;
    while w > 0 && p.keys[w - 1] <= sp {
        w -= 1;
    }
    let mut keep = w;
    for r in w..p.n {
        if p.stacks[r] == stack {
            if let Some(i) = find(p.keys[r]) {
                drop_entry(i);
            }
        } else {
            p.keys[keep] = p.keys[r];
            p.stacks[keep] = p.stacks[r];
            keep += 1;
        }
    }
    p.n = keep;
}

/// Installs `hook` to run when the frame `depth` levels up returns: depth 0
/// is the function that calls `install`, 1 its caller, and so on.
///
/// `hook` may capture up to three words of state (a closure over a few
/// references or integers, a function pointer plus an argument); larger
/// state fails to compile (box it and capture the box). It runs on this
/// thread, right after the frame returns, with the frame's return value
/// saved and restored around it.
///
/// Installing takes an exact capture to find the frame (a few hundred
/// nanoseconds warm), allocates nothing once the thread has installed a hook
/// before, and is not async-signal-safe.
///
/// ```
/// # #[cfg(callstack_exit_hooks)] {
/// use std::cell::Cell;
/// thread_local!(static ORDER: Cell<u32> = const { Cell::new(0) });
///
/// #[inline(never)]
/// fn inner() {
///     // Two hooks on two frames: `inner`'s runs first.
///     callstack::exit_hook::install(0, || ORDER.with(|o| o.set(o.get() * 10 + 1))).unwrap();
///     callstack::exit_hook::install(1, || ORDER.with(|o| o.set(o.get() * 10 + 2))).unwrap();
/// }
/// #[inline(never)]
/// fn outer() {
///     inner();
///     std::hint::black_box(());
/// }
/// outer();
/// assert_eq!(ORDER.with(|o| o.get()), 12);
/// # }
/// ```
// Inlined into its caller, so that the frame walk starts one frame nearer.
#[inline(always)]
pub fn install<F: FnOnce() + Send + 'static>(
    depth: u32,
    hook: F,
) -> Result<Installed, ExitHookError> {
    const {
        assert!(
            core::mem::size_of::<F>() <= 3 * core::mem::size_of::<usize>()
                && core::mem::align_of::<F>() <= core::mem::align_of::<usize>(),
            "an exit hook may capture at most three words: box larger state"
        );
    }
    unsafe fn call<F: FnOnce()>(data: *mut [usize; 3]) {
        // SAFETY: `data` holds an `F` written by `install` and read once.
        let f = unsafe { data.cast::<F>().read() };
        f();
    }
    unsafe fn drop_state<F>(data: *mut [usize; 3]) {
        // SAFETY: `data` holds an `F` written by `install`, never consumed.
        unsafe { drop(data.cast::<F>().read()) };
    }
    let mut h = Hook {
        call: call::<F>,
        drop: drop_state::<F>,
        data: [MaybeUninit::uninit(); 3],
        live: true,
    };
    // SAFETY: `F` fits in the three words (checked above) and is aligned
    // for them; it is moved in and read back exactly once by `call`.
    unsafe { h.data.as_mut_ptr().cast::<F>().write(hook) };
    let mut result = Err(ExitHookError::Unsupported);
    install_at(depth, h, &mut result);
    if result.is_err() {
        // The hook will never run: drop its state.
        // SAFETY: written above, not consumed.
        unsafe { drop(h.data.as_mut_ptr().cast::<F>().read()) };
    }
    result
}

/// Installs `hook(arg)` to run when the frame `depth` levels up from the
/// caller of the function this is inlined into returns: the C API's entry,
/// a function of its own called directly by the C code. See [`install`].
///
/// Inlined into that entry, so that the entry itself plays the part of
/// `install_at` and the frame walk starts from the C caller, as it does
/// from a Rust caller of [`install`]: two frames less to walk than through
/// a call of a call.
#[doc(hidden)]
#[inline(always)]
pub fn install_c(
    depth: u32,
    hook: unsafe extern "C" fn(*mut core::ffi::c_void),
    arg: *mut core::ffi::c_void,
) -> Result<Installed, ExitHookError> {
    unsafe fn call_c(data: *mut [usize; 3]) {
        // SAFETY: `data` holds the function and argument `install_c` stored.
        unsafe {
            let d = &*data;
            let f: unsafe extern "C" fn(*mut core::ffi::c_void) = core::mem::transmute(d[0]);
            f(d[1] as *mut core::ffi::c_void);
        }
    }
    unsafe fn nothing(_: *mut [usize; 3]) {}
    let h = Hook {
        call: call_c,
        drop: nothing,
        data: [
            MaybeUninit::new(hook as usize),
            MaybeUninit::new(arg as usize),
            MaybeUninit::new(0),
        ],
        live: true,
    };
    #[cfg(all(callstack_exit_hooks, target_os = "linux"))]
    {
        install_native(depth, h)
    }
    #[cfg(not(all(callstack_exit_hooks, target_os = "linux")))]
    {
        let _ = (depth, h);
        Err(ExitHookError::Unsupported)
    }
}

/// [`install`]'s frame of its own: the frame to hook is `depth + 1` frames
/// above the caller of this function. The result goes through `out` (so
/// that the caller's call is not a tail call, which would remove its
/// frame).
#[inline(never)]
fn install_at(depth: u32, hook: Hook, out: &mut Result<Installed, ExitHookError>) {
    #[cfg(all(callstack_exit_hooks, target_os = "linux"))]
    {
        *out = install_native(depth, hook);
    }
    #[cfg(not(all(callstack_exit_hooks, target_os = "linux")))]
    {
        let _ = (depth, hook);
        *out = Err(ExitHookError::Unsupported);
    }
}

#[cfg(all(callstack_exit_hooks, target_os = "linux"))]
#[inline(always)]
fn install_native(depth: u32, hook: Hook) -> Result<Installed, ExitHookError> {
    use crate::unwind::local::FrameRequest;
    use crate::unwind::{Frame, Method};
    // Frame 0: the return address into `install_at` (or the C entry that
    // `install_c` is inlined into); frame 1: into the function calling
    // `install` (or the C entry); frame 2 + depth is the one the
    // hooked frame returns to: its stack pointer is the hooked frame's CFA
    // (the key), and its return address is saved in the hooked frame at
    // `req.slot` (x86-64: just below the key, where `call` pushed it;
    // AArch64: where the hooked frame's CFI says it saved x30).
    let mut req = FrameRequest {
        up: 2 + depth as usize,
        here_sp: 0,
        frame: Frame {
            pc: 0,
            sp: 0,
            fp: 0,
            method: Method::Cfi,
        },
        slot: 0,
        found: false,
    };
    // SAFETY: `req` is a valid request.
    unsafe { crate::unwind::local::frame_entry(&mut req) };
    if !req.found {
        return Err(ExitHookError::NoSuchFrame(depth));
    }
    // A signal frame's "return" is a sigreturn. Field by field, as
    // `frame_from_entry` wrote them: a copy of the whole frame is loaded 16
    // bytes at a time, which the CPU cannot forward from the 8-byte stores
    // just made (a stall of a dozen cycles each).
    let (ret, key, method, slot) = (req.frame.pc, req.frame.sp, req.frame.method, req.slot);
    if matches!(method, Method::SignalFrame | Method::Context) || slot == 0 {
        return Err(ExitHookError::NotPatchable(depth));
    }
    let here = req.here_sp;
    let slot = slot as *mut u64;
    let tramp = crate::arch::native::exit_hook::trampoline();
    // SAFETY: `slot` is inside this thread's stack (the unwinder read the
    // return address there, bounded by the stack) and belongs to a live frame
    // above this one.
    let current = unsafe { slot.read_volatile() };
    if !crate::arch::native::exit_hook::is_plain(current) {
        // Signed (pointer authentication): the hooked function would check
        // the trampoline's address against the signature and fault.
        return Err(ExitHookError::NotPatchable(depth));
    }
    PENDING.with(|p| {
        // SAFETY: only this thread touches its own list, and not re-entrantly
        // (hooks run after `dispatch` is done with it).
        let p = unsafe { &mut *p.get() };
        if !p.registered {
            register_cleanup(p);
        }
        // Which stack the hooked frame is on: the thread's own in the common
        // case (two compares each); a lookup otherwise, or when an entry
        // lies at or below `here` and may have been left behind.
        let may_drop = p.n > 0 && p.keys[p.n - 1] <= here;
        let stack = if on_own_stack(here)
            && on_own_stack(key)
            && (!may_drop || !own_tagged_at_or_below(p, here))
        {
            // Nothing below `here` can be of this stack (the entries there
            // are of coroutines or alternate stacks outside it).
            OWN_STACK
        } else {
            let (here_stack, stack) = stack_tags(here, key);
            if may_drop {
                drop_stale(p, here_stack, here);
            }
            stack
        };
        if current == tramp {
            // A second hook on an already hooked frame.
            let i = find(key).ok_or(ExitHookError::NotPatchable(depth))?;
            let c = COUNTS[i].load(Ordering::Relaxed);
            if c == MAX_PER_FRAME {
                return Err(ExitHookError::TooMany);
            }
            // SAFETY: this thread owns slot `i` (its key is on this stack).
            unsafe { (*HOOKS.0.get())[i][c] = MaybeUninit::new(hook) };
            COUNTS[i].store(c + 1, Ordering::Relaxed);
            return Ok(Installed {
                slot: i as u32,
                hook: c as u8,
                key,
                generation: GENERATIONS[i].load(Ordering::Relaxed),
            });
        }
        if current != ret {
            return Err(ExitHookError::NotPatchable(depth));
        }
        if let Some(i) = find(key) {
            // An entry for this CFA whose frame does not return to the
            // trampoline: a frame left without returning (a longjmp) that
            // another frame now occupies.
            drop_entry(i);
            if let Some(j) = p.keys[..p.n].iter().position(|&k| k == key) {
                p.remove_at(j);
            }
        }
        if p.n == MAX_PER_THREAD {
            return Err(ExitHookError::TooMany);
        }
        let i = claim(key).ok_or(ExitHookError::TableFull)?;
        // SAFETY: this thread just claimed slot `i`.
        unsafe { (*HOOKS.0.get())[i][0] = MaybeUninit::new(hook) };
        COUNTS[i].store(1, Ordering::Relaxed);
        let generation = GENERATIONS[i].load(Ordering::Relaxed) + 1;
        GENERATIONS[i].store(generation, Ordering::Relaxed);
        TABLE[i].orig.store(current, Ordering::Relaxed);
        SLOT_ADDRS[i].store(slot as u64, Ordering::Relaxed);
        if !ever().load(Ordering::Relaxed) {
            ever().store(true, Ordering::Relaxed);
        }
        TABLE[i].key.store(key, Ordering::Release);
        // Keep the list sorted, lowest key last.
        let mut j = p.n;
        while j > 0 && p.keys[j - 1] < key {
            p.keys[j] = p.keys[j - 1];
            p.stacks[j] = p.stacks[j - 1];
            j -= 1;
        }
        p.keys[j] = key;
        p.stacks[j] = stack;
        p.n += 1;
        // SAFETY: as for the read above. From here the frame returns to the
        // trampoline, which finds slot `i` by `key`.
        unsafe { slot.write_volatile(tramp) };
        Ok(Installed {
            slot: i as u32,
            hook: 0,
            key,
            generation,
        })
    })
}

/// Claims a free slot for `key`: the first empty or freed one in its window.
fn claim(key: u64) -> Option<usize> {
    let h = hash(key);
    (h..h + PROBES).find(|&i| {
        let k = TABLE[i].key.load(Ordering::Relaxed);
        (k == EMPTY || k == FREE)
            && TABLE[i]
                .key
                .compare_exchange(k, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    })
}

/// Called by the trampoline with the key of the frame that just returned to
/// it (the original return address is already on the trampoline's frame):
/// runs its hooks, last installed first, and frees the entry.
///
/// # Safety
/// Only the trampoline calls this, on the thread whose frame returned.
pub(crate) unsafe extern "C" fn dispatch(key: u64) {
    let Some(i) = find(key) else { return };
    let n = COUNTS[i].load(Ordering::Relaxed);
    let mut hooks = [MaybeUninit::<Hook>::uninit(); MAX_PER_FRAME];
    // SAFETY: this thread owns slot `i`; hooks `0..n` were written by
    // `install`.
    unsafe { hooks[..n].copy_from_slice(&(&(*HOOKS.0.get()))[i][..n]) };
    free_slot(i);
    PENDING.with(|p| {
        // SAFETY: as in `install_native`.
        let p = unsafe { &mut *p.get() };
        if p.n > 0 && p.keys[p.n - 1] == key {
            // The common case: the lowest entry returned, none below it.
            p.n -= 1;
        } else {
            dispatch_rest(p, key);
        }
    });
    for h in hooks[..n].iter_mut().rev() {
        // SAFETY: initialized above; each hook's state is read once.
        unsafe {
            let h = h.assume_init_mut();
            if h.live {
                (h.call)(h.data.as_mut_ptr().cast());
            }
        }
    }
}

/// The rest of [`dispatch`] when the frame that returned (`key`) is not the
/// lowest entry: frames of other stacks lie below it (coroutines, an
/// alternate signal stack), or frames of its own stack that never returned
/// (a `longjmp`): those are dropped, the others stay. No lookup: each
/// entry's stack was found at its install.
#[cold]
#[inline(never)]
fn dispatch_rest(p: &mut Pending, key: u64) {
    let Some(at) = p.keys[..p.n].iter().position(|&k| k == key) else {
        return;
    };
    let stack = p.stacks[at];
    p.remove_at(at);
    if stack == OWN_STACK
        && (at..p.n).any(|i| p.stacks[i] == OWN_STACK)
        && stack_tags(key, key).0 != OWN_STACK
    {
        // Taken for the thread's own stack when installed (nothing lay below
        // it then), the frame was on a coroutine carved from it: the entries
        // of the own stack below are not its.
        return;
    }
    drop_stale(p, stack, key);
}

/// Called by the trampoline when a frame returned to it with no entry: the
/// table was overwritten. There is no address to return to.
pub(crate) extern "C" fn lost() -> ! {
    let msg =
        b"callstack: a frame returned to the exit-hook trampoline with no hook recorded for it\n";
    // SAFETY: write(2) of a static buffer.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::abort()
    }
}
