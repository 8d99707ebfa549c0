//! Call stacks of other processes: ELF core files, minidumps and live
//! processes.
//!
//! Each source produces a [`Snapshot`]: the threads with their registers and
//! names, the mapped modules (found on disk, checked against build-ids), and
//! a [`Memory`](crate::unwind::Memory) that reads the target's memory. Every
//! thread is then unwound by [`unwind_thread`], the same code for all
//! sources, and the frames are symbolized from the module files.
//!
//! ```no_run
//! use callstack::remote::{corefile::CoreFile, unwind_thread, Lookup};
//! let core = CoreFile::open("core.1234".as_ref(), Some("./app".as_ref()), &Lookup::default())?;
//! let mut mem = core.memory();
//! for t in &core.snapshot().threads {
//!     let frames = unwind_thread(core.snapshot(), &mut mem, t, 256);
//!     println!("{} frames in thread {}", frames.frames.len(), t.tid);
//! }
//! # Ok::<(), callstack::remote::RemoteError>(())
//! ```

pub mod corefile;
pub(crate) mod files;
pub mod minidump;
/// The parsers [`crate::fuzzing`] hands to the fuzz targets.
pub(crate) mod fuzzing {
    pub use super::files::{build_id, exec_segments, load_bias, load_segments};
}
#[cfg(target_os = "linux")]
pub mod perf;
#[cfg(target_os = "linux")]
pub mod process;
#[cfg(target_os = "linux")]
mod ptrace;
mod step;

pub use crate::arch::{Machine, PrstatusLayout, Registers, MAX_REGS};
pub use files::Lookup;
pub use step::{unwind_thread, RemoteUnwinder, Unwound};

use std::fmt;
use std::path::PathBuf;

/// One thread of a target.
#[derive(Clone, Debug)]
pub struct Thread {
    /// The thread id (LWP).
    pub tid: u32,
    /// The thread's name, when the source records it.
    pub name: Option<String>,
    /// The registers at the stop (or at the dump).
    pub registers: Registers,
    /// One past the highest address of the thread's stack (the end of the
    /// mapping holding its stack pointer), when known: stack scanning stays
    /// below it.
    pub stack_end: Option<u64>,
}

/// A file-backed mapping of the target (`NT_FILE` entry or `/proc/PID/maps` line).
#[derive(Clone, Debug)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// The path as the target saw it.
    pub path: String,
    /// Whether the mapping is executable (`None` when the source does not say).
    pub executable: Option<bool>,
}

/// A target whose memory is read from what was saved of it (a core, a
/// minidump): [`TargetMemory`] makes it the unwinder's [`Memory`].
pub trait ReadTarget {
    /// Copies the target's memory at `addr` into `buf`; false when any
    /// byte of it was not saved.
    fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool;

    /// Reads each `(addr, buf)` of `reqs` as [`read_bytes`](Self::read_bytes)
    /// would, `ok[i]` telling whether the `i`th was read whole. A running
    /// process's memory reads them all in one system call.
    fn read_each(&self, reqs: &mut [(u64, &mut [u8])], ok: &mut [bool]) {
        for ((addr, buf), ok) in reqs.iter_mut().zip(ok) {
            *ok = self.read_bytes(*addr, buf);
        }
    }
}

/// The memory of a saved target ([`ReadTarget`]), read by the unwinder
/// (little-endian words).
pub struct TargetMemory<'a, T: ?Sized>(pub(crate) &'a T);

impl<T: ReadTarget + ?Sized> crate::unwind::Memory for TargetMemory<'_, T> {
    fn read_u64(&mut self, addr: u64) -> Result<u64, crate::unwind::ReadError> {
        let mut b = [0u8; 8];
        if self.0.read_bytes(addr, &mut b) {
            Ok(u64::from_le_bytes(b))
        } else {
            Err(crate::unwind::ReadError::Unreadable(addr))
        }
    }
    fn read_u32(&mut self, addr: u64) -> Result<u32, crate::unwind::ReadError> {
        let mut b = [0u8; 4];
        if self.0.read_bytes(addr, &mut b) {
            Ok(u32::from_le_bytes(b))
        } else {
            Err(crate::unwind::ReadError::Unreadable(addr))
        }
    }
}

