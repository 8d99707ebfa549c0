//! ELF core files: threads from `NT_PRSTATUS`, the process name from
//! `NT_PRPSINFO`, mapped files from `NT_FILE`, the auxiliary vector from
//! `NT_AUXV`, memory from `PT_LOAD` (and, for read-only file-backed
//! segments the core left out, from the mapped file itself).
//!
//! Parsing never panics: a truncated or corrupt core gives a
//! [`RemoteError::BadCore`] when nothing can be had, and otherwise as much as
//! can be read plus a warning per problem in [`Snapshot::warnings`].

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};
use object::{Endianness, FileKind};
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use super::files::{self, Lookup};
use super::{Machine, Mapping, Module, RemoteError, Snapshot, Thread};

/// `AT_PHDR`: address of the executable's program headers.
pub const AT_PHDR: u64 = 3;
/// `AT_ENTRY`: the executable's entry point.
pub const AT_ENTRY: u64 = 9;
/// `AT_SYSINFO_EHDR`: address of the vDSO's ELF header.
pub const AT_SYSINFO_EHDR: u64 = 33;
/// `AT_EXECFN`: address of the executable's path as given to `execve`.
pub const AT_EXECFN: u64 = 31;
/// `NT_SIGINFO`: the `siginfo_t` of the signal that dumped the core.
pub const NT_SIGINFO: u32 = 0x5349_4749;

/// The signal that ended the process, from the core's notes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreSignal {
    /// The signal number (`pr_cursig` of the first `NT_PRSTATUS`), in the
    /// target architecture's numbering.
    pub number: u32,
    /// `si_code` of `NT_SIGINFO`, when the core has one for this signal.
    pub code: Option<i32>,
    /// The faulting address (`si_addr`) of a fault signal (`SIGSEGV`,
    /// `SIGBUS`, `SIGILL`, `SIGFPE`, `SIGTRAP`), when `NT_SIGINFO` gives it.
    pub address: Option<u64>,
    /// The thread that received it: the first `NT_PRSTATUS` note's.
    pub tid: u32,
}

/// Name and description (as gdb words them) of the signals numbered alike
/// on x86-64, AArch64 and ARM, from 1.
const SIGNALS: [(&str, &str); 31] = [
    ("SIGHUP", "Hangup"),
    ("SIGINT", "Interrupt"),
    ("SIGQUIT", "Quit"),
    ("SIGILL", "Illegal instruction"),
    ("SIGTRAP", "Trace/breakpoint trap"),
    ("SIGABRT", "Aborted"),
    ("SIGBUS", "Bus error"),
    ("SIGFPE", "Arithmetic exception"),
    ("SIGKILL", "Killed"),
    ("SIGUSR1", "User defined signal 1"),
    ("SIGSEGV", "Segmentation fault"),
    ("SIGUSR2", "User defined signal 2"),
    ("SIGPIPE", "Broken pipe"),
    ("SIGALRM", "Alarm clock"),
    ("SIGTERM", "Terminated"),
    ("SIGSTKFLT", "Stack fault"),
    ("SIGCHLD", "Child status changed"),
    ("SIGCONT", "Continued"),
    ("SIGSTOP", "Stopped (signal)"),
    ("SIGTSTP", "Stopped (user)"),
    ("SIGTTIN", "Stopped (tty input)"),
    ("SIGTTOU", "Stopped (tty output)"),
    ("SIGURG", "Urgent I/O condition"),
    ("SIGXCPU", "CPU time limit exceeded"),
    ("SIGXFSZ", "File size limit exceeded"),
    ("SIGVTALRM", "Virtual timer expired"),
    ("SIGPROF", "Profiling timer expired"),
    ("SIGWINCH", "Window size changed"),
    ("SIGIO", "I/O possible"),
    ("SIGPWR", "Power fail/restart"),
    ("SIGSYS", "Bad system call"),
];

/// MIPS numbers its signals differently from 7 on: the index into
/// [`SIGNALS`] of each MIPS number from 1 (`None`: SIGEMT, absent there).
const MIPS_SIGNALS: [Option<usize>; 31] = [
    Some(0),
    Some(1),
    Some(2),
    Some(3),
    Some(4),
    Some(5),
    None,
    Some(7),
    Some(8),
    Some(6),
    Some(10),
    Some(30),
    Some(12),
    Some(13),
    Some(14),
    Some(9),
    Some(11),
    Some(16),
    Some(29),
    Some(27),
    Some(22),
    Some(28),
    Some(18),
    Some(19),
    Some(17),
    Some(20),
    Some(21),
    Some(25),
    Some(26),
    Some(23),
    Some(24),
];

