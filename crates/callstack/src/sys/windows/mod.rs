//! Windows: everything the crate knows of it, in one place.
//!
//! - `teb`: the current thread's stack bounds from its Thread Environment
//!   Block (no system call), and the Process Environment Block;
//! - `loader`: the loader's list of loaded modules (the PEB's), read
//!   without a lock for the capture's "is this a return address?" check
//!   (the executable sections of the module holding an address) and copied
//!   for `modules::loaded_modules`;
//! - `api`: the kernel32 and ntdll functions the crash handler
//!   (`crash/windows.rs`) and its helper's minidump
//!   (`crash/windows_dump.rs`) call, declared by hand;
//! - `x86_64`: the Win64 ABI's naked capture entries (`capture_fast`,
//!   `capture_exact`) and the TEB's
//!   address (`gs`).
//!
//! What is Linux's stays Linux's: `/proc`, signals, cores, `perf_event`,
//! the ELF loader's `_dl_find_object` and the CFI rule cache of
//! `unwind::local` are not compiled here (see `build.rs`).

// Without the symbolizer no helper runs here: its calls go unused.
#[cfg_attr(not(feature = "symbolize"), allow(dead_code))]
pub mod api;
pub mod loader;
pub mod teb;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_64;
