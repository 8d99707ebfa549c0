//! A profile in the callstack trace file (`docs/trace-format.md`): the
//! `P` (profile), `T` (thread), `R` (a thread's process), `C` (comment),
//! `I` (exact frames), `Y` (named frames), `V` (values) and `E` (end) records beside the `M` and `S` records that every reader knows.

use super::{Profile, ValueType};
use crate::tracefile::{
    put_varint, unzigzag, zigzag, AnyRecord, Payload, Record, StackRecord, TraceError, TraceReader,
    TraceWriter,
};
use std::io::{self, Read, Write};

/// `P`: the profile's header (sample types, period, start time).
pub(crate) const TAG_PROFILE: u8 = b'P';
/// `T`: a thread's name.
pub(crate) const TAG_THREAD: u8 = b'T';
/// `V`: the values of the stack record just before.
pub(crate) const TAG_VALUES: u8 = b'V';
/// `E`: duration and lost samples (the last one read wins).
pub(crate) const TAG_END: u8 = b'E';
/// `R`: the process of a thread (id and name).
pub(crate) const TAG_THREAD_PROCESS: u8 = b'R';
/// `C`: a comment on the profile ([`Profile::comments`]).
pub(crate) const TAG_COMMENT: u8 = b'C';
/// `K`: a kernel function the profile's kernel frames fall in.
pub(crate) const TAG_KERNEL_SYMBOL: u8 = b'K';
/// `Y`: an address the profile names itself ([`Profile::named_frames`]).
pub(crate) const TAG_NAMED_FRAME: u8 = b'Y';
// `I`: the exact pcs past the first frame of the stack record just before
// (read by `TraceReader` into the stack's `StackRecord::exact`).
use crate::tracefile::TAG_EXACT;

/// `V` flag: the preceding stack record's tag is its thread id.
const VALUES_TAG_IS_THREAD: u64 = 1;

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn get_str(p: &mut Payload<'_>) -> Result<String, TraceError> {
    let n = p.varint()? as usize;
    Ok(String::from_utf8_lossy(p.bytes(n)?).into_owned())
}

impl Profile {
    /// Writes the profile as a callstack trace file: header, `P`, the
    /// modules, the thread names, each stack (`S`, its thread as the tag)
    /// followed by its exact frames past the first (`I`, if any) and its
    /// values (`V`), and `E`.
    pub fn write_trace(&self, sink: impl Write) -> io::Result<()> {
        let mut w = TraceWriter::new(sink)?;
        self.write_records(&mut w)?;
        w.finish().map(drop)
    }

    /// Writes the profile's records to a trace already started (after its
    /// header): what [`Profile::write_trace`] writes after the header.
    pub fn write_records<W: Write>(&self, w: &mut TraceWriter<W>) -> io::Result<()> {
        let mut b = Vec::new();
        put_varint(&mut b, self.sample_types.len() as u64);
        for t in &self.sample_types {
            put_str(&mut b, &t.name);
            put_str(&mut b, &t.unit);
        }
        put_varint(&mut b, self.default_sample_type as u64);
        match &self.period_type {
            Some(t) => {
                put_varint(&mut b, 1);
                put_str(&mut b, &t.name);
                put_str(&mut b, &t.unit);
            }
            None => put_varint(&mut b, 0),
        }
        put_varint(&mut b, zigzag(self.period));
        put_varint(&mut b, self.start_time_ns);
        w.write_raw(TAG_PROFILE, &b)?;
        for m in &self.modules {
            w.write_module(m)?;
        }
        for k in &self.kernel_symbols {
            b.clear();
            put_varint(&mut b, k.start);
            put_varint(&mut b, k.end.saturating_sub(k.start));
            put_str(&mut b, &k.name);
            w.write_raw(TAG_KERNEL_SYMBOL, &b)?;
        }
        for (&addr, n) in &self.named_frames {
            b.clear();
            put_varint(&mut b, addr);
            put_str(&mut b, &n.function);
            put_str(&mut b, n.file.as_deref().unwrap_or(""));
            put_varint(&mut b, n.line.map_or(0, u64::from));
            w.write_raw(TAG_NAMED_FRAME, &b)?;
        }
        for (&tid, name) in &self.threads {
            b.clear();
            put_varint(&mut b, tid as u64);
            put_str(&mut b, name);
            w.write_raw(TAG_THREAD, &b)?;
        }
        for c in &self.comments {
            b.clear();
            put_str(&mut b, c);
            w.write_raw(TAG_COMMENT, &b)?;
        }
        for (&tid, tp) in &self.thread_processes {
            b.clear();
            put_varint(&mut b, tid as u64);
            put_varint(&mut b, tp.pid as u64);
            put_str(&mut b, &tp.name);
            w.write_raw(TAG_THREAD_PROCESS, &b)?;
        }
        for s in &self.stacks {
            w.write_stack_tagged(&s.frames, s.first_is_exact, s.thread.map(u64::from))?;
            if !s.exact.is_empty() {
                b.clear();
                put_varint(&mut b, s.exact.len() as u64);
                for &i in &s.exact {
                    put_varint(&mut b, u64::from(i));
                }
                w.write_raw(TAG_EXACT, &b)?;
            }
            b.clear();
            put_varint(
                &mut b,
                if s.thread.is_some() {
                    VALUES_TAG_IS_THREAD
                } else {
                    0
                },
            );
            put_varint(&mut b, s.values.len() as u64);
            for &v in &s.values {
                put_varint(&mut b, zigzag(v));
            }
            w.write_raw(TAG_VALUES, &b)?;
        }
        b.clear();
        put_varint(&mut b, self.duration_ns);
        put_varint(&mut b, self.lost);
        w.write_raw(TAG_END, &b)
    }