impl CoreSignal {
    /// The signal's name (`SIGSEGV`) and description (`Segmentation
    /// fault`) on `arch`; `None` for a number without one (real-time
    /// signals, or unknown).
    pub fn name(&self, arch: Machine) -> Option<(&'static str, &'static str)> {
        let i = (self.number as usize).checked_sub(1)?;
        let k = match arch {
            Machine::Mips => (*MIPS_SIGNALS.get(i)?)?,
            _ => i,
        };
        if arch == Machine::Mips && i == 6 {
            return Some(("SIGEMT", "Emulation trap"));
        }
        SIGNALS.get(k).copied()
    }
}

/// Where [`CoreFile::executable`] found the executable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExeSource {
    /// Given by the caller (the command line).
    Given,
    /// The `NT_FILE` mapping holding `AT_PHDR`/`AT_ENTRY` (or the first
    /// mapping when the auxiliary vector does not say).
    NtFile,
    /// The path at `AT_EXECFN`, read from the core's memory.
    AtExecfn,
    /// The first word of `pr_psargs` (`NT_PRPSINFO`).
    Psargs,
    /// A minidump's module list: the module holding the entry point, else
    /// the list's first (see [`super::minidump::Minidump::executable`]).
    ModuleList,
}

impl ExeSource {
    /// A short name for messages and JSON (`given`, `nt_file`, `at_execfn`,
    /// `psargs`, `module_list`).
    pub fn as_str(self) -> &'static str {
        match self {
            ExeSource::Given => "given",
            ExeSource::NtFile => "nt_file",
            ExeSource::AtExecfn => "at_execfn",
            ExeSource::Psargs => "psargs",
            ExeSource::ModuleList => "module_list",
        }
    }
}

/// The executable of a core: the path the target saw and the file used.
#[derive(Clone, Debug)]
pub struct CoreExecutable {
    /// The path as the target saw it (or as given).
    pub name: String,
    /// The file on disk that was used, if one was found and matched.
    pub file: Option<std::path::PathBuf>,
    /// How it was found.
    pub source: ExeSource,
}

enum Bytes {
    Map(memmap2::Mmap),
    Vec(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Vec(v) => v,
        }
    }
}

/// A `PT_LOAD` segment of the core.
#[derive(Clone, Copy, Debug)]
struct Segment {
    vaddr: u64,
    memsz: u64,
    offset: u64,
    /// Bytes present in the core (clipped to the file's end).
    filesz: u64,
    /// `PF_X`: the segment held code.
    executable: bool,
    /// `p_flags` (`PF_R` 4, `PF_W` 2, `PF_X` 1).
    flags: u32,
}

/// A `PT_LOAD` segment of a core: a mapping of the dumped process, whether
/// or not the core holds its bytes ([`CoreFile::load_segments`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Bytes of it the core holds, from `start` (0: only the mapping is
    /// recorded, such as a file's unchanged code left out by the kernel).
    pub in_core: u64,
    /// `p_flags`: `PF_R` (4), `PF_W` (2), `PF_X` (1).
    pub flags: u32,
}

/// A file-backed mapping whose file was found: reads that the core cannot
/// answer go to it.
struct FileBacked {
    start: u64,
    end: u64,
    file_offset: u64,
    data: Arc<memmap2::Mmap>,
}

/// What the notes and program headers of a core say, before any file on
/// disk is looked at. [`parse`] produces it from bytes alone (the fuzz
/// target's entry point).
#[derive(Debug, Default)]
pub struct ParsedCore {
    /// The architecture (`None` when `e_machine` is unknown here).
    pub arch: Option<Machine>,
    /// `e_machine`.
    pub e_machine: u16,
    /// Whether the core is 64-bit.
    pub is_64: bool,
    /// The process id (`NT_PRPSINFO`, or the first thread).
    pub pid: u32,
    /// `pr_fname` of `NT_PRPSINFO`.
    pub process_name: Option<String>,
    /// `pr_psargs` of `NT_PRPSINFO`: the command line, truncated to 80 bytes.
    pub psargs: Option<String>,
    /// The signal that ended the process, when the core records one
    /// (`pr_cursig` is 0 in a core written by `gcore` of a running process).
    pub signal: Option<CoreSignal>,
    /// `(si_signo, si_code, si_addr)` of `NT_SIGINFO`.
    siginfo: Option<(u32, i32, Option<u64>)>,
    /// Threads, in note order.
    pub threads: Vec<Thread>,
    /// `NT_FILE` entries.
    pub mappings: Vec<Mapping>,
    /// `NT_AUXV` as (type, value) pairs.
    pub auxv: Vec<(u64, u64)>,
    /// Problems, one sentence each.
    pub warnings: Vec<String>,
    /// The descriptor of every `NT_PRSTATUS` note, in note order.
    pub prstatus_notes: Vec<Vec<u8>>,
    segments: Vec<Segment>,
}

