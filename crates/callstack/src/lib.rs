//! # callstack
//!
//! Capture the call stack of running code fast enough to do it on every
//! allocation, log line and profiler sample, and turn the addresses into
//! functions, files and lines.
//!
//! ## Capture
//! - [`capture_fast`]: the frame-pointer walk. No allocation, no lock, no
//!   system call once the thread's stack bounds are known; async-signal-safe;
//!   never faults on a corrupt chain.
//!
//! ```
//! let mut frames = [0usize; 64];
//! let n = callstack::capture_fast(0, &mut frames);
//! assert!(n >= 1); // frames[0] is inside this function
//! ```
//!
//! - [`capture_exact`]: DWARF CFI (`.eh_frame`), right for code without
//!   frame pointers (C/C++ release builds, glibc, Rust's std);
//!   [`capture_from_context`] unwinds the code a signal interrupted, from the
//!   handler's `ucontext_t`; [`capture_exact_with_info`] adds each frame's
//!   registers and [`Method`]. Same guarantees as `capture_fast`.
//!
//! ```
//! let mut frames = [0usize; 64];
//! let n = callstack::capture_exact(0, &mut frames);
//! assert!(n >= 2); // down to the thread's first frame
//! ```
//!
//! ## Signal safety
//! The capture functions allocate nothing, take no lock and make no system
//! call, except the one-time lookup of a thread's stack bounds (see
//! [`prepare_thread`]), which uses only `open`/`read`/`close` (none on the
//! main thread for `capture_exact`; `gettid`/`getpid` too if this library
//! was `dlopen`ed on a thread other than the main one), and reads glibc's
//! record of the thread's stack without its lock. A walk on a stack other than the
//! thread's own (a `sigaltstack`, a coroutine or fiber stack) looks that
//! stack's bounds up the same way every time, since it may be unmapped and
//! another mapping made at its address at any moment. They may be called
//! from any signal handler.
//!
//! ## Exact capture: how modules and unwind tables are published
//! - Nothing needs to be set up (glibc 2.35+): a capture finds the module of
//!   each address with glibc's lock-free, async-signal-safe
//!   `_dl_find_object` and evaluates its CFI directly from `.eh_frame_hdr`,
//!   with storage on the stack. Never `dl_iterate_phdr`, never `malloc`.
//! - [`prepare`] compiles every loaded module's CFI into a compact table
//!   ([`unwind::UnwindTable`]) and publishes all of them as one immutable
//!   snapshot behind an atomic pointer (old snapshots are never freed, so a
//!   capture may keep reading the one it loaded). Captures then take a rule
//!   from a lock-free cache or the table: a few nanoseconds a frame. Call it
//!   at start-up (it is not async-signal-safe: it allocates and takes the
//!   loader's lock), or let [`prepare_in_background`] call it whenever
//!   a capture met a module without a table or the loaded objects changed.
//! - After `dlclose`, call [`prepare`] again (or run the background
//!   refresher). With glibc 2.35+ a capture also notices by itself: before
//!   it takes a rule from the snapshot on a cache miss, or reads code, it
//!   checks with `_dl_find_object` that the module is still loaded there,
//!   and otherwise unwinds from the CFI of what is loaded now and clears
//!   the rule cache. Until [`prepare`] (or that first miss), a frame whose
//!   return address equals one cached from the closed library may still get
//!   its old rule: wrong frames at worst, never a fault (stack reads are
//!   checked against the thread's stack). With an older glibc, [`prepare`]
//!   after `dlclose` is required before the addresses can be reused.
//! - With a glibc older than 2.35 (no `_dl_find_object`), call [`prepare`]
//!   once before capturing: captures stop cleanly at an address in a module
//!   they do not know.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(target_os = "linux")]
pub mod alloc;
// Windows compiles the offline unwinder and the rule forms (cores of any
// system) but not yet the in-process CFI capture that uses the rest.
#[cfg_attr(windows, allow(dead_code, unused_imports, unused_macros))]
pub(crate) mod arch;
#[cfg(any(target_os = "linux", windows))]
pub mod crash;
#[cfg_attr(windows, allow(dead_code))]
mod elf_headers;
mod elf_section;
#[cfg(target_os = "linux")]
pub mod exit_hook;
mod fast;
#[doc(hidden)]
pub mod fuzzing;
mod hash;
#[cfg(any(all(feature = "remote", target_os = "linux"), windows))]
pub mod minidump;
pub mod modules;
// Profiles read and write Linux's recordings (perf's kernel symbols, the
// vDSO's image): not on Windows yet.
#[cfg(not(windows))]
pub mod profile;
#[cfg(all(target_os = "linux", callstack_native))]
pub mod profiler;
// Other processes (cores, ptrace, perf_event_open, /proc) and the CPython
// reader over them are Linux's.
#[cfg(all(feature = "remote", not(windows)))]
pub mod python;
#[cfg(all(feature = "remote", not(windows)))]
pub mod remote;
#[cfg_attr(windows, allow(dead_code))]
mod stack;
#[cfg(feature = "symbolize")]
pub mod symbolize;
mod sys;
mod trace;
#[cfg_attr(windows, allow(dead_code))]
pub mod tracefile;
mod types;
#[cfg_attr(windows, allow(dead_code))]
pub mod unwind;

