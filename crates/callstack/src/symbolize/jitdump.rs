//! Names, files and lines of JIT code from jitdump files (`jit-PID.dump`),
//! the format perf's `perf inject --jit` reads, written by `node
//! --perf-prof`, the JVM's and .NET's perf agents, and CPython 3.12+
//! (`-X perf_jit`).
//!
//! A runtime writes the file as it compiles: a header, then records, each
//! with its kind, size and time. [`JitDump`] reads the kinds that say where
//! code is and what it is:
//!
//! - code load (0): a function's name, its code's address and size, and
//!   the code bytes;
//! - code move (1): the code of a loaded function now lives elsewhere;
//! - debug info (2): the source file and line of addresses of a function
//!   loaded next;
//! - close (3): the end.
//!
//! Other kinds (unwinding info, unknown future ones) are skipped by their
//! size. As with perf maps, a later record for the same address wins. The
//! runtime also maps the file into its address space, executable, so that
//! perf sees it: that mapping is how `pstack` and `core` find the file.
//!
//! Both byte orders are read (the header's magic says which). Any bytes
//! give a [`JitDump`] or a [`JitDumpError`] naming what is wrong, never a
//! panic; a file cut short (the runtime still writing) keeps the records
//! before the cut.

use std::path::Path;

/// The header's magic, `JiTD` as a 32-bit number in the writer's order.
const MAGIC: u32 = 0x4A69_5444;
/// Bytes of the record prefix: kind, size, time.
const PREFIX: usize = 16;

const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;
const DEBUG_INFO: u32 = 2;
const CODE_CLOSE: u32 = 3;

/// Why a jitdump file could not be read.
#[derive(Debug)]
pub enum JitDumpError {
    /// The file could not be read.
    Io(std::io::Error),
    /// The header is missing or wrong.
    Header(&'static str),
    /// A record at this file offset is malformed (the records before it
    /// are kept by [`JitDump::parse`]; this is only returned when the very
    /// first one is).
    Record {
        /// File offset of the record.
        offset: usize,
        /// What is wrong with it.
        what: &'static str,
    },
}

impl std::fmt::Display for JitDumpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JitDumpError::Io(e) => write!(f, "cannot read the jitdump file: {e}"),
            JitDumpError::Header(what) => write!(f, "not a jitdump file: {what}"),
            JitDumpError::Record { offset, what } => {
                write!(f, "jitdump record at offset {offset:#x}: {what}")
            }
        }
    }
}

impl std::error::Error for JitDumpError {}

/// One source position of JIT code.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LineEntry {
    addr: u64,
    line: u32,
    file: std::sync::Arc<str>,
}

/// One function's code.
#[derive(Clone, Debug)]
struct Function {
    start: u64,
    end: u64,
    /// The record's place: later ones win.
    seq: u32,
    index: u64,
    name: Box<str>,
    /// Sorted by address (positions of the code as loaded; a move shifts
    /// them with the code).
    lines: Vec<LineEntry>,
}

/// What a jitdump file says of an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JitFrame {
    /// The function's name as the runtime wrote it.
    pub name: String,
    /// The source file, when a debug-info record gives one.
    pub file: Option<String>,
    /// The line in it.
    pub line: Option<u32>,
}

/// The functions of a jitdump file, looked up by address.
#[derive(Clone, Debug, Default)]
pub struct JitDump {
    /// Sorted by start, then by record.
    functions: Vec<Function>,
    max_size: u64,
    /// The writer's ELF machine (`e_machine`), from the header.
    pub elf_machine: u32,
    /// The writer's process id, from the header.
    pub pid: u32,
    /// Whether the file ended inside a record (a runtime still writing, or
    /// a file cut short): the records before are kept.
    pub truncated: bool,
}

/// A bounds-checked reader in the file's byte order.
struct Reader<'a> {
    data: &'a [u8],
    swap: bool,
}

impl Reader<'_> {
    fn u32(&self, at: usize) -> Option<u32> {
        let b: [u8; 4] = self.data.get(at..at.checked_add(4)?)?.try_into().ok()?;
        let v = u32::from_le_bytes(b);
        Some(if self.swap { v.swap_bytes() } else { v })
    }

    fn u64(&self, at: usize) -> Option<u64> {
        let b: [u8; 8] = self.data.get(at..at.checked_add(8)?)?.try_into().ok()?;
        let v = u64::from_le_bytes(b);
        Some(if self.swap { v.swap_bytes() } else { v })
    }

    /// The NUL-terminated string at `at` (within `end`) and the offset
    /// just past its NUL.
    fn cstr(&self, at: usize, end: usize) -> Option<(String, usize)> {
        let s = self.data.get(at..end)?;
        let n = s.iter().position(|&b| b == 0)?;
        Some((String::from_utf8_lossy(&s[..n]).into_owned(), at + n + 1))
    }
}

