//! One ELF object opened for symbolization: its DWARF (possibly in a
//! separate debug file), its symbol tables, its build-id.

use super::debuginfod::{Artifact, Debuginfod};
use super::dwarf::{DwarfIndex, Info};
use super::lazy::Inflating;
use super::mapped::Mapped;
use super::{Error, ErrorKind, IntMap, NameSource};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) type Slice = gimli::EndianSlice<'static, gimli::RunTimeEndian>;

/// A symbol of `.symtab` or `.dynsym`, for the fallback path.
#[derive(Clone, Copy)]
pub(crate) struct Sym {
    pub addr: u64,
    /// End of the symbol's section (binutils never names an address with
    /// a symbol of another section).
    pub end: u64,
    /// The symbol's `st_size` (0: not given).
    pub size: u64,
    pub name: &'static str,
    /// For a local symbol, the preceding `STT_FILE` symbol's name (the
    /// source file binutils reports without line info).
    pub file: Option<&'static str>,
    pub source: NameSource,
    /// A PLT entry (named `name@plt`, as gdb and objdump name it).
    pub plt: bool,
}

/// How far a symbol of `.symtab` / `.dynsym` reaches when it names an
/// address that no debug info covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SymbolExtent {
    /// binutils' `addr2line`: a symbol names every address up to the next
    /// symbol of its section, past its `st_size` (padding, and in a
    /// stripped object every local function after an exported one, get
    /// the exported one's name); a PLT entry has no name. What `callstack
    /// addr2line` uses.
    Section,
    /// gdb's: a sized symbol names only the addresses inside its size; one
    /// without a size names addresses up to the next symbol. An address
    /// that no symbol covers this way has no name (gdb prints `??`). The
    /// default: a stripped program's local functions are not given the
    /// name of the exported function before them. A PLT entry is named
    /// `function@plt`, as gdb (and objdump) name it.
    #[default]
    Sized,
}

/// [`ElfModule::address_of`]'s cache: a name's address and whether its
/// symbol is global, or `None` when no function symbol has that name.
type ByName = HashMap<&'static [u8], Option<(u64, bool)>>;

/// A demangled name and, when different, the name as stored.
pub(crate) type NamePair = (Option<Arc<str>>, Option<Arc<str>>);

/// An opened object. Field order matters: `dwarf`, the name maps and
/// `syms` borrow from `_sup_map`, `_debug_map` and `_map` and must be
/// dropped first.
pub(crate) struct ElfModule {
    pub dwarf: Option<DwarfIndex>,
    /// A PE image's PDB, when it names one and it was found
    /// (`symbolize/pdb.rs`, feature `pdb`).
    #[cfg(feature = "pdb")]
    pub pdb: Option<super::pdb::PdbModule>,
    /// Interned names, keyed by the address of the raw name in the mapped
    /// file: each name is demangled and allocated once per module, then
    /// shared.
    names: RefCell<IntMap<(usize, usize), NamePair>>,
    files: RefCell<IntMap<(usize, usize), Arc<str>>>,

    pub syms: Vec<Sym>,
    /// For each symbol of `syms`, the index of the nearest sized symbol at
    /// or before it (`u32::MAX`: none), for [`SymbolExtent::Sized`] lookups.
    prev_sized: Vec<u32>,
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
    /// How the debug info was found, what was skipped and why.
    pub report: DebugInfoReport,
    /// [`ElfModule::address_of`]'s answers, by name: only the tail-call
    /// search asks, for a few names, so the symbol tables are scanned per
    /// name rather than indexed.
    by_name: RefCell<ByName>,
    /// The inflated `.gnu_debugdata` image (MiniDebugInfo), stashed in
    /// `_map`, when its symbols were used.
    mini: Option<&'static [u8]>,
    /// The dwz supplementary file (`.gnu_debugaltlink`), if found.
    _sup_map: Option<Mapped>,
    _debug_map: Option<Mapped>,
    _map: Mapped,
}

/// Where split debug info may live, in addition to the default places.
#[derive(Clone, Debug, Default)]
pub(crate) struct SearchPaths {
    pub debug_dirs: Vec<PathBuf>,
    /// Do not look for debug files at all (objects from memory).
    pub disabled: bool,
    /// Where to fetch what is not on this machine (`DEBUGINFOD_URLS`).
    pub debuginfod: Option<Arc<Debuginfod>>,
}

impl SearchPaths {
    pub(crate) fn none() -> SearchPaths {
        SearchPaths {
            debug_dirs: Vec::new(),
            disabled: true,
            debuginfod: None,
        }
    }
}