/// Parses the headers and notes of a core held in memory. Never panics.
pub fn parse(data: &[u8]) -> Result<ParsedCore, RemoteError> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf64) => parse_of::<elf::FileHeader64<Endianness>>(data, true),
        Ok(FileKind::Elf32) => parse_of::<elf::FileHeader32<Endianness>>(data, false),
        Ok(k) => Err(RemoteError::BadCore(format!(
            "not an ELF core file (a {k:?} file)"
        ))),
        Err(_) if data.len() < 64 => Err(RemoteError::BadCore(format!(
            "not an ELF core file: only {} bytes",
            data.len()
        ))),
        Err(_) => Err(RemoteError::BadCore(
            "not an ELF core file (no ELF header)".into(),
        )),
    }
}

fn parse_of<Elf: FileHeader<Endian = Endianness>>(
    data: &[u8],
    is_64: bool,
) -> Result<ParsedCore, RemoteError> {
    let bad = |s: &str| RemoteError::BadCore(s.to_string());
    let need = std::mem::size_of::<Elf>();
    if data.len() < need {
        return Err(bad(&format!(
            "truncated core: {} bytes, shorter than an ELF header ({need} bytes)",
            data.len()
        )));
    }
    let hdr = Elf::parse(data).map_err(|e| bad(&format!("corrupt ELF header: {e}")))?;
    let endian = hdr
        .endian()
        .map_err(|e| bad(&format!("corrupt ELF header: {e}")))?;
    if hdr.e_type(endian) != elf::ET_CORE {
        return Err(bad(&format!(
            "not a core file: ELF type {} (a core has type ET_CORE, 4)",
            hdr.e_type(endian)
        )));
    }
    let mut out = ParsedCore {
        e_machine: hdr.e_machine(endian).0,
        is_64,
        ..Default::default()
    };
    out.arch = Machine::from_elf(out.e_machine, is_64);
    let phdrs = hdr.program_headers(endian, data).map_err(|_| {
        bad("truncated or corrupt core: its program headers lie beyond the end of the file")
    })?;
    if phdrs.is_empty() {
        return Err(bad("corrupt core: no program headers"));
    }
    let mut missing = 0u64;
    let mut notes_seen = false;
    for ph in phdrs {
        let p_type = ph.p_type(endian);
        if p_type == elf::PT_LOAD {
            let offset: u64 = ph.p_offset(endian).into();
            let filesz: u64 = ph.p_filesz(endian).into();
            let avail = (data.len() as u64).saturating_sub(offset).min(filesz);
            missing = missing.saturating_add(filesz - avail);
            out.segments.push(Segment {
                vaddr: ph.p_vaddr(endian).into(),
                memsz: ph.p_memsz(endian).into(),
                offset,
                filesz: avail,
                executable: ph.p_flags(endian).0 & elf::PF_X.0 != 0,
                flags: ph.p_flags(endian).0,
            });
        } else if p_type == elf::PT_NOTE {
            notes_seen = true;
            let offset: u64 = ph.p_offset(endian).into();
            let filesz: u64 = ph.p_filesz(endian).into();
            if offset.saturating_add(filesz) > data.len() as u64 {
                out.warnings.push(
                    "core is truncated inside its notes: some threads or mappings are missing"
                        .into(),
                );
            }
            let start = (offset as usize).min(data.len());
            let end = (offset.saturating_add(filesz) as usize).min(data.len());
            read_notes::<Elf>(endian, &data[start..end], ph.p_align(endian), &mut out);
        }
    }
    if missing > 0 {
        out.warnings.push(format!(
            "core is truncated: {missing} bytes of memory segments are missing; frames there are lost"
        ));
    }
    if !notes_seen {
        out.warnings
            .push("core has no notes: no threads or registers".into());
    }
    out.segments.sort_by_key(|s| s.vaddr);
    if out.pid == 0 {
        out.pid = out.threads.first().map(|t| t.tid).unwrap_or(0);
    }
    if let Some(sig) = out.signal.as_mut() {
        if let Some((signo, code, addr)) = out.siginfo {
            if signo == sig.number {
                sig.code = Some(code);
                sig.address = addr;
            }
        }
    }
    for t in out.threads.iter_mut() {
        let sp = t.registers.sp().unwrap_or(0);
        t.stack_end = out
            .segments
            .iter()
            .find(|s| sp >= s.vaddr && sp < s.vaddr.saturating_add(s.memsz))
            .map(|s| s.vaddr.saturating_add(s.memsz));
    }
    if let Some(name) = &out.process_name {
        let pid = out.pid;
        for t in out.threads.iter_mut().filter(|t| t.tid == pid) {
            t.name = Some(name.clone());
        }
    }
    Ok(out)
}

