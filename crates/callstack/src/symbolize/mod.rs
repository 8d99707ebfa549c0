//! Addresses to functions, files, lines and inlined frames.
//!
//! A [`Symbolizer`] maps an address to the module that contains it, opens
//! that module once (memory-mapped, parsed lazily), and answers with the
//! [`Frame`]s at the address: the innermost inlined function first, each
//! marked [`Frame::inlined`], the real (outermost) function last. Answers
//! are cached per address, so a repeat lookup is one hash-map probe.
//!
//! Sources of names, best first:
//! 1. DWARF (`.debug_info` + `.debug_line`, DWARF 2 to 5, zlib/zstd
//!    compressed sections included), in the object itself or in its split
//!    debug file, found by build-id (`/usr/lib/debug/.build-id/xx/yyyy.debug`)
//!    or by `.gnu_debuglink` (beside the object, in its `.debug/` subdir,
//!    under `/usr/lib/debug/<dir>/`, or any [`Symbolizer::add_debug_dir`]),
//!    else, with the `debuginfod` feature and `DEBUGINFOD_URLS` set, from
//!    a debuginfod server ([`debuginfod`], [`Symbolizer::set_debuginfod`]),
//!    which also gives the object of a module whose file is missing;
//! 2. `.symtab` (of the object or of its debug file); without either, the
//!    symbol table of the object's MiniDebugInfo (`.gnu_debugdata`, an
//!    xz-compressed object of the local functions' symbols, as Fedora,
//!    RHEL and CentOS ship every package), as gdb reads it;
//! 3. `.dynsym`.
//!
//! A split debug file is used only if it comes from the same build as the
//! object: the same GNU build-id when both have one, otherwise the CRC32
//! recorded in `.gnu_debuglink`. A stale file of another build under the
//! right name is skipped and the search goes on (gdb's order: build-id
//! path, then the debuglink places). DWARF processed by dwz refers into a
//! supplementary file named by `.gnu_debugaltlink`, looked for at that
//! path (relative to the debug file), under `<debug dir>/.dwz/`, and by its
//! build-id; its strings are used. Names that live only there (strings
//! without the file; DIEs reached through `DW_FORM_GNU_ref_alt`, which the
//! reader does not follow yet) are left unknown, never guessed: such an
//! inlined frame has no function name, an outermost one takes the symbol
//! table's. [`Symbolizer::debug_info`] reports which files were used,
//! which were skipped and why, and what is missing.
//!
//! Without any of them a frame is still reported as module + offset
//! ([`Symbolized::module`], [`Symbolized::offset`]).
//!
//! ## Return addresses and exact pcs
//! A captured return address points after the call instruction, possibly
//! into the next line or even the next function; it must be looked up at
//! `addr - 1`. The pc of the interrupted frame of a signal (or of frame 0
//! of a thread stopped by a debugger) is exact. [`Address`] says which:
//!
//! ```
//! use callstack::symbolize::{Address, Symbolizer};
//! #[inline(never)]
//! fn here() -> usize {
//!     let mut out = [0usize; 4];
//!     callstack::capture_fast(0, &mut out);
//!     out[0]
//! }
//! let mut s = Symbolizer::new();
//! let sym = s.symbolize(Address::Return(here()));
//! let f = sym.frames.last().expect("test binaries have symbols");
//! assert!(f.function.as_deref().unwrap().ends_with("here"), "{sym:?}");
//! ```
//!
//! ## Offline use
//! [`Symbolizer::from_modules`] takes the module list of another process
//! (from a trace file, a core file or `/proc/PID/maps`) and symbolizes its
//! addresses from the files on disk; [`Symbolizer::for_file`] does the same
//! for one file at its link-time addresses (what `addr2line -e` does).
//!
//! A file listed at several ranges (a library mapped by every process of a
//! whole-host profile, each at its own address) is opened once and shared
//! by all of them: the same GNU build-id, or for a file without one, the
//! same path, size and modification time.
//! [`Symbolizer::set_modules`] replaces the module list keeping the files
//! still listed open (a recording's next period);
//! [`Symbolizer::open_modules`] and [`Symbolizer::evict_to`] keep the
//! files held open under a memory budget.
//!
//! ## Libraries loaded and unloaded
//! An in-process symbolizer ([`Symbolizer::new`]) follows `dlopen` and
//! `dlclose`: on every cache miss it compares the loader's counters of
//! objects added and removed (about 30 ns), and when they moved it lists
//! the modules again, dropping those unloaded, their opened files and the
//! answers cached for them, so that a library loaded later at the same
//! address gets its own names. Cache hits are not checked:
//! [`Symbolizer::refresh_modules`] makes them right at once after a
//! `dlclose`.
//!
//! The symbolizer allocates and does file I/O: it is never for a signal
//! handler. Capture there, symbolize later.

mod called_from;
pub mod debuginfod;
mod demangle;
mod die;
mod dwarf;
mod elf;
pub mod jit;
pub mod jitdump;
mod lazy;
mod lines;
mod loader;
mod mapped;
#[cfg(feature = "pdb")]
mod pdb;
pub mod perfmap;
mod shared;
mod split;
mod sup;
mod tailcall;

pub use called_from::{called_from, called_from_any};
pub use demangle::demangle;
pub use elf::{DebugInfoReport, SymbolExtent};
pub use shared::{with_process_symbolizer, SymbolizedTrace};

