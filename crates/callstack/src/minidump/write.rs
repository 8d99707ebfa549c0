//! The minidump writer: a live process ([`write_live_process`]) or a core
//! file ([`write_core`]) to a standard minidump.
//!
//! The file is the Microsoft format as Breakpad and Crashpad write it on
//! Linux: the header and stream directory, then these streams (all
//! little-endian, built in memory and written with one `write`):
//!
//! | stream | what it holds |
//! |---|---|
//! | `ThreadList` | every thread: id, registers (`CONTEXT_AMD64`, or the Windows-layout `CONTEXT_ARM64` with `PROCESSOR_ARCHITECTURE_ARM64`, which rust-minidump and Breakpad both read), and its stack from the stack pointer minus 128 bytes (the x86-64 red zone) up to the end of the stack's mapping, at most [`WriteOptions::stack_limit`] bytes (the crashing thread's, [`CRASH_STACK`] at least); a stack pointer in a guard page (a stack overflow) takes the stack just above |
//! | `ThreadNames` | each thread's name (`/proc/PID/task/TID/comm`; in a core, the main thread's) |
//! | `ModuleList` | every mapped ELF object and the vDSO (named `linux-gate.so`, as Breakpad names it): base, size, path, and a CodeView record `MDCVInfoELF` (`BpEL` then the build-id bytes), from which rust-minidump and Breakpad derive the code id (the build-id in hex) and the debug id (its first 16 bytes as a GUID) that symbol servers index |
//! | `MemoryList` | the stacks, the vDSO's image, 256 bytes around every thread's pc (the code there: a reader that lacks the module's file still analyses it), and for the crashing thread 256 bytes around each register that points into readable memory (a live process; in a core, what the core holds) |
//! | `Exception` | the crash: signal, `si_code`, fault address, the crashing thread and its registers |
//! | `SystemInfo` | CPU architecture and count, Linux and its version (`/proc/sys/kernel`) |
//! | `MiscInfo` | the process id and, for a live process, its start time |
//! | `MD_LINUX_*` | `/proc/PID/maps`, auxv, `/proc/cpuinfo`, `/proc/PID/status`, `/etc/lsb-release` (or `/etc/os-release`), the command line; the environment only with [`WriteOptions::environ`] |
//!
//! From a core, the same streams come from the core: its threads and
//! memory, `NT_AUXV`, the maps rebuilt from its `PT_LOAD` segments named
//! after `NT_FILE`, and the command line (and environment, when asked) read
//! from the main thread's stack through the auxiliary vector the kernel left
//! there, falling back to `NT_PRPSINFO`'s 80-byte `pr_psargs`. A core
//! carries nothing about the machine that wrote it, so a core's dump has no
//! `/proc/cpuinfo`, `/proc/PID/status` or release stream, and its system
//! info says only the architecture and Linux.
//!
//! ### Stack size
//! Breakpad keeps 32 KiB of each stack, which cuts deep stacks short of
//! `main`. The default here, [`DEFAULT_STACK_LIMIT`], is the 512 KiB a
//! [`LiveProcess`] copies while the threads are stopped, so that every byte
//! of a live dump's stacks comes from the stop: the file grows only with
//! the stack the threads really use (an idle thread uses a few KiB).

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::remote::corefile::CoreFile;
use crate::remote::minidump::stream::{
    EXCEPTION, LINUX_CPU_INFO, LINUX_PROC_STATUS, MEMORY_LIST, MISC_INFO, MODULE_LIST, SYSTEM_INFO,
    THREAD_LIST, THREAD_NAMES,
};
use crate::remote::minidump::{SIGNATURE, VERSION};
use crate::remote::process::LiveProcess;
use crate::remote::{Lookup, Machine, Module, Registers, RemoteError, Snapshot};

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
    /// thread (ptrace sees it inside the signal handler), and its stack is
    /// taken from their stack pointer.
    pub registers: Option<Registers>,
}

/// What a dump holds beyond the threads and modules.
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// The crash, written as the exception stream. For [`write_core`],
    /// `None` takes the core's own signal.
    pub crash: Option<Crash>,
    /// Bytes of each thread's stack kept, from its stack pointer (minus the
    /// red zone) up, and never past the end of the stack's mapping
    /// (default [`DEFAULT_STACK_LIMIT`]; the crashing thread's, at least
    /// [`CRASH_STACK`]).
    pub stack_limit: u64,
    /// Include `MD_LINUX_ENVIRON` (off by default: environments hold secrets).
    pub environ: bool,
}

/// The default stack limit, 512 KiB per thread: what a live capture copies
/// while the threads are stopped (see the module docs).
pub const DEFAULT_STACK_LIMIT: u64 = crate::remote::process::STACK_COPY;

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
    /// What could not be captured, one sentence each (a thread that did not
    /// stop, or exited while being stopped, is missing from the dump).
    pub warnings: Vec<String>,
}

/// Why a dump could not be written.
#[derive(Debug)]
pub enum MinidumpError {
    /// The target could not be read.
    Remote(RemoteError),
    /// The output file could not be written.
    Io(PathBuf, std::io::Error),
    /// The target's architecture has no minidump context here (only x86-64
    /// and AArch64 have one).
    UnsupportedArch(String),
    /// The dump would not fit the format's 32-bit offsets.
    TooLarge(u64),
}

impl fmt::Display for MinidumpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MinidumpError::Remote(e) => write!(f, "{e}"),
            MinidumpError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            MinidumpError::UnsupportedArch(a) => write!(
                f,
                "minidumps of {a} targets are not supported (x86-64 and AArch64 are)"
            ),
            MinidumpError::TooLarge(n) => write!(
                f,
                "the minidump would be {n} bytes, past the format's 4 GiB: lower the stack limit"
            ),
        }
    }
}

impl std::error::Error for MinidumpError {}

impl From<RemoteError> for MinidumpError {
    fn from(e: RemoteError) -> Self {
        MinidumpError::Remote(e)
    }
}

