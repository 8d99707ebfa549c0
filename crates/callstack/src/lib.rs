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
//! ## Signal safety
//! The capture functions allocate nothing, take no lock and make no system
//! call, except the one-time lookup of a thread's stack bounds (see
//! [`prepare_thread`]), which uses only `open`/`read`/`close`. They may be
//! called from any signal handler.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod arch;
#[cfg(target_os = "linux")]
pub mod crash;
mod fast;
mod hash;
pub mod modules;
mod stack;
mod sys;
mod trace;
pub mod unwind;

pub use hash::hash_frames;
pub use stack::{prepare_thread, StackBounds};
pub use trace::Trace;

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
/// Async-signal-safe: no allocation, no lock, no system call (except the
/// first call on a thread, which looks up the stack bounds once).
///
/// Supported on x86-64 and AArch64 Linux; on other targets it returns 0.
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
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let max = out.len().min(u32::MAX as usize) as u32;
        let skip = skip.min(u32::MAX as usize) as u32;
        // SAFETY: `out` has `max` writable slots.
        unsafe { arch::native::fast_entry(skip, max, out.as_mut_ptr()) as usize }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (skip, out);
        0
    }
}

/// The raw entry behind [`capture_fast`], with the C signature. The C API
/// jumps here so that `out[0]` is inside the C caller. Not for Rust users.
///
/// # Safety
/// `out` must be valid for `max` writes, or null.
#[doc(hidden)]
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub use arch::native::fast_entry as __capture_fast_raw;
