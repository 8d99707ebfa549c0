//! Minidumps (the Microsoft format with the Breakpad/Crashpad Linux
//! streams), as written by Breakpad, Crashpad, sentry-native and the
//! `minidump-writer` crate, read into a [`Snapshot`] like a core.
//!
//! What is read:
//! - threads (`ThreadListStream`): ids and registers from their x86-64 or
//!   AArch64 contexts (the Microsoft `CONTEXT_ARM64` and Breakpad's older
//!   layout); the crashing thread's registers from the exception stream's
//!   context when there is one (the registers at the signal);
//! - memory from `MemoryListStream`, `Memory64ListStream` and the threads'
//!   stack descriptors; reads the dump cannot answer go to the module files
//!   found on disk;
//! - modules (`ModuleListStream`) with the ELF build-id of their CodeView
//!   record (`BpEL`, Breakpad's `MDCVInfoELF`); their mappings from
//!   `MD_LINUX_MAPS` when present (so that the load bias and the
//!   executable segments are right), else one mapping per module; each
//!   module's file is looked up like a core's ([`Lookup`]: the path in the
//!   dump when its build-id matches, debug files by build-id, debuginfod);
//!   a module named without a directory (Crashpad names libraries by
//!   soname) or whose path holds another build is looked for by name in
//!   the library directories and beside the other modules, accepted only
//!   with its build-id;
//! - the vDSO's image from the dump's memory when it is there, else this
//!   machine's own vDSO when its build-id is the one in the dump;
//! - the signal (`ExceptionStream`: signal number, `si_code`, fault address,
//!   thread), the command line (`MD_LINUX_CMD_LINE`), the process id and
//!   name (`MD_LINUX_PROC_STATUS`, `MiscInfoStream`), the auxiliary vector
//!   (`MD_LINUX_AUXV`), thread names (`ThreadNamesStream`).
//!
//! The parser is written here rather than taken from rust-minidump's
//! `minidump` crate: the part a Linux unwinder needs is a handful of fixed
//! structures, that crate brings some twenty crates (protobuf, text
//! encodings, time formatting, logging) into a library meant to stay small,
//! and it is lenient by design where this reader must refuse: every count
//! is checked against its stream and every stream and memory range against
//! the file before anything is allocated, and streams that overlap or point
//! past the end make the dump [`RemoteError::BadMinidump`]. Parsing never
//! panics.

use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use super::corefile::{CoreExecutable, CoreSignal, ExeSource, AT_ENTRY, AT_SYSINFO_EHDR};
use super::files::{self, Lookup};
use super::{Machine, Mapping, Module, Registers, RemoteError, Snapshot, Thread};

/// `MDMP`, the first four bytes of a minidump.
pub const SIGNATURE: u32 = 0x504d_444d;
/// The low half of the header's version (`MD_HEADER_VERSION`).
pub const VERSION: u16 = 0xa793;

/// Stream types: the format's own and Breakpad's Linux extensions.
pub mod stream {
    /// `ThreadListStream`.
    pub const THREAD_LIST: u32 = 3;
    /// `ModuleListStream`.
    pub const MODULE_LIST: u32 = 4;
    /// `MemoryListStream`.
    pub const MEMORY_LIST: u32 = 5;
    /// `ExceptionStream`.
    pub const EXCEPTION: u32 = 6;
    /// `SystemInfoStream`.
    pub const SYSTEM_INFO: u32 = 7;
    /// `Memory64ListStream`.
    pub const MEMORY64_LIST: u32 = 9;
    /// `MiscInfoStream`.
    pub const MISC_INFO: u32 = 15;
    /// `ThreadNamesStream`.
    pub const THREAD_NAMES: u32 = 24;
    /// `MD_LINUX_CPU_INFO`: `/proc/cpuinfo`.
    pub const LINUX_CPU_INFO: u32 = 0x4767_0003;
    /// `MD_LINUX_PROC_STATUS`: `/proc/PID/status`.
    pub const LINUX_PROC_STATUS: u32 = 0x4767_0004;
    /// `MD_LINUX_CMD_LINE`: `/proc/PID/cmdline`.
    pub const LINUX_CMD_LINE: u32 = 0x4767_0006;
    /// `MD_LINUX_AUXV`: `/proc/PID/auxv`.
    pub const LINUX_AUXV: u32 = 0x4767_0008;
    /// `MD_LINUX_MAPS`: `/proc/PID/maps`.
    pub const LINUX_MAPS: u32 = 0x4767_0009;
}

/// `MINIDUMP_THREAD`: 48 bytes.
const THREAD_SIZE: u64 = 48;
/// `MINIDUMP_MODULE`: 108 bytes.
const MODULE_SIZE: u64 = 108;
/// `MINIDUMP_MEMORY_DESCRIPTOR`: 16 bytes.
const MEMORY_DESC_SIZE: u64 = 16;
/// `MINIDUMP_THREAD_NAME`: thread id and a 64-bit RVA, packed: 12 bytes.
const THREAD_NAME_SIZE: u64 = 12;
/// `MINIDUMP_EXCEPTION_STREAM`: 168 bytes.
const EXCEPTION_SIZE: u64 = 168;
/// `MD_CVINFOELF_SIGNATURE`: 'BpEL', the CodeView record of an ELF module
/// (its build-id follows).
const CV_ELF: u32 = 0x4270_454c;
/// Breakpad's exception code of a dump asked for without a crash.
const DUMP_REQUESTED: u32 = 0xffff_ffff;
/// `CONTEXT_AMD64`, in a context's flags.
const CONTEXT_AMD64: u32 = 0x0010_0000;
/// `CONTEXT_ARM64` (Microsoft's layout).
const CONTEXT_ARM64: u32 = 0x0040_0000;
/// Breakpad's older ARM64 layout (`MDRawContextARM64_Old`), 64-bit flags.
const CONTEXT_ARM64_OLD: u64 = 0x8000_0000;
/// `MD_OS_LINUX` and `MD_OS_ANDROID`, in `SystemInfoStream`'s platform id.
const OS_LINUX: u32 = 0x8201;
const OS_ANDROID: u32 = 0x8203;
/// `PROCESSOR_ARCHITECTURE_*` of `SystemInfoStream`.
const CPU_AMD64: u16 = 9;
const CPU_ARM64: u16 = 12;
const CPU_ARM64_OLD: u16 = 0x8003;
/// Longest string read from a dump (names, paths): 64 KiB.
const MAX_STRING: u64 = 64 * 1024;

