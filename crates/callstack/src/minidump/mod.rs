//! Minidumps: the crash-dump format crash services ingest (the Microsoft
//! format with the Breakpad/Crashpad Linux streams).
//!
//! [`mod@write`] turns a live process or a core file into a minidump readable by
//! rust-minidump, Breakpad and Sentry.

pub mod write;

pub use write::{write_core, write_live_process, Crash, MinidumpError, WriteOptions, WriteStats};