impl JitDump {
    /// Parses a jitdump file's bytes.
    pub fn parse(data: &[u8]) -> Result<JitDump, JitDumpError> {
        let magic = data
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or(JitDumpError::Header("shorter than its magic"))?;
        let swap = match magic {
            MAGIC => false,
            m if m.swap_bytes() == MAGIC => true,
            _ => return Err(JitDumpError::Header("no JiTD magic")),
        };
        let r = Reader { data, swap };
        let header_size =
            r.u32(8)
                .ok_or(JitDumpError::Header("the header is cut short"))? as usize;
        if header_size < 40 || header_size > data.len() {
            return Err(JitDumpError::Header("the header's size is wrong"));
        }
        let mut dump = JitDump {
            elf_machine: r.u32(12).unwrap_or(0),
            pid: r.u32(20).unwrap_or(0),
            ..JitDump::default()
        };
        let mut pending_lines: Option<(u64, Vec<LineEntry>)> = None;
        let mut files: Vec<std::sync::Arc<str>> = Vec::new();
        let mut at = header_size;
        while at < data.len() {
            let bad = |what| JitDumpError::Record { offset: at, what };
            let (Some(kind), Some(size)) = (r.u32(at), r.u32(at + 4)) else {
                dump.truncated = true;
                break;
            };
            let size = size as usize;
            if size < PREFIX {
                if dump.functions.is_empty() {
                    return Err(bad("its size is smaller than a record's prefix"));
                }
                dump.truncated = true;
                break;
            }
            let Some(end) = at.checked_add(size).filter(|&e| e <= data.len()) else {
                dump.truncated = true;
                break;
            };
            let body = at + PREFIX;
            match kind {
                CODE_LOAD => {
                    // pid, tid (u32), vma, code_addr, code_size, code_index
                    // (u64), the name, then the code.
                    let fields = (r.u64(body + 16), r.u64(body + 24), r.u64(body + 32));
                    let (Some(addr), Some(len), Some(index)) = fields else {
                        return Err(bad("a code load is cut short"));
                    };
                    let (name, _) = r
                        .cstr(body + 40, end)
                        .ok_or_else(|| bad("a code load's name has no end"))?;
                    if let Some(fend) = addr.checked_add(len).filter(|_| len > 0) {
                        let lines = match pending_lines.take() {
                            Some((a, l)) if a == addr => l,
                            _ => Vec::new(),
                        };
                        dump.max_size = dump.max_size.max(len);
                        dump.functions.push(Function {
                            start: addr,
                            end: fend,
                            seq: u32::try_from(dump.functions.len()).unwrap_or(u32::MAX),
                            index,
                            name: name.into(),
                            lines,
                        });
                    }
                }
                CODE_MOVE => {
                    // pid, tid (u32), vma, old, new, size, index (u64).
                    let fields = (
                        r.u64(body + 16),
                        r.u64(body + 24),
                        r.u64(body + 32),
                        r.u64(body + 40),
                    );
                    let (Some(old), Some(new), Some(len), Some(index)) = fields else {
                        return Err(bad("a code move is cut short"));
                    };
                    let moved = dump
                        .functions
                        .iter()
                        .rev()
                        .find(|f| f.index == index && f.start == old)
                        .cloned();
                    if let (Some(mut f), Some(fend)) = (moved, new.checked_add(len)) {
                        let delta = new.wrapping_sub(old);
                        f.start = new;
                        f.end = fend;
                        f.seq = u32::try_from(dump.functions.len()).unwrap_or(u32::MAX);
                        for l in &mut f.lines {
                            l.addr = l.addr.wrapping_add(delta);
                        }
                        dump.max_size = dump.max_size.max(len);
                        dump.functions.push(f);
                    }
                }
                DEBUG_INFO => {
                    // code_addr, nr_entry (u64), then entries: addr (u64),
                    // line, discriminator (i32), file name.
                    let (Some(addr), Some(n)) = (r.u64(body), r.u64(body + 8)) else {
                        return Err(bad("a debug-info record is cut short"));
                    };
                    let mut lines = Vec::new();
                    let mut p = body + 16;
                    for _ in 0..n.min(size as u64) {
                        let (Some(a), Some(line)) = (r.u64(p), r.u32(p + 8)) else {
                            return Err(bad("a debug-info entry is cut short"));
                        };
                        let (file, next) = r
                            .cstr(p + 16, end)
                            .ok_or_else(|| bad("a debug-info file name has no end"))?;
                        let file = match files.iter().find(|f| ***f == *file) {
                            Some(f) => f.clone(),
                            None => {
                                let f: std::sync::Arc<str> = file.into();
                                files.push(f.clone());
                                f
                            }
                        };
                        lines.push(LineEntry {
                            addr: a,
                            line,
                            file,
                        });
                        p = next;
                    }
                    lines.sort_by_key(|l| l.addr);
                    pending_lines = Some((addr, lines));
                }
                CODE_CLOSE => break,
                _ => {}
            }
            at = end;
        }
        dump.functions.sort_by_key(|f| (f.start, f.seq));
        Ok(dump)
    }

