//! Minidumps of Windows x64 processes, in the native layout WinDbg,
//! `minidump-stackwalk` (rust-minidump) and Breakpad's processor read.
//!
//! This file is the format alone: [`assemble`] lays out what a collector
//! gathered ([`Dump`]) as a file. It is plain byte layout, built and unit
//! tested on every host; the collector that reads a crashed process
//! (`ReadProcessMemory`, `GetThreadContext`) is Windows-only
//! (`crash/windows_dump.rs`).
//!
//! | stream | what it holds |
//! |---|---|
//! | `ThreadList` | every thread: id, TEB, its `CONTEXT` (the x64 `CONTEXT` record as the kernel gives it, 1232 bytes, which is the format's `CONTEXT_AMD64`), and its stack from the stack pointer to the top of its committed region |
//! | `ModuleList` | every loaded image: base, size, checksum and timestamp from its PE header, its path, and its CodeView record (`RSDS`: GUID, age, PDB path) copied from the image's debug directory when it has one (mingw's `ld --build-id` writes one); otherwise none, and readers name the module by path, timestamp and size alone |
//! | `MemoryList` | the stacks, and 256 bytes around every thread's pc |
//! | `Exception` | the exception's code, flags, address and parameters, the thread and its `CONTEXT` at the fault |
//! | `SystemInfo` | AMD64, processor count, Windows NT and its version |
//! | `MiscInfo` | the process id |
//!
//! All offsets are little-endian; structures follow minidumpapiset.h
//! (`MINIDUMP_MODULE` is packed to 4 bytes: 108 bytes each).

/// One thread.
#[derive(Clone, Debug, Default)]
pub struct Thread {
    /// Its id.
    pub id: u32,
    /// Its TEB's address (0 when unknown).
    pub teb: u64,
    /// Its `CONTEXT` (an x64 `CONTEXT`, [`CONTEXT_SIZE`] bytes).
    pub context: Vec<u8>,
    /// Its stack's lowest address copied, and the bytes from there.
    pub stack: (u64, Vec<u8>),
}

/// One loaded image.
#[derive(Clone, Debug, Default)]
pub struct Module {
    /// Where it is mapped.
    pub base: u64,
    /// `SizeOfImage`.
    pub size: u32,
    /// `CheckSum` of its optional header.
    pub checksum: u32,
    /// `TimeDateStamp` of its file header.
    pub timestamp: u32,
    /// Its path.
    pub name: String,
    /// Its CodeView record (`RSDS`...), empty for none.
    pub cv: Vec<u8>,
}

/// The exception.
#[derive(Clone, Debug, Default)]
pub struct Exception {
    /// The thread it happened on.
    pub thread: u32,
    /// `ExceptionCode`.
    pub code: u32,
    /// `ExceptionFlags`.
    pub flags: u32,
    /// The address of its nested `EXCEPTION_RECORD` (0 for none).
    pub record: u64,
    /// `ExceptionAddress`.
    pub address: u64,
    /// `ExceptionInformation` (at most 15 are kept).
    pub parameters: Vec<u64>,
    /// The thread's `CONTEXT` at the exception.
    pub context: Vec<u8>,
}

/// The machine.
#[derive(Clone, Debug, Default)]
pub struct System {
    /// Logical processors.
    pub processors: u8,
    /// `wProcessorLevel`, `wProcessorRevision`.
    pub level: u16,
    /// See `level`.
    pub revision: u16,
    /// Windows' major, minor and build numbers.
    pub version: (u32, u32, u32),
}

/// Everything a dump holds.
#[derive(Clone, Debug, Default)]
pub struct Dump {
    /// The process id.
    pub pid: u32,
    /// When it was written (seconds since 1970).
    pub time: u32,
    /// Its threads.
    pub threads: Vec<Thread>,
    /// Its images.
    pub modules: Vec<Module>,
    /// Memory besides the stacks: (address, bytes).
    pub memory: Vec<(u64, Vec<u8>)>,
    /// The exception, if the dump is of a crash.
    pub exception: Option<Exception>,
    /// The machine.
    pub system: System,
}