const LINUX_LSB_RELEASE: u32 = 0x4767_0005;
const LINUX_CMD_LINE: u32 = 0x4767_0006;
const LINUX_ENVIRON: u32 = 0x4767_0007;
const LINUX_AUXV: u32 = 0x4767_0008;
const LINUX_MAPS: u32 = 0x4767_0009;

const PROCESSOR_ARCHITECTURE_AMD64: u16 = 9;
const PROCESSOR_ARCHITECTURE_ARM64: u16 = 12;
const PLATFORM_LINUX: u32 = 0x8201;
/// `CONTEXT_AMD64 | CONTEXT_CONTROL | CONTEXT_INTEGER`.
const CONTEXT_AMD64_CONTROL_INTEGER: u32 = 0x0010_0003;
/// `CONTEXT_ARM64 | CONTEXT_CONTROL | CONTEXT_INTEGER`.
const CONTEXT_ARM64_CONTROL_INTEGER: u32 = 0x0040_0003;
const CONTEXT_AMD64_SIZE: usize = 1232;
const CONTEXT_ARM64_SIZE: usize = 912;
/// `MDCVInfoELF`'s signature, "BpEL".
const CV_SIGNATURE_ELF: u32 = 0x4270_454c;
/// Bytes kept below the stack pointer (the x86-64 red zone).
const RED_ZONE: u64 = 128;
/// Bytes kept around the crashing pc and around each pointer in its registers.
const AROUND: u64 = 256;
/// A stack pointer in no readable mapping (a stack overflow: it points into
/// the guard) takes the readable mapping starting at most this far above it:
/// the kernel keeps a gap of 1 MiB (`stack_guard_gap`, since Linux 4.12)
/// below a growing stack, and glibc a guard mapping of a page or more below
/// a thread's.
const GUARD_SLACK: u64 = 1 << 20;

/// The crashing thread's stack is kept up to this at least, whatever the
/// limit: a stack overflow fills its stack, and the outermost frames (where
/// the recursion began) are as telling as the innermost.
pub const CRASH_STACK: u64 = 16 << 20;
/// The most of one stack a dump keeps, whatever the limit asked for.
const MAX_STACK: u64 = 256 << 20;
/// The most of the vDSO a dump keeps (it is 8 KiB on today's kernels).
const MAX_VDSO: u64 = 1 << 20;

/// A mapping of the target, for bounding the reads.
#[derive(Clone, Copy, Debug)]
struct Region {
    start: u64,
    end: u64,
    readable: bool,
}

/// Reads the target's memory.
trait Source {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;
}

impl Source for crate::remote::process::ProcessMemory<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.read_bytes(addr, buf)
    }
}

impl Source for CoreFile {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.read_bytes(addr, buf)
    }
}

/// The bytes at `[start, end)`, or the longest prefix of them that can be
/// read (halving the length until a read succeeds); `None` when not even
/// 16 bytes can.
fn read_prefix(src: &dyn Source, start: u64, end: u64) -> Option<Vec<u8>> {
    let mut len = end.checked_sub(start)?;
    while len >= 16 {
        let mut buf = vec![0u8; len as usize];
        if src.read(start, &mut buf) {
            return Some(buf);
        }
        len /= 2;
    }
    None
}

/// The readable region holding `addr`.
fn region_at(regions: &[Region], addr: u64) -> Option<&Region> {
    let i = regions.partition_point(|r| r.start <= addr);
    let r = regions.get(i.checked_sub(1)?)?;
    (addr < r.end && r.readable).then_some(r)
}

/// The range of a thread's stack to keep: from `sp` minus the red zone up to
/// the end of its mapping, at most `limit` bytes.
fn stack_range(regions: &[Region], sp: u64, limit: u64) -> Option<(u64, u64)> {
    let r = region_at(regions, sp).copied().or_else(|| {
        // An overflowed stack: sp is in the guard below the stack.
        regions
            .iter()
            .find(|r| r.readable && r.start > sp && r.start - sp <= GUARD_SLACK)
            .copied()
    })?;
    let lo = sp.saturating_sub(RED_ZONE).max(r.start);
    let hi = r.end.min(lo.saturating_add(limit.clamp(16, MAX_STACK)));
    (hi > lo).then_some((lo, hi))
}

/// The crash as the exception stream writes it.
struct Exception {
    tid: u32,
    signal: u32,
    code: i32,
    address: u64,
    /// The registers to write when the thread is not in the thread list.
    registers: Option<Registers>,
}

impl From<&Crash> for Exception {
    fn from(c: &Crash) -> Self {
        Exception {
            tid: c.tid,
            signal: c.signal as u32,
            code: c.code,
            address: c.address,
            registers: c.registers,
        }
    }
}

struct ThreadIn {
    tid: u32,
    name: Option<String>,
    registers: Registers,
    stack: Option<(u64, Vec<u8>)>,
}

struct ModuleIn {
    name: String,
    start: u64,
    size: u32,
    build_id: Option<Vec<u8>>,
}

/// An x86 CPU as `/proc/cpuinfo` names it: (vendor, family, model, stepping).
type X86Cpu = ([u8; 12], u32, u32, u32);

/// Everything a dump is made of, gathered from either source.
struct DumpIn {
    arch: Machine,
    pid: u32,
    threads: Vec<ThreadIn>,
    modules: Vec<ModuleIn>,
    /// Memory besides the stacks, as (address, bytes).
    memory: Vec<(u64, Vec<u8>)>,
    exception: Option<Exception>,
    cpus: u8,
    /// The x86 CPU (`/proc/cpuinfo`).
    x86_cpu: Option<X86Cpu>,
    /// `/proc/sys/kernel/osrelease` and the rest of the version string.
    os: Option<(String, String)>,
    /// Process start, in seconds since the epoch.
    start_time: Option<u32>,
    linux: Vec<(u32, Vec<u8>)>,
}