/// A range of the target's memory held by the dump.
#[derive(Clone, Copy, Debug)]
struct Region {
    start: u64,
    len: u64,
    offset: u64,
}

/// A module as the dump's module list describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpModule {
    /// The path the target saw.
    pub name: String,
    /// Base address.
    pub base: u64,
    /// Bytes from the base (the extent of its mappings).
    pub size: u64,
    /// The ELF build-id of its CodeView record (`BpEL`), when it has one.
    pub build_id: Option<Vec<u8>>,
}

/// Everything the streams of a minidump say, before any file on disk is
/// looked at: [`parse`] produces it from bytes alone (the fuzz target's
/// entry point).
#[derive(Debug, Default)]
pub struct ParsedMinidump {
    /// The architecture (`None` when neither the system info nor a context says).
    pub arch: Option<Machine>,
    /// The process id (`MD_LINUX_PROC_STATUS`, `MiscInfoStream`, else the first thread).
    pub pid: u32,
    /// The process name (`Name:` of `MD_LINUX_PROC_STATUS`).
    pub process_name: Option<String>,
    /// The command line (`MD_LINUX_CMD_LINE`, arguments joined by spaces).
    pub command_line: Option<String>,
    /// The signal of the exception stream, when it records one.
    pub signal: Option<CoreSignal>,
    /// Threads, in the thread list's order.
    pub threads: Vec<Thread>,
    /// The module list, in its order.
    pub modules: Vec<DumpModule>,
    /// `MD_LINUX_MAPS`: every mapping, file-backed or not.
    pub maps: Vec<Mapping>,
    /// `MD_LINUX_AUXV` as (type, value) pairs.
    pub auxv: Vec<(u64, u64)>,
    /// Problems, one sentence each.
    pub warnings: Vec<String>,
    regions: Vec<Region>,
}

/// Little-endian reads with every bound checked.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn slice(&self, off: u64, len: u64) -> Option<&'a [u8]> {
        let off = usize::try_from(off).ok()?;
        let len = usize::try_from(len).ok()?;
        self.0.get(off..off.checked_add(len)?)
    }
    fn u16(&self, off: u64) -> Option<u16> {
        Some(u16::from_le_bytes(self.slice(off, 2)?.try_into().ok()?))
    }
    fn u32(&self, off: u64) -> Option<u32> {
        Some(u32::from_le_bytes(self.slice(off, 4)?.try_into().ok()?))
    }
    fn u64(&self, off: u64) -> Option<u64> {
        Some(u64::from_le_bytes(self.slice(off, 8)?.try_into().ok()?))
    }
}

/// A stream's place in the file.
#[derive(Clone, Copy, Debug)]
struct Stream {
    kind: u32,
    size: u64,
    rva: u64,
}

fn stream_name(kind: u32) -> String {
    match kind {
        stream::THREAD_LIST => "ThreadListStream".into(),
        stream::MODULE_LIST => "ModuleListStream".into(),
        stream::MEMORY_LIST => "MemoryListStream".into(),
        stream::EXCEPTION => "ExceptionStream".into(),
        stream::SYSTEM_INFO => "SystemInfoStream".into(),
        stream::MEMORY64_LIST => "Memory64ListStream".into(),
        stream::MISC_INFO => "MiscInfoStream".into(),
        stream::THREAD_NAMES => "ThreadNamesStream".into(),
        stream::LINUX_PROC_STATUS => "MD_LINUX_PROC_STATUS".into(),
        stream::LINUX_CMD_LINE => "MD_LINUX_CMD_LINE".into(),
        stream::LINUX_AUXV => "MD_LINUX_AUXV".into(),
        stream::LINUX_MAPS => "MD_LINUX_MAPS".into(),
        k => format!("stream type {k:#x}"),
    }
}

fn bad(s: String) -> RemoteError {
    RemoteError::BadMinidump(s)
}

