//! The callstack trace file: raw stacks plus the module list needed to
//! symbolize them later, in another process or on another machine.
//!
//! The format is specified in `docs/trace-format.md`: a 12-byte header,
//! then a stream of self-delimited records (tag byte, LEB128 length,
//! payload). Module records give path, build-id, address range and bias;
//! stack records give the addresses as zigzag LEB128 deltas. A writer only
//! appends, so a profiler can stream into the file and a crash handler can
//! pipe it; a reader stops cleanly at a truncated tail.
//!
//! This module does not need the `symbolize` feature.
//!
//! ```
//! use callstack::tracefile::{TraceWriter, TraceReader, Record};
//! let mut w = TraceWriter::new(Vec::new()).unwrap();
//! w.write_loaded_modules().unwrap();
//! let mut frames = [0usize; 32];
//! let n = callstack::capture_fast(0, &mut frames);
//! w.write_stack(&frames[..n], false).unwrap();
//! let bytes = w.finish().unwrap();
//!
//! let trace = callstack::tracefile::read_all(&bytes[..]).unwrap();
//! assert_eq!(trace.stacks[0].frames, &frames[..n]);
//! assert!(!trace.modules.is_empty());
//! ```

use std::io::{self, Read, Write};
use std::path::PathBuf;

/// The first 8 bytes of a trace file.
pub const MAGIC: [u8; 8] = *b"CSTRACE\0";
/// The format version this code writes.
pub const VERSION: u8 = 1;

const TAG_MODULE: u8 = b'M';
const TAG_STACK: u8 = b'S';
/// `I`: the exact (interrupted) pcs past the first frame of the stack record just before.
pub(crate) const TAG_EXACT: u8 = b'I';
const FLAG_FIRST_EXACT: u64 = 1;
const FLAG_HAS_TAG: u64 = 2;

/// A module of the traced process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModuleRecord {
    /// Path of the file in the traced process.
    pub path: PathBuf,
    /// GNU build-id, if the module has one.
    pub build_id: Option<Vec<u8>>,
    /// Lowest runtime address of the module.
    pub start: u64,
    /// One past its highest runtime address.
    pub end: u64,
    /// Load bias: runtime address minus link-time address.
    pub bias: u64,
}

/// One captured stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackRecord {
    /// The addresses, innermost first. All are return addresses except
    /// `frames[0]` when `first_is_exact`.
    pub frames: Vec<usize>,
    /// Whether `frames[0]` is an exact pc (a signal's interrupted
    /// instruction) rather than a return address.
    pub first_is_exact: bool,
    /// A user value (thread id, sample weight, allocation size...), if any.
    pub tag: Option<u64>,
    /// The indices (ascending, each above 0) of the other frames that are
    /// exact pcs (an `I` record after the stack's: a profile's interrupted
    /// user pc after kernel frames, a pc through a signal frame); empty
    /// for most stacks. See [`StackRecord::is_exact`].
    pub exact: Vec<u32>,
}

impl StackRecord {
    /// Whether `frames[i]` is an exact pc (looked up as is) rather than a
    /// return address (looked up at the byte before).
    pub fn is_exact(&self, i: usize) -> bool {
        if i == 0 {
            self.first_is_exact
        } else {
            u32::try_from(i).is_ok_and(|i| self.exact.binary_search(&i).is_ok())
        }
    }
}

/// One record of a trace file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A module.
    Module(ModuleRecord),
    /// A stack.
    Stack(StackRecord),
}

/// Everything in a trace file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The modules, in file order.
    pub modules: Vec<ModuleRecord>,
    /// The stacks, in file order.
    pub stacks: Vec<StackRecord>,
    /// Whether the file ended inside a record (a writer was killed): the
    /// records before it are all here.
    pub truncated: bool,
}