fn read_notes<Elf: FileHeader<Endian = Endianness>>(
    endian: Endianness,
    data: &[u8],
    align: Elf::Word,
    out: &mut ParsedCore,
) {
    let Ok(mut it) = object::read::elf::NoteIterator::<Elf>::new(endian, align, data) else {
        out.warnings.push("corrupt note segment: ignored".into());
        return;
    };
    loop {
        let note = match it.next() {
            Ok(Some(n)) => n,
            Ok(None) => break,
            Err(e) => {
                out.warnings.push(format!(
                    "corrupt note in the core ({e}): the notes after it are ignored"
                ));
                break;
            }
        };
        let desc = note.desc();
        let name = note.name();
        let core_name = name == elf::ELF_NOTE_CORE || name == elf::ELF_NOTE_LINUX;
        if !core_name {
            continue;
        }
        let t = note.n_type(endian);
        if t == elf::NT_PRSTATUS {
            out.prstatus_notes.push(desc.to_vec());
            read_prstatus(desc, endian, out);
        } else if t == elf::NT_PRPSINFO {
            read_prpsinfo(desc, endian, out);
        } else if t.0 == NT_SIGINFO && out.siginfo.is_none() {
            read_siginfo(desc, endian, out);
        } else if t == elf::NT_AUXV {
            let w = if out.is_64 { 8 } else { 4 };
            let words: Vec<u64> = desc.chunks_exact(w).map(|c| word(c, endian)).collect();
            out.auxv = words
                .chunks_exact(2)
                .map(|p| (p[0], p[1]))
                .take_while(|p| p.0 != 0)
                .collect();
        } else if t == elf::NT_FILE {
            if let Err(e) = read_nt_file(desc, endian, out) {
                out.warnings.push(format!(
                    "corrupt NT_FILE note ({e}): mapped files may be missing"
                ));
            }
        }
    }
}

fn word(b: &[u8], endian: Endianness) -> u64 {
    match (b.len(), endian) {
        (8, Endianness::Little) => u64::from_le_bytes(b.try_into().unwrap()),
        (8, Endianness::Big) => u64::from_be_bytes(b.try_into().unwrap()),
        (4, Endianness::Little) => u32::from_le_bytes(b.try_into().unwrap()) as u64,
        (4, Endianness::Big) => u32::from_be_bytes(b.try_into().unwrap()) as u64,
        _ => 0,
    }
}

fn read_prstatus(desc: &[u8], endian: Endianness, out: &mut ParsedCore) {
    let Some(arch) = out.arch else {
        if out.threads.is_empty() && !out.warnings.iter().any(|w| w.contains("e_machine")) {
            out.warnings.push(format!(
                "no register layout for e_machine {}: threads cannot be unwound",
                out.e_machine
            ));
        }
        return;
    };
    let Some(layout) = arch.prstatus_layout() else {
        if !out.warnings.iter().any(|w| w.contains("register layout")) {
            out.warnings.push(format!(
                "no NT_PRSTATUS register layout for {arch:?} yet: threads cannot be unwound"
            ));
        }
        return;
    };
    if desc.len() < layout.regs_offset {
        out.warnings.push(format!(
            "NT_PRSTATUS note too short ({} bytes): thread skipped",
            desc.len()
        ));
        return;
    }
    let tid = word(&desc[layout.pid_offset..layout.pid_offset + 4], endian) as u32;
    // `struct elf_prstatus` starts alike everywhere: `struct elf_siginfo`
    // (three ints), then `short pr_cursig`. The first note is the thread
    // that received the signal.
    if out.prstatus_notes.len() == 1 && desc.len() >= 14 {
        let cursig = match endian {
            Endianness::Little => u16::from_le_bytes([desc[12], desc[13]]),
            Endianness::Big => u16::from_be_bytes([desc[12], desc[13]]),
        };
        if cursig != 0 {
            out.signal = Some(CoreSignal {
                number: cursig as u32,
                code: None,
                address: None,
                tid,
            });
        }
    }
    match arch.registers_from_user_regs(&desc[layout.regs_offset..]) {
        Some(registers) => out.threads.push(Thread {
            tid,
            name: None,
            registers,
            stack_end: None,
        }),
        None => out.warnings.push(format!(
            "NT_PRSTATUS of thread {tid} too short for its registers: thread skipped"
        )),
    }
}

fn read_prpsinfo(desc: &[u8], endian: Endianness, out: &mut ParsedCore) {
    // 64-bit `struct elf_prpsinfo`: pr_pid at 24, pr_fname[16] at 40.
    if !out.is_64 || desc.len() < 56 {
        return;
    }
    out.pid = word(&desc[24..28], endian) as u32;
    let fname = &desc[40..56];
    let len = fname.iter().position(|&b| b == 0).unwrap_or(16);
    out.process_name = Some(String::from_utf8_lossy(&fname[..len]).into_owned());
    // pr_psargs[80] at 56.
    if let Some(args) = desc.get(56..136) {
        let len = args.iter().position(|&b| b == 0).unwrap_or(args.len());
        let text = String::from_utf8_lossy(&args[..len]).trim_end().to_string();
        if !text.is_empty() {
            out.psargs = Some(text);
        }
    }
}