/// The README's Rust blocks, compiled and run as doc-tests (so that what
/// the README shows builds as written).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use hash::hash_frames;
pub use stack::{prepare_thread, StackBounds};

/// How many times a capture has looked the bounds of a stack up, rather
/// than found them cached, in this process. For tests of the caching;
/// not for Rust users.
#[doc(hidden)]
pub use stack::lookups as __stack_lookups;
#[cfg(feature = "symbolize")]
pub use symbolize::{called_from, called_from_any, Symbolizer};
pub use trace::Trace;
/// How many times the machine-code fallback of an in-process walk has
/// looked up the loaded segment of the code it reads (a walk remembers the
/// last one). For tests; not for Rust users.
#[doc(hidden)]
#[cfg(not(windows))]
pub use unwind::local::code_lookups as __code_lookups;
#[cfg(not(windows))]
pub use unwind::local::{has_dl_find_object, prepare, prepare_in_background, PrepareStats};
pub use unwind::{Frame, Method, StopReason};

/// Captures the current call stack by walking the frame-pointer chain.
///
/// `out[0]` is the return address of this call, a location inside the
/// function that called `capture_fast`; `skip` drops that many more entries.
/// Returns how many entries were written (at most `out.len()`).
///
/// The walk reads only inside the current thread's stack, each frame record
/// aligned and strictly above the previous one, so a corrupt or garbage chain
/// ends the walk cleanly instead of faulting. It stops at the first frame
/// built without a frame pointer (in a C program, usually glibc's
/// `__libc_start_call_main`); use exact capture for code without them.
///
/// Return addresses outside the executable code of the loaded modules end
/// the walk too (what a function built without frame pointers leaves where a
/// frame record would be); checking costs one lock-free `_dl_find_object`
/// per module the walk enters.
///
/// Async-signal-safe: no allocation, no lock, no system call (except the
/// first call on a thread, which looks up the stack bounds once, and a walk
/// on a stack that is not the thread's own, such as a `sigaltstack` or a
/// `makecontext` coroutine, which looks that stack's bounds up each time:
/// it may be unmapped and replaced at any moment).
///
/// Supported on x86-64, AArch64 and RISC-V 64 Linux and on x86-64 Windows
/// (the stack's bounds from the thread's TEB, the code's from the loader's
/// module list); on other targets it returns 0.
///
/// ```
/// #[inline(never)]
/// fn where_am_i() -> usize {
///     let mut out = [0usize; 16];
///     callstack::capture_fast(0, &mut out);
///     out[0] // an address inside `where_am_i`
/// }
/// assert_ne!(where_am_i(), 0);
/// ```
#[inline(always)]
pub fn capture_fast(skip: usize, out: &mut [usize]) -> usize {
    #[cfg(callstack_fast)]
    {
        let max = out.len().min(u32::MAX as usize) as u32;
        let skip = skip.min(u32::MAX as usize) as u32;
        // SAFETY: `out` has `max` writable slots.
        unsafe { fast::fast_entry(skip, max, out.as_mut_ptr()) as usize }
    }
    #[cfg(not(callstack_fast))]
    {
        let _ = (skip, out);
        0
    }
}