pub use debuginfod::Debuginfod;
use elf::{ElfModule, SearchPaths};
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An address to symbolize, and what kind of address it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Address {
    /// A return address (every frame of a captured stack but a signal's
    /// interrupted pc): looked up at `addr - 1`, inside the call
    /// instruction.
    Return(usize),
    /// An exact instruction address (a signal frame's pc, frame 0 of a
    /// stopped thread, an address from a disassembly): looked up as is.
    Exact(usize),
}

impl Address {
    /// The address as given.
    pub fn addr(self) -> usize {
        match self {
            Address::Return(a) | Address::Exact(a) => a,
        }
    }

    /// The address that is looked up (`addr - 1` for a return address).
    pub fn probe(self) -> usize {
        match self {
            Address::Return(a) => a.saturating_sub(1),
            Address::Exact(a) => a,
        }
    }

    fn key(self) -> u64 {
        match self {
            Address::Return(a) => (a as u64) << 1,
            Address::Exact(a) => ((a as u64) << 1) | 1,
        }
    }
}

/// Where a function name came from: how far it can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NameSource {
    /// DWARF debug info (also gives file, line and inlined frames).
    Dwarf,
    /// The `.symtab` symbol table (nearest preceding function symbol).
    Symtab,
    /// The `.dynsym` dynamic symbol table, or a PE image's export table
    /// (exported functions only: a static function in between may be
    /// misnamed as its exported predecessor).
    Dynsym,
    /// A PE image's PDB (also gives file, line and inlined frames).
    Pdb,
}

/// One frame at an address: a function, or an inlined function. A source
/// level (logical) frame, as `addr2line::Frame` is: one address of a
/// [`crate::unwind::Frame`] (a frame the unwinder walked: pc, sp, fp and
/// how it was found) names one or more of these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The demangled function name (Rust legacy and v0 without the hash,
    /// C++ with its parameters), if known.
    pub function: Option<Arc<str>>,
    /// The name as stored (mangled), when it differs from `function`.
    pub mangled: Option<Arc<str>>,
    /// The source file, as the compiler recorded it (usually absolute).
    pub file: Option<Arc<str>>,
    /// The line, 1-based.
    pub line: Option<u32>,
    /// The column, 1-based; `None` when unknown or 0 (left edge).
    pub column: Option<u32>,
    /// The line-table discriminator of the innermost frame's row (which of
    /// several blocks on one line), when nonzero. binutils prints it as
    /// `file:line (discriminator N)`.
    pub discriminator: Option<u32>,
    /// Whether this frame is an inlined copy of `function` inside the next
    /// frame of the list. The last frame of an address is never inlined.
    pub inlined: bool,
    /// Where the name came from.
    pub source: NameSource,
}

/// The answer for one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbolized {
    /// The address as given.
    pub address: Address,
    /// The module containing the address, if any.
    pub module: Option<Arc<ModuleInfo>>,
    /// The address looked up, in the module's own (link-time) address
    /// space: what `addr2line -e MODULE` takes. For a return address this
    /// is `addr - 1 - bias`.
    pub offset: u64,
    /// The frames, innermost (inlined) first, the real function last.
    /// Empty when nothing names the address.
    pub frames: Vec<Frame>,
}

impl Symbolized {
    /// The outermost (non-inlined) function name, if any.
    pub fn function(&self) -> Option<&str> {
        self.frames.last().and_then(|f| f.function.as_deref())
    }
}

impl fmt::Display for Symbolized {
    /// One line per frame: `function at file:line` (or `module+0xoffset`),
    /// inlined frames marked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let module = || {
            self.module
                .as_ref()
                .map(|m| m.path.display().to_string())
                .unwrap_or_else(|| "??".into())
        };
        if self.frames.is_empty() {
            return write!(f, "?? ({}+{:#x})", module(), self.offset);
        }
        for (i, fr) in self.frames.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            if fr.inlined {
                write!(f, "(inlined) ")?;
            }
            write!(f, "{}", fr.function.as_deref().unwrap_or("??"))?;
            match (&fr.file, fr.line) {
                (Some(file), Some(line)) => write!(f, " at {file}:{line}")?,
                (Some(file), None) => write!(f, " at {file}")?,
                _ => write!(f, " ({}+{:#x})", module(), self.offset)?,
            }
        }
        Ok(())
    }
}

/// A module (executable or shared object) of a process, as the symbolizer
/// needs it: which file, where it was loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// Path of the file on disk (tried first, when its build-id matches).
    pub path: PathBuf,
    /// GNU build-id, if known: used to check the file at `path` and to find
    /// it (or its debug file) under a debug dir's `.build-id/`.
    pub build_id: Option<Vec<u8>>,
    /// Lowest runtime address of the module's mapping.
    pub start: usize,
    /// One past its highest runtime address.
    pub end: usize,
    /// Load bias (runtime address minus link-time address). `None`: derive
    /// it when the file is opened, taking `start` as the address where the
    /// file's first `PT_LOAD` (file offset 0) is mapped, which is what
    /// `/proc/PID/maps` and core files show.
    pub bias: Option<usize>,
}

impl ModuleInfo {
    /// The modules loaded in this process ([`crate::modules::loaded_modules`]).
    pub fn loaded() -> Vec<ModuleInfo> {
        crate::modules::loaded_modules()
            .into_iter()
            .filter(|m| !m.is_vdso)
            .map(|m| {
                let (start, end) = m.range();
                ModuleInfo {
                    path: m.path,
                    build_id: m.build_id,
                    start,
                    end,
                    bias: Some(m.bias),
                }
            })
            .collect()
    }