/// Parses the header, the stream directory and the streams of a minidump
/// held in memory. Never panics; a dump whose structure is broken (short,
/// wrong magic, streams past the end or overlapping, counts that do not fit
/// their stream, memory past the end) is an error, while a problem confined
/// to one thread or module is a warning.
pub fn parse(data: &[u8]) -> Result<ParsedMinidump, RemoteError> {
    let b = Bytes(data);
    let len = data.len() as u64;
    if data.len() < 32 {
        return Err(bad(format!(
            "not a minidump: only {len} bytes, shorter than a minidump header (32 bytes)"
        )));
    }
    let magic = b.u32(0).unwrap_or(0);
    if magic != SIGNATURE {
        return Err(bad(format!(
            "not a minidump: its first bytes are {:02x?}, not \"MDMP\"",
            &data[..4]
        )));
    }
    let version = b.u32(4).unwrap_or(0);
    if version as u16 != VERSION {
        return Err(bad(format!(
            "not a minidump: header version {:#x} (a minidump has {VERSION:#x} in its low half)",
            version as u16
        )));
    }
    let count = b.u32(8).unwrap_or(0) as u64;
    let dir = b.u32(12).unwrap_or(0) as u64;
    if dir.saturating_add(count.saturating_mul(12)) > len || (count > 0 && dir < 32) {
        return Err(bad(format!(
            "truncated or corrupt minidump: its directory of {count} streams at offset {dir:#x} does not fit in the file ({len} bytes)"
        )));
    }
    let mut streams: Vec<Stream> = Vec::new();
    for i in 0..count {
        let at = dir + 12 * i;
        let s = Stream {
            kind: b.u32(at).unwrap_or(0),
            size: b.u32(at + 4).unwrap_or(0) as u64,
            rva: b.u32(at + 8).unwrap_or(0) as u64,
        };
        // `UnusedStream` entries (type 0) hold nothing.
        if s.kind == 0 || s.size == 0 {
            continue;
        }
        if s.rva.saturating_add(s.size) > len {
            return Err(bad(format!(
                "truncated or corrupt minidump: {} ({} bytes at offset {:#x}) runs past the end of the file ({len} bytes)",
                stream_name(s.kind),
                s.size,
                s.rva
            )));
        }
        streams.push(s);
    }
    // No two streams, nor a stream and the header or directory, may share bytes.
    let mut spans: Vec<(u64, u64, String)> = streams
        .iter()
        .map(|s| (s.rva, s.rva + s.size, stream_name(s.kind)))
        .collect();
    spans.push((0, 32, "the header".into()));
    if count > 0 {
        spans.push((dir, dir + 12 * count, "the stream directory".into()));
    }
    spans.sort_by_key(|s| (s.0, s.1));
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(bad(format!(
                "corrupt minidump: {} (offsets {:#x}..{:#x}) overlaps {} (offsets {:#x}..{:#x})",
                w[1].2, w[1].0, w[1].1, w[0].2, w[0].0, w[0].1
            )));
        }
    }
    let mut out = ParsedMinidump::default();
    let first = |kind: u32| streams.iter().find(|s| s.kind == kind).copied();
    let mut kinds: Vec<u32> = Vec::new();
    for s in &streams {
        if kinds.contains(&s.kind) {
            out.warnings.push(format!(
                "the minidump has more than one {}: only the first is read",
                stream_name(s.kind)
            ));
        } else {
            kinds.push(s.kind);
        }
    }
    let body = |s: Stream| b.slice(s.rva, s.size).unwrap_or(&[]);

    // The system: which architecture, and whether it is Linux at all.
    if let Some(s) = first(stream::SYSTEM_INFO) {
        let sb = Bytes(body(s));
        if let (Some(cpu), Some(platform)) = (sb.u16(0), sb.u32(20)) {
            if platform != OS_LINUX && platform != OS_ANDROID {
                let os = match platform {
                    0..=2 => "Windows",
                    0x8101 => "macOS",
                    0x8102 => "iOS",
                    0x8202 => "Solaris",
                    0x8205 => "Fuchsia",
                    _ => "a system other than Linux",
                };
                return Err(RemoteError::BadMinidump(format!(
                    "a minidump of {os} (platform id {platform:#x}): only Linux and Android minidumps are read"
                )));
            }
            out.arch = match cpu {
                CPU_AMD64 => Some(Machine::X86_64),
                CPU_ARM64 | CPU_ARM64_OLD => Some(Machine::Aarch64),
                other => {
                    return Err(RemoteError::UnsupportedArch(format!(
                        "minidump processor architecture {other:#x} (x86-64 and AArch64 are read)"
                    )))
                }
            };
        }
    }

    // Memory.
    if let Some(s) = first(stream::MEMORY_LIST) {
        let sb = Bytes(body(s));
        let n = sb.u32(0).unwrap_or(0) as u64;
        let base = list_start(s.size, n, MEMORY_DESC_SIZE).ok_or_else(|| {
            bad(format!(
                "corrupt minidump: MemoryListStream claims {n} ranges but holds {} bytes",
                s.size
            ))
        })?;
        for i in 0..n {
            let at = base + i * MEMORY_DESC_SIZE;
            let start = sb.u64(at).unwrap_or(0);
            let size = sb.u32(at + 8).unwrap_or(0) as u64;
            let rva = sb.u32(at + 12).unwrap_or(0) as u64;
            add_region(
                &mut out.regions,
                start,
                size,
                rva,
                len,
                "MemoryListStream",
                i,
            )?;
        }
    }
    if let Some(s) = first(stream::MEMORY64_LIST) {
        let sb = Bytes(body(s));
        let n = sb.u64(0).unwrap_or(0);
        let mut rva = sb.u64(8).unwrap_or(0);
        if n > s.size.saturating_sub(16) / MEMORY_DESC_SIZE || s.size < 16 {
            return Err(bad(format!(
                "corrupt minidump: Memory64ListStream claims {n} ranges but holds {} bytes",
                s.size
            )));
        }
        for i in 0..n {
            let at = 16 + i * MEMORY_DESC_SIZE;
            let start = sb.u64(at).unwrap_or(0);
            let size = sb.u64(at + 8).unwrap_or(0);
            add_region(
                &mut out.regions,
                start,
                size,
                rva,
                len,
                "Memory64ListStream",
                i,
            )?;
            rva = rva.saturating_add(size);
        }
    }

    // Threads.
    let mut contexts: Vec<(u32, &[u8])> = Vec::new();
    if let Some(s) = first(stream::THREAD_LIST) {
        let sb = Bytes(body(s));
        let n = sb.u32(0).unwrap_or(0) as u64;
        let base = list_start(s.size, n, THREAD_SIZE).ok_or_else(|| {
            bad(format!(
                "corrupt minidump: ThreadListStream claims {n} threads but holds {} bytes (room for {})",
                s.size,
                s.size.saturating_sub(4) / THREAD_SIZE
            ))
        })?;
        for i in 0..n {
            let at = base + i * THREAD_SIZE;
            let tid = sb.u32(at).unwrap_or(0);
            let stack_start = sb.u64(at + 24).unwrap_or(0);
            let stack_size = sb.u32(at + 32).unwrap_or(0) as u64;
            let stack_rva = sb.u32(at + 36).unwrap_or(0) as u64;
            let ctx_size = sb.u32(at + 40).unwrap_or(0) as u64;
            let ctx_rva = sb.u32(at + 44).unwrap_or(0) as u64;
            add_region(
                &mut out.regions,
                stack_start,
                stack_size,
                stack_rva,
                len,
                "the stack of thread",
                tid as u64,
            )?;
            match b.slice(ctx_rva, ctx_size) {
                Some(ctx) => contexts.push((tid, ctx)),
                None => {
                    return Err(bad(format!(
                        "truncated or corrupt minidump: the context of thread {tid} ({ctx_size} bytes at offset {ctx_rva:#x}) runs past the end of the file"
                    )))
                }
            }
        }
    }
    // The crashing thread's registers at the signal.
    if let Some(s) = first(stream::EXCEPTION) {
        let sb = Bytes(body(s));
        if s.size < EXCEPTION_SIZE {
            out.warnings.push(format!(
                "ExceptionStream is {} bytes, shorter than its {EXCEPTION_SIZE}: the signal is not known",
                s.size
            ));
        } else {
            let tid = sb.u32(0).unwrap_or(0);
            let code = sb.u32(8).unwrap_or(0);
            let flags = sb.u32(12).unwrap_or(0);
            let address = sb.u64(24).unwrap_or(0);
            let ctx_size = sb.u32(160).unwrap_or(0) as u64;
            let ctx_rva = sb.u32(164).unwrap_or(0) as u64;
            if code != DUMP_REQUESTED && code != 0 {
                // SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV carry an address.
                let fault = matches!(code, 4 | 5 | 7 | 8 | 11);
                out.signal = Some(CoreSignal {
                    number: code,
                    code: Some(flags as i32),
                    address: fault.then_some(address),
                    tid,
                });
            }
            if ctx_size > 0 {
                match b.slice(ctx_rva, ctx_size) {
                    Some(ctx) => {
                        if let Some(c) = contexts.iter_mut().find(|c| c.0 == tid) {
                            c.1 = ctx;
                        }
                    }
                    None => out.warnings.push(format!(
                        "the exception context ({ctx_size} bytes at offset {ctx_rva:#x}) runs past the end of the file: thread {tid} is unwound from its thread-list registers"
                    )),
                }
            }
        }
    }
    if out.arch.is_none() {
        out.arch = contexts.iter().find_map(|(_, c)| context_arch(c));
    }
    if let Some(arch) = out.arch {
        for (tid, ctx) in &contexts {
            match registers_from_context(arch, ctx) {
                Some(registers) => out.threads.push(Thread {
                    tid: *tid,
                    name: None,
                    registers,
                    stack_end: None,
                }),
                None => out.warnings.push(format!(
                    "thread {tid}: its context ({} bytes) is not a {arch:?} context: thread skipped",
                    ctx.len()
                )),
            }
        }
    } else if !contexts.is_empty() {
        return Err(RemoteError::UnsupportedArch(
            "the minidump's threads have contexts of an architecture not read here (x86-64 and AArch64 are)".into(),
        ));
    }

    // Modules.
    if let Some(s) = first(stream::MODULE_LIST) {
        let sb = Bytes(body(s));
        let n = sb.u32(0).unwrap_or(0) as u64;
        let base = list_start(s.size, n, MODULE_SIZE).ok_or_else(|| {
            bad(format!(
                "corrupt minidump: ModuleListStream claims {n} modules but holds {} bytes",
                s.size
            ))
        })?;
        for i in 0..n {
            let at = base + i * MODULE_SIZE;
            let mbase = sb.u64(at).unwrap_or(0);
            let size = sb.u32(at + 8).unwrap_or(0) as u64;
            let name_rva = sb.u32(at + 20).unwrap_or(0) as u64;
            let cv_size = sb.u32(at + 76).unwrap_or(0) as u64;
            let cv_rva = sb.u32(at + 80).unwrap_or(0) as u64;
            let Some(name) = read_string(&b, name_rva) else {
                out.warnings.push(format!(
                    "module {i} at {mbase:#x}: its name lies outside the file: module skipped"
                ));
                continue;
            };
            let build_id = match b.slice(cv_rva, cv_size) {
                // The signature 'BpEL' as a little-endian u32.
                Some(cv) if cv.len() > 4 && cv[..4] == CV_ELF.to_le_bytes() => {
                    Some(cv[4..].to_vec())
                }
                _ => None,
            };
            out.modules.push(DumpModule {
                name,
                base: mbase,
                size,
                build_id,
            });
        }
    }

    // Linux streams.
    if let Some(s) = first(stream::LINUX_MAPS) {
        let text = String::from_utf8_lossy(body(s));
        out.maps = text.lines().filter_map(parse_maps_line).collect();
    }
    if let Some(s) = first(stream::LINUX_AUXV) {
        let words: Vec<u64> = body(s)
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        out.auxv = words
            .chunks_exact(2)
            .map(|p| (p[0], p[1]))
            .take_while(|p| p.0 != 0)
            .collect();
    }
    if let Some(s) = first(stream::LINUX_CMD_LINE) {
        let args: Vec<String> = body(s)
            .split(|&c| c == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !args.is_empty() {
            out.command_line = Some(args.join(" "));
        }
    }
    if let Some(s) = first(stream::LINUX_PROC_STATUS) {
        let text = String::from_utf8_lossy(body(s));
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("Name:") {
                out.process_name = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("Tgid:") {
                out.pid = v.trim().parse().unwrap_or(0);
            }
        }
    }
    if out.pid == 0 {
        if let Some(s) = first(stream::MISC_INFO) {
            let sb = Bytes(body(s));
            // MINIDUMP_MISC1_PROCESS_ID in flags1.
            if sb.u32(4).unwrap_or(0) & 1 != 0 {
                out.pid = sb.u32(8).unwrap_or(0);
            }
        }
    }
    if out.pid == 0 {
        out.pid = out.threads.first().map(|t| t.tid).unwrap_or(0);
    }
    if let Some(s) = first(stream::THREAD_NAMES) {
        let sb = Bytes(body(s));
        let n = sb.u32(0).unwrap_or(0) as u64;
        match list_start(s.size, n, THREAD_NAME_SIZE) {
            None => out.warnings.push(format!(
                "ThreadNamesStream claims {n} names but holds {} bytes: thread names ignored",
                s.size
            )),
            Some(base) => {
                for i in 0..n {
                    let at = base + i * THREAD_NAME_SIZE;
                    let tid = sb.u32(at).unwrap_or(0);
                    let name = sb.u64(at + 4).and_then(|rva| read_string(&b, rva));
                    if let (Some(t), Some(name)) =
                        (out.threads.iter_mut().find(|t| t.tid == tid), name)
                    {
                        t.name = Some(name);
                    }
                }
            }
        }
    }
    if let Some(name) = &out.process_name {
        let pid = out.pid;
        for t in out
            .threads
            .iter_mut()
            .filter(|t| t.tid == pid && t.name.is_none())
        {
            t.name = Some(name.clone());
        }
    }

    out.regions.sort_by_key(|r| r.start);
    // Each thread's stack ends where the mapping (or dumped range) holding
    // its stack pointer ends.
    for t in out.threads.iter_mut() {
        let Some(sp) = t.registers.sp() else { continue };
        t.stack_end = out
            .maps
            .iter()
            .find(|m| sp >= m.start && sp < m.end)
            .map(|m| m.end)
            .or_else(|| {
                out.regions
                    .iter()
                    .find(|r| sp >= r.start && sp - r.start < r.len)
                    .map(|r| r.start + r.len)
            });
    }
    if streams.iter().all(|s| s.kind != stream::THREAD_LIST) {
        out.warnings
            .push("the minidump has no thread list: no threads to unwind".into());
    }
    Ok(out)
}