/// Captures the current call stack exactly, from DWARF CFI: right for code
/// built without frame pointers (C/C++ release builds, glibc, Rust's std).
///
/// Same contract as [`capture_fast`]: `out[0]` is the return address of
/// this call, a location inside the function that called `capture_exact`;
/// `skip` drops that many more entries; returns how many were written.
///
/// Each frame's rule comes from the module's compiled [`unwind::UnwindTable`]
/// (a table lookup and two loads per frame once warm). Modules without a
/// compiled table yet are unwound from their CFI directly, found through
/// glibc's lock-free `_dl_find_object`; see [`prepare`] and the
/// [`unwind`] module for how tables are published. Passes through PLT
/// stubs, signal frames (a capture in a signal handler continues into the
/// interrupted code), `alloca` frames, leaf functions, and code without CFI
/// but with a frame pointer. Ends at the outermost frame (`_start`, a
/// thread's start) or at an address in no loaded module.
///
/// Async-signal-safe: no allocation, no lock, no system call (except the
/// first call on a thread, which looks up its stack bounds once, and a walk
/// starting on a stack that is not the thread's own, which looks that
/// stack's bounds up each time). Every stack read is bounds-checked: a
/// corrupt stack ends the walk, never faults, and a caller outside the code
/// of the loaded modules ends it too.
///
/// ```
/// #[inline(never)]
/// fn here() -> usize {
///     let mut out = [0usize; 64];
///     let n = callstack::capture_exact(0, &mut out);
///     assert!(n >= 2); // here, its caller, ... down to the thread's start
///     out[0]
/// }
/// assert_ne!(here(), 0);
/// ```
#[inline(always)]
pub fn capture_exact(skip: usize, out: &mut [usize]) -> usize {
    #[cfg(callstack_native)]
    {
        let max = out.len().min(u32::MAX as usize) as u32;
        let skip = skip.min(u32::MAX as usize) as u32;
        // SAFETY: `out` has `max` writable slots.
        unsafe { unwind::local::exact_entry(skip, max, out.as_mut_ptr()) as usize }
    }
    // Windows x64: the images' `.pdata`/`.xdata` (`unwind/windows.rs`).
    #[cfg(all(windows, callstack_fast))]
    {
        let max = out.len().min(u32::MAX as usize) as u32;
        let skip = skip.min(u32::MAX as usize) as u32;
        // SAFETY: `out` has `max` writable slots.
        unsafe { unwind::windows::exact_entry(skip, max, out.as_mut_ptr()) as usize }
    }
    #[cfg(not(any(callstack_native, all(windows, callstack_fast))))]
    {
        let _ = (skip, out);
        0
    }
}

/// Like [`capture_exact`], keeping for each frame its stack pointer, frame
/// pointer and the [`Method`] that found it. Returns the number of frames
/// written and why the walk ended ([`StopReason::BufferFull`] if `out`
/// filled up). Async-signal-safe, like [`capture_exact`].
///
/// ```
/// let mut frames = [callstack::Frame { pc: 0, sp: 0, fp: 0, method: callstack::Method::Cfi }; 64];
/// let (n, stop) = callstack::capture_exact_with_info(0, &mut frames);
/// assert!(n >= 1);
/// assert_eq!(frames[0].method, callstack::Method::Context);
/// # let _ = stop;
/// ```
#[inline(always)]
pub fn capture_exact_with_info(skip: usize, out: &mut [Frame]) -> (usize, StopReason) {
    #[cfg(callstack_native)]
    {
        if out.is_empty() {
            return (0, StopReason::BufferFull);
        }
        let mut req = unwind::local::InfoRequest {
            skip,
            out: out.as_mut_ptr(),
            max: out.len(),
            stop: StopReason::Running,
        };
        // SAFETY: `req` points at `out`, which has `max` writable frames.
        let n = unsafe { unwind::local::info_entry(&mut req) };
        (n, req.stop)
    }
    #[cfg(not(callstack_native))]
    {
        let _ = (skip, out);
        (0, StopReason::Running)
    }
}