    fn contains(&self, a: usize) -> bool {
        self.start <= a && a < self.end
    }
}

/// What went wrong opening a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file could not be opened or mapped.
    Io,
    /// The file is not a valid object (truncated, not ELF, corrupt headers).
    BadObject,
    /// The file's build-id is not the module's.
    BuildIdMismatch,
    /// A debug file found through `.gnu_debuglink` has the right name but
    /// not the CRC32 the link records: it is from another build.
    DebugLinkCrcMismatch,
    /// The DWARF was processed by dwz and refers into a supplementary file
    /// (`.gnu_debugaltlink`) that was not found or does not match.
    MissingSupplementary,
    /// A unit's DWARF is split (`-gsplit-dwarf`) and neither its `.dwo`
    /// file nor a `.dwp` package holding it was found: its frames have the
    /// skeleton's files and lines and the symbol tables' names, without
    /// inlined frames. The path is the first place looked at.
    MissingSplitDwarf,
}

/// A module that could not be used, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The kind of failure.
    pub kind: ErrorKind,
    /// The file concerned.
    pub path: PathBuf,
    /// Details.
    pub message: String,
}

impl Error {
    fn new(kind: ErrorKind, path: &Path, message: String) -> Error {
        Error {
            kind,
            path: path.to_path_buf(),
            message,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for Error {}

/// A fast hash for integer keys (multiply-xorshift); the cache probe is
/// the whole cost of a repeat lookup.
#[derive(Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        let x = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^ (x >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64)
    }
}

pub(crate) type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

struct Entry {
    info: Arc<ModuleInfo>,
    /// Where its opened module is in [`Symbolizer::opened`], once opened:
    /// every entry of the same file (one per process that maps it, in a
    /// whole-host profile) points at the same slot.
    slot: Option<usize>,
}

/// What makes two modules the same file, so that it is opened once however
/// many processes (or places) map it: its GNU build-id, else its path, size
/// and modification time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ModuleKey {
    BuildId(Vec<u8>),
    File(PathBuf, u64, i64, i64),
}

impl ModuleKey {
    /// The key of `info` (`None` when it has no build-id and its file
    /// cannot be read: it is then opened on its own).
    fn of(info: &ModuleInfo) -> Option<ModuleKey> {
        if let Some(id) = info.build_id.as_ref().filter(|b| !b.is_empty()) {
            return Some(ModuleKey::BuildId(id.clone()));
        }
        let md = std::fs::metadata(&info.path).ok()?;
        #[cfg(unix)]
        let (size, secs, nanos) = {
            use std::os::unix::fs::MetadataExt;
            (md.size(), md.mtime(), md.mtime_nsec())
        };
        #[cfg(not(unix))]
        let (size, secs, nanos) = {
            let t = md
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .unwrap_or_default();
            (md.len(), t.as_secs() as i64, i64::from(t.subsec_nanos()))
        };
        Some(ModuleKey::File(info.path.clone(), size, secs, nanos))
    }
}

/// An opened module, shared by every [`Entry`] of its file.
struct Opened {
    key: Option<ModuleKey>,
    module: Result<ElfModule, Error>,
    /// The path it was opened from (the first entry's).
    path: PathBuf,
    /// [`Symbolizer::tick`] at its last lookup.
    last_used: u64,
}

/// A module a [`Symbolizer`] holds open: what [`Symbolizer::open_modules`]
/// lists and [`Symbolizer::evict_to`] drops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenModule {
    /// The file it was opened from.
    pub path: PathBuf,
    /// Its build-id, if it has one.
    pub build_id: Option<Vec<u8>>,
    /// An estimate of the memory its parsed state takes (symbol tables,
    /// the DWARF index built so far, inflated sections, interned names),
    /// in bytes; the file's mapping itself is not counted.
    pub bytes: usize,
    /// How many of the symbolizer's modules (address ranges) use it.
    pub ranges: usize,
}

/// How many answers a [`Symbolizer`] keeps at most: past it the cache is
/// emptied and fills again, so memory stays bounded however many distinct
/// addresses go through (the modules' parsed tables stay).
pub const CACHE_CAPACITY: usize = 1 << 16;

/// Turns addresses into frames, with a per-address cache (of at most
/// [`CACHE_CAPACITY`] answers).
///
/// Not `Sync`: give each thread its own, or put one behind a mutex (as
/// [`called_from`] does).
///
/// Threads: opening a module whose debug sections are zlib-compressed
/// (`SHF_COMPRESSED`, as in Debian's `-dbg` packages) starts up to two
/// short-lived worker threads that inflate them while lookups proceed;
/// lookups wait only for the bytes they need. Where no thread can be
/// started, the sections are inflated on the calling thread instead. A
/// child forked while a worker runs goes on without it. Dropping the
/// `Symbolizer` stops and joins its workers.
pub struct Symbolizer {
    entries: Vec<Entry>,
    /// The opened modules, by slot (`None`: a free slot), each shared by
    /// the entries of the same file ([`ModuleKey`]).
    opened: Vec<Option<Opened>>,
    /// The slot of each opened module by its key.
    by_key: HashMap<ModuleKey, usize>,
    /// Counts lookups that open or use a module: [`Opened::last_used`].
    tick: u64,
    in_process: bool,
    whole_file: bool,
    search: SearchPaths,
    cache: IntMap<u64, Symbolized>,
    /// [`Symbolizer::tail_calls`]' answers, by (caller, callee probe).
    tail_cache: HashMap<(u64, u64), Vec<usize>>,
    /// How far a symbol-table name reaches (see [`SymbolExtent`]).
    extent: SymbolExtent,
    /// See [`Symbolizer::set_scoped_names`].
    scoped_names: bool,
    /// The loader's (added, removed) counters when the module list was
    /// last read (in-process only; see `loader.rs`).
    loader_generation: Option<(u64, u64)>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer for addresses of this process. Modules loaded later
    /// (`dlopen`) are picked up, and modules unloaded (`dlclose`) dropped
    /// with their cached answers, when a lookup misses the cache (see
    /// [`Symbolizer::refresh_modules`]).
    pub fn new() -> Symbolizer {
        let generation = crate::modules::loader_counters();
        let mut s = Self::from_modules(ModuleInfo::loaded());
        s.in_process = true;
        s.loader_generation = generation;
        s
    }