/// `sizeof(CONTEXT)` on x64.
pub const CONTEXT_SIZE: usize = 1232;

// The numbers of `remote::minidump` (the reader, built on Linux only).
const MDMP: u32 = 0x504d_444d;
const MD_VERSION: u32 = 0xa793;
const THREAD_LIST: u32 = 3;
const MODULE_LIST: u32 = 4;
const MEMORY_LIST: u32 = 5;
const EXCEPTION: u32 = 6;
const SYSTEM_INFO: u32 = 7;
const MISC_INFO: u32 = 15;
const PROCESSOR_ARCHITECTURE_AMD64: u16 = 9;
const VER_PLATFORM_WIN32_NT: u32 = 2;
const VER_NT_WORKSTATION: u8 = 1;
const MODULE_BYTES: usize = 108;

/// The file being laid out: appended to, patched in place.
struct Out(Vec<u8>);

impl Out {
    fn pos(&self) -> u32 {
        self.0.len() as u32
    }
    fn align(&mut self, to: usize) {
        while self.0.len() % to != 0 {
            self.0.push(0);
        }
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn put32(&mut self, at: u32, v: u32) {
        self.0[at as usize..at as usize + 4].copy_from_slice(&v.to_le_bytes());
    }
    /// Appends `bytes` (8-aligned); their location descriptor.
    fn blob(&mut self, bytes: &[u8]) -> (u32, u32) {
        self.align(8);
        let at = self.pos();
        self.0.extend_from_slice(bytes);
        (bytes.len() as u32, at)
    }
    /// A `MINIDUMP_STRING` (UTF-16, its byte length first, NUL after).
    fn string(&mut self, s: &str) -> u32 {
        self.align(4);
        let at = self.pos();
        let units: Vec<u16> = s.encode_utf16().collect();
        self.u32((units.len() * 2) as u32);
        for u in units {
            self.u16(u);
        }
        self.u16(0);
        at
    }
}

/// What [`assemble`] refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DumpError {
    /// A `CONTEXT` of the wrong size (thread id, or 0 for the exception's).
    BadContext(u32),
    /// More than 4 GiB of dump.
    TooLarge,
}

impl std::fmt::Display for DumpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DumpError::BadContext(t) => write!(
                f,
                "thread {t}: a CONTEXT must be {CONTEXT_SIZE} bytes (x64)"
            ),
            DumpError::TooLarge => write!(f, "the dump would pass 4 GiB"),
        }
    }
}

impl std::error::Error for DumpError {}