/// Where the entries of a list stream of `size` bytes claiming `n` entries
/// of `entry` bytes start: after the 32-bit count, or after 4 bytes more
/// when the writer aligned the entries to 8 (as Windows' dbghelp does).
/// `None` when `n` entries do not fit.
fn list_start(size: u64, n: u64, entry: u64) -> Option<u64> {
    let need = n.checked_mul(entry)?;
    if size.checked_sub(4)? < need {
        return None;
    }
    Some(if size.checked_sub(8).is_some_and(|r| r == need) {
        8
    } else {
        4
    })
}

/// Adds the memory range `[start, start + size)` held at `rva`: an error
/// when the bytes lie past the end of the file or the range wraps around
/// the address space.
fn add_region(
    regions: &mut Vec<Region>,
    start: u64,
    size: u64,
    rva: u64,
    len: u64,
    what: &str,
    i: u64,
) -> Result<(), RemoteError> {
    if size == 0 {
        return Ok(());
    }
    if rva.checked_add(size).is_none_or(|e| e > len) {
        return Err(bad(format!(
            "truncated or corrupt minidump: memory range {i} of {what} ({size} bytes for address {start:#x}, at offset {rva:#x}) runs past the end of the file ({len} bytes)"
        )));
    }
    if start.checked_add(size).is_none() {
        return Err(bad(format!(
            "corrupt minidump: memory range {i} of {what} ({size} bytes at address {start:#x}) wraps around the address space"
        )));
    }
    regions.push(Region {
        start,
        len: size,
        offset: rva,
    });
    Ok(())
}