    /// A symbolizer for addresses of another process (or of this one at
    /// another time), given its modules: path, build-id and where each was
    /// loaded. Files are opened on first use; one that cannot be opened
    /// yields module+offset frames (see [`Symbolizer::module_errors`]).
    pub fn from_modules(modules: impl IntoIterator<Item = ModuleInfo>) -> Symbolizer {
        let mut entries: Vec<Entry> = modules
            .into_iter()
            .map(|m| Entry {
                info: Arc::new(m),
                slot: None,
            })
            .collect();
        entries.sort_by_key(|e| e.info.start);
        Symbolizer {
            entries,
            opened: Vec::new(),
            by_key: HashMap::new(),
            tick: 0,
            in_process: false,
            whole_file: false,
            search: SearchPaths {
                debuginfod: debuginfod::from_env_shared(),
                ..SearchPaths::default()
            },
            cache: IntMap::default(),
            tail_cache: HashMap::new(),
            extent: SymbolExtent::default(),
            scoped_names: false,
            loader_generation: None,
        }
    }

    /// A symbolizer for one object file at its link-time addresses (bias
    /// 0, every address belongs to it), as `addr2line -e FILE` does. Opens
    /// the file now, so a missing or invalid file is an error here.
    pub fn for_file(path: impl AsRef<Path>) -> Result<Symbolizer, Error> {
        Self::for_file_with_debug_dirs(path, &[])
    }

    /// [`Symbolizer::for_file`] of an object already in memory (an
    /// embedded image, a file read from an archive, a fuzzer's input).
    /// Split debug info is not searched for.
    pub fn for_bytes(bytes: Vec<u8>) -> Result<Symbolizer, Error> {
        let path = Path::new("<memory>");
        let m = ElfModule::from_mapped(
            mapped::Mapped::from_bytes(bytes),
            path,
            &SearchPaths::none(),
        )?;
        Ok(Self::single(path, m, SearchPaths::default()))
    }

    fn single(path: &Path, m: ElfModule, search: SearchPaths) -> Symbolizer {
        let info = ModuleInfo {
            path: path.to_path_buf(),
            build_id: m.build_id.clone(),
            start: 0,
            end: usize::MAX,
            bias: Some(0),
        };
        let opened = Opened {
            key: None,
            module: Ok(m),
            path: info.path.clone(),
            last_used: 0,
        };
        Symbolizer {
            entries: vec![Entry {
                info: Arc::new(info),
                slot: Some(0),
            }],
            opened: vec![Some(opened)],
            by_key: HashMap::new(),
            tick: 0,
            in_process: false,
            whole_file: true,
            search,
            cache: IntMap::default(),
            tail_cache: HashMap::new(),
            extent: SymbolExtent::default(),
            scoped_names: false,
            loader_generation: None,
        }
    }

    /// [`Symbolizer::for_file`], also searching `debug_dirs` for split
    /// debug info.
    pub fn for_file_with_debug_dirs(
        path: impl AsRef<Path>,
        debug_dirs: &[PathBuf],
    ) -> Result<Symbolizer, Error> {
        Self::for_file_with_debuginfod(path, debug_dirs, debuginfod::from_env_shared())
    }

    /// [`Symbolizer::for_file_with_debug_dirs`] with the given debuginfod
    /// client (`None`: none, whatever `DEBUGINFOD_URLS` says) instead of
    /// the environment's.
    pub fn for_file_with_debuginfod(
        path: impl AsRef<Path>,
        debug_dirs: &[PathBuf],
        client: Option<Arc<Debuginfod>>,
    ) -> Result<Symbolizer, Error> {
        let path = path.as_ref();
        let search = SearchPaths {
            debug_dirs: debug_dirs.to_vec(),
            disabled: false,
            debuginfod: client,
        };
        let m = open_entry(
            &ModuleInfo {
                path: path.to_path_buf(),
                build_id: None,
                start: 0,
                end: usize::MAX,
                bias: Some(0),
            },
            &search,
        )?;
        Ok(Self::single(path, m, search))
    }

    /// Fetch what is not on this machine from `client`'s debuginfod
    /// servers, or (`None`) from none. By default a symbolizer uses the
    /// servers of `DEBUGINFOD_URLS` ([`Debuginfod::from_env`]; none when
    /// it is unset or empty, or without the `debuginfod` feature). Affects
    /// modules not opened yet.
    pub fn set_debuginfod(&mut self, client: Option<Arc<Debuginfod>>) {
        self.search.debuginfod = client;
    }