/// A loaded ELF object of the target (executable, library, vDSO).
#[derive(Clone, Debug)]
pub struct Module {
    /// The path as the target saw it (`[vdso]` for the vDSO).
    pub name: String,
    /// The file on disk used for symbols and unwind tables; `None` when it
    /// was not found or did not match the target's build-id.
    pub file: Option<PathBuf>,
    /// A separate debug file (`--debug-dir`, by build-id), when found.
    pub debug_file: Option<PathBuf>,
    /// Lowest mapped address.
    pub start: u64,
    /// One past the highest mapped address.
    pub end: u64,
    /// Load bias: runtime address minus the address in the file.
    pub bias: u64,
    /// The build-id read from the target's memory, when available.
    pub build_id: Option<Vec<u8>>,
    /// For the vDSO (or a module not on disk): its image read from the target.
    pub image: Option<std::sync::Arc<Vec<u8>>>,
    /// Its mappings.
    pub mappings: Vec<Mapping>,
}

impl Module {
    /// Whether `addr` lies in one of this module's mappings.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.start
            && addr < self.end
            && self
                .mappings
                .iter()
                .any(|m| addr >= m.start && addr < m.end)
    }
}

/// Everything read from a target before unwinding.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The architecture.
    pub arch: Machine,
    /// The process id.
    pub pid: u32,
    /// The process name (`NT_PRPSINFO` `pr_fname`, or `/proc/PID/comm`).
    pub process_name: Option<String>,
    /// Every thread, in the source's order.
    pub threads: Vec<Thread>,
    /// The loaded modules, sorted by address.
    pub modules: Vec<Module>,
    /// Problems met on the way, each a sentence for the user.
    pub warnings: Vec<String>,
    /// Executable memory in no module, as (address, bytes): code that is in
    /// no file, such as JIT code or the signal-return trampolines qemu-user
    /// writes on a page of its own. The unwinder reads it to analyze that
    /// code and to recognize those trampolines. Of a live process, up to
    /// 64 MiB of it is read.
    pub anon_code: Vec<(u64, std::sync::Arc<Vec<u8>>)>,
}

impl Snapshot {
    /// The module containing `addr`.
    pub fn module_at(&self, addr: u64) -> Option<(usize, &Module)> {
        self.modules
            .iter()
            .enumerate()
            .find(|(_, m)| m.contains(addr))
    }
}

/// How a frame was found: the unwinder's own [`crate::unwind::Method`]
/// (the JSON output names a frame found through a kernel signal frame
/// `context`, since its registers come from the saved context).
pub use crate::unwind::Method;

/// Why a target could not be read at all.
#[derive(Debug)]
pub enum RemoteError {
    /// An I/O error on a named file.
    Io(PathBuf, std::io::Error),
    /// The core file is not a usable ELF core; the text says why.
    BadCore(String),
    /// The file is not a usable minidump; the text says why.
    BadMinidump(String),
    /// The target's architecture has no register layout here.
    UnsupportedArch(String),
    /// No process with that id.
    NoSuchProcess(u32),
    /// The process is a zombie: it has exited and has no stack.
    Zombie(u32),
    /// The process exited, or was killed, while its threads were being
    /// stopped: there is nothing left to show.
    Vanished(u32),
    /// Not allowed to trace the process; the text says why and what to do.
    Permission(u32, String),
    /// A ptrace or /proc failure.
    Ptrace(u32, String),
}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            RemoteError::BadCore(s) | RemoteError::BadMinidump(s) => write!(f, "{s}"),
            RemoteError::UnsupportedArch(s) => write!(f, "unsupported architecture: {s}"),
            RemoteError::NoSuchProcess(p) => write!(f, "no process with id {p}"),
            RemoteError::Zombie(p) => write!(
                f,
                "process {p} is a zombie (it has exited and its parent has not reaped it): it has no threads to show"
            ),
            RemoteError::Vanished(p) => write!(
                f,
                "process {p} exited (or was killed) while its threads were being stopped: it has no threads to show"
            ),
            RemoteError::Permission(p, s) => write!(f, "not permitted to trace process {p}: {s}"),
            RemoteError::Ptrace(p, s) => write!(f, "process {p}: {s}"),
        }
    }
}

impl std::error::Error for RemoteError {}
