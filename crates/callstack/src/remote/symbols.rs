//! Symbolizing code of another process that has no file: the vDSO, whose
//! image is read from the core or the process.
//!
//! Modules with a file are named by the crate's [`crate::symbolize::Symbolizer`]
//! (the `callstack core`/`pstack` commands do so); this small reader
//! (symbol tables through `object`, lines and inlined frames through
//! `addr2line`) covers in-memory images, which that Symbolizer does not
//! open. It began as the interim symbolizer of this module.

use addr2line::gimli;
use object::{Object, ObjectSymbol, SymbolKind};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::Module;

/// What is known of one address (one entry per inlined level).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Symbol {
    /// The function's name, demangled.
    pub function: Option<String>,
    /// The source file.
    pub file: Option<String>,
    /// The source line.
    pub line: Option<u32>,
    /// Whether this level was inlined into the next one.
    pub inlined: bool,
}

/// Sections are borrowed from the mapped file (or from decompressed copies
/// kept in [`Obj::_decompressed`]); see the SAFETY note in [`load`].
type Reader = gimli::EndianSlice<'static, gimli::RunTimeEndian>;

/// The bytes of an object: a mapped file or an image read from the target.
enum Backing {
    Map(memmap2::Mmap),
    Image(Arc<Vec<u8>>),
}

impl std::ops::Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Image(v) => v,
        }
    }
}

struct Obj {
    /// (address, size, name), sorted by address; addresses as in the file.
    symbols: Vec<(u64, u64, String)>,
    /// Declared before the storage it borrows, so it is dropped first.
    dwarf: Option<addr2line::Context<Reader>>,
    _decompressed: Vec<Vec<u8>>,
    _backing: Backing,
}

/// Symbolizes addresses of a target's modules, caching each parsed file.
#[derive(Default)]
pub struct Symbolizer {
    cache: HashMap<PathBuf, Option<Arc<Obj>>>,
}

fn demangle(name: &str) -> String {
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

fn load(backing: Backing) -> Option<Obj> {
    // SAFETY: `data` borrows the heap or mapped bytes of `backing`, which
    // move into the returned `Obj` without moving those bytes (a Vec's
    // buffer and a mapping have stable addresses). Every borrow made from
    // `data` (section slices in `dwarf`) also lives in that `Obj`, in a
    // field dropped before `_backing` and `_decompressed`, and is never
    // handed out beyond the `Obj`'s life: only owned Strings leave it.
    let data: &'static [u8] =
        unsafe { std::slice::from_raw_parts(backing.as_ptr(), backing.len()) };
    let file = object::File::parse(data).ok()?;
    let mut symbols: Vec<(u64, u64, String)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .filter(|s| !s.2.is_empty())
        .collect();
    // Prefer sized, global names when several share an address.
    symbols.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    symbols.dedup_by_key(|s| s.0);
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let mut decompressed: Vec<Vec<u8>> = Vec::new();
    let mut dwarf = None;
    if file.section_by_name(".debug_info").is_some() {
        let mut load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
            // Locations and macros are never needed to name code, and
            // are among the largest (compressed) sections of a debug file.
            use gimli::SectionId::*;
            if matches!(id, DebugLoc | DebugLocLists | DebugMacinfo | DebugMacro) {
                return Ok(gimli::EndianSlice::new(&[], endian));
            }
            let bytes: &'static [u8] = match file
                .section_by_name(id.name())
                .and_then(|s| crate::elf_section::data(&s).ok())
            {
                Some(std::borrow::Cow::Borrowed(b)) => b,
                Some(std::borrow::Cow::Owned(v)) => {
                    // SAFETY: as above: the Vec's heap buffer is kept in
                    // `decompressed`, moved into the `Obj` unchanged.
                    let b = unsafe { std::slice::from_raw_parts(v.as_ptr(), v.len()) };
                    decompressed.push(v);
                    b
                }
                None => &[],
            };
            Ok(gimli::EndianSlice::new(bytes, endian))
        };
        if let Ok(d) = gimli::Dwarf::load(&mut load) {
            dwarf = addr2line::Context::from_dwarf(d).ok();
        }
    }
    Some(Obj {
        symbols,
        dwarf,
        _decompressed: decompressed,
        _backing: backing,
    })
}

impl Symbolizer {
    /// A symbolizer with an empty cache.
    pub fn new() -> Symbolizer {
        Symbolizer::default()
    }

    fn obj(&mut self, module: &Module) -> Option<Arc<Obj>> {
        let key = module
            .debug_file
            .clone()
            .or_else(|| module.file.clone())
            .unwrap_or_else(|| PathBuf::from(&module.name));
        if let Some(o) = self.cache.get(&key) {
            return o.clone();
        }
        let open = |p: &PathBuf| super::files::map_file(p).ok().map(Backing::Map);
        let obj = if let Some(img) = &module.image {
            load(Backing::Image(img.clone()))
        } else {
            let mut o = module.debug_file.as_ref().and_then(open).and_then(load);
            let file = module.file.as_ref().and_then(open).and_then(load);
            // A debug file has the DWARF; the file itself may have the only symbols.
            match (&mut o, file) {
                (Some(dbg), Some(f)) if dbg.symbols.is_empty() => dbg.symbols = f.symbols,
                (None, f) => o = f,
                _ => {}
            }
            o
        };
        let obj = obj.map(Arc::new);
        self.cache.insert(key, obj.clone());
        obj
    }

    /// Names the code at runtime address `addr` of `module`: the inlined
    /// levels first (`inlined: true`), the containing function last. Empty
    /// when nothing is known.
    pub fn symbolize(&mut self, module: &Module, addr: u64) -> Vec<Symbol> {
        let Some(obj) = self.obj(module) else {
            return Vec::new();
        };
        let probe = addr.wrapping_sub(module.bias);
        let mut out = Vec::new();
        if let Some(ctx) = &obj.dwarf {
            if let Ok(mut frames) = ctx.find_frames(probe).skip_all_loads() {
                while let Ok(Some(f)) = frames.next() {
                    let function = f
                        .function
                        .as_ref()
                        .and_then(|n| n.raw_name().ok().map(|s| demangle(s.as_ref())));
                    out.push(Symbol {
                        function,
                        file: f.location.as_ref().and_then(|l| l.file.map(str::to_string)),
                        line: f.location.as_ref().and_then(|l| l.line),
                        inlined: true,
                    });
                }
            }
        }
        if let Some(last) = out.last_mut() {
            last.inlined = false;
        }
        let from_table = || {
            let i = obj.symbols.partition_point(|s| s.0 <= probe);
            let s = obj.symbols.get(i.checked_sub(1)?)?;
            (s.1 == 0 || probe < s.0.saturating_add(s.1)).then(|| demangle(&s.2))
        };
        match out.last_mut() {
            Some(last) if last.function.is_none() => last.function = from_table(),
            Some(_) => {}
            None => {
                if let Some(name) = from_table() {
                    out.push(Symbol {
                        function: Some(name),
                        ..Symbol::default()
                    })
                }
            }
        }
        out
    }
}
