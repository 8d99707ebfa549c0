//! A process's heap recording kept live in a file that a shared mapping
//! writes (`callstack memtrack`): whoever reads the file after the process
//! is gone, whatever ended it (exit, `_exit`, abort, a fatal signal,
//! SIGKILL), finds every allocation and free recorded up to that moment.
//!
//! ## The tables file
//! - A header page ([`TablesHeader`]): magic, pid, parent pid, capture
//!   kind, the recorder's capacity, whether the process wrote its own
//!   recording at exit, its live and peak heap bytes, the command line,
//!   and which module slot is current.
//! - Two module slots of [`MODULE_SLOT`] bytes, each a trace file
//!   (`docs/trace-format.md`) holding only the process's loaded modules.
//!   The writer fills the slot not in use and then makes it current with
//!   one atomic store: a process killed while writing leaves the previous
//!   list current. The process writes it at start and after each `dlopen`.
//! - At [`RECORDER_OFFSET`], a [`Recorder`]'s storage
//!   ([`Recorder::use_storage`]), whose updates are single-word atomics:
//!   see the module docs of the tables for what a kill in the middle of
//!   one leaves.
//!
//! The magic is written last at start, so a file whose process died
//! before it was set up is recognised as empty. [`read_tables`] reads it
//! back as a [`HeapSnapshot`] with its modules.
//!
//! ## The heap of all processes
//! [`GlobalHeap`]: one shared page every process of a run maps, with the
//! sum of their live heap bytes and its highest value, updated at each
//! allocation and free: the peak of the sum over time, the order of the
//! updates being the order of the atomic operations on one word.

use super::{Capture, HeapSnapshot, Recorder};
use std::sync::atomic::{AtomicU64, Ordering::*};

/// The first word of a tables file ("CSMTTAB1").
pub const TABLES_MAGIC: u64 = u64::from_le_bytes(*b"CSMTTAB1");
/// Bytes of the header page.
pub const HEADER_LEN: usize = 4096;
/// Bytes of each of the two module slots.
pub const MODULE_SLOT: usize = 1 << 20;
/// Where the recorder's storage starts.
pub const RECORDER_OFFSET: usize = HEADER_LEN + 2 * MODULE_SLOT;
/// Where the command line (arguments separated by NUL bytes) is in the
/// header, and its longest length kept.
pub const CMD_OFFSET: usize = 512;
/// The longest command line kept (longer ones are cut).
pub const CMD_MAX: usize = HEADER_LEN - CMD_OFFSET;

/// [`TablesHeader::state`]: the process is running, or died without
/// writing its recording.
pub const STATE_RUNNING: u64 = 0;
/// [`TablesHeader::state`]: the process wrote its own recording at exit.
pub const STATE_WRITTEN: u64 = 1;

/// The header of a tables file (the first words of its header page).
#[repr(C)]
pub struct TablesHeader {
    /// [`TABLES_MAGIC`] once the file is set up.
    pub magic: AtomicU64,
    /// The process.
    pub pid: AtomicU64,
    /// Its parent when the file was set up.
    pub ppid: AtomicU64,
    /// 0: fast capture, 1: exact.
    pub capture: AtomicU64,
    /// The recorder's `site_bits`.
    pub site_bits: AtomicU64,
    /// The recorder's `live_bits`.
    pub live_bits: AtomicU64,
    /// [`STATE_RUNNING`] or [`STATE_WRITTEN`].
    pub state: AtomicU64,
    /// Heap bytes live in the process now.
    pub live: AtomicU64,
    /// The highest value `live` had.
    pub peak: AtomicU64,
    /// The current module slot: 0 none yet, 1 or 2.
    pub modules_current: AtomicU64,
    /// The bytes used in each module slot.
    pub modules_len: [AtomicU64; 2],
    /// Bytes of the command line at [`CMD_OFFSET`].
    pub cmd_len: AtomicU64,
}

impl TablesHeader {
    /// Counts `size` bytes more live in this process, and in `global`.
    #[inline]
    pub fn add(&self, size: u64, global: Option<&GlobalHeap>) {
        let now = self.live.fetch_add(size, Relaxed) + size;
        if now > self.peak.load(Relaxed) {
            self.peak.fetch_max(now, Relaxed);
        }
        if let Some(g) = global {
            g.add(size);
        }
    }