/// A `MINIDUMP_STRING` (32-bit byte length, then UTF-16LE) at `rva`.
fn read_string(b: &Bytes<'_>, rva: u64) -> Option<String> {
    let n = b.u32(rva)? as u64;
    if n > MAX_STRING {
        return None;
    }
    let raw = b.slice(rva + 4, n & !1)?;
    let units: Vec<u16> = raw
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    Some(String::from_utf16_lossy(&units))
}

/// The architecture a context's flags name.
fn context_arch(ctx: &[u8]) -> Option<Machine> {
    let flags = u32::from_le_bytes(ctx.get(0..4)?.try_into().ok()?);
    // x86-64's flags sit after six home words.
    let amd64 = ctx
        .get(48..52)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])));
    if amd64.is_some_and(|f| f & 0xfff0_0000 == CONTEXT_AMD64) {
        Some(Machine::X86_64)
    } else if flags & 0xfff0_0000 == CONTEXT_ARM64 || flags as u64 & CONTEXT_ARM64_OLD != 0 {
        Some(Machine::Aarch64)
    } else {
        None
    }
}

/// A thread's registers from its minidump context, by DWARF number.
fn registers_from_context(arch: Machine, ctx: &[u8]) -> Option<Registers> {
    let b = Bytes(ctx);
    let mut regs = Registers::new(arch);
    match arch {
        Machine::X86_64 => {
            // CONTEXT_AMD64: rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8-r15
            // from offset 120, then rip.
            const DWARF: [u16; 16] = [0, 2, 1, 3, 7, 6, 4, 5, 8, 9, 10, 11, 12, 13, 14, 15];
            if b.u32(48)? & 0xfff0_0000 != CONTEXT_AMD64 {
                return None;
            }
            for (i, d) in DWARF.iter().enumerate() {
                regs.set(*d, b.u64(120 + 8 * i as u64)?);
            }
            regs.set(16, b.u64(248)?);
        }
        Machine::Aarch64 => {
            // Microsoft's CONTEXT_ARM64 (32-bit flags, cpsr, x0-x30, sp,
            // pc) and Breakpad's older layout (64-bit flags, x0-x28, fp,
            // lr, sp, pc) put the registers at the same offsets.
            let new = b.u32(0)? & 0xfff0_0000 == CONTEXT_ARM64;
            if !new && b.u64(0)? & CONTEXT_ARM64_OLD == 0 {
                return None;
            }
            let (x0, sp_at, pc_at) = (8, 256, 264);
            for i in 0..31u16 {
                regs.set(i, b.u64(x0 + 8 * i as u64)?);
            }
            regs.set(31, b.u64(sp_at)?);
            regs.set(32, b.u64(pc_at)?);
        }
        _ => return None,
    }
    Some(regs)
}

/// One line of `/proc/PID/maps` (the dump's `MD_LINUX_MAPS`).
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut it = line.split_whitespace();
    let (range, perms, off) = (it.next()?, it.next()?, it.next()?);
    let (_dev, _inode) = (it.next()?, it.next()?);
    let path = it.collect::<Vec<_>>().join(" ");
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    if end < start {
        return None;
    }
    Some(Mapping {
        start,
        end,
        file_offset: u64::from_str_radix(off, 16).ok()?,
        path,
        executable: Some(perms.as_bytes().get(2) == Some(&b'x')),
    })
}

enum Data {
    Map(memmap2::Mmap),
    Vec(Vec<u8>),
}

impl Deref for Data {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Data::Map(m) => m,
            Data::Vec(v) => v,
        }
    }
}

