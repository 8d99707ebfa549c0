//! `libcallstack_preload.so`: the library `callstack memtrack` preloads
//! into the program it runs.
//!
//! - [`memtrack`]: replaces the C allocator's entry points (malloc, free,
//!   calloc, realloc, reallocarray, memalign, posix_memalign,
//!   aligned_alloc, valloc, pvalloc; C++ `operator new`/`delete` reach them
//!   through libstdc++), records each block by call stack in a
//!   [`callstack::alloc::Recorder`] (in a shared file mapping that
//!   outlives the process, under `callstack memtrack`) and writes the
//!   recording at exit.
//!
//! - [`sampler`]: the in-process CPU sampler `callstack record` falls back
//!   to where perf events are refused; writes a profile at exit.
//!
//! Each is inert unless its variable is set (`CALLSTACK_MEMTRACK_OUT`,
//! `CALLSTACK_RECORD_OUT`).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod memtrack;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub mod sampler;