    /// The debuginfod client in use, if any (its
    /// [`Debuginfod::take_warnings`] tell what could not be fetched).
    pub fn debuginfod(&self) -> Option<&Arc<Debuginfod>> {
        self.search.debuginfod.as_ref()
    }

    /// Also look for split debug files under `dir` (like `/usr/lib/debug`:
    /// `dir/.build-id/xx/yyyy.debug`, `dir/<object's dir>/<debuglink>`,
    /// `dir/<debuglink>`). Affects modules not opened yet.
    pub fn add_debug_dir(&mut self, dir: impl Into<PathBuf>) {
        self.search.debug_dirs.push(dir.into());
    }

    /// How far a name from `.symtab` / `.dynsym` reaches where no debug
    /// info covers an address: [`SymbolExtent::Sized`] (gdb's, the
    /// default, which leaves an address past a sized symbol's end unnamed)
    /// or [`SymbolExtent::Section`] (binutils' `addr2line`). Empties the
    /// cache.
    pub fn set_symbol_extent(&mut self, extent: SymbolExtent) {
        self.extent = extent;
        self.cache.clear();
    }

    /// How C++ functions without a linkage name in the DWARF (functions
    /// of internal linkage: `static` ones, those of an anonymous
    /// namespace; methods of local classes) are named: `false` (the
    /// default), by their bare name as binutils' `addr2line` and
    /// llvm-symbolizer do (`wait_here`); `true`, qualified by the
    /// namespaces and classes around their DIE as gdb does
    /// (`shop::wait_here`, `(anonymous namespace)::helper`, `Local::run`
    /// for a class defined in a function). Empties the cache.
    pub fn set_scoped_names(&mut self, on: bool) {
        self.scoped_names = on;
        self.cache.clear();
        for o in self.opened.iter().flatten() {
            if let Ok(m) = &o.module {
                if let Some(d) = &m.dwarf {
                    d.set_scoped_names(on);
                }
            }
        }
    }

    /// The modules this symbolizer knows.
    pub fn modules(&self) -> impl Iterator<Item = &ModuleInfo> {
        self.entries.iter().map(|e| &*e.info)
    }

    /// The modules that could not be opened so far, with the reason.
    pub fn module_errors(&self) -> impl Iterator<Item = &Error> {
        self.opened
            .iter()
            .flatten()
            .filter_map(|o| o.module.as_ref().err())
    }

    /// How the debug info of each module opened so far was found: which
    /// file, which candidates were skipped and why (a stale debug file of
    /// another build), what is missing (a dwz supplementary file).
    ///
    /// A file mapped at several places (by several processes of a
    /// whole-host profile) is opened once and reported once, with the
    /// first of its modules.
    pub fn debug_info(&self) -> impl Iterator<Item = (&ModuleInfo, &DebugInfoReport)> {
        self.opened.iter().enumerate().filter_map(move |(slot, o)| {
            let m = o.as_ref()?.module.as_ref().ok()?;
            let e = self.entries.iter().find(|e| e.slot == Some(slot))?;
            Some((&*e.info, &m.report))
        })
    }

    /// Symbolizes `addr`, from the cache when it was seen before.
    pub fn symbolize(&mut self, addr: Address) -> &Symbolized {
        let key = addr.key();
        if self.cache.contains_key(&key) {
            return &self.cache[&key];
        }
        let s = self.resolve(addr);
        if self.cache.len() >= CACHE_CAPACITY {
            self.cache.clear();
        }
        self.cache.entry(key).or_insert(s)
    }

    /// Symbolizes many addresses at once (a profile's worth): the ones not
    /// cached yet are resolved in address order, so that neighbours share
    /// the units, line tables and functions just parsed while they are
    /// still in the CPU caches, then the answers are returned in the order
    /// asked.
    ///
    /// ```
    /// use callstack::symbolize::{Address, Symbolizer};
    /// let mut frames = [0usize; 16];
    /// let n = callstack::capture_fast(0, &mut frames);
    /// let addrs: Vec<Address> = frames[..n].iter().map(|&a| Address::Return(a)).collect();
    /// let mut s = Symbolizer::new();
    /// let answers = s.symbolize_batch(&addrs);
    /// assert_eq!(answers.len(), n);
    /// ```
    pub fn symbolize_batch(&mut self, addrs: &[Address]) -> Vec<&Symbolized> {
        // The answers returned must all be in the cache at once: a batch
        // larger than the room left starts from an empty cache (and one
        // larger than the capacity is kept whole until the next call).
        if self.cache.len() + addrs.len() > CACHE_CAPACITY {
            self.cache.clear();
        }
        let mut todo: Vec<Address> = addrs
            .iter()
            .copied()
            .filter(|a| !self.cache.contains_key(&a.key()))
            .collect();
        todo.sort_unstable_by_key(|a| (a.probe(), a.key()));
        todo.dedup();
        for a in todo {
            let s = self.resolve(a);
            self.cache.insert(a.key(), s);
        }
        addrs.iter().map(|a| &self.cache[&a.key()]).collect()
    }

    /// [`Symbolizer::symbolize`] of a return address.
    pub fn symbolize_return(&mut self, ra: usize) -> &Symbolized {
        self.symbolize(Address::Return(ra))
    }

