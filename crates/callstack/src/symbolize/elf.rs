//! One ELF object opened for symbolization: its DWARF (possibly in a
//! separate debug file), its symbol tables, its build-id.

use super::dwarf::{DwarfIndex, Info};
use super::lazy::Inflating;
use super::mapped::Mapped;
use super::{Error, ErrorKind, IntMap, NameSource};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use std::borrow::Cow;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) type Slice = gimli::EndianSlice<'static, gimli::RunTimeEndian>;

/// A symbol of `.symtab` or `.dynsym`, for the fallback path.
pub(crate) struct Sym {
    pub addr: u64,
    /// End of the symbol's section (binutils never names an address with
    /// a symbol of another section).
    pub end: u64,
    pub name: &'static str,
    /// For a local symbol, the preceding `STT_FILE` symbol's name (the
    /// source file binutils reports without line info).
    pub file: Option<&'static str>,
    pub source: NameSource,
}

/// A demangled name and, when different, the name as stored.
pub(crate) type NamePair = (Option<Arc<str>>, Option<Arc<str>>);

/// An opened object. Field order matters: `dwarf`, the name maps and
/// `syms` borrow from `_debug_map` and `_map` and must be dropped first.
pub(crate) struct ElfModule {
    pub dwarf: Option<DwarfIndex>,
    /// Interned names, keyed by the address of the raw name in the mapped
    /// file: each name is demangled and allocated once per module, then
    /// shared.
    names: RefCell<IntMap<(usize, usize), NamePair>>,
    files: RefCell<IntMap<(usize, usize), Arc<str>>>,

    pub syms: Vec<Sym>,
    #[allow(dead_code)] // kept for diagnostics
    /// Which file the DWARF came from (the object itself or its debug file).
    pub debug_path: Option<PathBuf>,
    pub build_id: Option<Vec<u8>>,
    /// Lowest file virtual address of a `PT_LOAD` with file offset 0 (for
    /// computing the bias from a load address).
    pub first_load_vaddr: u64,
    /// Sorted address ranges of the allocated (`SHF_ALLOC`) sections: an
    /// address outside them belongs to nothing, whatever the DWARF of
    /// discarded functions (relocated to 0 by the linker) claims.
    alloc: Vec<(u64, u64)>,
    _debug_map: Option<Mapped>,
    _map: Mapped,
}

/// Where split debug info may live, in addition to the default places.
#[derive(Clone, Debug, Default)]
pub(crate) struct SearchPaths {
    pub debug_dirs: Vec<PathBuf>,
    /// Do not look for debug files at all (objects from memory).
    pub disabled: bool,
}

impl SearchPaths {
    pub(crate) fn none() -> SearchPaths {
        SearchPaths {
            debug_dirs: Vec::new(),
            disabled: true,
        }
    }
}

impl ElfModule {
    pub(crate) fn open(path: &Path, search: &SearchPaths) -> Result<ElfModule, Error> {
        let map = Mapped::open(path).map_err(|e| Error::new(ErrorKind::Io, path, e.to_string()))?;
        Self::from_mapped(map, path, search)
    }

    pub(crate) fn from_mapped(
        map: Mapped,
        path: &Path,
        search: &SearchPaths,
    ) -> Result<ElfModule, Error> {
        let err = |kind, msg: String| Error::new(kind, path, msg);
        let data = map.bytes();
        let obj =
            object::File::parse(data).map_err(|e| err(ErrorKind::BadObject, e.to_string()))?;
        let build_id = obj.build_id().ok().flatten().map(|b| b.to_vec());
        let first_load_vaddr = first_load_vaddr(&obj);
        let mut alloc: Vec<(u64, u64)> = obj
            .sections()
            .filter(|s| match s.flags() {
                object::SectionFlags::Elf { sh_flags, .. } => {
                    sh_flags.contains(object::elf::SHF_ALLOC)
                }
                _ => true,
            })
            .filter(|s| s.size() > 0)
            .map(|s| (s.address(), s.address().saturating_add(s.size())))
            .collect();
        alloc.sort_unstable();

        let mut syms = Vec::new();
        collect_syms(&obj, false, &mut syms);

        let has_dwarf = obj
            .section_by_name(".debug_info")
            .is_some_and(|s| s.size() > 0);
        let mut debug_map = None;
        let mut debug_path = None;
        let loaded;
        if has_dwarf {
            loaded = load_dwarf(&obj, &map).ok();
            debug_path = Some(path.to_path_buf());
        } else if let Some(dpath) = find_debug_file(path, &obj, build_id.as_deref(), search) {
            let dmap = Mapped::open(&dpath)
                .map_err(|e| Error::new(ErrorKind::Io, &dpath, e.to_string()))?;
            let dobj = object::File::parse(dmap.bytes())
                .map_err(|e| Error::new(ErrorKind::BadObject, &dpath, e.to_string()))?;
            loaded = load_dwarf(&dobj, &dmap).ok();
            if syms.iter().all(|s| s.source != NameSource::Symtab) {
                collect_syms(&dobj, true, &mut syms);
            }
            debug_path = Some(dpath);
            debug_map = Some(dmap);
        } else {
            loaded = None;
        }
        let dwarf = loaded;
        syms.sort_by(|a, b| a.addr.cmp(&b.addr).then(a.source.cmp(&b.source)));
        // Keep one symbol per address: the best source (symtab over dynsym),
        // then the sized, global-looking one.
        syms.dedup_by(|b, a| a.addr == b.addr);
        Ok(ElfModule {
            dwarf,
            names: RefCell::new(IntMap::default()),
            files: RefCell::new(IntMap::default()),

            syms,
            debug_path,
            build_id,
            first_load_vaddr,
            alloc,
            _debug_map: debug_map,
            _map: map,
        })
    }