/// What is wrong with a trace file.
#[derive(Debug)]
pub enum TraceError {
    /// Reading or writing failed.
    Io(io::Error),
    /// The file does not start with [`MAGIC`].
    NotATrace,
    /// The file is of a newer format version.
    UnsupportedVersion(u8),
    /// A record's content is invalid (what is wrong, at which byte offset).
    Corrupt(&'static str, u64),
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TraceError::Io(e) => write!(f, "trace file I/O: {e}"),
            TraceError::NotATrace => write!(f, "not a callstack trace file (bad magic)"),
            TraceError::UnsupportedVersion(v) => {
                write!(f, "trace format version {v} not supported")
            }
            TraceError::Corrupt(what, off) => write!(f, "corrupt trace at byte {off}: {what}"),
        }
    }
}

impl std::error::Error for TraceError {}

impl From<io::Error> for TraceError {
    fn from(e: io::Error) -> Self {
        TraceError::Io(e)
    }
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Appends records to a trace. Buffers up to 64 KiB before writing; call
/// [`TraceWriter::flush`] to push the records out (e.g. before a crash
/// handler exits) and [`TraceWriter::finish`] at the end.
///
/// `write_stack` is allocation-free once the buffer has grown: it encodes
/// into the buffer and only writes to the sink when the buffer is full.
pub struct TraceWriter<W: Write> {
    sink: W,
    buf: Vec<u8>,
    scratch: Vec<u8>,
}

const BUF_CAP: usize = 64 * 1024;

impl<W: Write> TraceWriter<W> {
    /// Starts a new trace: writes the header.
    pub fn new(sink: W) -> io::Result<Self> {
        let mut w = Self::append(sink);
        w.buf.extend_from_slice(&MAGIC);
        w.buf
            .extend_from_slice(&[VERSION, std::mem::size_of::<usize>() as u8, 0, 0]);
        Ok(w)
    }

    /// Continues a trace whose header is already in `sink` (a file opened
    /// for appending).
    pub fn append(sink: W) -> Self {
        TraceWriter {
            sink,
            buf: Vec::with_capacity(BUF_CAP + 4096),
            scratch: Vec::with_capacity(4096),
        }
    }