/// Captures the stack of the code a signal interrupted, from the signal
/// handler's third argument. `out[0]` is the interrupted pc itself (not a
/// return address), `out[1]` the return address into its caller, and so on.
///
/// Async-signal-safe: meant to be called from a `SIGPROF` handler (`ctx`
/// is the `void*` third argument, cast to `&libc::ucontext_t`). A context
/// whose stack pointer is not in readable, writable stack memory (a crafted
/// or corrupt one) gives the pc alone.
#[cfg(all(target_os = "linux", callstack_native))]
pub fn capture_from_context(ctx: &libc::ucontext_t, out: &mut [usize]) -> usize {
    let regs = arch::native::context::regs_from_ucontext(ctx);
    unwind::local::walk_pcs(regs, true, 0, out).0
}

/// Makes the captures follow modules' unloading (Windows x64): from now on
/// every `FreeLibrary` that unmaps a module clears the cached unwind rules
/// and code ranges, so that a module loaded later at the same addresses is
/// unwound by its own unwind data. Without it a rule cached from an
/// unloaded module may be applied to the next module there (wrong frames,
/// never a fault). Call it once at start-up; not from an exception
/// handler (it takes the loader's lock). Linux's `prepare` compiles unwind
/// tables; nothing is compiled ahead on Windows.
#[cfg(all(windows, callstack_fast))]
pub fn prepare() {
    unwind::windows::prepare();
}

/// Captures the stack of the code an exception interrupted, from its
/// `CONTEXT` (Windows x64: a vectored exception handler's
/// `ExceptionInfo->ContextRecord`, or `RtlCaptureContext`'s). `out[0]` is
/// the interrupted pc itself, `out[1]` the return address into its
/// caller, and so on, from the images' `.pdata` unwind data. No
/// allocation, no lock, no system call; reads only the running thread's
/// stack (a context of another thread's stack gives the pc alone).
///
/// A pc in an epilogue, which the unwind data does not describe, is
/// unwound by the epilogue's code (`add rsp`/`lea rsp`, `pop`s, `ret`).
///
/// # Safety
/// `ctx` must point at a readable x64 `CONTEXT`.
#[cfg(all(windows, callstack_fast))]
pub unsafe fn capture_from_context(ctx: *const core::ffi::c_void, out: &mut [usize]) -> usize {
    // SAFETY: as promised by the caller.
    unsafe { unwind::windows::walk_context(ctx.cast(), out) }
}

/// Like [`capture_from_context`], with per-frame registers and methods.
#[cfg(all(target_os = "linux", callstack_native))]
pub fn capture_from_context_with_info(
    ctx: &libc::ucontext_t,
    out: &mut [Frame],
) -> (usize, StopReason) {
    let regs = arch::native::context::regs_from_ucontext(ctx);
    unwind::local::walk_frames(regs, true, 0, out)
}

/// The raw entry behind [`capture_exact`], with the C signature. The C API
/// jumps here so that `out[0]` is inside the C caller. Not for Rust users.
///
/// # Safety
/// `out` must be valid for `max` writes, or null.
#[doc(hidden)]
#[cfg(callstack_native)]
pub use unwind::local::exact_entry as __capture_exact_raw;

/// The raw entry behind [`capture_fast`], with the C signature. The C API
/// jumps here so that `out[0]` is inside the C caller. Not for Rust users.
///
/// # Safety
/// `out` must be valid for `max` writes, or null.
#[doc(hidden)]
#[cfg(callstack_fast)]
pub use fast::fast_entry as __capture_fast_raw;

/// The raw entry behind [`capture_exact`] on Windows x64, with the C
/// signature. Not for Rust users.
///
/// # Safety
/// `out` must be valid for `max` writes, or null.
#[doc(hidden)]
#[cfg(all(windows, callstack_fast))]
pub use unwind::windows::exact_entry as __capture_exact_raw;