    /// The symbol-table entry covering `addr`, if any.
    pub(crate) fn symbol(&self, addr: u64) -> Option<&Sym> {
        let i = self.syms.partition_point(|s| s.addr <= addr);
        let s = self.syms.get(i.checked_sub(1)?)?;
        (addr < s.end).then_some(s)
    }
}

impl ElfModule {
    /// Whether `addr` lies in an allocated section of the object.
    pub(crate) fn in_allocated_section(&self, addr: u64) -> bool {
        let i = self.alloc.partition_point(|r| r.0 <= addr);
        // Sections may overlap (.tbss): look back over a few.
        self.alloc[..i]
            .iter()
            .rev()
            .take(4)
            .any(|&(b, e)| b <= addr && addr < e)
    }

    /// The demangled and the raw (when different) name of a function, given
    /// its bytes in the mapped file, interned.
    pub(crate) fn function_name(&self, raw: &[u8], lang: Option<gimli::DwLang>) -> NamePair {
        let key = (raw.as_ptr() as usize, raw.len());
        if let Some(v) = self.names.borrow().get(&key) {
            return v.clone();
        }
        let raw = String::from_utf8_lossy(raw);
        let d = super::demangle::demangle_lang(&raw, lang);
        let v = if d == raw {
            (Some(Arc::from(&*raw)), None)
        } else {
            (Some(Arc::from(&*d)), Some(Arc::from(&*raw)))
        };
        self.names.borrow_mut().insert(key, v.clone());
        v
    }

    /// A file name, interned by the address of its text (stable for as long
    /// as the module lives: it points into the mapped file).
    pub(crate) fn file_name(&self, p: &str) -> Arc<str> {
        let key = (p.as_ptr() as usize, p.len());
        self.files
            .borrow_mut()
            .entry(key)
            .or_insert_with(|| Arc::from(p))
            .clone()
    }
}

fn first_load_vaddr(obj: &object::File<'static>) -> u64 {
    use object::ObjectSegment;
    obj.segments()
        .filter(|s| s.file_range().0 == 0)
        .map(|s| s.address())
        .min()
        .or_else(|| obj.segments().map(|s| s.address()).min())
        .unwrap_or(0)
}

fn collect_syms(obj: &object::File<'static>, from_debug_file: bool, out: &mut Vec<Sym>) {
    let mut file: Option<&'static str> = None;
    let mut push = |sym: object::Symbol<'static, '_>, source| {
        if sym.kind() == SymbolKind::File {
            file = sym.name().ok().filter(|n| !n.is_empty());
            return;
        }
        if sym.kind() != SymbolKind::Text || sym.is_undefined() || sym.address() == 0 {
            return;
        }
        // Like binutils, a symbol names every address up to the next
        // symbol of its section, padding included: ELF sizes are not
        // trusted (hand-written assembly often has none).
        // A range that wraps past the top of the address space is corrupt:
        // the symbol is left out.
        let end = match sym
            .section_index()
            .and_then(|i| obj.section_by_index(i).ok())
        {
            Some(sec) => sec.address().checked_add(sec.size()),
            None if sym.size() > 0 => sym.address().checked_add(sym.size()),
            None => return,
        };
        let Some(end) = end else { return };
        // A debug file's .symtab describes NOBITS sections: still right.
        let _ = from_debug_file;
        if let Ok(name) = sym.name() {
            if !name.is_empty() {
                out.push(Sym {
                    addr: sym.address(),
                    end,
                    name,
                    file: if sym.is_local() { file } else { None },
                    source,
                });
            }
        }
    };
    for s in obj.symbols() {
        push(s, NameSource::Symtab);
    }
    for s in obj.dynamic_symbols() {
        push(s, NameSource::Dynsym);
    }
}

