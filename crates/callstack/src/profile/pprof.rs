//! The pprof profile format (`profile.proto` of github.com/google/pprof),
//! encoded by hand: the few message kinds a profile needs are a page of
//! protobuf wire format, not worth a code generator.
//!
//! Read by `go tool pprof`, Grafana Pyroscope, Parca and most profile
//! viewers. Functions, files and lines come from [`Names`], so the file is
//! symbolized (`has_functions`) and needs no binary to be viewed; the
//! mappings keep path and build-id for tools that re-symbolize.

use super::{Names, Profile};
use std::collections::HashMap;

/// Protobuf wire types.
const VARINT: u64 = 0;
const LEN: u64 = 2;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u64, wire: u64) {
    put_varint(out, (field << 3) | wire);
}

/// A varint field (int64 / uint64 / bool); zero is the default and left out.
fn uint(out: &mut Vec<u8>, field: u64, v: u64) {
    if v != 0 {
        key(out, field, VARINT);
        put_varint(out, v);
    }
}

fn bytes(out: &mut Vec<u8>, field: u64, b: &[u8]) {
    key(out, field, LEN);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A packed repeated varint field.
fn packed(out: &mut Vec<u8>, field: u64, vals: impl Iterator<Item = u64>, tmp: &mut Vec<u8>) {
    tmp.clear();
    for v in vals {
        put_varint(tmp, v);
    }
    if !tmp.is_empty() {
        bytes(out, field, tmp);
    }
}

/// The string table: index 0 is "".
struct Strings {
    index: HashMap<String, u64>,
    list: Vec<String>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Strings {
            index: HashMap::new(),
            list: Vec::new(),
        };
        s.id("");
        s
    }

    fn id(&mut self, s: &str) -> u64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.list.len() as u64;
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Whether `m` names no file: `[kernel.kallsyms]`, `[vdso]`.
fn is_pseudo_module(m: &crate::tracefile::ModuleRecord) -> bool {
    m.path.as_os_str().as_encoded_bytes().starts_with(b"[")
}

/// The file offset of a module's lowest address (pprof's `file_offset`):
/// from the file's `PT_LOAD` headers when it is here and is the one
/// recorded (same build-id), since the link-time address (`start - bias`)
/// is the offset only when the first segment is linked at 0: a program
/// built without PIE is linked at 0x400000 from file offset 0, and a
/// server given 0x400000 would look past its end. Else `start - bias`.
pub fn file_offset(m: &crate::tracefile::ModuleRecord) -> u64 {
    let link = m.start.wrapping_sub(m.bias);
    if let Some(off) = offset_in_file(m, link) {
        return off;
    }
    link
}

/// The offset of link-time address `link` in `m`'s file, read from its
/// first 64 KiB (the ELF and program headers, the build-id note).
fn offset_in_file(m: &crate::tracefile::ModuleRecord, link: u64) -> Option<u64> {
    use std::io::Read;
    if !m.path.is_absolute() {
        return None;
    }
    let mut head = Vec::with_capacity(64 << 10);
    std::fs::File::open(&m.path)
        .ok()?
        .take(64 << 10)
        .read_to_end(&mut head)
        .ok()?;
    if let Some(want) = &m.build_id {
        if crate::elf_headers::build_id(&head).as_ref() != Some(want) {
            return None;
        }
    }
    let (_, loads) = crate::elf_headers::load_segments(&head)?;
    // The segment mapped at `link` (segments are mapped from page
    // boundaries): the last that starts at or below it.
    let (page_vaddr, page_offset) = loads
        .iter()
        .map(|&(vaddr, offset, _, _)| (vaddr & !0xfff, offset & !0xfff))
        .filter(|&(page_vaddr, _)| page_vaddr <= link)
        .max_by_key(|&(page_vaddr, _)| page_vaddr)?;
    Some(page_offset + (link - page_vaddr))
}

/// Encodes the profile as an uncompressed pprof `Profile` message, named
/// by `names` (with `Names::default()`, no names: locations hold their
/// address and mapping only, and the mappings say they have no functions,
/// for a server to symbolize by build-id). Every sample of a stack with a thread gets the labels
/// `thread_id` (number) and `thread_name` (when known), and, when the
/// profile knows the thread's process ([`Profile::thread_processes`]),
/// `pid` (number) and `comm` (the process's name): `go tool pprof -tags`,
/// `-tagfocus=comm=python3`, `-tagfocus=pid=1234` split by process.
pub fn encode(profile: &Profile, names: &Names) -> Vec<u8> {
    let mut out = Vec::new();
    let mut strings = Strings::new();
    let mut msg = Vec::new();
    let mut tmp = Vec::new();

    // 1: sample_type
    for t in &profile.sample_types {
        msg.clear();
        uint(&mut msg, 1, strings.id(&t.name));
        uint(&mut msg, 2, strings.id(&t.unit));
        bytes(&mut out, 1, &msg);
    }

    // 3: mapping (ids 1..), one per module, in the profile's order but
    // for pseudo-modules (`[kernel.kallsyms]`, `[vdso]`: no file) put
    // last: viewers take the first mapping for the program (`File:` of
    // `go tool pprof`), and a profile's modules start with it.
    let mut order: Vec<usize> = (0..profile.modules.len()).collect();
    order.sort_by_key(|&i| is_pseudo_module(&profile.modules[i]));
    let mut mapping_id = vec![0u64; profile.modules.len()];
    for (n, &i) in order.iter().enumerate() {
        mapping_id[i] = n as u64 + 1;
    }
    // A mapping is named when an address of it is.
    let mut named_mapping = vec![false; profile.modules.len()];
    if !names.is_empty() {
        for s in &profile.stacks {
            for (k, &a) in s.frames.iter().enumerate() {
                if names.get(a, s.is_exact(k)).is_some_and(|n| !n.is_empty()) {
                    if let Some(i) = profile
                        .modules
                        .iter()
                        .rposition(|m| m.start <= a as u64 && (a as u64) < m.end)
                    {
                        named_mapping[i] = true;
                    }
                }
            }
        }
    }
    for &i in &order {
        let m = &profile.modules[i];
        msg.clear();
        uint(&mut msg, 1, mapping_id[i]);
        uint(&mut msg, 2, m.start);
        uint(&mut msg, 3, m.end);
        // The file offset mapped at `start`: what a server adds to
        // `address - start` to find the address's place in the file.
        uint(&mut msg, 4, file_offset(m));
        uint(&mut msg, 5, strings.id(&m.path.to_string_lossy()));
        if let Some(id) = &m.build_id {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            uint(&mut msg, 6, strings.id(&hex));
        }
        // Named (or not, for a server to symbolize from the build-ids:
        // `Names::default()`, or `Names::own` where only the profile's
        // own frames are named).
        let named = named_mapping[i] as u64;
        uint(&mut msg, 7, named); // has_functions
        uint(&mut msg, 8, named); // has_filenames
        uint(&mut msg, 9, named); // has_line_numbers
        uint(&mut msg, 10, named); // has_inline_frames
        bytes(&mut out, 3, &msg);
    }
    let mapping_of = |a: u64| -> u64 {
        profile
            .modules
            .iter()
            .rposition(|m| m.start <= a && a < m.end)
            .map_or(0, |i| mapping_id[i])
    };

    // Functions (by name + file) and locations (by address + exactness).
    let mut functions: HashMap<(String, String), u64> = HashMap::new();
    let mut function_msgs = Vec::new();
    let mut locations: HashMap<(usize, bool), u64> = HashMap::new();
    let mut location_msgs = Vec::new();
    let mut sample_msgs = Vec::new();
    let mut loc_ids: Vec<u64> = Vec::new();
    let mut line_msg = Vec::new();
    for s in &profile.stacks {
        loc_ids.clear();
        for (i, &a) in s.frames.iter().enumerate() {
            let exact = s.is_exact(i);
            let next = locations.len() as u64 + 1;
            let id = *locations.entry((a, exact)).or_insert(next);
            if id == next {
                msg.clear();
                uint(&mut msg, 1, id);
                uint(&mut msg, 2, mapping_of(a as u64));
                // The instruction address: inside the call for a return
                // address, as pprof's own profiles give it.
                let addr = if exact { a } else { a.saturating_sub(1) };
                uint(&mut msg, 3, addr as u64);
                for f in names.get(a, exact).unwrap_or(&[]) {
                    let file = f.file.clone().unwrap_or_default();
                    let fkey = (f.function.clone(), file);
                    let next_f = functions.len() as u64 + 1;
                    let fid = *functions.entry(fkey).or_insert(next_f);
                    if fid == next_f {
                        let mut fm = Vec::new();
                        uint(&mut fm, 1, fid);
                        uint(&mut fm, 2, strings.id(&f.function));
                        uint(&mut fm, 3, strings.id(&f.function));
                        if let Some(file) = &f.file {
                            uint(&mut fm, 4, strings.id(file));
                        }
                        function_msgs.push(fm);
                    }
                    line_msg.clear();
                    uint(&mut line_msg, 1, fid);
                    uint(&mut line_msg, 2, f.line.unwrap_or(0) as u64);
                    bytes(&mut msg, 4, &line_msg);
                }
                location_msgs.push(msg.clone());
            }
            loc_ids.push(id);
        }
        msg.clear();
        packed(&mut msg, 1, loc_ids.iter().copied(), &mut tmp);
        packed(&mut msg, 2, s.values.iter().map(|&v| v as u64), &mut tmp);
        if let Some(t) = s.thread {
            line_msg.clear();
            uint(&mut line_msg, 1, strings.id("thread_id"));
            uint(&mut line_msg, 3, t as u64);
            bytes(&mut msg, 3, &line_msg);
            if let Some(name) = profile.threads.get(&t) {
                line_msg.clear();
                uint(&mut line_msg, 1, strings.id("thread_name"));
                uint(&mut line_msg, 2, strings.id(name));
                bytes(&mut msg, 3, &line_msg);
            }
            if let Some(tp) = profile.thread_processes.get(&t) {
                line_msg.clear();
                uint(&mut line_msg, 1, strings.id("pid"));
                uint(&mut line_msg, 3, tp.pid as u64);
                bytes(&mut msg, 3, &line_msg);
                if !tp.name.is_empty() {
                    line_msg.clear();
                    uint(&mut line_msg, 1, strings.id("comm"));
                    uint(&mut line_msg, 2, strings.id(&tp.name));
                    bytes(&mut msg, 3, &line_msg);
                }
            }
        }
        sample_msgs.push(msg.clone());
    }
    for m in &sample_msgs {
        bytes(&mut out, 2, m);
    }
    for m in &location_msgs {
        bytes(&mut out, 4, m);
    }
    for m in &function_msgs {
        bytes(&mut out, 5, m);
    }
    // 9: time_nanos, 10: duration_nanos, 11: period_type, 12: period.
    uint(&mut out, 9, profile.start_time_ns);
    uint(&mut out, 10, profile.duration_ns);
    if let Some(t) = &profile.period_type {
        msg.clear();
        uint(&mut msg, 1, strings.id(&t.name));
        uint(&mut msg, 2, strings.id(&t.unit));
        bytes(&mut out, 11, &msg);
    }
    uint(&mut out, 12, profile.period as u64);
    // 13: comment.
    if profile.lost > 0 {
        let c = strings.id(&format!("lost samples: {}", profile.lost));
        uint(&mut out, 13, c);
    }
    for c in &profile.comments {
        let c = strings.id(c);
        uint(&mut out, 13, c);
    }
    // 14: default_sample_type (a string index).
    if let Some(t) = profile.sample_types.get(profile.default_sample_type) {
        let id = strings.id(&t.name);
        uint(&mut out, 14, id);
    }
    // 6: string_table, last (all strings are known now); field order does
    // not matter to protobuf readers.
    for s in &strings.list {
        bytes(&mut out, 6, s.as_bytes());
    }
    out
}

/// Writes the profile as a gzip'd pprof file (what `go tool pprof` and
/// profile servers take).
#[cfg(feature = "pprof")]
pub fn write_gzip(
    profile: &Profile,
    names: &Names,
    sink: impl std::io::Write,
) -> std::io::Result<()> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(sink, flate2::Compression::default());
    gz.write_all(&encode(profile, names))?;
    gz.finish().map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::FrameName;

    /// Reads the top-level fields of a protobuf message.
    fn fields(mut b: &[u8]) -> Vec<(u64, Vec<u8>, u64)> {
        fn varint(b: &mut &[u8]) -> u64 {
            let mut v = 0;
            let mut s = 0;
            loop {
                let x = b[0];
                *b = &b[1..];
                v |= ((x & 0x7f) as u64) << s;
                s += 7;
                if x & 0x80 == 0 {
                    return v;
                }
            }
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let k = varint(&mut b);
            match k & 7 {
                0 => out.push((k >> 3, Vec::new(), varint(&mut b))),
                2 => {
                    let n = varint(&mut b) as usize;
                    out.push((k >> 3, b[..n].to_vec(), 0));
                    b = &b[n..];
                }
                w => panic!("wire type {w}"),
            }
        }
        out
    }

    #[test]
    fn encodes_the_messages() {
        let mut p = Profile::cpu(1000);
        p.add(&[0x10, 0x20], true, Some(3), &[2, 2_000_000]);
        p.add(&[0x30, 0x20], true, None, &[1, 1_000_000]);
        let names = Names::resolve(&p, |a, _| vec![FrameName::function(format!("f{a:x}"))]);
        let b = encode(&p, &names);
        let f = fields(&b);
        let count = |n| f.iter().filter(|x| x.0 == n).count();
        assert_eq!(count(1), 2); // sample types
        assert_eq!(count(2), 2); // samples
        assert_eq!(count(4), 3); // locations
        assert_eq!(count(5), 3); // functions
        let strings: Vec<String> = f
            .iter()
            .filter(|x| x.0 == 6)
            .map(|x| String::from_utf8(x.1.clone()).unwrap())
            .collect();
        assert_eq!(strings[0], "");
        for s in [
            "samples",
            "count",
            "cpu",
            "nanoseconds",
            "f10",
            "f20",
            "thread_id",
        ] {
            assert!(strings.iter().any(|x| x == s), "{s}");
        }
        let period = f.iter().find(|x| x.0 == 12).unwrap().2;
        assert_eq!(period, 1_000_000);
    }
}
