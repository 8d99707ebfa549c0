//! The minidump writer (stub: the body comes next).

use std::fmt;
use std::path::{Path, PathBuf};

use crate::remote::corefile::CoreFile;
use crate::remote::{Lookup, Registers, RemoteError};

/// The crash a dump records (its exception stream).
#[derive(Clone, Debug)]
pub struct Crash {
    /// The crashing thread.
    pub tid: u32,
    /// The signal (`si_signo`).
    pub signal: i32,
    /// The signal's code (`si_code`).
    pub code: i32,
    /// The fault address (`si_addr`).
    pub address: u64,
    /// The crashing thread's registers at the fault (from the signal's
    /// ucontext). When `Some`, they replace what ptrace reads for that
    /// thread (ptrace sees it inside the signal handler).
    pub registers: Option<Registers>,
}

/// What a dump holds beyond the threads and modules.
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// The crash, written as the exception stream.
    pub crash: Option<Crash>,
    /// Bytes of each thread's stack kept, from its stack pointer (minus the
    /// red zone) up, and never past the end of the stack's mapping.
    pub stack_limit: u64,
    /// Include `MD_LINUX_ENVIRON` (off by default: environments hold secrets).
    pub environ: bool,
}

/// The default stack limit: 256 KiB per thread.
pub const DEFAULT_STACK_LIMIT: u64 = 256 * 1024;

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            crash: None,
            stack_limit: DEFAULT_STACK_LIMIT,
            environ: false,
        }
    }
}

/// What a written dump holds.
#[derive(Clone, Debug)]
pub struct WriteStats {
    /// Threads written.
    pub threads: usize,
    /// Modules written.
    pub modules: usize,
    /// The file's size in bytes.
    pub bytes: u64,
}

/// Why a dump could not be written.
#[derive(Debug)]
pub enum MinidumpError {
    /// The target could not be read.
    Remote(RemoteError),
    /// The output file could not be written.
    Io(PathBuf, std::io::Error),
    /// The target's architecture has no minidump context here.
    UnsupportedArch(String),
}

impl fmt::Display for MinidumpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MinidumpError::Remote(e) => write!(f, "{e}"),
            MinidumpError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            MinidumpError::UnsupportedArch(a) => {
                write!(f, "no minidump context for architecture {a}")
            }
        }
    }
}

impl std::error::Error for MinidumpError {}

impl From<RemoteError> for MinidumpError {
    fn from(e: RemoteError) -> Self {
        MinidumpError::Remote(e)
    }
}

/// Writes a minidump of live process `pid` (stopped with ptrace only while
/// registers and stacks are copied; left running).
pub fn write_live_process(
    pid: u32,
    out: &Path,
    opts: &WriteOptions,
    lookup: &Lookup,
) -> Result<WriteStats, MinidumpError> {
    let _ = (pid, out, opts, lookup);
    Err(MinidumpError::UnsupportedArch("(writer not implemented yet)".into()))
}

/// Writes a minidump of a core file (its signal becomes the exception stream).
pub fn write_core(
    core: &CoreFile,
    out: &Path,
    opts: &WriteOptions,
) -> Result<WriteStats, MinidumpError> {
    let _ = (core, out, opts);
    Err(MinidumpError::UnsupportedArch("(writer not implemented yet)".into()))
}