    /// [`Symbolizer::symbolize`] of an exact pc.
    pub fn symbolize_pc(&mut self, pc: usize) -> &Symbolized {
        self.symbolize(Address::Exact(pc))
    }

    /// Symbolizes `addr` without reading or filling the cache (for
    /// streaming many distinct addresses once, as `callstack addr2line`
    /// does).
    pub fn resolve(&mut self, addr: Address) -> Symbolized {
        let probe = addr.probe();
        if self.in_process {
            self.sync_with_loader(probe);
        }
        let Some(i) = self.find_entry(probe) else {
            return Symbolized {
                address: addr,
                module: None,
                offset: probe as u64,
                frames: Vec::new(),
            };
        };
        let extent = self.extent;
        let (opened, bias) = self.open(i);
        let offset = probe.wrapping_sub(bias) as u64;
        let frames = match opened {
            Some(m) => frames_at(m, offset, extent),
            None => Vec::new(),
        };
        self.note_missing_split(i);
        let info = self.entries[i].info.clone();

        Symbolized {
            address: addr,
            module: Some(info),
            offset,
            frames,
        }
    }

    /// Moves the split-DWARF files that lookups in module `i` found
    /// missing into its report.
    fn note_missing_split(&mut self, i: usize) {
        let Some(slot) = self.entries[i].slot else {
            return;
        };
        if let Some(Opened { module: Ok(m), .. }) = &mut self.opened[slot] {
            let Some(d) = &m.dwarf else { return };
            for p in d.take_missing_split() {
                m.report.degraded.push(Error::new(
                    ErrorKind::MissingSplitDwarf,
                    &p,
                    "split DWARF not found (no .dwo file there, no .dwp package holds the unit): \
                     names from the symbol table, no inlined frames"
                        .to_string(),
                ));
            }
        }
    }

    /// The module of entry `i`, opened now if it was not yet (`None` when
    /// it cannot be), and its load bias.
    ///
    /// A file is opened once for all the entries that map it (same
    /// build-id, or same path, size and modification time: the same
    /// library in every process of a whole-host profile), whatever their
    /// addresses.
    fn open(&mut self, i: usize) -> (Option<&ElfModule>, usize) {
        self.tick += 1;
        let slot = match self.entries[i].slot {
            Some(s) => s,
            None => {
                let info = self.entries[i].info.clone();
                let key = ModuleKey::of(&info);
                let shared = key
                    .as_ref()
                    .and_then(|k| self.by_key.get(k))
                    .copied()
                    .filter(|&s| matches!(&self.opened[s], Some(o) if o.module.is_ok()));
                let s = match shared {
                    Some(s) => s,
                    None => {
                        let m = open_entry(&info, &self.search);
                        if let Ok(Some(d)) = m.as_ref().map(|m| m.dwarf.as_ref()) {
                            d.set_scoped_names(self.scoped_names);
                        }
                        let s = match self.opened.iter().position(Option::is_none) {
                            Some(s) => s,
                            None => {
                                self.opened.push(None);
                                self.opened.len() - 1
                            }
                        };
                        if let (Some(k), true) = (&key, m.is_ok()) {
                            self.by_key.insert(k.clone(), s);
                        }
                        self.opened[s] = Some(Opened {
                            key,
                            module: m,
                            path: info.path.clone(),
                            last_used: 0,
                        });
                        s
                    }
                };
                self.entries[i].slot = Some(s);
                s
            }
        };
        let tick = self.tick;
        let o = self.opened[slot].as_mut().expect("an entry's slot is live");
        o.last_used = tick;
        let m = o.module.as_ref().ok();
        (m, bias_of(&self.entries[i].info, m))
    }

    /// The modules held open, with an estimate of their memory.
    pub fn open_modules(&self) -> Vec<OpenModule> {
        self.opened
            .iter()
            .enumerate()
            .filter_map(|(slot, o)| {
                let o = o.as_ref()?;
                let m = o.module.as_ref().ok();
                Some(OpenModule {
                    path: o.path.clone(),
                    build_id: m.and_then(|m| m.build_id.clone()),
                    bytes: m.map_or(0, ElfModule::approx_bytes),
                    ranges: self.entries.iter().filter(|e| e.slot == Some(slot)).count(),
                })
            })
            .collect()
    }

    /// Closes the least recently used modules until the estimated memory
    /// of those left open ([`OpenModule::bytes`]) is at most `budget`
    /// bytes, and returns the ones closed. A closed module is opened again
    /// if an address needs it (the answers cached so far stay).
    pub fn evict_to(&mut self, budget: usize) -> Vec<OpenModule> {
        let mut live: Vec<(u64, usize, usize)> = self
            .opened
            .iter()
            .enumerate()
            .filter_map(|(s, o)| {
                let o = o.as_ref()?;
                let bytes = o.module.as_ref().map_or(0, ElfModule::approx_bytes);
                Some((o.last_used, s, bytes))
            })
            .collect();
        let mut total: usize = live.iter().map(|l| l.2).sum();
        live.sort_unstable();
        let mut out = Vec::new();
        for (_, s, bytes) in live {
            if total <= budget {
                break;
            }
            let ranges = self.entries.iter().filter(|e| e.slot == Some(s)).count();
            for e in &mut self.entries {
                if e.slot == Some(s) {
                    e.slot = None;
                }
            }
            let o = self.opened[s].take().expect("live slot");
            if let Some(k) = &o.key {
                if self.by_key.get(k) == Some(&s) {
                    self.by_key.remove(k);
                }
            }
            total -= bytes;
            out.push(OpenModule {
                path: o.path,
                build_id: o.module.as_ref().ok().and_then(|m| m.build_id.clone()),
                bytes,
                ranges,
            });
        }
        if !out.is_empty() {
            self.tail_cache.clear();
        }
        out
    }