impl ElfModule {
    /// An estimate of the heap this module takes: its symbol tables,
    /// interned names and DWARF index (the mapped files are not counted:
    /// the kernel's page cache, given back under pressure).
    pub(crate) fn approx_bytes(&self) -> usize {
        std::mem::size_of::<ElfModule>()
            + self.syms.len() * std::mem::size_of::<Sym>()
            + self.prev_sized.len() * 4
            + self.alloc.len() * 16
            + (self.names.borrow().len() + self.files.borrow().len()) * 64
            + self.dwarf.as_ref().map_or(0, DwarfIndex::approx_bytes)
    }

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
        let mut report = DebugInfoReport::default();
        let mut sup = None;
        let loaded;
        if has_dwarf {
            let inflating = start_inflating(&obj);
            sup = find_supplementary(path, &obj, search, &mut report);
            loaded = load_dwarf(&obj, &map, sup.as_ref(), inflating).ok();
            debug_path = Some(path.to_path_buf());
        } else if let Some((dpath, dmap)) =
            find_debug_file(path, &obj, build_id.as_deref(), search, &mut report.skipped)
        {
            let dobj = object::File::parse(dmap.bytes())
                .map_err(|e| Error::new(ErrorKind::BadObject, &dpath, e.to_string()))?;
            // The compressed sections inflate on workers while this
            // thread reads the symbol table.
            let inflating = start_inflating(&dobj);
            sup = find_supplementary(&dpath, &dobj, search, &mut report);
            if syms.iter().all(|s| s.source != NameSource::Symtab) {
                collect_syms(&dobj, true, &mut syms);
            }
            loaded = load_dwarf(&dobj, &dmap, sup.as_ref(), inflating).ok();
            debug_path = Some(dpath);
            debug_map = Some(dmap);
        } else {
            loaded = None;
        }
        let mut dwarf = loaded;
        if let Some(d) = dwarf.as_mut().filter(|_| !search.disabled) {
            d.set_split_places(super::split::SplitPlaces {
                object: path.to_path_buf(),
                debug_file: debug_path.clone().filter(|p| p != path),
                build_id: build_id.clone(),
                roots: roots(search),
            });
        }
        report.debug_file = dwarf.as_ref().and(debug_path.clone());
        // A PE image built by MSVC (or clang with lld) keeps its debug info
        // in a PDB of its own.
        #[cfg(feature = "pdb")]
        let pdb = if obj.format() == object::BinaryFormat::Pe && !search.disabled {
            super::pdb::PdbModule::find(path, &obj, &search.debug_dirs, &mut report.skipped)
        } else {
            None
        };
        #[cfg(feature = "pdb")]
        {
            report.pdb = pdb.as_ref().map(|p| p.path.clone());
        }
        // MiniDebugInfo: a stripped object whose symbol table, object's or
        // debug file's, is missing may carry the names of its local
        // functions in `.gnu_debugdata`, as gdb reads them.
        let mut mini = None;
        if syms.iter().all(|s| s.source != NameSource::Symtab) {
            match mini_debuginfo(&obj, &map) {
                Ok(Some(bytes)) => match object::File::parse(bytes) {
                    Ok(mobj) => {
                        collect_syms(&mobj, true, &mut syms);
                        report.mini_debuginfo = true;
                        mini = Some(bytes);
                    }
                    Err(e) => report.degraded.push(err(
                        ErrorKind::BadObject,
                        format!(".gnu_debugdata: the inflated image is not an object: {e}"),
                    )),
                },
                Ok(None) => {}
                Err(e) => report.degraded.push(err(ErrorKind::BadObject, e)),
            }
        }
        let syms = one_per_address(syms);
        let mut prev_sized = Vec::with_capacity(syms.len());
        let mut last = u32::MAX;
        for (i, s) in syms.iter().enumerate() {
            if s.size != 0 {
                last = u32::try_from(i).unwrap_or(u32::MAX);
            }
            prev_sized.push(last);
        }
        Ok(ElfModule {
            dwarf,
            #[cfg(feature = "pdb")]
            pdb,
            names: RefCell::new(IntMap::default()),
            files: RefCell::new(IntMap::default()),

            syms,
            prev_sized,
            debug_path,
            build_id,
            first_load_vaddr,
            alloc,
            report,
            by_name: RefCell::new(HashMap::new()),
            mini,
            _sup_map: sup.map(|(_, m)| m),
            _debug_map: debug_map,
            _map: map,
        })
    }

    /// The symbol-table entry covering `addr`, if any, under `extent`.
    pub(crate) fn symbol(&self, addr: u64, extent: SymbolExtent) -> Option<&Sym> {
        let i = self
            .syms
            .partition_point(|s| s.addr <= addr)
            .checked_sub(1)?;
        let s = self.syms.get(i)?;
        if addr >= s.end {
            return None;
        }
        if s.plt && extent == SymbolExtent::Section {
            // binutils' addr2line names no PLT entry.
            return None;
        }
        match extent {
            SymbolExtent::Section => Some(s),
            SymbolExtent::Sized => {
                // gdb's minimal-symbol rule: the nearest sized symbol at or
                // before `addr` names it if `addr` lies inside its size;
                // otherwise the nearest unsized symbol after that one does
                // (an unsized symbol reaches up to the next symbol, since
                // `s` is the nearest one); otherwise nothing does.
                let sized = self.prev_sized.get(i).copied().unwrap_or(u32::MAX);
                if let Some(z) = self.syms.get(sized as usize) {
                    if addr < z.addr.saturating_add(z.size) && addr < z.end {
                        return Some(z);
                    }
                }
                (s.size == 0).then_some(s)
            }
        }
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
        let raw = match std::str::from_utf8(raw) {
            Ok(s) => std::borrow::Cow::Borrowed(s),
            Err(_) => String::from_utf8_lossy(raw),
        };
        let d = super::demangle::demangle_lang(&raw, lang);
        let v = if d == raw {
            (Some(Arc::from(&*raw)), None)
        } else {
            (Some(Arc::from(&*d)), Some(Arc::from(&*raw)))
        };
        self.names.borrow_mut().insert(key, v.clone());
        v
    }

    /// The address of the function symbol `name`, of any alias in
    /// `.symtab` (of the object or of its debug file) or `.dynsym`, and
    /// whether it is global (a global one when one file has several of
    /// that name).
    pub(crate) fn address_of(&self, name: &'static [u8]) -> Option<(u64, bool)> {
        if let Some(a) = self.by_name.borrow().get(name) {
            return *a;
        }
        let mut found: Option<(u64, bool)> = None;
        let maps = [
            Some(self._map.bytes()),
            self._debug_map.as_ref().map(Mapped::bytes),
            self.mini,
        ];
        for bytes in maps.into_iter().flatten() {
            let here = match object::FileKind::parse(bytes) {
                Ok(object::FileKind::Elf64) => {
                    find_symbol::<object::elf::FileHeader64<object::Endianness>>(bytes, name)
                }
                Ok(object::FileKind::Elf32) => {
                    find_symbol::<object::elf::FileHeader32<object::Endianness>>(bytes, name)
                }
                _ => None,
            };
            if here.is_some_and(|f| f.1) {
                found = here;
                break;
            }
            found = found.or(here);
        }
        self.by_name.borrow_mut().insert(name, found);
        found
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

/// The function symbol `name` of the ELF file `bytes` (`.symtab`, then
/// `.dynsym`): its address and whether it is global, a global one first.
/// Names are compared in place in the string table, without a lookup per
/// symbol: a scan of glibc's 10,000 symbols is a few instructions each.
fn find_symbol<Elf: object::read::elf::FileHeader<Endian = object::Endianness>>(
    bytes: &'static [u8],
    name: &[u8],
) -> Option<(u64, bool)> {
    use object::read::elf::{ElfFile, SectionHeader, Sym};
    let elf = ElfFile::<Elf>::parse(bytes).ok()?;
    let endian = elf.endian();
    let mut local = None;
    // A global symbol of a version other than the name's default (`name@V`
    // rather than `name@@V`: glibc's compatibility entry points, such as
    // `__pthread_cond_timedwait_2_0` for `pthread_cond_timedwait@GLIBC_2.2.5`)
    // is what a call by that name never binds to: the default one first.
    let mut non_default = None;
    // `.gnu.version`: a 16-bit word per `.dynsym` entry, bit 15 set on a
    // non-default version.
    let versym = elf
        .elf_section_table()
        .iter()
        .find(|h| h.sh_type(endian) == object::elf::SHT_GNU_VERSYM)
        .and_then(|h| h.data(endian, bytes).ok());
    let dynamic = elf.elf_dynamic_symbol_table().string_section();
    for table in [elf.elf_symbol_table(), elf.elf_dynamic_symbol_table()] {
        let Some(strings) = elf
            .elf_section_table()
            .section(table.string_section())
            .ok()
            .and_then(|h| h.data(endian, bytes).ok())
        else {
            continue;
        };
        let is_dynamic = !table.is_empty() && table.string_section() == dynamic;
        for (i, sym) in table.symbols().iter().enumerate() {
            let at = sym.st_name(endian) as usize;
            let matches = strings.get(at..at.saturating_add(name.len())) == Some(name)
                && strings.get(at + name.len()) == Some(&0);
            if !matches
                || !matches!(
                    sym.st_type(),
                    object::elf::STT_FUNC | object::elf::STT_GNU_IFUNC
                )
                || sym.st_shndx(endian) == object::elf::SHN_UNDEF
                || sym.st_value(endian).into() == 0
            {
                continue;
            }
            let addr: u64 = sym.st_value(endian).into();
            if sym.st_bind() != object::elf::STB_LOCAL {
                let hidden = is_dynamic
                    && versym
                        .and_then(|v| v.get(2 * i..2 * i + 2))
                        .is_some_and(|b| {
                            let w = if endian == object::Endianness::Little {
                                u16::from_le_bytes([b[0], b[1]])
                            } else {
                                u16::from_be_bytes([b[0], b[1]])
                            };
                            w & 0x8000 != 0
                        });
                if !hidden {
                    return Some((addr, true));
                }
                non_default = non_default.or(Some((addr, true)));
                continue;
            }
            local = local.or(Some((addr, false)));
        }
    }
    non_default.or(local)
}

/// The most a `.gnu_debugdata` image may inflate to: Fedora's are a few
/// hundred kilobytes (a symbol table and its strings); a stream that
/// claims more is refused rather than filling memory.
const MINI_DEBUGINFO_MAX: usize = 256 << 20;

/// The ELF image that `.gnu_debugdata` (MiniDebugInfo: an xz stream of an
/// object holding only a symbol table, as Fedora, RHEL and CentOS strip
/// their packages) inflates to, stashed in `map`; `Ok(None)` without the
/// section, `Err` (why) when the stream is bad.
fn mini_debuginfo(
    obj: &object::File<'static>,
    map: &Mapped,
) -> Result<Option<&'static [u8]>, String> {
    let Some(sec) = obj.section_by_name(".gnu_debugdata") else {
        return Ok(None);
    };
    let data = sec
        .data()
        .map_err(|e| format!(".gnu_debugdata: unreadable section: {e}"))?;
    if data.is_empty() {
        return Ok(None);
    }
    let out = inflate_xz(data, MINI_DEBUGINFO_MAX)
        .map_err(|e| format!(".gnu_debugdata: bad xz stream: {e}"))?;
    Ok(Some(map.stash(out)))
}