/// A found module file's mapping: reads the dump cannot answer go there.
struct FileBacked {
    start: u64,
    end: u64,
    file_offset: u64,
    data: Arc<memmap2::Mmap>,
}

/// An opened minidump: its snapshot and its memory.
pub struct Minidump {
    data: Data,
    regions: Vec<Region>,
    /// `reach[k]`: the highest end of `regions[..=k]`.
    reach: Vec<u64>,
    file_backed: Vec<FileBacked>,
    snapshot: Snapshot,
    signal: Option<CoreSignal>,
    command_line: Option<String>,
    executable: Option<CoreExecutable>,
    missing: Vec<String>,
}

impl Minidump {
    /// Opens the minidump at `path` and finds its modules' files.
    pub fn open(path: &Path, lookup: &Lookup) -> Result<Minidump, RemoteError> {
        let f = std::fs::File::open(path).map_err(|e| RemoteError::Io(path.into(), e))?;
        // SAFETY: read-only mapping of a dump file; it is not written while we read it.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| RemoteError::Io(path.into(), e))?;
        Self::from_data(Data::Map(map), lookup)
    }

    /// Opens a minidump held in memory (tests, fuzzing).
    pub fn from_vec(data: Vec<u8>, lookup: &Lookup) -> Result<Minidump, RemoteError> {
        Self::from_data(Data::Vec(data), lookup)
    }

    fn from_data(data: Data, lookup: &Lookup) -> Result<Minidump, RemoteError> {
        let parsed = parse(&data)?;
        let arch = parsed.arch.ok_or_else(|| {
            RemoteError::BadMinidump(
                "the minidump says neither its architecture (no SystemInfoStream) nor has a thread context to tell it by".into(),
            )
        })?;
        let reach = parsed
            .regions
            .iter()
            .scan(0u64, |m, r| {
                *m = (*m).max(r.start + r.len);
                Some(*m)
            })
            .collect();
        let mut dump = Minidump {
            data,
            reach,
            regions: parsed.regions,
            file_backed: Vec::new(),
            signal: parsed.signal,
            command_line: parsed.command_line,
            executable: None,
            missing: Vec::new(),
            snapshot: Snapshot {
                arch,
                pid: parsed.pid,
                process_name: parsed.process_name,
                threads: parsed.threads,
                modules: Vec::new(),
                warnings: parsed.warnings,
                anon_code: Vec::new(),
            },
        };
        dump.find_modules(&parsed.modules, &parsed.maps, &parsed.auxv, lookup);
        Ok(dump)
    }

    fn find_modules(
        &mut self,
        list: &[DumpModule],
        maps: &[Mapping],
        auxv: &[(u64, u64)],
        lookup: &Lookup,
    ) {
        let auxv_value = |t: u64| auxv.iter().find(|p| p.0 == t).map(|p| p.1);
        let vdso_at = auxv_value(AT_SYSINFO_EHDR)
            .or_else(|| maps.iter().find(|m| m.path == "[vdso]").map(|m| m.start));
        let mut warnings = std::mem::take(&mut self.snapshot.warnings);
        let mut mods: Vec<Module> = Vec::new();
        let mut vdso: Option<(Mapping, Option<Vec<u8>>)> = None;
        for dm in list {
            let end = dm.base.saturating_add(dm.size.max(1));
            let is_vdso = Some(dm.base) == vdso_at
                || dm.name == "[vdso]"
                || dm.name.ends_with("linux-gate.so")
                || dm.name.ends_with("linux-vdso.so.1");
            if is_vdso {
                vdso = Some((
                    Mapping {
                        start: dm.base,
                        end,
                        file_offset: 0,
                        path: "[vdso]".into(),
                        executable: Some(true),
                    },
                    dm.build_id.clone(),
                ));
                continue;
            }
            let mut mappings: Vec<Mapping> = maps
                .iter()
                .filter(|m| m.path == dm.name && m.start < end && m.end > dm.base)
                .cloned()
                .collect();
            if mappings.is_empty() {
                mappings.push(Mapping {
                    start: dm.base,
                    end,
                    file_offset: 0,
                    path: dm.name.clone(),
                    executable: None,
                });
            }
            let start = mappings.iter().map(|m| m.start).min().unwrap_or(dm.base);
            let mend = mappings.iter().map(|m| m.end).max().unwrap_or(end).max(end);
            mods.push(Module {
                name: dm.name.clone(),
                file: None,
                debug_file: None,
                start,
                end: mend,
                bias: 0,
                build_id: dm.build_id.clone(),
                image: None,
                mappings,
            });
        }
        if vdso.is_none() {
            if let Some(m) = maps.iter().find(|m| m.path == "[vdso]") {
                vdso = Some((m.clone(), None));
            }
        }
        // The executable: the module holding the entry point, else the
        // first of the list (Breakpad and minidump-writer put it first).
        let exe_name = auxv_value(AT_ENTRY)
            .and_then(|a| mods.iter().find(|m| m.contains(a)))
            .or(mods.first())
            .map(|m| m.name.clone());
        find_by_name(&mut mods, lookup);
        files::resolve_files(&mut mods, lookup, None, &mut warnings);
        // A dump's maps may leave out some of a module's mappings (ours,
        // rebuilt from a core that did not dump the code; other writers'
        // maps cut short): the module list's range and the file's segments
        // give the rest.
        for m in mods.iter_mut() {
            let Some(path) = &m.file else { continue };
            if let Ok(map) = files::map_file(path) {
                files::complete_mappings(m, &map);
            }
        }
        self.missing = mods
            .iter()
            .filter(|m| m.file.is_none() && m.image.is_none())
            .filter(|m| m.mappings.iter().any(|x| x.executable != Some(false)))
            .map(|m| m.name.clone())
            .collect();
        if let Some(name) = exe_name {
            let m = mods.iter().find(|m| m.name == name);
            self.executable = Some(CoreExecutable {
                file: m.and_then(|m| m.file.clone()),
                name,
                source: ExeSource::ModuleList,
            });
        }
        if let Some((mapping, id)) = vdso {
            match self.vdso_image(&mapping, id.as_deref()) {
                Some(image) => mods.push(files::image_module(mapping, Arc::new(image))),
                None => warnings.push(format!(
                    "the vDSO at {:#x} is not in the minidump and this machine's differs: frames in it are unnamed",
                    mapping.start
                )),
            }
        }
        mods.sort_by_key(|m| m.start);
        for m in &mods {
            let Some(path) = &m.file else { continue };
            let Ok(map) = files::map_file(path) else {
                continue;
            };
            for mp in &m.mappings {
                self.file_backed.push(FileBacked {
                    start: mp.start,
                    end: mp.end,
                    file_offset: mp.file_offset,
                    data: map.clone(),
                });
            }
        }
        // Code the dump holds in modules whose file is missing (the bytes
        // around a crashing pc): instruction analysis can read it there.
        let anon: Vec<(u64, Arc<Vec<u8>>)> = self
            .regions
            .iter()
            .filter(|r| {
                mods.iter().any(|m| {
                    m.file.is_none()
                        && m.image.is_none()
                        && m.contains(r.start)
                        && m.contains(r.start + r.len - 1)
                })
            })
            .filter_map(|r| {
                let bytes = Bytes(&self.data).slice(r.offset, r.len)?;
                Some((r.start, Arc::new(bytes.to_vec())))
            })
            .collect();
        self.snapshot.anon_code = anon;
        self.snapshot.modules = mods;
        self.snapshot.warnings = warnings;
    }