    /// Replaces the modules (address ranges) this symbolizer knows with
    /// `modules`, keeping the files already opened that the new list
    /// still maps (same build-id, or same path, size and modification
    /// time): the next period of a recording, or of a whole host whose
    /// processes come and go, does not read them again. Cached answers
    /// are dropped (an address may now be another module's).
    pub fn set_modules(&mut self, modules: impl IntoIterator<Item = ModuleInfo>) {
        let mut entries: Vec<Entry> = modules
            .into_iter()
            .map(|m| {
                // Already opened under its key: point at it at once.
                let slot = ModuleKey::of(&m).and_then(|k| self.by_key.get(&k).copied());
                Entry {
                    info: Arc::new(m),
                    slot,
                }
            })
            .collect();
        entries.sort_by_key(|e| e.info.start);
        self.entries = entries;
        self.close_unused();
        self.clear_cache();
    }

    /// Closes the modules no entry uses any more.
    fn close_unused(&mut self) {
        for s in 0..self.opened.len() {
            if self.opened[s].is_some() && !self.entries.iter().any(|e| e.slot == Some(s)) {
                if let Some(k) = self.opened[s].take().and_then(|o| o.key) {
                    if self.by_key.get(&k) == Some(&s) {
                        self.by_key.remove(&k);
                    }
                }
            }
        }
    }

    /// The tail-call frames between a caller and its callee, as gdb shows
    /// them: functions that ran in between but left no frame, each having
    /// ended with a jump to the next (`return f(x)` compiled to `jmp f`).
    ///
    /// `caller` is the caller's return address, `callee` an address of
    /// the frame below it (its pc, or its return address). The answer is
    /// the return address of each tail call (just past its jump: the pc
    /// gdb gives its frame), innermost (nearest the callee) first; name
    /// each with [`Symbolizer::symbolize`] of [`Address::Return`]. Empty
    /// when there are none, or when the DWARF call-site information
    /// (`DW_TAG_call_site`, which gcc emits with `-g` at `-O1` and up)
    /// cannot tell them. A chain may go from one module to another (a
    /// call through the PLT to a library function ending with a tail
    /// call) through the modules opened so far.
    ///
    /// When several chains of tail calls lead from the caller's call to
    /// the callee, only the calls common to all of them are given (gdb's
    /// rule). Bad DWARF gives no frames, never a loop or a panic.
    pub fn tail_calls(&mut self, caller: usize, callee: Address) -> Vec<usize> {
        let probe = callee.probe();
        if self.in_process {
            self.sync_with_loader(probe);
        }
        let Some(i) = self.find_entry(caller.wrapping_sub(1)) else {
            return Vec::new();
        };
        let key = (caller as u64, probe as u64);
        if let Some(v) = self.tail_cache.get(&key) {
            return v.clone();
        }
        let Some(k) = self.find_entry(probe) else {
            return Vec::new();
        };
        self.open(i);
        self.open(k);
        // A chain may go through any module opened so far (a library's
        // function reached through the PLT).
        let world = tailcall::World {
            modules: self
                .entries
                .iter()
                .filter_map(|e| {
                    let o = self.opened.get(e.slot?)?.as_ref()?;
                    let m = o.module.as_ref().ok()?;
                    Some(tailcall::Loaded {
                        start: e.info.start as u64,
                        end: e.info.end as u64,
                        module: m,
                        bias: bias_of(&e.info, Some(m)) as u64,
                    })
                })
                .collect(),
        };
        let found: Vec<usize> = tailcall::between(&world, caller as u64, probe as u64)
            .into_iter()
            .map(|pc| pc as usize)
            .collect();
        if self.tail_cache.len() >= CACHE_CAPACITY {
            self.tail_cache.clear();
        }
        self.tail_cache.insert(key, found.clone());
        found
    }

    /// Empties the address cache (modules stay open).
    pub fn clear_cache(&mut self) {
        self.cache.clear();
        self.tail_cache.clear();
    }

    /// How many addresses are cached.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    fn find_entry(&self, a: usize) -> Option<usize> {
        if self.whole_file {
            return Some(0);
        }
        let i = self.entries.partition_point(|e| e.info.start <= a);
        let i = i.checked_sub(1)?;
        self.entries[i].info.contains(a).then_some(i)
    }
}

/// The load bias of a module: given, or derived from where the first
/// `PT_LOAD` of its file `m` (once opened) is mapped.
fn bias_of(info: &ModuleInfo, m: Option<&ElfModule>) -> usize {
    match (m, info.bias) {
        (_, Some(b)) => b,
        (Some(m), None) => info
            .start
            .wrapping_sub((m.first_load_vaddr & !0xfff) as usize),
        _ => info.start,
    }
}