    /// Reads and parses the file at `path`.
    pub fn from_file(path: &Path) -> Result<JitDump, JitDumpError> {
        JitDump::parse(&std::fs::read(path).map_err(JitDumpError::Io)?)
    }

    /// The function whose code holds `addr` (the last record covering it),
    /// with the source position of the nearest line entry at or before
    /// `addr`.
    pub fn lookup(&self, addr: u64) -> Option<JitFrame> {
        let hi = self.functions.partition_point(|f| f.start <= addr);
        let lo = addr.saturating_sub(self.max_size);
        let f = self.functions[..hi]
            .iter()
            .rev()
            .take_while(|f| f.start >= lo)
            .filter(|f| addr < f.end)
            .max_by_key(|f| f.seq)?;
        let i = f.lines.partition_point(|l| l.addr <= addr);
        let pos = i.checked_sub(1).map(|i| &f.lines[i]);
        Some(JitFrame {
            name: f.name.to_string(),
            file: pos.map(|l| l.file.to_string()),
            line: pos.map(|l| l.line),
        })
    }

    /// How many functions the file loads or moves.
    pub fn len(&self) -> usize {
        self.functions.len()
    }

    /// Whether it names no function.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }
}

/// Writes jitdump files, for tests: the header, then records.
#[cfg(test)]
pub(crate) mod write {
    /// A header for `pid`, x86-64.
    pub fn header(pid: u32) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [super::MAGIC, 1, 40, 62, 0, pid] {
            b.extend(v.to_le_bytes());
        }
        b.extend(0u64.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b
    }