    /// The vDSO's image: from the dump's memory, else this process's own
    /// vDSO when its build-id is the dump's (the same kernel build).
    fn vdso_image(&self, mapping: &Mapping, build_id: Option<&[u8]>) -> Option<Vec<u8>> {
        let len = usize::try_from(mapping.end.checked_sub(mapping.start)?).ok()?;
        // A vDSO is a few pages; a larger claim is not one.
        if len <= 1 << 20 {
            let mut image = vec![0u8; len];
            if self.read_bytes(mapping.start, &mut image) {
                return Some(image);
            }
        }
        let want = build_id?;
        let own = own_vdso()?;
        (files::build_id(&own).as_deref() == Some(want)).then_some(own)
    }

    /// Copies target memory at `addr` into `buf`; false when any byte is unknown.
    pub fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
        let len = buf.len() as u64;
        let i = self.regions.partition_point(|r| r.start <= addr);
        // Ranges may overlap (a stack listed twice, the bytes around a pc
        // inside a stack): the nearest start first, then the others, as
        // long as one of them may still reach `addr`.
        for (k, r) in self.regions[..i].iter().enumerate().rev() {
            if self.reach[k] <= addr {
                break;
            }
            let rel = addr - r.start;
            if rel.saturating_add(len) <= r.len {
                if let Some(src) = Bytes(&self.data).slice(r.offset + rel, len) {
                    buf.copy_from_slice(src);
                    return true;
                }
            }
        }
        for f in &self.file_backed {
            if addr >= f.start && addr.saturating_add(len) <= f.end {
                let off = f.file_offset.saturating_add(addr - f.start);
                if let Some(src) = Bytes(&f.data).slice(off, len) {
                    buf.copy_from_slice(src);
                    return true;
                }
            }
        }
        false
    }

    /// The signal of the exception stream and the thread that received
    /// it; `None` for a dump taken without a crash.
    pub fn signal(&self) -> Option<&CoreSignal> {
        self.signal.as_ref()
    }

    /// The command line (`MD_LINUX_CMD_LINE`), its arguments joined by spaces.
    pub fn command_line(&self) -> Option<&str> {
        self.command_line.as_deref()
    }

    /// The executable: the module holding the entry point (`MD_LINUX_AUXV`),
    /// else the module list's first.
    pub fn executable(&self) -> Option<&CoreExecutable> {
        self.executable.as_ref()
    }

    /// The modules that may hold code and whose file was not found (nor
    /// fetched): their frames are unwound by instruction analysis and
    /// stack scanning, and unnamed.
    pub fn missing_modules(&self) -> &[String] {
        &self.missing
    }

    /// The threads, modules and warnings.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Size of the dump in bytes.
    pub fn size(&self) -> u64 {
        self.data.len() as u64
    }

    /// A reader of the dump's memory for the unwinder.
    pub fn memory(&self) -> MinidumpMemory<'_> {
        super::TargetMemory(self)
    }
}

/// Where a module named without a directory (Crashpad names libraries by
/// their `DT_SONAME`: `libc.so.6`), or whose path holds no file of its
/// build-id here, is looked for: the directories of the dump's other
/// modules, then the usual library directories.
const LIBRARY_DIRS: [&str; 10] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/lib64",
];

/// Gives each module whose path (the dump's, under the sysroot if any) has
/// no file of the module's build-id the path of a file of the same name
/// that has it, found in [`LIBRARY_DIRS`] or beside the dump's other
/// modules. A module without a build-id is left as it is: nothing would
/// tell another file of that name from the right one.
fn find_by_name(mods: &mut [Module], lookup: &Lookup) {
    let matches = |path: &Path, id: &[u8]| {
        files::map_file(path)
            .ok()
            .is_some_and(|d| files::build_id(&d).as_deref() == Some(id))
    };
    let mut dirs: Vec<String> = mods
        .iter()
        .filter_map(|m| Some(m.name.rsplit_once('/')?.0.to_string()))
        .filter(|d| d.starts_with('/'))
        .collect();
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    // A process maps libraries from a handful of directories: a dump
    // naming hundreds is not worth a search of each for every module.
    dirs.truncate(32);
    dirs.extend(
        LIBRARY_DIRS
            .iter()
            .map(|d| d.to_string())
            .filter(|d| seen.insert(d.clone())),
    );
    for m in mods.iter_mut() {
        let Some(id) = m.build_id.clone().filter(|id| !id.is_empty()) else {
            continue;
        };
        if m.name.starts_with('[') || lookup.candidates(&m.name).iter().any(|c| matches(c, &id)) {
            continue;
        }
        let base = m.name.rsplit('/').next().unwrap_or(&m.name).to_string();
        if base.is_empty() {
            continue;
        }
        let found = dirs.iter().find_map(|d| {
            let path = format!("{d}/{base}");
            lookup
                .candidates(&path)
                .iter()
                .any(|c| matches(c, &id))
                .then_some(path)
        });
        if let Some(path) = found {
            for mp in m.mappings.iter_mut() {
                mp.path = path.clone();
            }
            m.name = path;
        }
    }
}