fn context_size(arch: Machine) -> Result<usize, MinidumpError> {
    match arch {
        Machine::X86_64 => Ok(CONTEXT_AMD64_SIZE),
        Machine::Aarch64 => Ok(CONTEXT_ARM64_SIZE),
        other => Err(MinidumpError::UnsupportedArch(format!("{other:?}"))),
    }
}

/// Writes `regs` as a `CONTEXT_AMD64` or `CONTEXT_ARM64`.
fn context(regs: &Registers) -> Vec<u8> {
    let r = |n: u16| regs.get(n).unwrap_or(0);
    match regs.arch {
        Machine::Aarch64 => {
            let mut c = vec![0u8; CONTEXT_ARM64_SIZE];
            put32(&mut c, 0, CONTEXT_ARM64_CONTROL_INTEGER);
            // x0..x30, then sp, then pc: DWARF 0..=31 and our pc slot 32.
            for i in 0..=32u16 {
                put64(&mut c, 8 + 8 * i as usize, r(i));
            }
            c
        }
        _ => {
            let mut c = vec![0u8; CONTEXT_AMD64_SIZE];
            put32(&mut c, 48, CONTEXT_AMD64_CONTROL_INTEGER);
            put32(&mut c, 52, 0x1f80); // mxcsr: its reset value
                                       // rax rcx rdx rbx rsp rbp rsi rdi r8..r15 rip, by DWARF number.
            const ORDER: [u16; 17] = [0, 2, 1, 3, 7, 6, 4, 5, 8, 9, 10, 11, 12, 13, 14, 15, 16];
            for (i, d) in ORDER.iter().enumerate() {
                put64(&mut c, 120 + 8 * i, r(*d));
            }
            c
        }
    }
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The file being built: blobs appended at 8-byte-aligned offsets.
struct Out {
    b: Vec<u8>,
}

/// Where a blob is: (size, offset).
type Loc = (u32, u32);

impl Out {
    fn align(&mut self) {
        while self.b.len() % 8 != 0 {
            self.b.push(0);
        }
    }
    fn blob(&mut self, bytes: &[u8]) -> Loc {
        self.align();
        let at = self.b.len() as u32;
        self.b.extend_from_slice(bytes);
        (bytes.len() as u32, at)
    }
    /// A `MINIDUMP_STRING`: byte length, UTF-16LE, a 0 terminator.
    fn string(&mut self, s: &str) -> u32 {
        self.align();
        let at = self.b.len() as u32;
        let units: Vec<u16> = s.encode_utf16().collect();
        self.u32((units.len() * 2) as u32);
        for u in units {
            self.b.extend_from_slice(&u.to_le_bytes());
        }
        self.b.extend_from_slice(&[0, 0]);
        at
    }
    fn u16(&mut self, v: u16) {
        self.b.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.b.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.b.extend_from_slice(&v.to_le_bytes());
    }
    fn loc(&mut self, l: Loc) {
        self.u32(l.0);
        self.u32(l.1);
    }
    fn here(&mut self) -> u32 {
        self.align();
        self.b.len() as u32
    }
    fn since(&self, at: u32) -> Loc {
        (self.b.len() as u32 - at, at)
    }
}

/// Lays the dump out and returns its bytes.
fn assemble(d: &DumpIn) -> Result<Vec<u8>, MinidumpError> {
    context_size(d.arch)?;
    // Everything past 4 GiB is out of the format's reach.
    let total: u64 = d
        .threads
        .iter()
        .filter_map(|t| t.stack.as_ref())
        .map(|s| s.1.len() as u64)
        .chain(d.memory.iter().map(|m| m.1.len() as u64))
        .sum();
    if total > u32::MAX as u64 / 2 {
        return Err(MinidumpError::TooLarge(total));
    }
    let mut o = Out {
        b: Vec::with_capacity(total as usize + 64 * 1024),
    };
    let mut dir: Vec<(u32, Loc)> = Vec::new();
    // The header, patched at the end.
    o.b.resize(32, 0);

    // Contexts and stacks.
    let mut ctx_locs = Vec::with_capacity(d.threads.len());
    let mut stack_locs = Vec::with_capacity(d.threads.len());
    for t in &d.threads {
        ctx_locs.push(o.blob(&context(&t.registers)));
        stack_locs.push(t.stack.as_ref().map(|(a, b)| (*a, o.blob(b))));
    }
    let mut mem_locs: Vec<(u64, Loc)> = stack_locs.iter().flatten().copied().collect();
    for (a, b) in &d.memory {
        mem_locs.push((*a, o.blob(b)));
    }
    mem_locs.sort_by_key(|m| m.0);
    // No two regions of the list may overlap (Breakpad's reader rejects the
    // whole list then): two stacks in one mapping (threads that share a
    // stack) are listed once; each thread still points at its own copy.
    let mut end = 0u64;
    mem_locs.retain(|(start, (size, _))| {
        let keep = *start >= end;
        if keep {
            end = start + *size as u64;
        }
        keep
    });

    // ThreadList.
    let at = o.here();
    o.u32(d.threads.len() as u32);
    for (i, t) in d.threads.iter().enumerate() {
        o.u32(t.tid);
        o.u32(0); // suspend count
        o.u32(0); // priority class
        o.u32(0); // priority
        o.u64(0); // teb
        let (start, loc) = stack_locs[i].unwrap_or((0, (0, 0)));
        o.u64(start);
        o.loc(loc);
        o.loc(ctx_locs[i]);
    }
    dir.push((THREAD_LIST, o.since(at)));

    // ThreadNames.
    let names: Vec<(u32, u32)> = d
        .threads
        .iter()
        .filter_map(|t| Some((t.tid, t.name.as_deref()?)))
        .map(|(tid, n)| (tid, o.string(n)))
        .collect();
    let at = o.here();
    o.u32(names.len() as u32);
    for (tid, rva) in names {
        o.u32(tid);
        o.u64(rva as u64);
    }
    dir.push((THREAD_NAMES, o.since(at)));

    // ModuleList.
    let mut mods = Vec::with_capacity(d.modules.len());
    for m in &d.modules {
        let name = o.string(&m.name);
        let cv = m.build_id.as_ref().map(|id| {
            let mut rec = CV_SIGNATURE_ELF.to_le_bytes().to_vec();
            rec.extend_from_slice(id);
            o.blob(&rec)
        });
        mods.push((name, cv));
    }
    let at = o.here();
    o.u32(d.modules.len() as u32);
    for (m, (name, cv)) in d.modules.iter().zip(mods) {
        o.u64(m.start);
        o.u32(m.size);
        o.u32(0); // checksum
        o.u32(0); // time stamp
        o.u32(name);
        o.b.extend_from_slice(&[0u8; 52]); // VS_FIXEDFILEINFO
        o.loc(cv.unwrap_or((0, 0)));
        o.loc((0, 0)); // misc record
        o.u64(0);
        o.u64(0);
    }
    dir.push((MODULE_LIST, o.since(at)));

    // MemoryList.
    let at = o.here();
    o.u32(mem_locs.len() as u32);
    for (start, loc) in &mem_locs {
        o.u64(*start);
        o.loc(*loc);
    }
    dir.push((MEMORY_LIST, o.since(at)));

    // Exception.
    if let Some(e) = &d.exception {
        let ctx = match d.threads.iter().position(|t| t.tid == e.tid) {
            Some(i) => ctx_locs[i],
            None => match &e.registers {
                Some(r) => o.blob(&context(r)),
                None => (0, 0),
            },
        };
        let at = o.here();
        o.u32(e.tid);
        o.u32(0);
        o.u32(e.signal);
        o.u32(e.code as u32); // Breakpad's Linux writers put si_code in the flags
        o.u64(0); // nested record
        o.u64(e.address);
        o.u32(0); // parameters
        o.u32(0);
        o.b.extend_from_slice(&[0u8; 15 * 8]);
        o.loc(ctx);
        dir.push((EXCEPTION, o.since(at)));
    }

    // SystemInfo.
    let csd = o.string(&d.os.as_ref().map(|(_, v)| v.clone()).unwrap_or_default());
    let (major, minor, build) =
        d.os.as_ref()
            .map(|(release, _)| kernel_version(release))
            .unwrap_or((0, 0, 0));
    let at = o.here();
    o.u16(match d.arch {
        Machine::Aarch64 => PROCESSOR_ARCHITECTURE_ARM64,
        _ => PROCESSOR_ARCHITECTURE_AMD64,
    });
    let (vendor, family, model, stepping) = d.x86_cpu.unwrap_or(([0; 12], 0, 0, 0));
    o.u16(family as u16);
    o.u16(((model << 8) | stepping) as u16);
    o.b.push(d.cpus);
    o.b.push(0); // product type
    o.u32(major);
    o.u32(minor);
    o.u32(build);
    o.u32(PLATFORM_LINUX);
    o.u32(csd);
    o.u16(0); // suite mask
    o.u16(0);
    if d.x86_cpu.is_some() {
        o.b.extend_from_slice(&vendor);
        // cpuid 1's eax, as Breakpad fills it from /proc/cpuinfo.
        let ext_family = family.saturating_sub(15);
        let (base_family, ext_model) = (family.min(15), model >> 4);
        o.u32(
            (ext_family << 20)
                | (ext_model << 16)
                | (base_family << 8)
                | ((model & 15) << 4)
                | (stepping & 15),
        );
        o.u32(0);
        o.u32(0);
    } else {
        o.b.extend_from_slice(&[0u8; 24]);
    }
    dir.push((SYSTEM_INFO, o.since(at)));

    // MiscInfo (MINIDUMP_MISC_INFO: process id, and its start time).
    let at = o.here();
    o.u32(24);
    o.u32(1 | if d.start_time.is_some() { 2 } else { 0 });
    o.u32(d.pid);
    o.u32(d.start_time.unwrap_or(0));
    o.u32(0);
    o.u32(0);
    dir.push((MISC_INFO, o.since(at)));

    for (kind, bytes) in &d.linux {
        let loc = o.blob(bytes);
        dir.push((*kind, loc));
    }

    // The directory, then the header.
    let dir_at = o.here();
    for (kind, loc) in &dir {
        o.u32(*kind);
        o.loc(*loc);
    }
    if o.b.len() as u64 > u32::MAX as u64 {
        return Err(MinidumpError::TooLarge(o.b.len() as u64));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0);
    let h = &mut o.b[..32];
    put32(h, 0, SIGNATURE);
    put32(h, 4, VERSION as u32);
    put32(h, 8, dir.len() as u32);
    put32(h, 12, dir_at);
    put32(h, 16, 0);
    put32(h, 20, now);
    put64(h, 24, 0);
    Ok(o.b)
}

/// "6.8.0-45-generic" to (6, 8, 0).
fn kernel_version(release: &str) -> (u32, u32, u32) {
    let mut it = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|s| s.parse::<u32>().unwrap_or(0));
    (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    )
}