/// `si_signo`, `si_code` and, for a fault signal, `si_addr` of a `siginfo_t`.
fn read_siginfo(desc: &[u8], endian: Endianness, out: &mut ParsedCore) {
    if desc.len() < 12 {
        return;
    }
    let signo = word(&desc[0..4], endian) as u32;
    let code = word(&desc[8..12], endian) as u32 as i32;
    // The union follows the three ints, aligned to a pointer.
    let (off, w) = if out.is_64 { (16, 8) } else { (12, 4) };
    // SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV in the generic numbering
    // (MIPS shares these five numbers except SIGBUS, 10 there).
    let fault = match out.arch {
        Some(Machine::Mips) => matches!(signo, 4 | 5 | 8 | 10 | 11),
        _ => matches!(signo, 4 | 5 | 7 | 8 | 11),
    };
    let addr = if fault {
        desc.get(off..off + w).map(|b| word(b, endian))
    } else {
        None
    };
    out.siginfo = Some((signo, code, addr));
}

fn read_nt_file(desc: &[u8], endian: Endianness, out: &mut ParsedCore) -> Result<(), String> {
    let w = if out.is_64 { 8 } else { 4 };
    let get = |i: usize| -> Result<u64, String> {
        desc.get(i * w..i * w + w)
            .map(|b| word(b, endian))
            .ok_or_else(|| "truncated".to_string())
    };
    let count = get(0)? as usize;
    let page = get(1)?;
    if count > desc.len() / (3 * w) {
        return Err(format!(
            "{count} entries cannot fit in {} bytes",
            desc.len()
        ));
    }
    let mut names = desc
        .get((2 + 3 * count) * w..)
        .ok_or("truncated")?
        .split(|&b| b == 0);
    for i in 0..count {
        let (start, end, pgoff) = (get(2 + 3 * i)?, get(3 + 3 * i)?, get(4 + 3 * i)?);
        let name = names.next().ok_or("fewer names than entries")?;
        if end < start {
            return Err(format!("entry {i} ends before it starts"));
        }
        out.mappings.push(Mapping {
            start,
            end,
            file_offset: pgoff.saturating_mul(page),
            path: String::from_utf8_lossy(name).into_owned(),
            executable: None,
        });
    }
    Ok(())
}

/// An opened core file: its snapshot and its memory.
pub struct CoreFile {
    data: Bytes,
    segments: Vec<Segment>,
    file_backed: Vec<FileBacked>,
    snapshot: Snapshot,
    auxv: Vec<(u64, u64)>,
    prstatus_notes: Vec<Vec<u8>>,
    size: u64,
    psargs: Option<String>,
    signal: Option<CoreSignal>,
    executable: Option<CoreExecutable>,
    e_machine: u16,
}

impl CoreFile {
    /// Opens the core at `path`. `exe` is the executable from the command
    /// line: it stands for the executable's mapping (and is the whole map
    /// when the core has no `NT_FILE` note).
    pub fn open(path: &Path, exe: Option<&Path>, lookup: &Lookup) -> Result<CoreFile, RemoteError> {
        let f = std::fs::File::open(path).map_err(|e| RemoteError::Io(path.into(), e))?;
        // SAFETY: read-only mapping of a core file; it is not written while we read it.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| RemoteError::Io(path.into(), e))?;
        Self::from_bytes(Bytes::Map(map), exe, lookup)
    }

    /// Opens a core held in memory (tests, fuzzing).
    pub fn from_vec(
        data: Vec<u8>,
        exe: Option<&Path>,
        lookup: &Lookup,
    ) -> Result<CoreFile, RemoteError> {
        Self::from_bytes(Bytes::Vec(data), exe, lookup)
    }