    fn record(out: &mut Vec<u8>, kind: u32, body: &[u8]) {
        out.extend(kind.to_le_bytes());
        out.extend(((super::PREFIX + body.len()) as u32).to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend(body);
    }

    /// A code load.
    pub fn load(out: &mut Vec<u8>, addr: u64, code: &[u8], index: u64, name: &str) {
        let mut b = Vec::new();
        b.extend(1u32.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        for v in [addr, addr, code.len() as u64, index] {
            b.extend(v.to_le_bytes());
        }
        b.extend(name.as_bytes());
        b.push(0);
        b.extend(code);
        record(out, super::CODE_LOAD, &b);
    }

    /// A code move.
    pub fn moved(out: &mut Vec<u8>, old: u64, new: u64, len: u64, index: u64) {
        let mut b = Vec::new();
        b.extend(1u32.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        for v in [new, old, new, len, index] {
            b.extend(v.to_le_bytes());
        }
        record(out, super::CODE_MOVE, &b);
    }

    /// Debug info for the code load that follows.
    pub fn lines(out: &mut Vec<u8>, addr: u64, entries: &[(u64, u32, &str)]) {
        let mut b = Vec::new();
        b.extend(addr.to_le_bytes());
        b.extend((entries.len() as u64).to_le_bytes());
        for &(a, line, file) in entries {
            b.extend(a.to_le_bytes());
            b.extend(line.to_le_bytes());
            b.extend(0u32.to_le_bytes());
            b.extend(file.as_bytes());
            b.push(0);
        }
        record(out, super::DEBUG_INFO, &b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut d = write::header(77);
        write::lines(
            &mut d,
            0x1000,
            &[(0x1000, 10, "app.js"), (0x1010, 12, "app.js")],
        );
        write::load(
            &mut d,
            0x1000,
            &[0x90; 0x20],
            1,
            "LazyCompile:*fib app.js:10",
        );
        write::load(&mut d, 0x2000, &[0xc3; 8], 2, "Stub:CEntry");
        d
    }

    #[test]
    fn names_and_lines() {
        let j = JitDump::parse(&sample()).unwrap();
        assert_eq!(
            (j.pid, j.elf_machine, j.len(), j.truncated),
            (77, 62, 2, false)
        );
        let f = j.lookup(0x1014).unwrap();
        assert_eq!(f.name, "LazyCompile:*fib app.js:10");
        assert_eq!((f.file.as_deref(), f.line), (Some("app.js"), Some(12)));
        assert_eq!(j.lookup(0x1004).unwrap().line, Some(10));
        let s = j.lookup(0x2007).unwrap();
        assert_eq!(
            (s.name.as_str(), s.file, s.line),
            ("Stub:CEntry", None, None)
        );
        assert!(j.lookup(0x2008).is_none() && j.lookup(0xfff).is_none());
    }

    #[test]
    fn moved_code_is_found_at_its_new_place() {
        let mut d = sample();
        write::moved(&mut d, 0x1000, 0x5000, 0x20, 1);
        let j = JitDump::parse(&d).unwrap();
        let f = j.lookup(0x5014).unwrap();
        assert_eq!(
            (f.name.as_str(), f.line),
            ("LazyCompile:*fib app.js:10", Some(12))
        );
    }

    #[test]
    fn a_file_cut_short_keeps_what_came_before() {
        let d = sample();
        let j = JitDump::parse(&d[..d.len() - 3]).unwrap();
        assert!(j.truncated);
        assert_eq!(j.lookup(0x1000).unwrap().name, "LazyCompile:*fib app.js:10");
        assert!(j.lookup(0x2000).is_none());
    }

    #[test]
    fn the_other_byte_order_reads_the_same() {
        // The same file written big-endian: every field swapped.
        let mut d = Vec::new();
        for v in [MAGIC, 1, 40, 62, 0, 9] {
            d.extend(v.to_be_bytes());
        }
        d.extend([0u8; 16]);
        let mut body = Vec::new();
        body.extend(1u32.to_be_bytes());
        body.extend(1u32.to_be_bytes());
        for v in [0x3000u64, 0x3000, 4, 1] {
            body.extend(v.to_be_bytes());
        }
        body.extend(b"be_fn\0");
        body.extend([0u8; 4]);
        d.extend(CODE_LOAD.to_be_bytes());
        d.extend(((PREFIX + body.len()) as u32).to_be_bytes());
        d.extend(0u64.to_be_bytes());
        d.extend(body);
        let j = JitDump::parse(&d).unwrap();
        assert_eq!(
            (j.pid, j.lookup(0x3003).unwrap().name.as_str()),
            (9, "be_fn")
        );
    }

    #[test]
    fn bad_input_gives_errors() {
        assert!(matches!(JitDump::parse(b""), Err(JitDumpError::Header(_))));
        assert!(matches!(
            JitDump::parse(b"ELF\x7f...."),
            Err(JitDumpError::Header(_))
        ));
        let mut d = write::header(1);
        d[8] = 200; // header size past the end
        assert!(matches!(JitDump::parse(&d), Err(JitDumpError::Header(_))));
        let mut d = write::header(1);
        d.extend(0u32.to_le_bytes());
        d.extend(4u32.to_le_bytes()); // a record smaller than its prefix
        d.extend([0u8; 8]);
        assert!(matches!(
            JitDump::parse(&d),
            Err(JitDumpError::Record { offset: 40, .. })
        ));
        // A load whose name never ends.
        let mut d = write::header(1);
        d.extend(CODE_LOAD.to_le_bytes());
        d.extend(((PREFIX + 44) as u32).to_le_bytes());
        d.extend([0u8; 8]);
        d.extend([b'x'; 44]);
        assert!(JitDump::parse(&d).is_err());
        // Junk: never a panic.
        let mut seed = 7u64;
        for len in 0..400 {
            let mut d = write::header(1);
            d.extend((0..len).map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 33) as u8
            }));
            let _ = JitDump::parse(&d).map(|j| j.lookup(0x1000));
        }
    }
}