/// Creates `out`, readable by its owner only (a dump holds the process's
/// memory). Done before the target is read: a path that cannot be written
/// fails first.
fn create(out: &Path) -> Result<std::fs::File, MinidumpError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| MinidumpError::Io(out.to_path_buf(), e))
}

/// The modules a dump lists: the ELF objects among `snap`'s mapped files
/// with code (an object whose first page is in memory must start with the
/// ELF magic; when it is not, one whose file was found counts), and the
/// vDSO.
fn modules(snap: &Snapshot, src: &dyn Source) -> Vec<ModuleIn> {
    snap.modules
        .iter()
        .filter(|m| is_elf(m, src))
        .map(|m| ModuleIn {
            name: if m.name == "[vdso]" {
                "linux-gate.so".into()
            } else {
                m.name.clone()
            },
            start: m.start,
            size: m.end.saturating_sub(m.start).min(u32::MAX as u64) as u32,
            build_id: m.build_id.clone(),
        })
        .collect()
}

fn is_elf(m: &Module, src: &dyn Source) -> bool {
    if m.image.is_some() {
        return true;
    }
    // An object mapped without execute permission holds no code (a core
    // does not say: there, every ELF counts).
    if m.mappings.iter().all(|x| x.executable == Some(false)) {
        return false;
    }
    let Some(first) = m.mappings.iter().find(|x| x.file_offset == 0) else {
        return false;
    };
    let mut magic = [0u8; 4];
    if src.read(first.start, &mut magic) {
        magic == *b"\x7fELF"
    } else {
        m.file.is_some()
    }
}