/// Lays out `d` as a minidump file.
pub fn assemble(d: &Dump) -> Result<Vec<u8>, DumpError> {
    for t in &d.threads {
        if t.context.len() != CONTEXT_SIZE {
            return Err(DumpError::BadContext(t.id));
        }
    }
    if let Some(e) = &d.exception {
        if e.context.len() != CONTEXT_SIZE {
            return Err(DumpError::BadContext(0));
        }
    }
    let total: u64 = d
        .threads
        .iter()
        .map(|t| (t.stack.1.len() + CONTEXT_SIZE) as u64)
        .chain(d.memory.iter().map(|m| m.1.len() as u64))
        .sum();
    if total > u32::MAX as u64 / 2 {
        return Err(DumpError::TooLarge);
    }
    let streams = 5 + u32::from(d.exception.is_some());
    let mut o = Out(Vec::with_capacity(total as usize + 64 * 1024));
    o.u32(MDMP);
    o.u32(MD_VERSION);
    o.u32(streams);
    o.u32(32);
    o.u32(0);
    o.u32(d.time);
    o.u64(0); // MiniDumpNormal
    let dir = o.pos();
    o.0.resize(o.0.len() + 12 * streams as usize, 0);
    let mut entry = 0;
    let mut stream = |o: &mut Out, kind: u32, at: u32| {
        let size = o.pos() - at;
        let e = dir + 12 * entry;
        o.put32(e, kind);
        o.put32(e + 4, size);
        o.put32(e + 8, at);
        entry += 1;
    };

    // The stacks and the other memory first; the lists point at them.
    let stacks: Vec<(u32, u32)> = d.threads.iter().map(|t| o.blob(&t.stack.1)).collect();
    let contexts: Vec<(u32, u32)> = d.threads.iter().map(|t| o.blob(&t.context)).collect();
    let memory: Vec<(u32, u32)> = d.memory.iter().map(|m| o.blob(&m.1)).collect();
    let exc_context = d.exception.as_ref().map(|e| o.blob(&e.context));
    let names: Vec<u32> = d.modules.iter().map(|m| o.string(&m.name)).collect();
    let cvs: Vec<(u32, u32)> = d
        .modules
        .iter()
        .map(|m| {
            if m.cv.is_empty() {
                (0, 0)
            } else {
                o.blob(&m.cv)
            }
        })
        .collect();
    let csd = o.string("");

    o.align(8);
    let at = o.pos();
    o.u32(d.threads.len() as u32);
    for (i, t) in d.threads.iter().enumerate() {
        o.u32(t.id);
        o.u32(0); // SuspendCount
        o.u32(0); // PriorityClass
        o.u32(0); // Priority
        o.u64(t.teb);
        o.u64(t.stack.0);
        o.u32(stacks[i].0);
        o.u32(stacks[i].1);
        o.u32(contexts[i].0);
        o.u32(contexts[i].1);
    }
    stream(&mut o, THREAD_LIST, at);

    o.align(8);
    let at = o.pos();
    o.u32(d.modules.len() as u32);
    for (i, m) in d.modules.iter().enumerate() {
        let start = o.0.len();
        o.u64(m.base);
        o.u32(m.size);
        o.u32(m.checksum);
        o.u32(m.timestamp);
        o.u32(names[i]);
        o.0.resize(o.0.len() + 52, 0); // VS_FIXEDFILEINFO: no version resource read
        o.u32(cvs[i].0);
        o.u32(cvs[i].1);
        o.u64(0); // MiscRecord
        o.u64(0); // Reserved0
        o.u64(0); // Reserved1
        debug_assert_eq!(o.0.len() - start, MODULE_BYTES);
    }
    stream(&mut o, MODULE_LIST, at);

    o.align(8);
    let at = o.pos();
    o.u32((d.threads.len() + d.memory.len()) as u32);
    for (i, t) in d.threads.iter().enumerate() {
        o.u64(t.stack.0);
        o.u32(stacks[i].0);
        o.u32(stacks[i].1);
    }
    for (i, m) in d.memory.iter().enumerate() {
        o.u64(m.0);
        o.u32(memory[i].0);
        o.u32(memory[i].1);
    }
    stream(&mut o, MEMORY_LIST, at);

    if let (Some(e), Some(ctx)) = (&d.exception, exc_context) {
        o.align(8);
        let at = o.pos();
        o.u32(e.thread);
        o.u32(0);
        o.u32(e.code);
        o.u32(e.flags);
        o.u64(e.record);
        o.u64(e.address);
        let n = e.parameters.len().min(15);
        o.u32(n as u32);
        o.u32(0);
        for i in 0..15 {
            o.u64(e.parameters.get(i).copied().filter(|_| i < n).unwrap_or(0));
        }
        o.u32(ctx.0);
        o.u32(ctx.1);
        stream(&mut o, EXCEPTION, at);
    }

    o.align(8);
    let at = o.pos();
    o.u16(PROCESSOR_ARCHITECTURE_AMD64);
    o.u16(d.system.level);
    o.u16(d.system.revision);
    o.0.push(d.system.processors);
    o.0.push(VER_NT_WORKSTATION);
    o.u32(d.system.version.0);
    o.u32(d.system.version.1);
    o.u32(d.system.version.2);
    o.u32(VER_PLATFORM_WIN32_NT);
    o.u32(csd);
    o.u16(0); // SuiteMask
    o.u16(0);
    o.0.resize(o.0.len() + 24, 0); // CPU_INFORMATION: not read
    stream(&mut o, SYSTEM_INFO, at);

    o.align(8);
    let at = o.pos();
    o.u32(24); // SizeOfInfo: MINIDUMP_MISC_INFO
    o.u32(1); // MINIDUMP_MISC1_PROCESS_ID
    o.u32(d.pid);
    o.u32(0);
    o.u32(0);
    o.u32(0);
    stream(&mut o, MISC_INFO, at);

    if o.0.len() > u32::MAX as usize {
        return Err(DumpError::TooLarge);
    }
    Ok(o.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    /// The stream of `kind`: (size, offset).
    fn stream(b: &[u8], kind: u32) -> Option<(usize, usize)> {
        let n = u32_at(b, 8) as usize;
        let dir = u32_at(b, 12) as usize;
        (0..n).map(|i| dir + 12 * i).find_map(|e| {
            (u32_at(b, e) == kind).then(|| (u32_at(b, e + 4) as usize, u32_at(b, e + 8) as usize))
        })
    }

    fn sample() -> Dump {
        let mut ctx = vec![0u8; CONTEXT_SIZE];
        ctx[0xf8..0x100].copy_from_slice(&0x1400_0123u64.to_le_bytes());
        Dump {
            pid: 77,
            time: 1,
            threads: vec![Thread {
                id: 9,
                teb: 0x1000,
                context: ctx.clone(),
                stack: (0x8000, vec![1, 2, 3, 4, 5, 6, 7, 8]),
            }],
            modules: vec![Module {
                base: 0x1_4000_0000,
                size: 0x5000,
                checksum: 3,
                timestamp: 4,
                name: "C:\\a\\b.exe".into(),
                cv: b"RSDS0123456789abcdef\x01\0\0\0b.pdb\0".to_vec(),
            }],
            memory: vec![(0x1400_0023, vec![0xcc; 256])],
            exception: Some(Exception {
                thread: 9,
                code: 0xc000_0005,
                address: 0x1400_0123,
                parameters: vec![0, 0],
                context: ctx,
                ..Default::default()
            }),
            system: System {
                processors: 2,
                version: (10, 0, 19045),
                ..Default::default()
            },
        }
    }

    #[test]
    fn lays_out_the_streams_readers_look_for() {
        let b = assemble(&sample()).unwrap();
        assert_eq!(&b[..4], b"MDMP");
        assert_eq!(u32_at(&b, 8), 6);
        let (size, at) = stream(&b, THREAD_LIST).unwrap();
        assert_eq!((size, u32_at(&b, at)), (4 + 48, 1));
        assert_eq!(u32_at(&b, at + 4), 9);
        let stack_rva = u32_at(&b, at + 4 + 36) as usize;
        assert_eq!(&b[stack_rva..stack_rva + 8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        let (size, at) = stream(&b, MODULE_LIST).unwrap();
        assert_eq!(size, 4 + MODULE_BYTES);
        let name = u32_at(&b, at + 4 + 20) as usize;
        assert_eq!(u32_at(&b, name), 20); // "C:\a\b.exe" in UTF-16
        let cv = u32_at(&b, at + 4 + 80) as usize;
        assert_eq!(&b[cv..cv + 4], b"RSDS");
        let (_, at) = stream(&b, EXCEPTION).unwrap();
        assert_eq!(u32_at(&b, at + 8), 0xc000_0005);
        let (size, at) = stream(&b, SYSTEM_INFO).unwrap();
        assert_eq!(size, 56);
        assert_eq!(u32_at(&b, at) & 0xffff, 9);
        assert_eq!(u32_at(&b, at + 20), VER_PLATFORM_WIN32_NT);
        let (_, at) = stream(&b, MEMORY_LIST).unwrap();
        assert_eq!(u32_at(&b, at), 2);
    }

    #[test]
    fn a_context_of_the_wrong_size_is_an_error() {
        let mut d = sample();
        d.threads[0].context.truncate(100);
        assert_eq!(assemble(&d), Err(DumpError::BadContext(9)));
        let mut d = sample();
        d.exception.as_mut().unwrap().context.clear();
        assert_eq!(assemble(&d), Err(DumpError::BadContext(0)));
    }
}