    /// Reads a profile from a callstack trace file. A trace without
    /// profile records is a profile too: each stack record counts one
    /// `samples/count`. A truncated file gives the records before the cut.
    pub fn read_trace(src: impl Read) -> Result<Profile, TraceError> {
        let mut r = TraceReader::new(src)?;
        let mut p = Profile::new(vec![ValueType::new("samples", "count")]);
        // The last stack read, waiting for its `V` record.
        let mut pending: Option<StackRecord> = None;
        let flush = |p: &mut Profile, s: Option<StackRecord>| {
            if let Some(s) = s {
                p.add_exact(&s.frames, s.first_is_exact, &s.exact, None, &[1]);
            }
        };
        loop {
            let (rec, _truncated) = r.next_any()?;
            match rec {
                None => break,
                Some(AnyRecord::Known(Record::Module(m))) => {
                    flush(&mut p, pending.take());
                    p.modules.push(m);
                }
                Some(AnyRecord::Known(Record::Stack(s))) => {
                    flush(&mut p, pending.take());
                    pending = Some(s);
                }
                Some(AnyRecord::Other(TAG_VALUES, mut b)) => {
                    let flags = b.varint()?;
                    let n = b.varint()? as usize;
                    if n > b.b.len() {
                        return Err(TraceError::Corrupt("value count exceeds record", b.at));
                    }
                    let mut vals = Vec::with_capacity(n);
                    for _ in 0..n {
                        vals.push(unzigzag(b.varint()?));
                    }
                    if let Some(s) = pending.take() {
                        let thread = if flags & VALUES_TAG_IS_THREAD != 0 {
                            s.tag.map(|t| t as u32)
                        } else {
                            None
                        };
                        p.add_exact(&s.frames, s.first_is_exact, &s.exact, thread, &vals);
                    }
                }
                Some(AnyRecord::Other(tag, mut b)) => {
                    flush(&mut p, pending.take());
                    match tag {
                        TAG_PROFILE => {
                            let n = b.varint()? as usize;
                            if n > b.b.len() {
                                return Err(TraceError::Corrupt("too many sample types", b.at));
                            }
                            let mut types = Vec::with_capacity(n);
                            for _ in 0..n {
                                let name = get_str(&mut b)?;
                                let unit = get_str(&mut b)?;
                                types.push(ValueType { name, unit });
                            }
                            if types.is_empty() {
                                return Err(TraceError::Corrupt(
                                    "profile without sample types",
                                    b.at,
                                ));
                            }
                            p.default_sample_type = (b.varint()? as usize).min(n - 1);
                            p.sample_types = types;
                            p.period_type = if b.varint()? != 0 {
                                let name = get_str(&mut b)?;
                                let unit = get_str(&mut b)?;
                                Some(ValueType { name, unit })
                            } else {
                                None
                            };
                            p.period = unzigzag(b.varint()?);
                            p.start_time_ns = b.varint()?;
                        }
                        TAG_THREAD => {
                            let tid = b.varint()? as u32;
                            let name = get_str(&mut b)?;
                            p.threads.insert(tid, name);
                        }
                        TAG_COMMENT => p.comments.push(get_str(&mut b)?),
                        TAG_THREAD_PROCESS => {
                            let tid = b.varint()? as u32;
                            let pid = b.varint()? as u32;
                            let name = get_str(&mut b)?;
                            p.thread_processes
                                .insert(tid, super::ThreadProcess { pid, name });
                        }
                        TAG_END => {
                            p.duration_ns = b.varint()?;
                            p.lost = b.varint()?;
                        }
                        TAG_NAMED_FRAME => {
                            let addr = b.varint()?;
                            let function = get_str(&mut b)?;
                            let file = get_str(&mut b)?;
                            let line = b.varint()?;
                            p.named_frames.insert(
                                addr,
                                super::FrameName {
                                    function,
                                    file: (!file.is_empty()).then_some(file),
                                    line: u32::try_from(line).ok().filter(|&l| l > 0),
                                    inlined: false,
                                },
                            );
                        }
                        TAG_KERNEL_SYMBOL => {
                            let start = b.varint()?;
                            let size = b.varint()?;
                            let name = get_str(&mut b)?;
                            p.kernel_symbols.push(super::KernelSymbol {
                                start,
                                end: start.saturating_add(size),
                                name,
                            });
                        }
                        _ => {}
                    }
                }
            }
        }
        flush(&mut p, pending.take());
        p.kernel_symbols.sort_by_key(|k| k.start);
        Ok(p)
    }
}