/// Extra memory: `AROUND` bytes centred on the pc of every thread in
/// `pc_of` (the code there, for a reader that lacks the module's file:
/// instruction analysis finds the frame's return address in it) and on
/// each register value of `crashed` that points into readable memory (the
/// pc included), merged, none overlapping a stack or each other.
fn memory_around(
    crashed: Option<&Registers>,
    pc_of: &[&Registers],
    regions: &[Region],
    stacks: &[(u64, u64)],
    src: &dyn Source,
) -> Vec<(u64, Vec<u8>)> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let values = crashed.into_iter().flat_map(|regs| {
        (0..crate::remote::MAX_REGS as u16)
            .filter_map(|r| regs.get(r))
            .chain(regs.pc())
    });
    for v in values.chain(pc_of.iter().filter_map(|r| r.pc())) {
        let Some(r) = region_at(regions, v) else {
            continue;
        };
        let lo = v.saturating_sub(AROUND / 2).max(r.start);
        let hi = v.saturating_add(AROUND / 2).min(r.end);
        ranges.push((lo, hi));
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    let mut out = Vec::new();
    for (mut lo, mut hi) in merged {
        // Clip against the stacks (already in the list).
        for &(s, e) in stacks {
            if lo >= s && lo < e {
                lo = e;
            }
            if hi > s && hi <= e {
                hi = s;
            }
            if lo < s && hi > e {
                // A stack inside: keep the part below it.
                hi = s;
            }
        }
        if hi <= lo {
            continue;
        }
        let mut buf = vec![0u8; (hi - lo) as usize];
        if src.read(lo, &mut buf) {
            out.push((lo, buf));
        }
    }
    out
}

/// The threads with their stacks, the crash's registers standing in for
/// the crashing thread's (`crash_tid`), whose stack is kept up to
/// [`CRASH_STACK`] at least.
fn threads(
    snap: &Snapshot,
    crash_tid: Option<u32>,
    crash_registers: Option<&Registers>,
    regions: &[Region],
    limit: u64,
    src: &dyn Source,
) -> Vec<ThreadIn> {
    snap.threads
        .iter()
        .map(|t| {
            let crashed = crash_tid == Some(t.tid);
            let registers = match crash_registers {
                Some(r) if crashed => *r,
                _ => t.registers,
            };
            let limit = if crashed {
                limit.max(CRASH_STACK)
            } else {
                limit
            };
            let stack = registers
                .sp()
                .and_then(|sp| stack_range(regions, sp, limit))
                .and_then(|(lo, hi)| Some((lo, read_prefix(src, lo, hi)?)));
            ThreadIn {
                tid: t.tid,
                name: t.name.clone(),
                registers,
                stack,
            }
        })
        .collect()
}

/// The extra memory of a dump: around the crashing thread's registers, and
/// the vDSO's image.
fn extra_memory(
    snap: &Snapshot,
    threads: &[ThreadIn],
    crash_tid: Option<u32>,
    regions: &[Region],
    src: &dyn Source,
) -> Vec<(u64, Vec<u8>)> {
    let stacks: Vec<(u64, u64)> = threads
        .iter()
        .filter_map(|t| t.stack.as_ref())
        .map(|(a, b)| (*a, a + b.len() as u64))
        .collect();
    let crashed = crash_tid
        .and_then(|tid| threads.iter().find(|t| t.tid == tid))
        .map(|t| &t.registers);
    let others: Vec<&Registers> = threads
        .iter()
        .filter(|t| Some(t.tid) != crash_tid)
        .map(|t| &t.registers)
        .collect();
    let mut mem = memory_around(crashed, &others, regions, &stacks, src);
    // The vDSO: its code and CFI are in no file the reader has. Whatever
    // pointer memory overlaps it is dropped in its favour.
    if let Some(v) = snap.modules.iter().find(|m| m.name == "[vdso]") {
        if let Some(image) = v.image.as_deref() {
            let image = &image[..image.len().min(MAX_VDSO as usize)];
            let (s, e) = (v.start, v.start + image.len() as u64);
            mem.retain(|(a, b)| a + b.len() as u64 <= s || *a >= e);
            mem.push((v.start, image.to_vec()));
        } else if let Some(image) = read_prefix(src, v.start, v.end.min(v.start + MAX_VDSO)) {
            let (s, e) = (v.start, v.start + image.len() as u64);
            mem.retain(|(a, b)| a + b.len() as u64 <= s || *a >= e);
            mem.push((v.start, image));
        }
    }
    mem
}

/// Reads a whole file. /proc files report no size: reading them in
/// 64 KiB steps takes one or two reads where `std::fs::read` takes a dozen.
fn read_file(path: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        if out.capacity() - out.len() < 16 * 1024 {
            out.reserve(64 * 1024);
        }
        let len = out.len();
        let spare = out.capacity() - len;
        out.resize(len + spare, 0);
        match f.read(&mut out[len..]) {
            Ok(0) => {
                out.truncate(len);
                return Some(out);
            }
            Ok(n) => out.truncate(len + n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => out.truncate(len),
            Err(_) => return None,
        }
    }
}