    fn record(&mut self, tag: u8) -> io::Result<()> {
        self.buf.push(tag);
        put_varint(&mut self.buf, self.scratch.len() as u64);
        self.buf.extend_from_slice(&self.scratch);
        if self.buf.len() >= BUF_CAP {
            self.sink.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Writes a record of another kind (the profile records of
    /// [`crate::profile`]): `tag`, then `payload` as is.
    pub(crate) fn write_raw(&mut self, tag: u8, payload: &[u8]) -> io::Result<()> {
        self.scratch.clear();
        self.scratch.extend_from_slice(payload);
        self.record(tag)
    }

    /// Writes a module record.
    pub fn write_module(&mut self, m: &ModuleRecord) -> io::Result<()> {
        self.scratch.clear();
        let s = &mut self.scratch;
        put_varint(s, m.start);
        put_varint(s, m.end.wrapping_sub(m.start));
        put_varint(s, m.bias);
        let id = m.build_id.as_deref().unwrap_or(&[]);
        put_varint(s, id.len() as u64);
        s.extend_from_slice(id);
        let path = m.path.as_os_str().as_encoded_bytes();
        put_varint(s, path.len() as u64);
        s.extend_from_slice(path);
        self.record(TAG_MODULE)
    }

    /// Writes one module record per object loaded in this process
    /// ([`crate::modules::loaded_modules`]; not for signal handlers: call it
    /// at start-up, and again after a `dlopen`).
    pub fn write_loaded_modules(&mut self) -> io::Result<()> {
        for m in crate::modules::loaded_modules() {
            if m.is_vdso {
                continue;
            }
            let (start, end) = m.range();
            self.write_module(&ModuleRecord {
                path: m.path.clone(),
                build_id: m.build_id.clone(),
                start: start as u64,
                end: end as u64,
                bias: m.bias as u64,
            })?;
        }
        Ok(())
    }

    /// Writes a stack of return addresses (`first_is_exact`: `frames[0]` is
    /// an exact pc, as in a signal handler's interrupted frame).
    pub fn write_stack(&mut self, frames: &[usize], first_is_exact: bool) -> io::Result<()> {
        self.write_stack_tagged(frames, first_is_exact, None)
    }

    /// [`TraceWriter::write_stack`] with a user value (thread id, weight...).
    pub fn write_stack_tagged(
        &mut self,
        frames: &[usize],
        first_is_exact: bool,
        tag: Option<u64>,
    ) -> io::Result<()> {
        self.scratch.clear();
        let s = &mut self.scratch;
        let flags = if first_is_exact { FLAG_FIRST_EXACT } else { 0 }
            | if tag.is_some() { FLAG_HAS_TAG } else { 0 };
        put_varint(s, flags);
        if let Some(t) = tag {
            put_varint(s, t);
        }
        put_varint(s, frames.len() as u64);
        let mut prev = 0u64;
        for &a in frames {
            put_varint(s, zigzag((a as u64).wrapping_sub(prev) as i64));
            prev = a as u64;
        }
        self.record(TAG_STACK)
    }

    /// Writes the buffered records to the sink and flushes it.
    pub fn flush(&mut self) -> io::Result<()> {
        self.sink.write_all(&self.buf)?;
        self.buf.clear();
        self.sink.flush()
    }

    /// Flushes and returns the sink.
    pub fn finish(mut self) -> io::Result<W> {
        self.flush()?;
        Ok(self.sink)
    }
}

/// Reads records from a trace.
pub struct TraceReader<R: Read> {
    src: R,
    offset: u64,
    payload: Vec<u8>,
    /// A record read past a stack record to look for its `I` record, not
    /// one: its raw form, given by the next read.
    stashed: Option<Raw>,
}

/// A record as read, before decoding: its payload is in
/// `TraceReader::payload`, or in the `Vec` of a stashed one.
enum Raw {
    Record(u8, u64, Vec<u8>),
    Eof,
    Truncated,
}

/// The outcome of reading one record.
enum Step {
    Record(Record),
    /// A record of a kind `Record` does not hold; its payload is in
    /// `TraceReader::payload`.
    Other(u8, u64),
    Eof,
    Truncated,
}

impl<R: Read> TraceReader<R> {
    /// Checks the header and returns a reader positioned at the first record.
    pub fn new(mut src: R) -> Result<Self, TraceError> {
        let mut h = [0u8; 12];
        let got = read_full(&mut src, &mut h)?;
        if got < 12 || h[..8] != MAGIC {
            return Err(TraceError::NotATrace);
        }
        if h[8] > VERSION || h[8] == 0 {
            return Err(TraceError::UnsupportedVersion(h[8]));
        }
        Ok(TraceReader {
            src,
            offset: 12,
            payload: Vec::new(),
            stashed: None,
        })
    }

    /// The next record; `Ok(None)` at the end of the file or at a
    /// truncated final record. Records of unknown kinds are skipped.
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        self.next_with_truncation().map(|(r, _)| r)
    }

    fn next_with_truncation(&mut self) -> Result<(Option<Record>, bool), TraceError> {
        loop {
            match self.step()? {
                Step::Record(r) => return Ok((Some(r), false)),
                Step::Other(..) => continue,
                Step::Eof => return Ok((None, false)),
                Step::Truncated => return Ok((None, true)),
            }
        }
    }

    /// Like `next_with_truncation`, also giving the records `Record` does
    /// not hold, as (tag, payload, byte offset).
    pub(crate) fn next_any(&mut self) -> Result<(Option<AnyRecord<'_>>, bool), TraceError> {
        match self.step()? {
            Step::Record(r) => Ok((Some(AnyRecord::Known(r)), false)),
            Step::Other(tag, at) => Ok((
                Some(AnyRecord::Other(
                    tag,
                    Payload {
                        b: &self.payload,
                        at,
                    },
                )),
                false,
            )),
            Step::Eof => Ok((None, false)),
            Step::Truncated => Ok((None, true)),
        }
    }

    /// Reads the next record's tag, offset and payload (into `payload`).
    fn read_raw(&mut self) -> Result<Raw, TraceError> {
        let mut tag = [0u8; 1];
        if read_full(&mut self.src, &mut tag)? == 0 {
            return Ok(Raw::Eof);
        }
        let mut len: u64 = 0;
        let mut shift = 0;
        loop {
            let mut b = [0u8; 1];
            if read_full(&mut self.src, &mut b)? == 0 {
                return Ok(Raw::Truncated);
            }
            if shift > 63 {
                return Err(TraceError::Corrupt("record length overflows", self.offset));
            }
            len |= ((b[0] & 0x7f) as u64) << shift;
            shift += 7;
            if b[0] & 0x80 == 0 {
                break;
            }
        }
        if len > 1 << 30 {
            return Err(TraceError::Corrupt("record longer than 1 GiB", self.offset));
        }
        // Grow the buffer with the bytes that actually arrive, not with the
        // declared length: a 10-byte file claiming a 1 GiB record must not
        // allocate 1 GiB before it turns out truncated.
        self.payload.clear();
        let got = read_up_to(&mut self.src, &mut self.payload, len)?;
        if got < len {
            return Ok(Raw::Truncated);
        }
        let at = self.offset;
        self.offset += 1 + len + shift as u64 / 7;
        Ok(Raw::Record(tag[0], at, Vec::new()))
    }

    fn step(&mut self) -> Result<Step, TraceError> {
        let raw = match self.stashed.take() {
            Some(Raw::Record(tag, at, payload)) => {
                self.payload = payload;
                Raw::Record(tag, at, Vec::new())
            }
            Some(r) => r,
            None => self.read_raw()?,
        };
        let (tag, at) = match raw {
            Raw::Record(tag, at, _) => (tag, at),
            Raw::Eof => return Ok(Step::Eof),
            Raw::Truncated => return Ok(Step::Truncated),
        };
        let mut step = self.decode(tag, at)?;
        if let Step::Record(Record::Stack(st)) = &mut step {
            // Its `I` record, if it has one, comes next.
            match self.read_raw()? {
                Raw::Record(TAG_EXACT, xat, _) => {
                    let mut p = Payload {
                        b: &self.payload,
                        at: xat,
                    };
                    let n = p.varint()? as usize;
                    if n > p.b.len() {
                        return Err(TraceError::Corrupt("exact count exceeds record", xat));
                    }
                    st.exact = (0..n)
                        .map(|_| p.varint().map(|i| u32::try_from(i).unwrap_or(u32::MAX)))
                        .collect::<Result<_, _>>()?;
                    st.exact
                        .retain(|&i| i > 0 && (i as usize) < st.frames.len());
                    st.exact.sort_unstable();
                    st.exact.dedup();
                }
                Raw::Record(t, a, _) => {
                    self.stashed = Some(Raw::Record(t, a, std::mem::take(&mut self.payload)));
                }
                other => self.stashed = Some(other),
            }
        }
        Ok(step)
    }

    /// Decodes the record in `payload`.
    fn decode(&mut self, tag: u8, at: u64) -> Result<Step, TraceError> {
        let mut p = Payload {
            b: &self.payload,
            at,
        };
        match tag {
            TAG_MODULE => {
                let start = p.varint()?;
                let size = p.varint()?;
                let bias = p.varint()?;
                let idlen = p.varint()? as usize;
                let id = p.bytes(idlen)?.to_vec();
                let plen = p.varint()? as usize;
                let path = p.bytes(plen)?;
                let path = PathBuf::from(String::from_utf8_lossy(path).into_owned());
                Ok(Step::Record(Record::Module(ModuleRecord {
                    path,
                    build_id: (!id.is_empty()).then_some(id),
                    start,
                    end: start.wrapping_add(size),
                    bias,
                })))
            }
            TAG_STACK => {
                let flags = p.varint()?;
                let tag = if flags & FLAG_HAS_TAG != 0 {
                    Some(p.varint()?)
                } else {
                    None
                };
                let n = p.varint()? as usize;
                if n > p.b.len() {
                    return Err(TraceError::Corrupt("stack count exceeds record", at));
                }
                let mut frames = Vec::with_capacity(n);
                let mut prev = 0u64;
                for _ in 0..n {
                    prev = prev.wrapping_add(unzigzag(p.varint()?) as u64);
                    frames.push(prev as usize);
                }
                Ok(Step::Record(Record::Stack(StackRecord {
                    frames,
                    first_is_exact: flags & FLAG_FIRST_EXACT != 0,
                    tag,
                    exact: Vec::new(),
                })))
            }
            t => Ok(Step::Other(t, at)),
        }
    }
}

/// A record read by `TraceReader::next_any`.
pub(crate) enum AnyRecord<'a> {
    /// A module or a stack.
    Known(Record),
    /// Another kind: its tag and payload.
    Other(u8, Payload<'a>),
}

/// A record's payload being decoded.
pub(crate) struct Payload<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) at: u64,
}

impl<'a> Payload<'a> {
    pub(crate) fn varint(&mut self) -> Result<u64, TraceError> {
        let mut v = 0u64;
        for (i, &byte) in self.b.iter().enumerate() {
            if i >= 10 {
                break;
            }
            v |= ((byte & 0x7f) as u64) << (7 * i);
            if byte & 0x80 == 0 {
                self.b = &self.b[i + 1..];
                return Ok(v);
            }
        }
        Err(TraceError::Corrupt("bad varint in record", self.at))
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], TraceError> {
        if n > self.b.len() {
            return Err(TraceError::Corrupt("field longer than its record", self.at));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
}

fn read_full(src: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match src.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Appends up to `len` bytes of `src` to `buf`, growing it in steps as the
/// bytes come (never by `len` at once); returns how many were read.
fn read_up_to(src: &mut impl Read, buf: &mut Vec<u8>, len: u64) -> io::Result<u64> {
    let mut got = 0u64;
    let mut chunk = [0u8; 8192];
    while got < len {
        let want = (len - got).min(chunk.len() as u64) as usize;
        let n = read_full(src, &mut chunk[..want])?;
        buf.extend_from_slice(&chunk[..n]);
        got += n as u64;
        if n < want {
            break;
        }
    }
    Ok(got)
}

/// Reads a whole trace.
pub fn read_all(src: impl Read) -> Result<Trace, TraceError> {
    let mut r = TraceReader::new(src)?;
    let mut t = Trace::default();
    loop {
        match r.next_with_truncation()? {
            (Some(Record::Module(m)), _) => t.modules.push(m),
            (Some(Record::Stack(s)), _) => t.stacks.push(s),
            (None, truncated) => {
                t.truncated = truncated;
                return Ok(t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let mut w = TraceWriter::new(Vec::new()).unwrap();
        let m = ModuleRecord {
            path: "/bin/x".into(),
            build_id: Some(vec![1, 2, 3]),
            start: 0x5555_0000_0000,
            end: 0x5555_0001_0000,
            bias: 0x5555_0000_0000,
        };
        w.write_module(&m).unwrap();
        w.write_stack(&[0x5555_0000_1234, 0x7fff_0000_0001, 0x10], true)
            .unwrap();
        w.write_stack_tagged(&[], false, Some(42)).unwrap();
        let bytes = w.finish().unwrap();
        let t = read_all(&bytes[..]).unwrap();
        assert_eq!(t.modules, vec![m]);
        assert_eq!(t.stacks.len(), 2);
        assert_eq!(
            t.stacks[0].frames,
            vec![0x5555_0000_1234, 0x7fff_0000_0001, 0x10]
        );
        assert!(t.stacks[0].first_is_exact);
        assert_eq!(t.stacks[1].tag, Some(42));
        assert!(!t.truncated);
        // Every truncation point reads cleanly.
        for cut in 12..bytes.len() {
            let t = read_all(&bytes[..cut]).unwrap();
            assert!(t.stacks.len() <= 2);
        }
        assert!(matches!(
            read_all(&b"garbage"[..]),
            Err(TraceError::NotATrace)
        ));
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 0x1234_5678;
        for len in 0..400 {
            let mut v = MAGIC.to_vec();
            v.extend_from_slice(&[1, 8, 0, 0]);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push(x as u8);
            }
            let _ = read_all(&v[..]);
        }
    }
}
