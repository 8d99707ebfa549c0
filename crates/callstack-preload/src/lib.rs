//! `libcallstack_preload.so`: the library `callstack memtrack` preloads
//! into the program it runs.
//!
//! - [`memtrack`]: replaces the C allocator's entry points (malloc, free,
//!   calloc, realloc, reallocarray, memalign, posix_memalign,
//!   aligned_alloc, valloc, pvalloc; C++ `operator new`/`delete` reach them
//!   through libstdc++), records each block by call stack in a
//!   [`callstack::alloc::Recorder`] and writes the recording at exit.
//!
//! Inert unless `CALLSTACK_MEMTRACK_OUT` is set.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod memtrack;