/// This process's vDSO image, read through `AT_SYSINFO_EHDR`.
#[cfg(target_os = "linux")]
fn own_vdso() -> Option<Vec<u8>> {
    // SAFETY: getauxval only reads the auxiliary vector.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if base == 0 {
        return None;
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let m = maps
        .lines()
        .filter_map(parse_maps_line)
        .find(|m| m.start == base && m.path == "[vdso]")?;
    let len = usize::try_from(m.end - m.start).ok()?;
    // SAFETY: the vDSO is mapped readable for the life of the process, at
    // `base` for `len` bytes (its maps line says so).
    let bytes = unsafe { std::slice::from_raw_parts(base as *const u8, len) };
    Some(bytes.to_vec())
}

#[cfg(not(target_os = "linux"))]
fn own_vdso() -> Option<Vec<u8>> {
    None
}

/// The memory of a minidump, read by the unwinder.
pub type MinidumpMemory<'a> = super::TargetMemory<'a, Minidump>;

impl super::ReadTarget for Minidump {
    fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
        Minidump::read_bytes(self, addr, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(streams: &[(u32, u32, u32)]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&SIGNATURE.to_le_bytes());
        v.extend_from_slice(&(VERSION as u32).to_le_bytes());
        v.extend_from_slice(&(streams.len() as u32).to_le_bytes());
        v.extend_from_slice(&32u32.to_le_bytes());
        v.resize(32, 0);
        for (k, size, rva) in streams {
            for w in [k, size, rva] {
                v.extend_from_slice(&w.to_le_bytes());
            }
        }
        v
    }

    #[test]
    fn list_start_checks_the_count() {
        assert_eq!(list_start(4 + 48, 1, 48), Some(4));
        assert_eq!(list_start(8 + 48, 1, 48), Some(8));
        assert_eq!(list_start(4 + 47, 1, 48), None);
        assert_eq!(list_start(100, u64::MAX, 48), None);
        assert_eq!(list_start(0, 0, 48), None);
    }

    #[test]
    fn huge_thread_count_is_an_error() {
        let mut v = header(&[(stream::THREAD_LIST, 4 + 48, 44)]);
        v.extend_from_slice(&1_000_000u32.to_le_bytes());
        v.resize(44 + 52, 0);
        let e = parse(&v).unwrap_err().to_string();
        assert!(e.contains("claims 1000000 threads"), "{e}");
    }

    #[test]
    fn x86_64_context_registers_by_dwarf_number() {
        let mut ctx = vec![0u8; 1232];
        ctx[48..52].copy_from_slice(&(CONTEXT_AMD64 | 0xf).to_le_bytes());
        // rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8..r15 from 120, rip at 248.
        for i in 0..16u64 {
            let at = 120 + 8 * i as usize;
            ctx[at..at + 8].copy_from_slice(&(0x1000 + i).to_le_bytes());
        }
        ctx[248..256].copy_from_slice(&0x4242u64.to_le_bytes());
        assert_eq!(context_arch(&ctx), Some(Machine::X86_64));
        let r = registers_from_context(Machine::X86_64, &ctx).unwrap();
        assert_eq!(r.get(0), Some(0x1000)); // rax
        assert_eq!(r.get(2), Some(0x1001)); // rcx
        assert_eq!(r.get(1), Some(0x1002)); // rdx
        assert_eq!(r.sp(), Some(0x1004));
        assert_eq!(r.fp(), Some(0x1005));
        assert_eq!(r.get(15), Some(0x100f));
        assert_eq!(r.pc(), Some(0x4242));
        assert!(registers_from_context(Machine::X86_64, &ctx[..250]).is_none());
    }

    #[test]
    fn aarch64_contexts_both_layouts() {
        for old in [false, true] {
            let mut ctx = vec![0u8; 912];
            if old {
                ctx[0..8].copy_from_slice(&(CONTEXT_ARM64_OLD | 3).to_le_bytes());
            } else {
                ctx[0..4].copy_from_slice(&(CONTEXT_ARM64 | 3).to_le_bytes());
            }
            for i in 0..31u64 {
                let at = 8 + 8 * i as usize;
                ctx[at..at + 8].copy_from_slice(&(0x2000 + i).to_le_bytes());
            }
            ctx[256..264].copy_from_slice(&0x7ff0u64.to_le_bytes());
            ctx[264..272].copy_from_slice(&0x4000u64.to_le_bytes());
            assert_eq!(context_arch(&ctx), Some(Machine::Aarch64), "old {old}");
            let r = registers_from_context(Machine::Aarch64, &ctx).unwrap();
            assert_eq!(r.fp(), Some(0x2000 + 29));
            assert_eq!(r.get(30), Some(0x2000 + 30));
            assert_eq!(r.sp(), Some(0x7ff0));
            assert_eq!(r.pc(), Some(0x4000));
        }
    }

    #[test]
    fn maps_lines_and_strings() {
        let m = parse_maps_line("7f00-7f80 r-xp 00001000 08:01 42   /usr/lib/a b.so").unwrap();
        assert_eq!((m.start, m.end, m.file_offset), (0x7f00, 0x7f80, 0x1000));
        assert_eq!(m.path, "/usr/lib/a b.so");
        assert_eq!(m.executable, Some(true));
        assert!(parse_maps_line("80-70 r-xp 0 0:0 0").is_none());
        let mut v = vec![6, 0, 0, 0];
        v.extend("a/b".encode_utf16().flat_map(|u| u.to_le_bytes()));
        assert_eq!(read_string(&Bytes(&v), 0).as_deref(), Some("a/b"));
        v[0] = 200; // longer than the file
        assert_eq!(read_string(&Bytes(&v), 0), None);
    }
}