/// (vendor, family, model, stepping) from an x86 `/proc/cpuinfo`'s first
/// processor, and the number of processors.
fn parse_cpuinfo(text: &str) -> (u8, Option<X86Cpu>) {
    let count = text
        .lines()
        .filter(|l| l.starts_with("processor") && l.contains(':'))
        .count()
        .min(255) as u8;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let x86 = field("vendor_id").map(|v| {
        let mut vendor = [0u8; 12];
        for (d, s) in vendor.iter_mut().zip(v.bytes()) {
            *d = s;
        }
        let num = |n: &str| field(n).and_then(|s| s.parse().ok()).unwrap_or(0);
        (vendor, num("cpu family"), num("model"), num("stepping"))
    });
    (count, x86)
}

/// Writes a minidump of live process `pid` (stopped with ptrace only while
/// registers and stacks are copied; left running).
pub fn write_live_process(
    pid: u32,
    out: &Path,
    opts: &WriteOptions,
    lookup: &Lookup,
) -> Result<WriteStats, MinidumpError> {
    let file = create(out)?;
    let live = LiveProcess::capture(pid, lookup)?;
    let snap = live.snapshot();
    context_size(snap.arch)?;
    let mem = live.memory();
    let src: &dyn Source = &mem;
    let proc = |rest: &str| format!("/proc/{pid}/{rest}");
    let maps = read_file(&proc("maps")).unwrap_or_default();
    let mut regions: Vec<Region> = String::from_utf8_lossy(&maps)
        .lines()
        .filter_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let (s, e) = range.split_once('-')?;
            Some(Region {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                readable: rest.starts_with('r'),
            })
        })
        .collect();
    regions.sort_by_key(|r| r.start);

    let crash_tid = opts.crash.as_ref().map(|c| c.tid);
    let crash_registers = opts.crash.as_ref().and_then(|c| c.registers.as_ref());
    let threads = threads(
        snap,
        crash_tid,
        crash_registers,
        &regions,
        opts.stack_limit,
        src,
    );
    let memory = extra_memory(snap, &threads, crash_tid, &regions, src);
    let cpuinfo = read_file("/proc/cpuinfo").unwrap_or_default();
    let (cpus, x86_cpu) = parse_cpuinfo(&String::from_utf8_lossy(&cpuinfo));
    let kernel = |f: &str| {
        std::fs::read_to_string(format!("/proc/sys/kernel/{f}"))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let os = kernel("osrelease").map(|release| {
        let machine = match snap.arch {
            Machine::Aarch64 => "aarch64",
            _ => "x86_64",
        };
        let text = format!(
            "{} {} {} {}",
            kernel("ostype").unwrap_or_else(|| "Linux".into()),
            release,
            kernel("version").unwrap_or_default(),
            machine
        );
        (release, text)
    });

    let mut linux = vec![(LINUX_MAPS, maps)];
    let mut add = |kind: u32, path: &str| {
        if let Some(b) = read_file(path) {
            linux.push((kind, b));
        }
    };
    add(LINUX_AUXV, &proc("auxv"));
    add(LINUX_PROC_STATUS, &proc("status"));
    add(LINUX_CMD_LINE, &proc("cmdline"));
    if opts.environ {
        add(LINUX_ENVIRON, &proc("environ"));
    }
    if std::path::Path::new("/etc/lsb-release").exists() {
        add(LINUX_LSB_RELEASE, "/etc/lsb-release");
    } else {
        add(LINUX_LSB_RELEASE, "/etc/os-release");
    }
    linux.push((LINUX_CPU_INFO, cpuinfo));

    let dump = DumpIn {
        arch: snap.arch,
        pid,
        modules: modules(snap, src),
        memory,
        exception: opts.crash.as_ref().map(Exception::from),
        cpus,
        x86_cpu,
        os,
        start_time: start_time(pid),
        linux,
        threads,
    };
    finish(&dump, file, out, snap)
}

fn finish(
    dump: &DumpIn,
    mut file: std::fs::File,
    out: &Path,
    snap: &Snapshot,
) -> Result<WriteStats, MinidumpError> {
    let bytes = assemble(dump)?;
    file.write_all(&bytes)
        .map_err(|e| MinidumpError::Io(out.to_path_buf(), e))?;
    Ok(WriteStats {
        threads: dump.threads.len(),
        modules: dump.modules.len(),
        bytes: bytes.len() as u64,
        // The snapshot's words on threads; those on files (not found, another
        // build) do not concern a dump, which holds build-ids, not files.
        warnings: snap
            .warnings
            .iter()
            .filter(|w| w.starts_with("thread "))
            .cloned()
            .collect(),
    })
}

/// When `pid` started, in seconds since the epoch (`/proc/PID/stat`'s
/// start time in clock ticks after boot, plus `/proc/stat`'s boot time).
fn start_time(pid: u32) -> Option<u32> {
    let stat = String::from_utf8(read_file(&format!("/proc/{pid}/stat"))?).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // Field 22 overall is the 20th after the command.
    let ticks: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let btime: u64 = String::from_utf8_lossy(&read_file("/proc/stat")?)
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // The kernel reports ticks at USER_HZ, 100 on every Linux ABI.
    u32::try_from(btime + ticks / 100).ok()
}