fn open_entry(info: &ModuleInfo, search: &SearchPaths) -> Result<ElfModule, Error> {
    let first_err = match ElfModule::open(&info.path, search) {
        Ok(m) => match (&info.build_id, &m.build_id) {
            (Some(want), Some(have)) if want != have => Error::new(
                ErrorKind::BuildIdMismatch,
                &info.path,
                "build-id differs from the module's".into(),
            ),
            _ => return Ok(m),
        },
        Err(e) => e,
    };
    // Not at its path (or not the same file): look it up by build-id.
    if let Some(id) = info.build_id.as_ref().filter(|b| b.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let mut roots = search.debug_dirs.clone();
        roots.push(PathBuf::from("/usr/lib/debug"));
        for r in roots {
            let base = r.join(".build-id").join(&hex[..2]);
            for name in [hex[2..].to_string(), format!("{}.debug", &hex[2..])] {
                let p = base.join(name);
                if p.is_file() {
                    if let Ok(m) = ElfModule::open(&p, search) {
                        return Ok(m);
                    }
                }
            }
        }
        // Nor under a debug dir: the debuginfod servers' copy.
        if let Some(p) = search
            .debuginfod
            .as_ref()
            .and_then(|c| c.fetch(id, debuginfod::Artifact::Executable))
        {
            if let Ok(m) = ElfModule::open(&p, search) {
                return Ok(m);
            }
        }
    }
    Err(first_err)
}

/// The frames at file address `offset` of module `m`.
fn frames_at(m: &ElfModule, offset: u64, extent: SymbolExtent) -> Vec<Frame> {
    if !m.in_allocated_section(offset) {
        return Vec::new();
    }
    #[cfg(feature = "pdb")]
    if let Some(p) = &m.pdb {
        let mut frames: Vec<Frame> = p
            .frames(offset)
            .into_iter()
            .map(|f| {
                // A function known by its public symbol alone is named by
                // its decorated name (`?run@Widget@@QEAAHH@Z`).
                let (function, mangled) = match f.function {
                    Some(n) if n.starts_with('?') => (
                        Some(Arc::from(&*demangle::demangle(&n))),
                        Some(Arc::from(n)),
                    ),
                    n => (n.map(Arc::from), None),
                };
                Frame {
                    function,
                    mangled,
                    file: f.file.map(Arc::from),
                    line: f.line.filter(|&l| l != 0),
                    column: None,
                    discriminator: None,
                    inlined: true,
                    source: NameSource::Pdb,
                }
            })
            .collect();
        if let Some(last) = frames.last_mut() {
            last.inlined = false;
            return frames;
        }
    }
    let mut frames = Vec::new();
    if let Some(d) = &m.dwarf {
        let mut raw = Vec::with_capacity(8);
        d.frames(offset, &mut raw);
        frames.reserve_exact(raw.len().max(1));
        for f in raw {
            let (function, mangled) = match f.name {
                Some(n) => m.function_name(n, f.lang),
                None => (None, None),
            };
            frames.push(Frame {
                function,
                mangled,
                file: f.file,
                line: (f.line != 0).then_some(f.line),
                column: (f.line != 0 && f.column != 0).then_some(f.column),
                discriminator: (f.discriminator != 0).then_some(f.discriminator),
                inlined: true,
                source: NameSource::Dwarf,
            });
        }
    }
    if let Some(last) = frames.last_mut() {
        last.inlined = false;
    }
    // No function name from DWARF for the outermost frame: take the symbol
    // table's (assembly, or line tables without DIEs).
    let needs_name = frames.last().is_none_or(|f| f.function.is_none());
    if needs_name {
        if let Some(sym) = m.symbol(offset, extent) {
            let (mut function, mangled) = m.function_name(sym.name.as_bytes(), None);
            if sym.plt {
                function = function.map(|f| format!("{f}@plt").into());
            }
            match frames.last_mut() {
                Some(f) => {
                    f.function = function;
                    f.mangled = mangled;
                    f.source = sym.source;
                }
                None => frames.push(Frame {
                    function,
                    mangled,
                    file: sym.file.map(|p| m.file_name(p)),
                    line: None,
                    column: None,
                    discriminator: None,
                    inlined: false,
                    source: sym.source,
                }),
            }
        }
    }
    frames
}

/// The address of section `name` of the object file at `path` (what
/// binutils' `addr2line -j NAME` adds to each offset it is given);
/// `Ok(None)` when the object has no such section.
pub fn section_address(path: impl AsRef<Path>, name: &str) -> Result<Option<u64>, Error> {
    use object::{Object, ObjectSection};
    let path = path.as_ref();
    let map =
        mapped::Mapped::open(path).map_err(|e| Error::new(ErrorKind::Io, path, e.to_string()))?;
    let obj = object::File::parse(map.bytes())
        .map_err(|e| Error::new(ErrorKind::BadObject, path, e.to_string()))?;
    Ok(obj.section_by_name(name).map(|s| s.address()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_cache_is_bounded() {
        // Addresses in no module: cheap answers, each cached.
        let mut s = Symbolizer::from_modules([]);
        for i in 0..CACHE_CAPACITY + 1000 {
            let a = 0x1000 + i * 16;
            assert_eq!(s.symbolize_pc(a).offset, a as u64);
            assert!(s.cached() <= CACHE_CAPACITY);
        }
        // A batch returns every answer, even past the room left.
        let addrs: Vec<Address> = (0..1000).map(|i| Address::Exact(0x10 + i)).collect();
        let got = s.symbolize_batch(&addrs);
        assert_eq!(got.len(), 1000);
        assert!(got.iter().zip(0..).all(|(a, i)| a.offset == 0x10 + i));
    }
}