    /// Counts `size` bytes fewer live in this process, and in `global`.
    #[inline]
    pub fn sub(&self, size: u64, global: Option<&GlobalHeap>) {
        self.live.fetch_sub(size, Relaxed);
        if let Some(g) = global {
            g.live.fetch_sub(size, Relaxed);
        }
    }
}

/// The heap of every process of a run: one shared page.
#[repr(C)]
pub struct GlobalHeap {
    /// Sum of the live heap bytes of the processes running.
    pub live: AtomicU64,
    /// The highest value `live` had.
    pub peak: AtomicU64,
}

impl GlobalHeap {
    /// Counts `size` bytes more live.
    #[inline]
    pub fn add(&self, size: u64) {
        let now = self.live.fetch_add(size, Relaxed) + size;
        if now > self.peak.load(Relaxed) {
            self.peak.fetch_max(now, Relaxed);
        }
    }
}

/// Bytes of a tables file for `rec`.
pub fn tables_len(rec: &Recorder) -> usize {
    RECORDER_OFFSET + rec.storage_len()
}

/// The header of the tables file mapped at `base`.
///
/// # Safety
/// `base` is the start of a mapping of at least [`HEADER_LEN`] bytes,
/// 8-aligned, that stays mapped for `'a`.
pub unsafe fn header<'a>(base: *mut u8) -> &'a TablesHeader {
    // SAFETY: the caller's contract; all-zero bytes are valid atomics.
    unsafe { &*(base as *const TablesHeader) }
}

/// Writes the command line (arguments separated by NUL) into the header.
///
/// # Safety
/// As [`header`]; no other thread writes the command line meanwhile.
pub unsafe fn set_command(base: *mut u8, cmd: &[u8]) {
    let n = cmd.len().min(CMD_MAX);
    // SAFETY: [CMD_OFFSET, CMD_OFFSET + n) is inside the header page.
    unsafe {
        std::ptr::copy_nonoverlapping(cmd.as_ptr(), base.add(CMD_OFFSET), n);
        header(base).cmd_len.store(n as u64, Release);
    }
}

/// The loaded modules of this process as the bytes of a module slot (a
/// trace file without stacks). Allocates.
pub fn modules_bytes() -> std::io::Result<Vec<u8>> {
    let mut t = crate::tracefile::TraceWriter::new(Vec::new())?;
    t.write_loaded_modules()?;
    t.finish()
}

/// Writes `bytes` (from [`modules_bytes`]) to the module slot not in use
/// and makes it current. Returns `false` if they do not fit.
///
/// # Safety
/// `base` is a tables file's mapping of at least [`RECORDER_OFFSET`]
/// bytes; the caller serializes calls.
pub unsafe fn publish_modules(base: *mut u8, bytes: &[u8]) -> bool {
    if bytes.len() > MODULE_SLOT {
        return false;
    }
    // SAFETY: the caller's contract.
    let h = unsafe { header(base) };
    let next = if h.modules_current.load(Acquire) == 1 {
        2
    } else {
        1
    };
    // SAFETY: slot `next` is [HEADER_LEN + (next-1) * MODULE_SLOT, +
    // MODULE_SLOT) of the mapping, not read by anyone until made current.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            base.add(HEADER_LEN + (next as usize - 1) * MODULE_SLOT),
            bytes.len(),
        );
    }
    h.modules_len[next as usize - 1].store(bytes.len() as u64, Release);
    h.modules_current.store(next, Release);
    true
}

/// The data extents of `[from, from + len)` of the file `fd` (its parts
/// that are not holes), relative to `from`, sorted; `None` if the file
/// system cannot tell (no `SEEK_DATA`). Allocates.
pub fn data_extents(fd: libc::c_int, from: usize, len: usize) -> Option<Vec<(usize, usize)>> {
    let mut out = Vec::new();
    let end = (from + len) as libc::off_t;
    let mut off = from as libc::off_t;
    while off < end {
        // SAFETY: lseek on a descriptor the caller owns.
        let data = unsafe { libc::lseek(fd, off, libc::SEEK_DATA) };
        if data < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            return None;
        }
        if data >= end {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole <= data {
            return None;
        }
        let hole = hole.min(end);
        out.push(((data as usize) - from, (hole as usize) - from));
        off = hole;
    }
    Some(out)
}