/// Writes a minidump of a core file (its signal becomes the exception
/// stream, unless `opts.crash` names one).
pub fn write_core(
    core: &CoreFile,
    out: &Path,
    opts: &WriteOptions,
) -> Result<WriteStats, MinidumpError> {
    let snap = core.snapshot();
    context_size(snap.arch)?;
    let file = create(out)?;
    let src: &dyn Source = core;
    let segs = core.load_segments();
    let regions: Vec<Region> = segs
        .iter()
        .map(|s| Region {
            start: s.start,
            // What the core holds of an anonymous mapping (a stack) is all
            // that can be read of it; a file's mapping the core left out is
            // read from the file.
            end: if s.in_core > 0 {
                s.start.saturating_add(s.in_core)
            } else {
                s.end
            },
            readable: s.flags & 4 != 0 || s.in_core > 0,
        })
        .collect();
    let exception = match &opts.crash {
        Some(c) => Some(Exception::from(c)),
        None => core.signal().map(|s| Exception {
            tid: s.tid,
            signal: s.number,
            code: s.code.unwrap_or(0),
            address: s.address.unwrap_or(0),
            registers: None,
        }),
    };
    let crash_registers = opts.crash.as_ref().and_then(|c| c.registers.as_ref());
    let threads = threads(
        snap,
        exception.as_ref().map(|e| e.tid),
        crash_registers,
        &regions,
        opts.stack_limit,
        src,
    );
    let memory = extra_memory(
        snap,
        &threads,
        exception.as_ref().map(|e| e.tid),
        &regions,
        src,
    );

    let mut linux = vec![(LINUX_MAPS, core_maps(core, &segs).into_bytes())];
    let mut auxv = Vec::with_capacity(core.auxv().len() * 16);
    for (k, v) in core.auxv() {
        auxv.extend_from_slice(&k.to_le_bytes());
        auxv.extend_from_slice(&v.to_le_bytes());
    }
    linux.push((LINUX_AUXV, auxv));
    let main_sp = snap
        .threads
        .iter()
        .find(|t| t.tid == snap.pid)
        .or(snap.threads.first())
        .and_then(|t| t.registers.sp());
    match main_sp.and_then(|sp| initial_args(core, &regions, sp)) {
        Some((args, env)) => {
            linux.push((LINUX_CMD_LINE, args));
            if opts.environ {
                linux.push((LINUX_ENVIRON, env));
            }
        }
        None => {
            if let Some(p) = core.psargs() {
                linux.push((LINUX_CMD_LINE, p.as_bytes().to_vec()));
            }
        }
    }

    let dump = DumpIn {
        arch: snap.arch,
        pid: snap.pid,
        modules: modules(snap, src),
        memory,
        exception,
        cpus: 0,
        x86_cpu: None,
        os: None,
        start_time: None,
        linux,
        threads,
    };
    finish(&dump, file, out, snap)
}

/// `/proc/PID/maps` as it was, rebuilt from the core's segments: their
/// permissions, and the file (with its offset) of the `NT_FILE` mapping
/// each lies in; the vDSO and the main thread's stack named as the kernel
/// names them. The parts of `NT_FILE` mappings that have no segment (gdb's
/// `gcore` leaves out the file-backed segments it does not dump, the code
/// among them; the kernel records them with no bytes) are listed too, with
/// the permissions of the file's own segment at that offset when the file
/// was found (`r-xp` for an executable segment), else `r--p`.
fn core_maps(core: &CoreFile, segs: &[crate::remote::corefile::LoadSegment]) -> String {
    use std::fmt::Write as _;
    let snap = core.snapshot();
    let vdso = core
        .auxv()
        .iter()
        .find(|(k, _)| *k == crate::remote::corefile::AT_SYSINFO_EHDR)
        .map(|(_, v)| *v);
    let main_sp = snap
        .threads
        .iter()
        .find(|t| t.tid == snap.pid)
        .and_then(|t| t.registers.sp());
    let files: Vec<(&crate::remote::Module, &crate::remote::Mapping)> = snap
        .modules
        .iter()
        .flat_map(|m| m.mappings.iter().map(move |x| (m, x)))
        .filter(|(_, x)| x.path.starts_with('/'))
        .collect();
    // (start, end, perms, offset, path)
    let mut lines: Vec<(u64, u64, String, u64, &str)> = Vec::new();
    for g in segs {
        let perm = |bit: u32, c: char| if g.flags & bit != 0 { c } else { '-' };
        let file = files
            .iter()
            .find(|(_, m)| g.start >= m.start && g.start < m.end);
        let (offset, path) = match file {
            Some((_, m)) => (m.file_offset + (g.start - m.start), m.path.as_str()),
            None if Some(g.start) == vdso => (0, "[vdso]"),
            None if main_sp.is_some_and(|sp| sp >= g.start && sp < g.end) => (0, "[stack]"),
            None => (0, ""),
        };
        let perms = format!("{}{}{}p", perm(4, 'r'), perm(2, 'w'), perm(1, 'x'));
        lines.push((g.start, g.end, perms, offset, path));
    }
    // The file mappings' parts no segment covers.
    let mut exec_of: Vec<(&str, Vec<crate::remote::files::FileSegment>)> = Vec::new();
    for (module, m) in &files {
        let gaps = crate::remote::files::uncovered(
            (m.start, m.end),
            segs.iter().map(|g| (g.start, g.end)),
        );
        if gaps.is_empty() {
            continue;
        }
        let exec = match exec_of.iter().find(|(p, _)| *p == m.path) {
            Some((_, e)) => e.clone(),
            None => {
                let e = module
                    .file
                    .as_ref()
                    .and_then(|f| crate::remote::files::map_file(f).ok())
                    .map(|d| crate::remote::files::exec_segments(&d))
                    .unwrap_or_default();
                exec_of.push((m.path.as_str(), e.clone()));
                e
            }
        };
        for (a, b) in gaps {
            let offset = m.file_offset + (a - m.start);
            let x = exec
                .iter()
                .any(|&(_, off, len)| offset >= off & !0xfff && offset < off + len);
            let perms = if x { "r-xp" } else { "r--p" }.to_string();
            lines.push((a, b, perms, offset, m.path.as_str()));
        }
    }
    lines.sort_by_key(|l| l.0);
    let mut s = String::new();
    for (start, end, perms, offset, path) in lines {
        let _ = writeln!(
            s,
            "{:08x}-{:08x} {} {:08x} 00:00 0{}{}",
            start,
            end,
            perms,
            offset,
            if path.is_empty() { "" } else { "    " },
            path
        );
    }
    s
}

