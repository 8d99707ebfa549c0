//! Address to function, file and line, for the symbolized part of a report.
//!
//! PLACEHOLDER: until `callstack::symbolize::Symbolizer` lands, this is a
//! small resolver over the `addr2line` crate (DWARF, with inlined frames)
//! and `.symtab`/`.dynsym` (via `object`). [`Resolver::resolve`] is the one
//! function the crash reports call; it switches to the Symbolizer then.

use addr2line::gimli;
use object::{Object, ObjectSection, ObjectSymbol};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

type Slice = gimli::EndianSlice<'static, gimli::RunTimeEndian>;

/// One resolved frame (an address can give several: inlined ones first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SymFrame {
    /// Demangled function name, if known.
    pub function: Option<String>,
    /// Source file, if known.
    pub file: Option<String>,
    /// Line, if known.
    pub line: Option<u32>,
    /// Column, if known.
    pub column: Option<u32>,
    /// Whether this frame was inlined into the next one.
    pub inlined: bool,
}

struct Loaded {
    ctx: Option<addr2line::Context<Slice>>,
    /// (address, size, name), sorted by address.
    symbols: Vec<(u64, u64, String)>,
    build_id: Option<Vec<u8>>,
}

/// Resolves module offsets, caching each module it opens.
#[derive(Default)]
pub struct Resolver {
    modules: HashMap<PathBuf, Option<Loaded>>,
}

fn leak(c: Cow<'_, [u8]>, keep: &'static [u8]) -> &'static [u8] {
    match c {
        // A borrowed slice points into the leaked map `keep`.
        Cow::Borrowed(b) => {
            let off = b.as_ptr() as usize - keep.as_ptr() as usize;
            &keep[off..off + b.len()]
        }
        Cow::Owned(v) => Box::leak(v.into_boxed_slice()),
    }
}

fn load(path: &Path) -> Option<Loaded> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: the file is mapped read-only; a concurrent truncation could
    // fault, the risk every symbolizer of mapped files takes.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let data: &'static [u8] = &Box::leak(Box::new(map))[..];
    let obj = object::File::parse(data).ok()?;
    let endian = if obj.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let section = |id: gimli::SectionId| -> Result<Slice, gimli::Error> {
        let bytes = obj
            .section_by_name(id.name())
            .and_then(|s| s.uncompressed_data().ok())
            .map(|c| leak(c, data))
            .unwrap_or(&[]);
        Ok(gimli::EndianSlice::new(bytes, endian))
    };
    let ctx = gimli::Dwarf::load(section)
        .ok()
        .and_then(|d| addr2line::Context::from_dwarf(d).ok());
    let mut symbols: Vec<(u64, u64, String)> = obj
        .symbols()
        .chain(obj.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .collect();
    symbols.sort();
    symbols.dedup_by_key(|s| s.0);
    let build_id = obj.build_id().ok().flatten().map(<[u8]>::to_vec);
    Some(Loaded {
        ctx,
        symbols,
        build_id,
    })
}

/// Demangles Rust (legacy and v0) and C++ names; others are returned as is.
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z") {
        if let Ok(s) = cpp_demangle::Symbol::new(name) {
            if let Ok(d) = s.demangle() {
                return d;
            }
        }
    }
    name.to_string()
}

/// What [`Resolver::resolve`] says about one address.
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    /// Frames at the address, innermost (inlined) first; empty if unknown.
    pub frames: Vec<SymFrame>,
    /// Set when the file on disk has another build-id than the report's.
    pub build_id_mismatch: bool,
    /// Set when the module file could not be read.
    pub unreadable: bool,
}

impl Resolver {
    /// A resolver with an empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Resolves `offset` (address minus load bias) in the module at `path`.
    /// `is_return_address` looks up `offset - 1`, the call instruction.
    pub fn resolve(
        &mut self,
        path: &Path,
        build_id: Option<&[u8]>,
        offset: u64,
        is_return_address: bool,
    ) -> Resolved {
        let probe = if is_return_address {
            offset.saturating_sub(1)
        } else {
            offset
        };
        let loaded = self
            .modules
            .entry(path.to_path_buf())
            .or_insert_with(|| load(path));
        let Some(m) = loaded else {
            return Resolved {
                unreadable: true,
                ..Default::default()
            };
        };
        let mut out = Resolved {
            build_id_mismatch: matches!((build_id, &m.build_id), (Some(a), Some(b)) if !a.is_empty() && a != &b[..]),
            ..Default::default()
        };
        if let Some(ctx) = &m.ctx {
            if let Ok(mut it) = ctx.find_frames(probe).skip_all_loads() {
                while let Ok(Some(f)) = it.next() {
                    let function = f
                        .function
                        .as_ref()
                        .and_then(|n| n.raw_name().ok())
                        .map(|n| demangle(&n));
                    let (file, line, column) = match &f.location {
                        Some(l) => (l.file.map(str::to_string), l.line, l.column),
                        None => (None, None, None),
                    };
                    out.frames.push(SymFrame {
                        function,
                        file,
                        line,
                        column,
                        inlined: true,
                    });
                }
            }
            if let Some(last) = out.frames.last_mut() {
                last.inlined = false;
            }
        }
        if out.frames.iter().all(|f| f.function.is_none()) {
            let i = m.symbols.partition_point(|s| s.0 <= probe);
            if i > 0 {
                let (addr, size, name) = &m.symbols[i - 1];
                if size == &0 || probe < addr + size {
                    let name = demangle(name);
                    match out.frames.last_mut() {
                        Some(f) => f.function = Some(name),
                        None => out.frames.push(SymFrame {
                            function: Some(name),
                            ..Default::default()
                        }),
                    }
                }
            }
        }
        out
    }
}