/// A process's recording read from its tables file.
#[derive(Debug)]
pub struct ProcessTables {
    /// The process.
    pub pid: u32,
    /// Its parent when it started.
    pub ppid: u32,
    /// Its command line, arguments joined by spaces.
    pub command: String,
    /// Whether it wrote its own recording at exit.
    pub written: bool,
    /// Heap bytes live when it ended (or now, if it still runs).
    pub live: u64,
    /// Its highest live heap bytes.
    pub peak: u64,
    /// Sites, counters and modules, as [`HeapSnapshot::read_from`] gives.
    pub snapshot: HeapSnapshot,
}

/// Reads a tables file. Errors: not a tables file, or not set up (the
/// process died before it was), or unreadable.
pub fn read_tables(path: &std::path::Path) -> Result<ProcessTables, String> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len() as usize;
    if len < RECORDER_OFFSET {
        return Err(format!("{}: not set up (too short)", path.display()));
    }
    // SAFETY: a private mapping of the whole file; nothing else in this
    // process uses it, and it is unmapped below after its last use.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(format!(
            "{}: mmap: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    let base = base as *mut u8;
    let extents = data_extents(f.as_raw_fd(), RECORDER_OFFSET, len - RECORDER_OFFSET);
    // SAFETY: `base` maps `len` >= RECORDER_OFFSET bytes until the munmap.
    let r = unsafe { read_mapped(base, len, extents.as_deref()) };
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(base.cast(), len) };
    r.map_err(|e| format!("{}: {e}", path.display()))
}

/// # Safety
/// `base` maps `len` >= [`RECORDER_OFFSET`] bytes, page-aligned.
unsafe fn read_mapped(
    base: *mut u8,
    len: usize,
    extents: Option<&[(usize, usize)]>,
) -> Result<ProcessTables, String> {
    // SAFETY: the caller's contract.
    let h = unsafe { header(base) };
    if h.magic.load(Acquire) != TABLES_MAGIC {
        return Err("not set up (no magic)".into());
    }
    let (sb, lb) = (h.site_bits.load(Relaxed), h.live_bits.load(Relaxed));
    if sb > 30 || lb > 30 {
        return Err(format!("bad capacity {sb} {lb}"));
    }
    let rec = Recorder::with_capacity(sb as u32, lb as u32);
    if rec.capacity_bits() != (sb as u32, lb as u32) || tables_len(&rec) > len {
        return Err(format!("capacity {sb} {lb} does not fit {len} bytes"));
    }
    // SAFETY: the storage lies inside the mapping (checked above), is
    // page-aligned (RECORDER_OFFSET is), and outlives `rec`, dropped at
    // the end of this function.
    unsafe { rec.use_storage(base.add(RECORDER_OFFSET)) };
    let mut snapshot = match extents {
        Some(e) => rec.snapshot_of_extents(e),
        None => rec.snapshot(),
    };
    snapshot.capture = if h.capture.load(Relaxed) == 1 {
        Capture::Exact
    } else {
        Capture::Fast
    };
    let cur = h.modules_current.load(Acquire);
    if cur == 1 || cur == 2 {
        let n = (h.modules_len[cur as usize - 1].load(Acquire) as usize).min(MODULE_SLOT);
        // SAFETY: the slot is inside the mapping.
        let bytes = unsafe {
            std::slice::from_raw_parts(base.add(HEADER_LEN + (cur as usize - 1) * MODULE_SLOT), n)
        };
        if let Ok(t) = crate::tracefile::read_all(bytes) {
            snapshot.modules = t.modules;
        }
    }
    let n = (h.cmd_len.load(Acquire) as usize).min(CMD_MAX);
    // SAFETY: inside the header page.
    let cmd = unsafe { std::slice::from_raw_parts(base.add(CMD_OFFSET), n) };
    let command = cmd
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    Ok(ProcessTables {
        pid: h.pid.load(Relaxed) as u32,
        ppid: h.ppid.load(Relaxed) as u32,
        command,
        written: h.state.load(Acquire) == STATE_WRITTEN,
        live: h.live.load(Relaxed),
        peak: h.peak.load(Relaxed),
        snapshot,
    })
}