    fn from_bytes(
        data: Bytes,
        exe: Option<&Path>,
        lookup: &Lookup,
    ) -> Result<CoreFile, RemoteError> {
        let parsed = parse(&data)?;
        let arch = parsed.arch.ok_or_else(|| {
            RemoteError::UnsupportedArch(format!("ELF machine {}", parsed.e_machine))
        })?;
        let mut core = CoreFile {
            size: data.len() as u64,
            data,
            segments: parsed.segments,
            file_backed: Vec::new(),
            auxv: parsed.auxv,
            prstatus_notes: parsed.prstatus_notes,
            psargs: parsed.psargs,
            signal: parsed.signal,
            executable: None,
            e_machine: parsed.e_machine,
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
        core.find_modules(parsed.mappings, exe, lookup);
        core.snapshot.anon_code = core
            .executable_segments()
            .into_iter()
            .filter(|(a, b)| {
                let end = a.saturating_add(b.len() as u64);
                !core
                    .snapshot
                    .modules
                    .iter()
                    .any(|m| *a < m.end && end > m.start)
            })
            .map(|(a, b)| (a, Arc::new(b.to_vec())))
            .collect();
        Ok(core)
    }

    fn auxv_value(&self, t: u64) -> Option<u64> {
        self.auxv.iter().find(|p| p.0 == t).map(|p| p.1)
    }

    fn find_modules(&mut self, mappings: Vec<Mapping>, exe: Option<&Path>, lookup: &Lookup) {
        let mut warnings = std::mem::take(&mut self.snapshot.warnings);
        let mut mods = files::group_mappings(&mappings);
        let entry = self.auxv_value(AT_ENTRY).or(self.auxv_value(AT_PHDR));
        if mods.is_empty() {
            // No NT_FILE (qemu-user cores, some static executables): the
            // executable is the map, from the command line or, failing
            // that, from AT_EXECFN or the command line in NT_PRPSINFO.
            let found = match exe {
                Some(exe) => Some((
                    exe.to_path_buf(),
                    exe.display().to_string(),
                    ExeSource::Given,
                )),
                None => self.find_executable(lookup, &mut warnings),
            };
            if let Some((path, name, source)) = found {
                let m = self.exe_module(&path, &mut warnings);
                self.executable = Some(CoreExecutable {
                    name,
                    file: m.as_ref().and_then(|m| m.file.clone()),
                    source,
                });
                mods.extend(m);
            }
        } else {
            // Build-ids from the first page of each mapped object, when dumped.
            for m in mods.iter_mut() {
                let mut page = vec![0u8; 4096];
                if self.read_bytes(m.start, &mut page) {
                    m.build_id = files::build_id(&page);
                }
            }
            let exe_name = entry
                .and_then(|a| mods.iter().find(|m| m.contains(a)))
                .or(mods.first())
                .map(|m| m.name.clone());
            let exe_arg = match (exe, &exe_name) {
                (Some(p), Some(n)) => Some((p, n.as_str())),
                _ => None,
            };
            files::resolve_files(&mut mods, lookup, exe_arg, &mut warnings);
            if let Some(name) = exe_name {
                let m = mods.iter().find(|m| m.name == name);
                self.executable = Some(CoreExecutable {
                    file: m.and_then(|m| m.file.clone()),
                    name,
                    source: if exe.is_some() {
                        ExeSource::Given
                    } else {
                        ExeSource::NtFile
                    },
                });
            }
        }
        // The vDSO, from the core's own memory.
        if let Some(vdso) = self.auxv_value(AT_SYSINFO_EHDR) {
            // The image is what the core holds of the segment from `vdso`
            // on (nothing when `vdso` lies past the dumped bytes).
            let seg_end = |seg: &Segment| seg.vaddr.saturating_add(seg.filesz);
            if let Some(seg) = self.segment_at(vdso).filter(|s| vdso < seg_end(s)) {
                let end = seg_end(seg);
                let mut image = vec![0u8; (end - vdso) as usize];
                if self.read_bytes(vdso, &mut image) {
                    let mapping = Mapping {
                        start: vdso,
                        end,
                        file_offset: 0,
                        path: "[vdso]".into(),
                        executable: Some(true),
                    };
                    mods.push(files::image_module(mapping, Arc::new(image)));
                }
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
        self.snapshot.modules = mods;
        self.snapshot.warnings = warnings;
    }

    /// The executable of a core without `NT_FILE` and without one given:
    /// the path at `AT_EXECFN`, else the first word of `pr_psargs`, each
    /// accepted only when it is an ELF file of the core's machine whose
    /// program headers equal those the core holds at `AT_PHDR` (when the
    /// core holds them). Returns (file, the path the target saw, source).
    fn find_executable(
        &self,
        lookup: &Lookup,
        warnings: &mut Vec<String>,
    ) -> Option<(std::path::PathBuf, String, ExeSource)> {
        let mut tried: Vec<(String, ExeSource)> = Vec::new();
        if let Some(s) = self
            .auxv_value(AT_EXECFN)
            .and_then(|a| self.read_c_string(a))
        {
            tried.push((s, ExeSource::AtExecfn));
        }
        if let Some(first) = self
            .psargs
            .as_deref()
            .and_then(|a| a.split_whitespace().next())
        {
            if !tried.iter().any(|t| t.0 == first) {
                tried.push((first.to_string(), ExeSource::Psargs));
            }
        }
        for (name, source) in &tried {
            for c in lookup.candidates(name) {
                if self.is_the_executable(&c) {
                    return Some((c, name.clone(), *source));
                }
            }
        }
        let names: Vec<&str> = tried.iter().map(|t| t.0.as_str()).collect();
        warnings.push(if names.is_empty() {
            "core has no NT_FILE note and names no executable: give the executable on the command line (callstack core EXE CORE); frames are unnamed".into()
        } else {
            format!(
                "core has no NT_FILE note and its executable ({}) was not found or does not match the core: give it on the command line (callstack core EXE CORE); frames are unnamed",
                names.join(", ")
            )
        });
        None
    }

    /// A NUL-terminated string of the target's memory (at most 4 KiB).
    fn read_c_string(&self, addr: u64) -> Option<String> {
        let mut out = Vec::new();
        let mut b = [0u8; 1];
        while out.len() < 4096 {
            if !self.read_bytes(addr.checked_add(out.len() as u64)?, &mut b) {
                return None;
            }
            if b[0] == 0 {
                return (!out.is_empty()).then(|| String::from_utf8_lossy(&out).into_owned());
            }
            out.push(b[0]);
        }
        None
    }

    /// Whether `path` is an ELF executable for this core: same machine and,
    /// when the core holds the program headers at `AT_PHDR`, the same ones.
    fn is_the_executable(&self, path: &Path) -> bool {
        let Ok(data) = files::map_file(path) else {
            return false;
        };
        let Some(h) = elf_header(&data) else {
            return false;
        };
        if h.machine != self.e_machine {
            return false;
        }
        let Some(at_phdr) = self.auxv_value(AT_PHDR) else {
            return true;
        };
        let len = h.phentsize as usize * h.phnum as usize;
        let Some(want) = slice_at(&data, h.phoff, len) else {
            return false;
        };
        let mut have = vec![0u8; len];
        if !self.read_bytes(at_phdr, &mut have) {
            // The core does not hold them: nothing to check against.
            return true;
        }
        have == want
    }

    /// The executable as the only module, placed by the auxiliary vector.
    fn exe_module(&self, exe: &Path, warnings: &mut Vec<String>) -> Option<Module> {
        let data = match files::map_file(exe) {
            Ok(d) => d,
            Err(e) => {
                warnings.push(format!("{}: {e}: frames are unnamed", exe.display()));
                return None;
            }
        };
        let Some((_, segs)) = files::load_segments(&data) else {
            warnings.push(format!(
                "{}: not an ELF file: frames are unnamed",
                exe.display()
            ));
            return None;
        };
        let e_entry = object::read::File::parse(&data[..])
            .ok()
            .map(|f| object::Object::entry(&f));
        let bias = match (self.auxv_value(AT_ENTRY), e_entry) {
            (Some(at), Some(e)) => at.wrapping_sub(e),
            _ => 0,
        };
        let mappings: Vec<Mapping> = segs
            .iter()
            .map(|&(vaddr, off, filesz, _)| {
                let start = (bias.wrapping_add(vaddr)) & !4095;
                Mapping {
                    start,
                    end: bias.wrapping_add(vaddr).wrapping_add(filesz.max(1)),
                    file_offset: off & !4095,
                    path: exe.display().to_string(),
                    executable: None,
                }
            })
            .collect();
        let start = mappings.iter().map(|m| m.start).min()?;
        let end = mappings.iter().map(|m| m.end).max()?;
        Some(Module {
            name: exe.display().to_string(),
            file: Some(exe.to_path_buf()),
            debug_file: None,
            start,
            end,
            bias,
            build_id: files::build_id(&data),
            image: None,
            mappings,
        })
    }

    fn segment_at(&self, addr: u64) -> Option<&Segment> {
        let i = self.segments.partition_point(|s| s.vaddr <= addr);
        let s = self.segments.get(i.checked_sub(1)?)?;
        (addr < s.vaddr.saturating_add(s.memsz)).then_some(s)
    }

    /// Copies target memory at `addr` into `buf`; false when any byte is unknown.
    pub fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
        let len = buf.len() as u64;
        if let Some(s) = self.segment_at(addr) {
            let rel = addr - s.vaddr;
            // `filesz` is clipped to the file, but a segment can start past
            // its end (then `filesz` is 0): every index is checked.
            if rel.saturating_add(len) <= s.filesz {
                if let Some(src) = slice_at(&self.data, s.offset.saturating_add(rel), buf.len()) {
                    buf.copy_from_slice(src);
                    return true;
                }
            }
        }
        for f in &self.file_backed {
            if addr >= f.start && addr.saturating_add(len) <= f.end {
                let off = f.file_offset.saturating_add(addr - f.start);
                if let Some(src) = slice_at(&f.data, off, buf.len()) {
                    buf.copy_from_slice(src);
                    return true;
                }
            }
        }
        false
    }

    /// The signal that ended the process and the thread that received it,
    /// when the core records one (a kernel-written core of a crash does; a
    /// `gcore` of a running process does not).
    pub fn signal(&self) -> Option<&CoreSignal> {
        self.signal.as_ref()
    }

    /// The executable: the one given to [`CoreFile::open`], else the one
    /// found from the core (see [`ExeSource`]). `None` when neither.
    pub fn executable(&self) -> Option<&CoreExecutable> {
        self.executable.as_ref()
    }

    /// `pr_psargs` of `NT_PRPSINFO`: the command line (80 bytes at most).
    pub fn psargs(&self) -> Option<&str> {
        self.psargs.as_deref()
    }

    /// The threads, modules and warnings.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The auxiliary vector (`NT_AUXV`), as (type, value) pairs.
    pub fn auxv(&self) -> &[(u64, u64)] {
        &self.auxv
    }

    /// The raw descriptor of every `NT_PRSTATUS` note (`struct
    /// elf_prstatus`: signal, ids, times, then `pr_reg`, laid out per
    /// architecture), in note order: the kernel writes the thread that
    /// dumped first. Unlike [`Snapshot::threads`] this includes notes whose
    /// registers could not be decoded here, and keeps every field.
    ///
    /// For callers that decode the register block themselves, such as
    /// [`crate::unwind::insn::unwind_prstatus`]:
    ///
    /// ```no_run
    /// use callstack::remote::{corefile::CoreFile, Lookup};
    /// use callstack::unwind::Machine;
    /// use callstack::unwind::insn::{unwind_prstatus, Method, ModuleCode};
    /// let core = CoreFile::open("core".as_ref(), Some("./app".as_ref()), &Lookup::default())?;
    /// let desc = &core.prstatus_notes()[0];
    /// let stack_end = core.snapshot().threads[0].stack_end.unwrap_or(u64::MAX);
    /// let mut out = [(0u64, Method::Context); 64];
    /// let n = unwind_prstatus(
    ///     Machine::X86_64,
    ///     desc,
    ///     &mut core.memory(),
    ///     &mut ModuleCode::new(),
    ///     stack_end,
    ///     &mut out,
    /// );
    /// # let _ = n;
    /// # Ok::<(), callstack::remote::RemoteError>(())
    /// ```
    pub fn prstatus_notes(&self) -> &[Vec<u8>] {
        &self.prstatus_notes
    }

    /// The executable (`PF_X`) `PT_LOAD` segments whose bytes the core
    /// holds, as (address, bytes), by address: code that is in no file on
    /// disk (the vDSO, JIT code, qemu-user's signal trampolines).
    pub fn executable_segments(&self) -> Vec<(u64, &[u8])> {
        self.segments
            .iter()
            .filter(|s| s.executable && s.filesz > 0)
            .map(|s| {
                let off = s.offset as usize;
                (s.vaddr, &self.data[off..off + s.filesz as usize])
            })
            .collect()
    }

    /// Every `PT_LOAD` segment (the dumped process's mappings), by address.
    pub fn load_segments(&self) -> Vec<LoadSegment> {
        self.segments
            .iter()
            .map(|s| LoadSegment {
                start: s.vaddr,
                end: s.vaddr.saturating_add(s.memsz),
                in_core: s.filesz,
                flags: s.flags,
            })
            .collect()
    }

    /// Size of the core file in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// A reader of the core's memory for the unwinder.
    pub fn memory(&self) -> CoreMemory<'_> {
        super::TargetMemory(self)
    }
}

/// The ELF header fields [`CoreFile::is_the_executable`] checks.
struct ElfHeader {
    machine: u16,
    phoff: u64,
    phentsize: u16,
    phnum: u16,
}

/// Reads an ELF file's header (either class, either byte order).
fn elf_header(data: &[u8]) -> Option<ElfHeader> {
    if data.get(0..4)? != b"\x7fELF" {
        return None;
    }
    let endian = match data.get(5)? {
        1 => Endianness::Little,
        2 => Endianness::Big,
        _ => return None,
    };
    let u16_at = |o: usize| -> Option<u16> {
        let b = data.get(o..o + 2)?;
        Some(match endian {
            Endianness::Little => u16::from_le_bytes([b[0], b[1]]),
            Endianness::Big => u16::from_be_bytes([b[0], b[1]]),
        })
    };
    let (phoff, phentsize_at) = match data.get(4)? {
        2 => (word(data.get(32..40)?, endian), 54),
        1 => (word(data.get(28..32)?, endian), 42),
        _ => return None,
    };
    Some(ElfHeader {
        machine: u16_at(18)?,
        phoff,
        phentsize: u16_at(phentsize_at)?,
        phnum: u16_at(phentsize_at + 2)?,
    })
}

/// `len` bytes of `data` at `off`, if they all lie inside it.
fn slice_at(data: &[u8], off: u64, len: usize) -> Option<&[u8]> {
    let off = usize::try_from(off).ok()?;
    data.get(off..off.checked_add(len)?)
}

/// The memory of a core, read by the unwinder.
pub type CoreMemory<'a> = super::TargetMemory<'a, CoreFile>;

impl super::ReadTarget for CoreFile {
    fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
        CoreFile::read_bytes(self, addr, buf)
    }
}