/// An xz stream inflated, refused past `max` bytes.
pub(crate) fn inflate_xz(data: &[u8], max: usize) -> Result<Vec<u8>, String> {
    /// A `Write` into a vector that fails past a bound.
    struct Capped {
        out: Vec<u8>,
        max: usize,
    }
    impl std::io::Write for Capped {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.out.len().saturating_add(buf.len()) > self.max {
                return Err(std::io::Error::other("inflates past the size limit"));
            }
            self.out.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = Capped {
        out: Vec::new(),
        max,
    };
    let mut input = data;
    lzma_rs::xz_decompress(&mut input, &mut w).map_err(|e| e.to_string())?;
    Ok(w.out)
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

/// `syms` sorted by address, one per address: the best source (symtab over
/// dynsym), then a sized one, then the first listed.
///
/// Sorts 24-byte keys rather than the symbols themselves, and without a
/// comparison closure: glibc's debug file lists 10,000 symbols, whose
/// stable sort took a millisecond of `callstack pstack`.
fn one_per_address(syms: Vec<Sym>) -> Vec<Sym> {
    let mut keys: Vec<(u64, NameSource, bool, usize)> = syms
        .iter()
        .enumerate()
        .map(|(i, s)| (s.addr, s.source, s.size == 0, i))
        .collect();
    keys.sort_unstable();
    keys.dedup_by_key(|k| k.0);
    keys.iter().map(|k| syms[k.3]).collect()
}

fn collect_syms(obj: &object::File<'static>, from_debug_file: bool, out: &mut Vec<Sym>) {
    // The end of each section and whether it holds code, by index (looked
    // up once per symbol).
    let mut section_end: Vec<Option<u64>> = Vec::new();
    let mut section_code: Vec<bool> = Vec::new();
    for sec in obj.sections() {
        let i = sec.index().0;
        if section_end.len() <= i {
            section_end.resize(i + 1, None);
            section_code.resize(i + 1, false);
        }
        section_end[i] = sec.address().checked_add(sec.size());
        section_code[i] = sec.kind() == object::SectionKind::Text;
    }
    let mut file: Option<&'static str> = None;
    let mut push = |sym: object::Symbol<'static, '_>, source| {
        if sym.kind() == SymbolKind::File {
            file = sym.name().ok().filter(|n| !n.is_empty());
            return;
        }
        // Functions, and (as gdb and binutils take them) untyped symbols
        // in code: assembly labels such as the dynamic loader's `_start`.
        // ARM's mapping symbols (`$a`, `$t`, `$x`, `$d`) mark code and
        // data, they name nothing.
        let untyped_code = || {
            sym.kind() == SymbolKind::Unknown
                && sym
                    .section_index()
                    .is_some_and(|i| section_code.get(i.0).copied().unwrap_or(false))
                && sym.name_bytes().is_ok_and(|n| !n.starts_with(b"$"))
        };
        if !(sym.kind() == SymbolKind::Text || untyped_code())
            || sym.is_undefined()
            || sym.address() == 0
        {
            return;
        }
        // Like binutils, a symbol names every address up to the next
        // symbol of its section, padding included: ELF sizes are not
        // trusted (hand-written assembly often has none).
        // A range that wraps past the top of the address space is corrupt:
        // the symbol is left out.
        let end = match sym
            .section_index()
            .and_then(|i| section_end.get(i.0).copied())
        {
            Some(end) => end,
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
                    size: sym.size(),
                    name,
                    file: if sym.is_local() { file } else { None },
                    source,
                    plt: false,
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
    if !from_debug_file {
        collect_plt(obj, out);
        if obj.format() == object::BinaryFormat::Pe {
            collect_exports(obj, out);
        }
    }
}

/// A PE image's exported functions, as `.dynsym` names an ELF object's
/// ([`NameSource::Dynsym`]): the names left to an image without COFF
/// symbols, DWARF or PDB (a stripped mingw DLL, a system DLL whose PDB is
/// not here). Each names the addresses up to the next symbol of its code
/// section; exported data and forwarders (`NTDLL.RtlAllocateHeap`) name
/// nothing here, nor do exports by ordinal alone.
fn collect_exports(obj: &object::File<'static>, out: &mut Vec<Sym>) {
    use object::read::{ExportTarget, NameOrOrdinal};
    let Ok(exports) = obj.exports() else {
        return;
    };
    let code: Vec<(u64, u64)> = obj
        .sections()
        .filter(|s| s.kind() == object::SectionKind::Text)
        .map(|s| (s.address(), s.address().saturating_add(s.size())))
        .collect();
    for e in exports {
        // A corrupt export table ends the list where it breaks.
        let Ok(e) = e else { break };
        let ExportTarget::Address { address } = e.target() else {
            continue;
        };
        let Some(&(_, end)) = code.iter().find(|&&(lo, hi)| lo <= address && address < hi) else {
            continue;
        };
        let NameOrOrdinal::Name(std::borrow::Cow::Borrowed(name)) = e.into_name() else {
            continue;
        };
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        out.push(Sym {
            addr: address,
            end,
            size: 0,
            name,
            file: None,
            source: NameSource::Dynsym,
            plt: false,
        });
    }
}

/// The PLT entries of `obj`, named after the functions they call (`puts`
/// for `puts@plt`), as binutils' synthetic symbols name them.
/// x86-64: every 8- or 16-byte entry of `.plt`, `.plt.sec` and `.plt.got`
/// whose `jmp *slot(%rip)` goes through a GOT slot that a dynamic
/// relocation with a symbol fills (`JUMP_SLOT`, `GLOB_DAT`). AArch64:
/// entry `i` of `.plt` (after its 32-byte header) for `.rela.plt`'s
/// relocation `i`. Other layouts give none.
fn collect_plt(obj: &object::File<'static>, out: &mut Vec<Sym>) {
    use object::read::elf::{SectionHeader, Sym as _};
    let object::File::Elf64(elf) = obj else {
        return;
    };
    let endian = elf.endian();
    let data = elf.data();
    let table = elf.elf_section_table();
    let by_name = |name: &[u8]| {
        table
            .iter()
            .find(|h| table.section_name(endian, h).ok() == Some(name))
    };
    let relas = |name: &[u8]| {
        by_name(name)
            .and_then(|h| {
                h.data_as_array::<object::elf::Rela64<object::Endianness>, _>(endian, data)
                    .ok()
            })
            .unwrap_or(&[])
    };
    let dynsym = elf.elf_dynamic_symbol_table();
    let name_of = |index: u32| -> Option<&'static str> {
        let sym = dynsym.symbol(object::SymbolIndex(index as usize)).ok()?;
        let name = std::str::from_utf8(sym.name(endian, dynsym.strings()).ok()?).ok()?;
        (!name.is_empty()).then_some(name)
    };
    let mut push = |addr: u64, step: u64, name: &'static str| {
        out.push(Sym {
            addr,
            end: addr + step,
            size: step,
            name,
            file: None,
            source: NameSource::Dynsym,
            plt: true,
        })
    };
    match elf.elf_header().e_machine.get(endian) {
        object::elf::EM_X86_64 => {
            // GOT slot -> symbol, from both relocation sections.
            let mut slots: HashMap<u64, u32> = HashMap::new();
            for r in relas(b".rela.plt").iter().chain(relas(b".rela.dyn")) {
                let index = r.r_sym(endian, false);
                if index != 0 {
                    slots.insert(r.r_offset.get(endian), index);
                }
            }
            for sec in [&b".plt"[..], b".plt.sec", b".plt.got"] {
                let Some(h) = by_name(sec) else { continue };
                let Ok(code) = h.data(endian, data) else {
                    continue;
                };
                let step = match h.sh_entsize(endian) {
                    8 => 8,
                    _ => 16,
                };
                let base = h.sh_addr(endian);
                for (k, entry) in code.chunks_exact(step as usize).enumerate() {
                    // `jmp *disp32(%rip)`, maybe after `endbr64` and `bnd`.
                    let Some(at) = entry.windows(2).position(|w| w == [0xff, 0x25]) else {
                        continue;
                    };
                    let Some(disp) = entry.get(at + 2..at + 6) else {
                        continue;
                    };
                    let disp = i32::from_le_bytes(disp.try_into().unwrap());
                    let addr = base + k as u64 * step;
                    let slot = (addr + at as u64 + 6).wrapping_add_signed(i64::from(disp));
                    if let Some(name) = slots.get(&slot).and_then(|&i| name_of(i)) {
                        push(addr, step, name);
                    }
                }
            }
        }
        object::elf::EM_AARCH64 => {
            let Some(plt) = by_name(b".plt") else { return };
            let first = plt.sh_addr(endian) + 32;
            for (i, r) in relas(b".rela.plt").iter().enumerate() {
                if let Some(name) = name_of(r.r_sym(endian, false)) {
                    push(first + 16 * i as u64, 16, name);
                }
            }
        }
        _ => {}
    }
}

/// The DWARF sections the symbolizer reads; location lists (variables'
/// locations) and macros are never read: not loading them spares
/// inflating them, which in a compressed debug file such as glibc's is
/// about a sixth of all the DWARF (1.4 of 9.9 MB for libc6-dbg's
/// libc.so.6).
fn wanted(id: gimli::SectionId) -> bool {
    use gimli::SectionId::*;
    !matches!(
        id,
        DebugLoc | DebugLocLists | DebugMacinfo | DebugMacro | DebugNames
    )
}

/// Starts inflating the zlib-compressed DWARF sections of `obj` that
/// [`load_dwarf`] reads, each on a worker thread where one can be started,
/// `.debug_info` first: [`Inflating::spawn`].
fn start_inflating(obj: &object::File<'static>) -> Vec<(gimli::SectionId, Inflating)> {
    use gimli::SectionId::*;
    // In the order `gimli::Dwarf::load` asks for them.
    let ids = [
        DebugInfo,
        DebugAbbrev,
        DebugAranges,
        DebugLine,
        DebugRngLists,
        DebugRanges,
        DebugStr,
        DebugLineStr,
        DebugStrOffsets,
        DebugAddr,
        DebugTypes,
    ];
    let mut streams = Vec::new();
    for id in ids {
        debug_assert!(wanted(id));
        let Some(c) = obj
            .section_by_name(id.name())
            .and_then(|s| s.compressed_data().ok())
        else {
            continue;
        };
        // A declared size the stream cannot hold (a corrupt header) leaves
        // the section to `load_dwarf`, which treats it as absent.
        if c.format == object::CompressionFormat::Zlib && crate::elf_section::plausible(&c) {
            streams.push((id, (c.data, c.uncompressed_size as usize)));
        }
    }
    // Two workers: `.debug_info`, read progressively as units are looked
    // up, and the sections `gimli::Dwarf::load` takes whole.
    let (info, whole): (Vec<_>, Vec<_>) = streams
        .into_iter()
        .partition(|s| s.0 == gimli::SectionId::DebugInfo);
    let mut out = Vec::new();
    for group in [info, whole] {
        let z: Vec<_> = group.iter().map(|s| s.1).collect();
        out.extend(group.iter().map(|s| s.0).zip(Inflating::spawn(&z)));
    }
    out
}

/// The DWARF of `obj`; `inflating`: its compressed sections, from
/// [`start_inflating`].
fn load_dwarf(
    obj: &object::File<'static>,
    map: &Mapped,
    sup: Option<&(PathBuf, Mapped)>,
    mut inflating: Vec<(gimli::SectionId, Inflating)>,
) -> Result<DwarfIndex, gimli::Error> {
    let endian = if obj.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    // `.debug_info` is read through `Info`: a compressed one is used as
    // far as it is inflated, waiting only for the units used (the units of
    // a few frames of glibc sit well before the end of its 6 MB).
    let info_at = inflating
        .iter()
        .position(|(id, _)| *id == gimli::SectionId::DebugInfo);
    let info_z = info_at.map(|i| inflating.remove(i).1);
    let load = |id: gimli::SectionId| -> Result<Slice, gimli::Error> {
        if !wanted(id) || (id == gimli::SectionId::DebugInfo && info_z.is_some()) {
            return Ok(gimli::EndianSlice::new(&[], endian));
        }
        if let Some((_, z)) = inflating.iter().find(|(i, _)| *i == id) {
            // A stream that breaks before its declared size: absent.
            return Ok(gimli::EndianSlice::new(z.whole().unwrap_or(&[]), endian));
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
    let mut dwarf = gimli::Dwarf::load(load)?;
    // dwz: strings (`DW_FORM_GNU_strp_alt`, `DW_FORM_strp_sup`) and DIEs
    // (`DW_FORM_GNU_ref_alt`, `DW_FORM_ref_sup*`) of the supplementary file.
    // gimli resolves the strings through `Dwarf::sup`.
    if let Some((_, smap)) = sup {
        if let Some(sd) = object::File::parse(smap.bytes())
            .ok()
            .and_then(|sobj| load_sup_dwarf(&sobj, smap, endian).ok())
        {
            dwarf.set_sup(sd);
        }
    }
    let info = match info_z {
        Some(z) => Info::Inflating(z, endian),
        None => Info::Plain(*gimli::Section::reader(&dwarf.debug_info)),
    };
    let inflated = inflating.into_iter().map(|(_, z)| z).collect();
    Ok(DwarfIndex::new(dwarf, info, inflated))
}

/// The sections of a dwz supplementary file that references into it need.
pub(crate) fn load_sup_dwarf(
    obj: &object::File<'static>,
    map: &Mapped,
    endian: gimli::RunTimeEndian,
) -> Result<gimli::Dwarf<Slice>, gimli::Error> {
    gimli::Dwarf::load(|id: gimli::SectionId| -> Result<Slice, gimli::Error> {
        let bytes: &'static [u8] = match id {
            gimli::SectionId::DebugInfo
            | gimli::SectionId::DebugAbbrev
            | gimli::SectionId::DebugStr
            | gimli::SectionId::DebugLineStr
            | gimli::SectionId::DebugLine
            | gimli::SectionId::DebugStrOffsets => match obj.section_by_name(id.name()) {
                // A declared size its stream cannot hold counts as absent.
                Some(s) => match crate::elf_section::data(&s) {
                    Ok(Cow::Borrowed(b)) => b,
                    Ok(Cow::Owned(v)) => map.stash(v),
                    Err(_) => &[],
                },
                None => &[],
            },
            _ => &[],
        };
        Ok(gimli::EndianSlice::new(bytes, endian))
    })
}

/// How a module's debug info was found, and what was passed over.
///
/// A debug file is used only when it belongs to the same build as the
/// object: same GNU build-id when both have one, otherwise the CRC32 that
/// `.gnu_debuglink` records (a stale file of another build, left under
/// the right name, would give wrong names and lines). Skipped candidates
/// are listed in [`DebugInfoReport::skipped`] and the search goes on; when
/// none fits, names come from `.symtab` / `.dynsym`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DebugInfoReport {
    /// The file the DWARF is read from (the object itself or its separate
    /// debug file); `None` when there is no usable DWARF.
    pub debug_file: Option<PathBuf>,
    /// The dwz supplementary file (named by `.gnu_debugaltlink`) that the
    /// DWARF refers into, when it was found and matched.
    pub supplementary: Option<PathBuf>,
    /// Debug-file candidates that exist but were not used, each with why
    /// ([`ErrorKind::DebugLinkCrcMismatch`],
    /// [`ErrorKind::BuildIdMismatch`], unreadable or not an object).
    pub skipped: Vec<Error>,
    /// What is missing and makes answers less complete than the DWARF
    /// would allow, such as [`ErrorKind::MissingSupplementary`],
    /// [`ErrorKind::MissingSplitDwarf`] (added as lookups find them: a
    /// split unit is looked for when an address first falls in it), or a
    /// `.gnu_debugdata` section that could not be read.
    pub degraded: Vec<Error>,
    /// Whether the symbols of the object's MiniDebugInfo (`.gnu_debugdata`,
    /// an xz-compressed object of local function symbols) were used: the
    /// object has no `.symtab` and no debug file gave one.
    pub mini_debuginfo: bool,
    /// The PDB a PE image's names, files and lines come from, when its
    /// CodeView record names one and a file of that GUID was found
    /// (candidates of another GUID are in `skipped`). Always `None`
    /// without the `pdb` feature.
    pub pdb: Option<PathBuf>,
}

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The debug roots: the configured ones, then `/usr/lib/debug`.
fn roots(search: &SearchPaths) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = search.debug_dirs.clone();
    roots.push(PathBuf::from("/usr/lib/debug"));
    roots
}

/// `<root>/.build-id/xx/yyyy.debug` for each root.
fn build_id_paths(id: &[u8], search: &SearchPaths) -> Vec<PathBuf> {
    if id.len() < 2 {
        return Vec::new();
    }
    let hex = hex(id);
    roots(search)
        .into_iter()
        .map(|r| {
            r.join(".build-id")
                .join(&hex[..2])
                .join(format!("{}.debug", &hex[2..]))
        })
        .collect()
}

/// Opens `candidate` and checks that it is an object; `None` (with the
/// reason in `skipped`) when it cannot be read or parsed.
fn open_candidate(candidate: &Path, skipped: &mut Vec<Error>) -> Option<(Mapped, Option<Vec<u8>>)> {
    let map = match Mapped::open(candidate) {
        Ok(m) => m,
        Err(e) => {
            skipped.push(Error::new(ErrorKind::Io, candidate, e.to_string()));
            return None;
        }
    };
    match object::File::parse(map.bytes()) {
        Ok(o) => {
            let id = o.build_id().ok().flatten().map(|b| b.to_vec());
            Some((map, id))
        }
        Err(e) => {
            skipped.push(Error::new(ErrorKind::BadObject, candidate, e.to_string()));
            None
        }
    }
}

/// Finds the separate debug file of `path`, the way gdb does: by build-id
/// under `<root>/.build-id/xx/yyyy.debug`, then by `.gnu_debuglink`
/// beside the file, in its `.debug/` subdirectory and under
/// `<root>/<its dir>/`, for each root (the configured debug dirs, then
/// `/usr/lib/debug`), then `<debug dir>/<name>`.
///
/// A candidate is used only if it belongs to the same build: equal
/// build-ids when both files have one (cheap, and stronger than the CRC:
/// a debug file rewritten after linking, e.g. by dwz, keeps its build-id
/// but not its CRC), otherwise the CRC32 of the whole candidate must be
/// the one `.gnu_debuglink` records. Others go to `skipped`, with why.
///
/// When none is on this machine, the debuginfod servers (if any) are asked
/// for the build-id's debug file.
fn find_debug_file(
    path: &Path,
    obj: &object::File<'static>,
    build_id: Option<&[u8]>,
    search: &SearchPaths,
    skipped: &mut Vec<Error>,
) -> Option<(PathBuf, Mapped)> {
    if search.disabled {
        return None;
    }
    if let Some(found) = find_local_debug_file(path, obj, build_id, search, skipped) {
        return Some(found);
    }
    let (client, id) = (search.debuginfod.as_ref()?, build_id?);
    let p = client.fetch(id, Artifact::Debuginfo)?;
    let (map, have) = open_candidate(&p, skipped)?;
    if have.as_deref() != Some(id) {
        skipped.push(Error::new(
            ErrorKind::BuildIdMismatch,
            &p,
            format!(
                "build-id {} is not the object's {}",
                have.as_deref().map(hex).unwrap_or_else(|| "(none)".into()),
                hex(id)
            ),
        ));
        return None;
    }
    Some((p, map))
}

/// [`find_debug_file`] on this machine only.
fn find_local_debug_file(
    path: &Path,
    obj: &object::File<'static>,
    build_id: Option<&[u8]>,
    search: &SearchPaths,
    skipped: &mut Vec<Error>,
) -> Option<(PathBuf, Mapped)> {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let is_self = |c: &Path| c == path || c == real.as_path();
    if let Some(id) = build_id {
        for p in build_id_paths(id, search) {
            if !p.is_file() || is_self(&p) {
                continue;
            }
            let Some((map, have)) = open_candidate(&p, skipped) else {
                continue;
            };
            match have {
                Some(h) if h != id => skipped.push(Error::new(
                    ErrorKind::BuildIdMismatch,
                    &p,
                    format!("build-id {} is not the object's {}", hex(&h), hex(id)),
                )),
                _ => return Some((p, map)),
            }
        }
    }
    let (name, crc) = obj.gnu_debuglink().ok().flatten()?;
    let name = std::str::from_utf8(name).ok()?;
    let mut candidates: Vec<PathBuf> = Vec::new();
    for dir in [path.parent(), real.parent()].into_iter().flatten() {
        candidates.push(dir.join(name));
        candidates.push(dir.join(".debug").join(name));
        for r in roots(search) {
            let rel = dir.strip_prefix("/").unwrap_or(dir);
            candidates.push(r.join(rel).join(name));
        }
    }
    for r in &search.debug_dirs {
        candidates.push(r.join(name));
    }
    let mut seen = Vec::new();
    for c in candidates {
        if seen.contains(&c) || !c.is_file() || is_self(&c) {
            continue;
        }
        seen.push(c.clone());
        let Some((map, have)) = open_candidate(&c, skipped) else {
            continue;
        };
        match (build_id, have) {
            (Some(want), Some(h)) => {
                if h == want {
                    return Some((c, map));
                }
                skipped.push(Error::new(
                    ErrorKind::BuildIdMismatch,
                    &c,
                    format!("build-id {} is not the object's {}", hex(&h), hex(want)),
                ));
            }
            _ => {
                let got = crc32fast::hash(map.bytes());
                if got == crc {
                    return Some((c, map));
                }
                skipped.push(Error::new(
                    ErrorKind::DebugLinkCrcMismatch,
                    &c,
                    format!(
                        "CRC32 {got:#010x} is not the {crc:#010x} that .gnu_debuglink records: \
                         a debug file of another build"
                    ),
                ));
            }
        }
    }
    None
}

/// Finds the dwz supplementary file that `debug` (a file with DWARF)
/// names in `.gnu_debugaltlink`: at the path it gives (absolute, or
/// relative to the debug file's directory, as dwz writes it), under each
/// root's `.dwz/` by file name, then by the supplementary build-id under
/// each root's `.build-id/`. Its build-id must be the one the section
/// records. When it is not found, the reason goes to `report.degraded`.
fn find_supplementary(
    debug: &Path,
    obj: &object::File<'static>,
    search: &SearchPaths,
    report: &mut DebugInfoReport,
) -> Option<(PathBuf, Mapped)> {
    let (name, want) = obj.gnu_debugaltlink().ok().flatten()?;
    let name = Path::new(std::str::from_utf8(name).ok()?);
    let mut candidates: Vec<PathBuf> = Vec::new();
    if !search.disabled {
        let real = std::fs::canonicalize(debug).unwrap_or_else(|_| debug.to_path_buf());
        for dir in [debug.parent(), real.parent()].into_iter().flatten() {
            candidates.push(dir.join(name));
        }
        if let Some(file) = name.file_name() {
            for r in roots(search) {
                candidates.push(r.join(".dwz").join(file));
                // Debian: /usr/lib/debug/.dwz/<triplet>/<package>.debug
                if let Some(parent) = name.parent().and_then(|p| p.file_name()) {
                    candidates.push(r.join(".dwz").join(parent).join(file));
                }
            }
        }
        candidates.extend(build_id_paths(want, search));
    }
    let mut seen = Vec::new();
    for c in candidates {
        if seen.contains(&c) || !c.is_file() {
            continue;
        }
        seen.push(c.clone());
        let Some((map, have)) = open_candidate(&c, &mut report.skipped) else {
            continue;
        };
        if have.as_deref() == Some(want) {
            report.supplementary = Some(c.clone());
            return Some((c, map));
        }
        report.skipped.push(Error::new(
            ErrorKind::BuildIdMismatch,
            &c,
            format!(
                "build-id {} is not the {} that .gnu_debugaltlink records",
                have.as_deref().map(hex).unwrap_or_else(|| "(none)".into()),
                hex(want)
            ),
        ));
    }
    report.degraded.push(Error::new(
        ErrorKind::MissingSupplementary,
        debug,
        format!(
            "needs the dwz supplementary file {} (build-id {}): names stored there are unknown",
            name.display(),
            hex(want)
        ),
    ));
    None
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::{ElfModule, SearchPaths};

    /// A name with several versions in `.dynsym` (glibc's compatibility
    /// entry points: `pthread_cond_timedwait@GLIBC_2.2.5` is
    /// `__pthread_cond_timedwait_2_0` on x86-64) resolves to its default
    /// version, the one a call by that name binds to and `dlsym` returns:
    /// the tail-call search took the old one for the target of libpython's
    /// call and added a frame gdb does not show.
    #[test]
    fn a_versioned_name_resolves_to_its_default_version() {
        for name in [&b"pthread_cond_timedwait"[..], b"pthread_cond_wait"] {
            let c = std::ffi::CString::new(name).unwrap();
            // SAFETY: dlsym/dladdr with a valid C string and a zeroed
            // `Dl_info` they fill.
            let (sym, path, base) = unsafe {
                let sym = libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr());
                assert!(!sym.is_null());
                let mut info: libc::Dl_info = core::mem::zeroed();
                assert_ne!(libc::dladdr(sym, &mut info), 0);
                let path = std::ffi::CStr::from_ptr(info.dli_fname)
                    .to_str()
                    .unwrap()
                    .to_string();
                (sym as u64, path, info.dli_fbase as u64)
            };
            let m = ElfModule::open(std::path::Path::new(&path), &SearchPaths::none()).unwrap();
            let name: &'static [u8] = Box::leak(name.to_vec().into_boxed_slice());
            let (a, global) = m.address_of(name).unwrap();
            assert!(global);
            assert_eq!(
                a.wrapping_add(base),
                sym,
                "{} in {path}",
                String::from_utf8_lossy(name)
            );
        }
    }
}
