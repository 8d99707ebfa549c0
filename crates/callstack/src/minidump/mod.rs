//! Minidumps: the crash-dump format crash services ingest (the Microsoft
//! format with the Breakpad/Crashpad Linux streams).
//!
//! [`mod@write`] turns a live process or a core file into a minidump readable by
//! rust-minidump, Breakpad and Sentry.
//!
//! [`mod@windows`] lays out a Windows x64 process's dump in the native
//! layout (the crash handler's collector on Windows fills it).

pub mod windows;
#[cfg(all(feature = "remote", target_os = "linux"))]
pub mod write;

#[cfg(all(feature = "remote", target_os = "linux"))]
pub use write::{write_core, write_live_process, Crash, MinidumpError, WriteOptions, WriteStats};