fn load_dwarf(obj: &object::File<'static>, map: &Mapped) -> Result<DwarfIndex, gimli::Error> {
    let endian = if obj.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<Slice, gimli::Error> {
        // Location lists (variables' locations) are never read by the
        // symbolizer: not loading them spares inflating them, which in a
        // compressed debug file such as glibc's is about a sixth of all
        // the DWARF (1.4 of 9.9 MB for libc6-dbg's libc.so.6).
        if matches!(
            id,
            gimli::SectionId::DebugLoc | gimli::SectionId::DebugLocLists
        ) {
            return Ok(gimli::EndianSlice::new(&[], endian));
        }
        // A zlib-compressed `.debug_info` is inflated lazily (below).
        if id == gimli::SectionId::DebugInfo
            && obj.section_by_name(id.name()).is_some_and(|s| {
                s.compressed_data()
                    .is_ok_and(|c| c.format == object::CompressionFormat::Zlib)
            })
        {
            return Ok(gimli::EndianSlice::new(&[], endian));
        }
        let bytes: &'static [u8] = match obj.section_by_name(id.name()) {
            Some(s) => match crate::elf_section::data(&s) {
                Ok(Cow::Borrowed(b)) => b,
                Ok(Cow::Owned(v)) => map.stash(v),
                // A section we cannot decompress (or whose header declares
                // a size its stream cannot hold) is treated as absent.
                Err(_) => &[],
            },
            None => &[],
        };
        Ok(gimli::EndianSlice::new(bytes, endian))
    };
    let dwarf = gimli::Dwarf::load(load)?;
    // `.debug_info` is read through `Info`: a zlib-compressed one is
    // inflated only as far as the units used (the units of a few frames of
    // glibc sit well before the end of its 6 MB).
    let info = match obj
        .section_by_name(".debug_info")
        .map(|s| s.compressed_data())
    {
        // A declared size the stream cannot hold (a corrupt header) leaves
        // `.debug_info` absent rather than allocating that size.
        Some(Ok(c))
            if c.format == object::CompressionFormat::Zlib && crate::elf_section::plausible(&c) =>
        {
            Info::Inflating(Inflating::new(c.data, c.uncompressed_size as usize), endian)
        }
        _ => Info::Plain(*gimli::Section::reader(&dwarf.debug_info)),
    };
    Ok(DwarfIndex::new(dwarf, info))
}

/// Finds the separate debug file of `path`: by build-id under
/// `<dir>/.build-id/xx/yyyy.debug`, then by `.gnu_debuglink` beside the
/// file, in its `.debug/` subdirectory and under `<dir>/<its dir>/`, for
/// each debug dir (the configured ones, then `/usr/lib/debug`).
pub(crate) fn find_debug_file(
    path: &Path,
    obj: &object::File<'static>,
    build_id: Option<&[u8]>,
    search: &SearchPaths,
) -> Option<PathBuf> {
    if search.disabled {
        return None;
    }
    let mut roots: Vec<PathBuf> = search.debug_dirs.clone();
    roots.push(PathBuf::from("/usr/lib/debug"));
    if let Some(id) = build_id.filter(|b| b.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        for r in &roots {
            let p = r
                .join(".build-id")
                .join(&hex[..2])
                .join(format!("{}.debug", &hex[2..]));
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let (name, _crc) = obj.gnu_debuglink().ok().flatten()?;
    let name = std::str::from_utf8(name).ok()?;
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut candidates = Vec::new();
    for dir in [path.parent(), real.parent()].into_iter().flatten() {
        candidates.push(dir.join(name));
        candidates.push(dir.join(".debug").join(name));
        for r in &roots {
            let rel = dir.strip_prefix("/").unwrap_or(dir);
            candidates.push(r.join(rel).join(name));
        }
    }
    for r in &search.debug_dirs {
        candidates.push(r.join(name));
    }
    candidates
        .into_iter()
        .find(|c| c.is_file() && c.as_path() != path && c.as_path() != real.as_path())
}