/// The command line and environment of a core's process, NUL-separated as
/// in `/proc/PID/cmdline`, read from the strings `execve` left at the top
/// of the main thread's stack: the kernel's copy of the auxiliary vector is
/// found there, and below it, backwards, the environment's pointers, a
/// NULL, the arguments' pointers and `argc`.
fn initial_args(core: &CoreFile, regions: &[Region], sp: u64) -> Option<(Vec<u8>, Vec<u8>)> {
    let auxv = core.auxv();
    if auxv.len() < 2 {
        return None;
    }
    let r = region_at(regions, sp)?;
    let stack = read_prefix(core, sp & !7, r.end)?;
    let words: Vec<u64> = stack
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    let first = [auxv[0].0, auxv[0].1, auxv[1].0, auxv[1].1];
    let at = words.windows(4).position(|w| w == first)?;
    // words[at - 1] is envp's NULL.
    let mut i = at.checked_sub(1)?;
    if words[i] != 0 {
        return None;
    }
    let env_end = i;
    while i > 0 && words[i - 1] != 0 {
        i -= 1;
    }
    let env_start = i;
    // words[env_start - 1] is argv's NULL; argv runs back to argc.
    let argv_end = env_start.checked_sub(1)?;
    let mut j = argv_end;
    let mut argc = 0u64;
    while j > 0 {
        if words[j - 1] == argc && argc > 0 {
            break;
        }
        j -= 1;
        argc += 1;
        if argc > 4096 {
            return None;
        }
    }
    if j == 0 || words[j - 1] != argc {
        return None;
    }
    // Every pointer points into the stack, where execve copied the strings.
    let on_stack = |p: &u64| *p >= r.start && *p < r.end;
    if !words[j..argv_end].iter().all(on_stack) || !words[env_start..env_end].iter().all(on_stack) {
        return None;
    }
    let strings = |ptrs: &[u64]| -> Vec<u8> {
        let mut out = Vec::new();
        for &p in ptrs {
            let mut byte = [0u8; 1];
            let mut a = p;
            while core.read_bytes(a, &mut byte) && byte[0] != 0 && a - p < 128 * 1024 {
                out.push(byte[0]);
                a += 1;
            }
            out.push(0);
        }
        out
    };
    Some((
        strings(&words[j..argv_end]),
        strings(&words[env_start..env_end]),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The (type, size, offset) of every stream of a dump.
    fn directory(b: &[u8]) -> Vec<(u32, u32, u32)> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let (n, at) = (u32_at(8) as usize, u32_at(12) as usize);
        (0..n)
            .map(|i| {
                let e = at + 12 * i;
                (u32_at(e), u32_at(e + 4), u32_at(e + 8))
            })
            .collect()
    }

    #[test]
    fn overlapping_stacks_are_listed_once_in_the_memory_list() {
        let mut regs = Registers::new(Machine::X86_64);
        regs.set(7, 0x1010);
        let thread = |tid, start| ThreadIn {
            tid,
            name: None,
            registers: regs,
            stack: Some((start, vec![7u8; 64])),
        };
        let d = DumpIn {
            arch: Machine::X86_64,
            pid: 1,
            threads: vec![thread(1, 0x1000), thread(2, 0x1010), thread(3, 0x2000)],
            modules: Vec::new(),
            memory: Vec::new(),
            exception: None,
            cpus: 1,
            x86_cpu: None,
            os: None,
            start_time: None,
            linux: Vec::new(),
        };
        let b = assemble(&d).unwrap();
        let (_, _, at) = directory(&b)
            .into_iter()
            .find(|e| e.0 == MEMORY_LIST)
            .unwrap();
        let at = at as usize;
        let count = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        assert_eq!(count, 2);
        let start =
            |i: usize| u64::from_le_bytes(b[at + 4 + 16 * i..at + 12 + 16 * i].try_into().unwrap());
        assert_eq!((start(0), start(1)), (0x1000, 0x2000));
        // The thread list still has three stacks.
        let (_, _, t) = directory(&b)
            .into_iter()
            .find(|e| e.0 == THREAD_LIST)
            .unwrap();
        assert_eq!(
            u32::from_le_bytes(b[t as usize..t as usize + 4].try_into().unwrap()),
            3
        );
    }

    #[test]
    fn kernel_versions_parse() {
        assert_eq!(kernel_version("6.8.0-45-generic"), (6, 8, 0));
        assert_eq!(kernel_version("5.15.153.1-microsoft"), (5, 15, 153));
        assert_eq!(kernel_version(""), (0, 0, 0));
    }

    #[test]
    fn stacks_stay_in_their_mapping() {
        let regions = [
            Region {
                start: 0x1000,
                end: 0x2000,
                readable: false,
            },
            Region {
                start: 0x2000,
                end: 0x8000,
                readable: true,
            },
        ];
        assert_eq!(
            stack_range(&regions, 0x7000, 1 << 20),
            Some((0x7000 - 128, 0x8000))
        );
        assert_eq!(stack_range(&regions, 0x2010, 0x100), Some((0x2000, 0x2100)));
        // In the guard below: the stack above it.
        assert_eq!(
            stack_range(&regions, 0x1ff0, 1 << 20),
            Some((0x2000, 0x8000))
        );
        assert_eq!(stack_range(&regions, 0x9000, 1 << 20), None);
    }

    #[test]
    fn cpuinfo_gives_vendor_and_count() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nstepping\t: 7\n\nprocessor\t: 1\n";
        let (n, x) = parse_cpuinfo(text);
        assert_eq!(n, 2);
        let (v, f, m, s) = x.unwrap();
        assert_eq!(&v, b"GenuineIntel");
        assert_eq!((f, m, s), (6, 85, 7));
    }
}
