//! Our DWARF lookup: address -> (function, inlined chain, file, line,
//! column, discriminator), built on gimli, parsing only what is asked.
//!
//! Why not the `addr2line` crate (which we measured, see BENCHMARKS.md):
//! - opening: it parses every unit (abbreviations, DIE ranges) before the
//!   first answer; we read the flat `.debug_aranges` table (falling back
//!   to unit DIEs only for units it does not list) and parse a unit's
//!   abbreviations when an address first falls in it;
//! - lines: it renders every file path of a unit when the unit is first
//!   used; we render a path when a frame needs it, and keep the
//!   discriminator that binutils prints;
//! - inlines: it resolves the name of every inlined call in a function
//!   when the function is first hit; we record each call's range and DIE
//!   offset, and read the call site and name of the frames on the chain
//!   asked for, once each.
//!
//! gimli parses headers, strings and the rare forms; the hot loops are our
//! own, each checked against gimli by a test on the test binary's DWARF:
//! DIE walks with per-abbreviation skip plans (`die.rs`), line programs
//! decoded per sequence with a checkpoint every 16 rows (`lines.rs`), and
//! DWARF 4 range lists ([`bare_ranges`]).
//!
//! Semantics follow the addr2line crate and binutils (checked by the
//! oracle tests): later rows at one address replace earlier ones, a name
//! is the linkage name, else `DW_AT_name`, else that of the
//! `DW_AT_abstract_origin`/`DW_AT_specification` (16 levels at most),
//! paths are `comp_dir/dir/file` with absolute parts restarting the path.
//!
//! Everything returns `Option`: malformed DWARF gives no answer (and the
//! caller falls back to the symbol tables), never a panic.

use super::die::{AbbrevIndex, Abbrevs, Cursor, RawPc};
use super::elf::Slice;
use super::lazy::{Frozen, Inflating};
use super::lines::{Program, Row, Sequence, Stop};
use super::IntMap;
use gimli::{AttributeValue, UnitOffset};
use std::cell::{Cell, OnceCell, RefCell};
use std::sync::Arc;

const NAME_DEPTH: usize = 16;

/// A name as stored in the file (bytes of `.debug_str` and friends).
pub(crate) type RawName = &'static [u8];

/// One frame as found in DWARF, before demangling and interning.
pub(crate) struct RawFrame {
    pub name: Option<RawName>,
    pub lang: Option<gimli::DwLang>,
    pub file: Option<Arc<str>>,
    pub line: u32,
    pub column: u32,
    pub discriminator: u32,
}

struct Slot {
    /// Offset of the unit header in `.debug_info`.
    offset: usize,
    header: gimli::UnitHeader<Slice>,
    data: OnceCell<Option<Box<UnitData>>>,
}

struct Lines {
    header: gimli::LineProgramHeader<Slice>,
    /// Our interpreter of the program (`None`: every sequence was decoded
    /// by gimli up front).
    program: Option<Program>,
    sequences: Box<[Sequence]>,
    files: RefCell<IntMap<u64, Option<Arc<str>>>>,
}

/// One range of an inlined call: only what finds the chain at an
/// address. Its call site and origin are read from `die` when it is on a
/// chain asked for (a few DIEs per address instead of all of a function).
#[derive(Clone, Copy)]
struct Inlined {
    begin: u64,
    end: u64,
    depth: u32,
    /// Unit offset of the DIE (a unit of 4 GiB or more is not indexed).
    die: u32,
}

impl Inlined {
    fn die(&self) -> UnitOffset {
        UnitOffset(self.die as usize)
    }
}

/// The attributes of an inlined call's DIE that a frame needs.
#[derive(Default)]
struct CallSite {
    /// The DIE its name comes from (its abstract origin), or `None` to
    /// read the name from the DIE itself: the names of every inlined copy
    /// of a function then share one cache entry.
    origin: Option<Origin>,
    file: Option<u64>,
    line: u32,
    column: u32,
}

/// Where an abstract origin is.
#[derive(Clone, Copy)]
enum Origin {
    /// In the same unit.
    Unit(UnitOffset),
    /// At this offset of `.debug_info` (not in a split unit).
    Info(usize),
}

struct Function {
    /// Sorted by (depth, begin), as the addr2line crate does: a binary
    /// search per depth finds the chain.
    inlined: Box<[Inlined]>,
}

struct UnitData {
    /// The unit whose DIEs are walked: the split unit of a skeleton
    /// whose `.dwo` was found (`split.rs`), else the unit itself.
    unit: gimli::Unit<Slice>,
    /// For a split unit: its DWARF and the skeleton (whose line table and
    /// ranges are the object's). `None` for every other unit.
    split: Option<Box<Split>>,
    /// Where each abbreviation starts (a cheap scan, always made).
    index: AbbrevIndex,
    /// The unit's abbreviations with their skip plans (`die.rs`), built
    /// when the unit is walked; a unit only read for names through
    /// abstract origins never needs them.
    abbrevs: OnceCell<Option<Abbrevs>>,
    /// `.debug_abbrev`.
    abbrev_section: &'static [u8],
    lang: Option<gimli::DwLang>,
    lines: OnceCell<Option<Lines>>,
    /// (begin, end, subprogram DIE), sorted by begin.
    functions: OnceCell<Box<[(u64, u64, UnitOffset)]>>,
    details: RefCell<IntMap<usize, Arc<Function>>>,
    /// The call sites of each function asked for (by subprogram DIE
    /// offset), read on first use (`tailcall.rs`).
    call_sites: RefCell<IntMap<usize, Arc<[CallSiteRec]>>>,
    /// The unit's scopes, for C++ names without a linkage name: built on
    /// the first such name.
    scopes: OnceCell<Box<[Scope]>>,
}

/// A DIE with children that names a scope (namespace, class, structure,
/// union), or a function (whose local classes gdb names without it).
struct Scope {
    /// Unit offsets of the DIE and of the end of its children.
    begin: usize,
    end: usize,
    /// Index of the enclosing scope, `u32::MAX` for none.
    parent: u32,
    /// `None`: a function (the qualification stops there).
    part: Option<ScopeName>,
}

enum ScopeName {
    Named(RawName),
    /// A namespace without a name.
    AnonymousNamespace,
    /// A class, structure or union without a name: not part of the name.
    Unnamed,
}

/// Whether names of `lang` are qualified by their enclosing scopes.
fn scoped_language(lang: Option<gimli::DwLang>) -> bool {
    matches!(
        lang,
        Some(
            gimli::DW_LANG_C_plus_plus
                | gimli::DW_LANG_C_plus_plus_03
                | gimli::DW_LANG_C_plus_plus_11
                | gimli::DW_LANG_C_plus_plus_14
                | gimli::DW_LANG_ObjC_plus_plus
        )
    )
}

/// The scopes of a unit, in DIE order (a walk of the whole unit).
#[inline(never)]
fn parse_scopes(dwarf: &gimli::Dwarf<Slice>, u: &UnitData) -> Box<[Scope]> {
    let mut out: Vec<Scope> = Vec::new();
    let _ = (|| -> Option<()> {
        let unit = &u.unit;
        let mut c = Cursor::new(&unit.header, u.abbrevs()?, unit.header.root_offset())?;
        // (tree depth, index in `out`) of the open scopes.
        let mut stack: Vec<(isize, usize)> = Vec::new();
        while !c.is_empty() {
            let depth = c.depth();
            let off = c.offset().0;
            while let Some(&(d, i)) = stack.last() {
                if d < depth {
                    break;
                }
                out[i].end = off;
                stack.pop();
            }
            let abbrev = match c.read_abbrev()? {
                Some(a) => a,
                None => continue,
            };
            let kind = match abbrev.tag {
                gimli::DW_TAG_namespace => 1,
                gimli::DW_TAG_class_type
                | gimli::DW_TAG_structure_type
                | gimli::DW_TAG_union_type => 2,
                gimli::DW_TAG_subprogram => 3,
                _ => 0,
            };
            if kind == 0 || !abbrev.children {
                c.skip_attributes(abbrev)?;
                continue;
            }
            let mut name = None;
            let mut declaration = false;
            c.attributes(abbrev, |at, v| match at {
                gimli::DW_AT_name => name = dwarf.attr_string(unit, v).ok().map(|s| s.slice()),
                gimli::DW_AT_declaration => declaration = matches!(v, AttributeValue::Flag(true)),
                _ => {}
            })?;
            let part = match (kind, name) {
                (3, _) => None,
                (_, Some(n)) => Some(ScopeName::Named(n)),
                (1, None) => Some(ScopeName::AnonymousNamespace),
                _ => Some(ScopeName::Unnamed),
            };
            // A function's declaration in a class is no function scope.
            let part = if kind == 3 && declaration {
                Some(ScopeName::Unnamed)
            } else {
                part
            };
            out.push(Scope {
                begin: off,
                end: usize::MAX,
                parent: stack.last().map_or(u32::MAX, |&(_, i)| i as u32),
                part,
            });
            stack.push((depth, out.len() - 1));
        }
        Some(())
    })();
    out.into_boxed_slice()
}

/// `name` preceded by the scopes around the DIE at `die` (`a::b::name`),
/// up to the unit or the first enclosing function; `None` when there is
/// no scope to add.
fn qualified(scopes: &[Scope], die: usize, name: &[u8]) -> Option<Vec<u8>> {
    let mut i = scopes.partition_point(|s| s.begin < die).checked_sub(1)?;
    // The innermost scope holding `die`.
    loop {
        let s = &scopes[i];
        if s.begin < die && die < s.end {
            break;
        }
        i = s.parent as usize;
        if i >= scopes.len() {
            return None;
        }
    }
    let mut parts: Vec<&[u8]> = Vec::new();
    loop {
        let s = &scopes[i];
        match &s.part {
            None => break,
            Some(ScopeName::Named(n)) => parts.push(n),
            Some(ScopeName::AnonymousNamespace) => parts.push(b"(anonymous namespace)"),
            Some(ScopeName::Unnamed) => {}
        }
        i = s.parent as usize;
        if i >= scopes.len() {
            break;
        }
    }
    if parts.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(name.len() + parts.iter().map(|p| p.len() + 2).sum::<usize>());
    for p in parts.iter().rev() {
        out.extend_from_slice(p);
        out.extend_from_slice(b"::");
    }
    out.extend_from_slice(name);
    Some(out)
}

/// A split unit's DWARF and its skeleton.
struct Split {
    dwarf: Arc<gimli::Dwarf<Slice>>,
    skeleton: gimli::Unit<Slice>,
}

impl UnitData {
    /// The DWARF `unit`'s attributes are read in: `main`, or the split
    /// unit's.
    #[inline]
    fn dw<'a>(&'a self, main: &'a gimli::Dwarf<Slice>) -> &'a gimli::Dwarf<Slice> {
        match &self.split {
            None => main,
            Some(s) => &s.dwarf,
        }
    }

    /// The unit of the object's DWARF (the skeleton of a split unit): its
    /// line table and address ranges.
    #[inline]
    fn own_unit(&self) -> &gimli::Unit<Slice> {
        match &self.split {
            None => &self.unit,
            Some(s) => &s.skeleton,
        }
    }

    /// The unit's full abbreviation table, parsed on first use.
    fn abbrevs(&self) -> Option<&Abbrevs> {
        self.abbrevs
            .get_or_init(|| {
                let h = &self.unit.header;
                Abbrevs::parse(self.abbrev_section, h.debug_abbrev_offset().0, h.encoding())
            })
            .as_ref()
    }
}

/// Sorted unit ranges: (begin, end, `.debug_info` offset of the unit).
struct RangeIndex {
    ranges: Box<[(u64, u64, usize)]>,
    max_end: Box<[u64]>,
    /// Sorted offsets of the units listed in `.debug_aranges` (only for the
    /// aranges index).
    covered: Vec<usize>,
}

impl RangeIndex {
    fn new(mut ranges: Vec<(u64, u64, usize)>, covered: Vec<usize>) -> RangeIndex {
        ranges.sort_unstable_by_key(|r| (r.0, r.2));
        let mut m = 0;
        let max_end = ranges
            .iter()
            .map(|r| {
                m = m.max(r.1);
                m
            })
            .collect();
        RangeIndex {
            ranges: ranges.into_boxed_slice(),
            max_end,
            covered,
        }
    }
}

/// The DWARF of one object, indexed lazily.
pub(crate) struct DwarfIndex {
    dwarf: gimli::Dwarf<Slice>,
    /// The units found so far, in `.debug_info` order: the list grows as
    /// far as an offset asked for (so a compressed `.debug_info` is
    /// inflated only up to the units used).
    slots: Frozen<Slot>,
    /// Offset of the next unit header to read, `None` once all are read.
    scan: Cell<Option<usize>>,
    /// (begin, end, slot), sorted by begin, with the running maximum of
    /// `end` to walk back over overlapping ranges: from `.debug_aranges`
    /// alone (cheap), then, built only when an address is not found there,
    /// from every unit.
    aranges: OnceCell<RangeIndex>,
    all_ranges: OnceCell<RangeIndex>,
    names: RefCell<IntMap<u64, Option<RawName>>>,
    /// Reused while parsing a function (no regrowing per function).
    scratch: RefCell<Vec<Inlined>>,
    /// Names of DIEs in a dwz supplementary file (`DW_FORM_GNU_ref_alt`).
    sup_names: super::sup::SupNames,
    /// The other inflated sections `dwarf` reads, and `.debug_info`
    /// (last fields: everything above may borrow from them).
    _inflated: Vec<Inflating>,
    info: Info,
    /// The `.dwo` files and `.dwp` package of split units (last: the
    /// split units above borrow from its mappings).
    split: super::split::SplitLoader,
    /// Whether C++ names without a linkage name are qualified by their
    /// scopes (gdb's names) or not (binutils' and llvm's).
    scoped: Cell<bool>,
    /// Names made here (qualified C++ names), as long as the index.
    owned: super::mapped::Mapped,
}

/// `.debug_info`: as mapped, or inflated on demand.
pub(crate) enum Info {
    Plain(Slice),
    Inflating(Inflating, gimli::RunTimeEndian),
}

impl Info {
    /// A reader over at least the first `end` bytes (fewer if the section
    /// is shorter or corrupt).
    fn prefix(&self, end: usize) -> Slice {
        match self {
            Info::Plain(s) => *s,
            Info::Inflating(z, e) => gimli::EndianSlice::new(z.prefix(end), *e),
        }
    }

    fn len(&self) -> usize {
        match self {
            Info::Plain(s) => s.len(),
            Info::Inflating(z, _) => z.len(),
        }
    }
}

impl DwarfIndex {
    /// An estimate of the heap this index takes (what a memory budget
    /// counts): the sections inflated so far, the units read, the address
    /// indexes built and the names looked up. Parsed unit contents (line
    /// tables, functions) are counted at a flat rate per unit read.
    pub(crate) fn approx_bytes(&self) -> usize {
        let inflated: usize = self._inflated.iter().map(Inflating::len).sum::<usize>()
            + match &self.info {
                Info::Inflating(z, _) => z.len(),
                Info::Plain(_) => 0,
            };
        let ranges = |r: &OnceCell<RangeIndex>| {
            r.get()
                .map_or(0, |r| r.ranges.len() * 32 + r.covered.len() * 8)
        };
        inflated
            + self.slots.len()
                * (std::mem::size_of::<Slot>() + std::mem::size_of::<UnitData>() + 4096)
            + ranges(&self.aranges)
            + ranges(&self.all_ranges)
            + self.names.borrow().len() * 48
    }

    /// `dwarf.debug_info` is not used: `info` is.
    /// `inflated`: the sections `dwarf` reads from inflated buffers, kept
    /// alive as long as it.
    pub(crate) fn new(
        dwarf: gimli::Dwarf<Slice>,
        info: Info,
        inflated: Vec<Inflating>,
    ) -> DwarfIndex {
        let endian = gimli::Reader::endian(gimli::Section::reader(&dwarf.debug_abbrev));
        DwarfIndex {
            split: super::split::SplitLoader::new(endian),
            scoped: Cell::new(false),
            owned: super::mapped::Mapped::from_bytes(Vec::new()),
            dwarf,
            _inflated: inflated,
            slots: Frozen::new(),
            scan: Cell::new(Some(0)),
            info,
            aranges: OnceCell::new(),
            all_ranges: OnceCell::new(),
            names: RefCell::new(IntMap::default()),
            scratch: RefCell::new(Vec::new()),
            sup_names: super::sup::SupNames::new(),
        }
    }

    /// Where split units' `.dwo` files and package may be (without it,
    /// skeleton units answer alone).
    pub(crate) fn set_split_places(&mut self, places: super::split::SplitPlaces) {
        self.split.set_places(places);
    }

    /// Names C++ functions without a linkage name as gdb does
    /// (`ns::f`, `(anonymous namespace)::f`, `Local::run`), or by their
    /// bare `DW_AT_name` as binutils and llvm do.
    pub(crate) fn set_scoped_names(&self, on: bool) {
        if self.scoped.replace(on) != on {
            self.names.borrow_mut().clear();
        }
    }

    /// Split-DWARF files found missing since the last call.
    pub(crate) fn take_missing_split(&self) -> Vec<std::path::PathBuf> {
        if !self.split.has_missing() {
            return Vec::new();
        }
        self.split.take_missing()
    }

    /// Reads unit headers until one starts past `info_offset` (or all).
    fn scan_to(&self, info_offset: usize) {
        while let Some(at) = self.scan.get() {
            if at > info_offset {
                return;
            }
            self.scan.set(None);
            // The initial length (4 bytes, or 0xffffffff and 8 bytes).
            let head = self.info.prefix(at.saturating_add(12));
            let Some(h) = head.slice().get(at..) else {
                return;
            };
            let mut r = gimli::EndianSlice::new(h, gimli::Reader::endian(&head));
            let Ok((len, format)) = gimli::Reader::read_initial_length(&mut r) else {
                return;
            };
            let end = at
                .saturating_add(format.initial_length_size() as usize)
                .saturating_add(len);
            let info = gimli::DebugInfo::from(self.info.prefix(end));
            let Ok(header) = info.header_from_offset(gimli::DebugInfoOffset(at)) else {
                return;
            };
            self.slots.push(Slot {
                offset: at,
                header,
                data: OnceCell::new(),
            });
            if end < self.info.len() {
                self.scan.set(Some(end));
            }
        }
    }

    fn slot(&self, i: usize) -> Option<&Slot> {
        self.slots.get(i)
    }

    /// Every unit's slot.
    fn all_slots(&self) -> usize {
        self.scan_to(usize::MAX);
        self.slots.len()
    }

    fn slot_at(&self, info_offset: usize) -> Option<usize> {
        self.scan_to(info_offset);
        let i = self.slots.partition_point(|s| s.offset <= info_offset);
        i.checked_sub(1)
    }

    fn unit(&self, slot: usize) -> Option<&UnitData> {
        let s = self.slot(slot)?;
        s.data.get_or_init(|| self.load_unit(s)).as_deref()
    }

    #[inline(never)]
    fn load_unit(&self, s: &Slot) -> Option<Box<UnitData>> {
        // Our table (with skip plans) is the one walks use; gimli
        // gets only the root DIE's entry, which is all it reads.
        let section = gimli::Section::reader(&self.dwarf.debug_abbrev).slice();
        let enc = s.header.encoding();
        let index = AbbrevIndex::scan(section, s.header.debug_abbrev_offset().0)?;
        let root = s
            .header
            .range_from(s.header.root_offset()..)
            .ok()
            .and_then(|mut r| gimli::Reader::read_uleb128(&mut r).ok());
        let one = root.and_then(|c| {
            let t = Abbrevs::parse_one(section, index.get(c)?, enc)?;
            t.gimli_one(section, c)
        });
        let unit = match one {
            Some(one) => {
                gimli::Unit::new_with_abbreviations(&self.dwarf, s.header, Arc::new(one)).ok()?
            }
            None => self.dwarf.unit(s.header).ok()?,
        };
        // A skeleton: the DIEs are those of its split unit, when found.
        let (unit, split, index, section) = match unit
            .dwo_id
            .and_then(|_| self.split.load(&self.dwarf, &unit))
        {
            None => (unit, None, index, section),
            Some(su) => {
                let section = gimli::Section::reader(&su.dwarf.debug_abbrev).slice();
                let index = AbbrevIndex::scan(section, su.unit.header.debug_abbrev_offset().0)?;
                (
                    su.unit,
                    Some(Box::new(Split {
                        dwarf: su.dwarf,
                        skeleton: unit,
                    })),
                    index,
                    section,
                )
            }
        };
        let lang = unit
            .entries_raw(None)
            .ok()
            .and_then(|mut e| {
                let abbrev = e.read_abbreviation().ok()??;
                let mut lang = None;
                for spec in abbrev.attributes() {
                    let attr = e.read_attribute(*spec).ok()?;
                    if attr.name() == gimli::DW_AT_language {
                        if let AttributeValue::Language(l) = attr.value() {
                            lang = Some(l);
                        }
                    }
                }
                Some(lang)
            })
            .flatten();
        Some(Box::new(UnitData {
            unit,
            split,
            index,
            abbrevs: OnceCell::new(),
            abbrev_section: section,
            lang,
            lines: OnceCell::new(),
            functions: OnceCell::new(),
            details: RefCell::new(IntMap::default()),
            call_sites: RefCell::new(IntMap::default()),
            scopes: OnceCell::new(),
        }))
    }

    /// Ranges listed in `.debug_aranges`, and which slots it covers.
    fn aranges(&self) -> &RangeIndex {
        self.aranges.get_or_init(|| {
            // Keyed by unit offset: which offsets really start units is
            // checked when an address falls in one (reading the unit list
            // only that far).
            let mut covered = Vec::new();
            let mut out: Vec<(u64, u64, usize)> = Vec::new();
            let mut headers = self.dwarf.debug_aranges.headers();
            while let Ok(Some(h)) = headers.next() {
                let unit = h.debug_info_offset().0;
                let mut entries = h.entries();
                while let Ok(Some(e)) = entries.next() {
                    let r = e.range();
                    if r.begin < r.end && r.begin != 0 {
                        out.push((r.begin, r.end, unit));
                        covered.push(unit);
                    }
                }
            }
            covered.sort_unstable();
            covered.dedup();
            RangeIndex::new(out, covered)
        })
    }

    /// Every unit's ranges: the aranges, plus the DIE ranges of the units
    /// `.debug_aranges` does not list (parsing those units' headers and
    /// abbreviations, hence built only when needed).
    fn all_ranges(&self) -> &RangeIndex {
        self.all_ranges.get_or_init(|| {
            let a = self.aranges();
            let mut out = a.ranges.to_vec();
            for i in 0..self.all_slots() {
                let Some(s) = self.slot(i) else { continue };
                if a.covered.binary_search(&s.offset).is_ok() {
                    continue;
                }
                let mut split = false;
                if self.quick_unit_ranges(i, &mut out, &mut split).is_some() {
                    continue;
                }
                // A skeleton's ranges are its own: read without looking
                // for its split unit (which `self.unit` would open).
                let skeleton;
                let own = if split && s.data.get().is_none() {
                    skeleton = match self.dwarf.unit(s.header) {
                        Ok(u) => u,
                        Err(_) => continue,
                    };
                    &skeleton
                } else {
                    let Some(u) = self.unit(i) else { continue };
                    u.own_unit()
                };
                let ur = gimli::UnitRef::new(&self.dwarf, own);
                if let Ok(mut it) = ur.unit_ranges() {
                    while let Ok(Some(r)) = it.next() {
                        // Ranges at 0 are code the linker discarded.
                        if r.begin < r.end && r.begin != 0 {
                            out.push((r.begin, r.end, s.offset));
                        }
                    }
                }
            }
            RangeIndex::new(out, Vec::new())
        })
    }

    /// The address ranges of a unit's root DIE, decoding only the one
    /// abbreviation it uses instead of the unit's whole abbreviation table
    /// (which is what `gimli::Dwarf::unit` parses, and most of the cost of
    /// indexing units `.debug_aranges` does not list). `None`: use the
    /// full path (with `split` set for a skeleton unit).
    fn quick_unit_ranges(
        &self,
        slot: usize,
        out: &mut Vec<(u64, u64, usize)>,
        split: &mut bool,
    ) -> Option<()> {
        use gimli::{Reader, Section};
        let s = self.slot(slot)?;
        let (h, offset) = (s.header, s.offset);
        let start = UnitOffset(h.header_size());
        let mut die = h.range_from(start..).ok()?;
        let before = die.len();
        let code = die.read_uleb128().ok()?;
        let attrs_at = UnitOffset(start.0 + (before - die.len()));
        // Find `code` in the unit's abbreviation table, reading only up to it.
        let mut ab = *self.dwarf.debug_abbrev.reader();
        ab.skip(h.debug_abbrev_offset().0).ok()?;
        let mut specs = Vec::new();
        loop {
            let c = ab.read_uleb128().ok()?;
            if c == 0 {
                return None;
            }
            let _tag = ab.read_uleb128().ok()?;
            let _children = ab.read_u8().ok()?;
            specs.clear();
            loop {
                let name = ab.read_uleb128_u16().ok()?;
                let form = ab.read_uleb128_u16().ok()?;
                if name == 0 && form == 0 {
                    break;
                }
                let implicit = if form == gimli::DW_FORM_implicit_const.0 {
                    Some(ab.read_sleb128().ok()?)
                } else {
                    None
                };
                specs.push(gimli::AttributeSpecification::new(
                    gimli::DwAt(name),
                    gimli::DwForm(form),
                    implicit,
                ));
            }
            if c == code {
                break;
            }
        }
        let empty = gimli::Abbreviations::default();
        let mut e = h.entries_raw(&empty, Some(attrs_at)).ok()?;
        let mut unit = gimli::Unit {
            header: h,
            abbreviations: Arc::new(gimli::Abbreviations::default()),
            name: None,
            comp_dir: None,
            low_pc: 0,
            str_offsets_base: gimli::DebugStrOffsetsBase::default_for_encoding_and_file(
                h.encoding(),
                gimli::DwarfFileType::Main,
            ),
            addr_base: gimli::DebugAddrBase(0),
            loclists_base: gimli::DebugLocListsBase::default_for_encoding_and_file(
                h.encoding(),
                gimli::DwarfFileType::Main,
            ),
            rnglists_base: gimli::DebugRngListsBase::default_for_encoding_and_file(
                h.encoding(),
                gimli::DwarfFileType::Main,
            ),
            line_program: None,
            dwo_id: None,
        };
        let mut attrs = Vec::with_capacity(specs.len());
        for spec in &specs {
            let a = e.read_attribute(*spec).ok()?;
            match (a.name(), a.value()) {
                (
                    gimli::DW_AT_addr_base | gimli::DW_AT_GNU_addr_base,
                    AttributeValue::DebugAddrBase(b),
                ) => unit.addr_base = b,
                (gimli::DW_AT_rnglists_base, AttributeValue::DebugRngListsBase(b)) => {
                    unit.rnglists_base = b
                }
                (gimli::DW_AT_GNU_ranges_base, _)
                | (gimli::DW_AT_GNU_dwo_id, _)
                | (gimli::DW_AT_dwo_name, _) => {
                    // Split units: leave them to gimli's full path.
                    *split = true;
                    return None;
                }
                _ => attrs.push(a),
            }
        }
        let mut pc = Pc::default();
        for a in &attrs {
            pc.take(&self.dwarf, &unit, a.name(), a.value());
        }
        unit.low_pc = pc.low.unwrap_or(0);
        pc.each(&self.dwarf, &unit, |b, end| {
            // Ranges at 0 are code the linker discarded.
            if b != 0 {
                out.push((b, end, offset));
            }
        });
        Some(())
    }

    /// The frames at `probe`, innermost first; empty when no unit has a
    /// function or a line row there.
    pub(crate) fn frames(&self, probe: u64, out: &mut Vec<RawFrame>) {
        let mut tried = Vec::new();
        if self.frames_in(self.aranges(), probe, out, &mut tried) {
            return;
        }
        // A unit listed there holds `probe` but has neither a function nor
        // a line row at it (a signal trampoline written in assembly inside
        // a C unit): as in `function_at`, no unit `.debug_aranges` leaves
        // out is looked for, which would read (and, compressed, inflate)
        // every unit header.
        if !tried.is_empty() || self.aranges_cover_all() {
            return;
        }
        self.frames_in(self.all_ranges(), probe, out, &mut tried);
    }

    fn frames_in(
        &self,
        index: &RangeIndex,
        probe: u64,
        out: &mut Vec<RawFrame>,
        tried: &mut Vec<usize>,
    ) -> bool {
        self.first_unit_at(index, probe, tried, |slot| {
            self.frames_in_unit(slot, probe, out).then_some(())
        })
        .is_some()
    }

    /// Calls `f` with the slot of each unit whose ranges in `index` hold
    /// `probe`, each unit once (`tried`), until it gives `Some`. An offset
    /// that starts no unit (corrupt aranges) is skipped.
    fn first_unit_at<T>(
        &self,
        index: &RangeIndex,
        probe: u64,
        tried: &mut Vec<usize>,
        mut f: impl FnMut(usize) -> Option<T>,
    ) -> Option<T> {
        let mut i = index.ranges.partition_point(|r| r.0 <= probe);
        while i > 0 {
            i -= 1;
            if index.max_end[i] <= probe {
                break;
            }
            let (b, e, unit) = index.ranges[i];
            if !(b <= probe && probe < e) || tried.contains(&unit) {
                continue;
            }
            tried.push(unit);
            let Some(slot) = self
                .slot_at(unit)
                .filter(|&s| self.slot(s).is_some_and(|s| s.offset == unit))
            else {
                continue;
            };
            if let Some(t) = f(slot) {
                return Some(t);
            }
        }
        None
    }

    /// Whether `.debug_aranges` lists every unit: then no unit it leaves
    /// out can hold an address.
    fn aranges_cover_all(&self) -> bool {
        let covered = &self.aranges().covered;
        (0..self.all_slots()).all(|i| {
            self.slot(i)
                .is_some_and(|s| covered.binary_search(&s.offset).is_ok())
        })
    }

    fn frames_in_unit(&self, slot: usize, probe: u64, out: &mut Vec<RawFrame>) -> bool {
        let Some(u) = self.unit(slot) else {
            return false;
        };
        let lines = u
            .lines
            .get_or_init(|| parse_lines(&self.dwarf, u.own_unit()))
            .as_ref();
        let row = lines.and_then(|l| l.find(probe));
        let function = u
            .functions
            .get_or_init(|| parse_functions(u.dw(&self.dwarf), u))
            .as_ref();
        let func = find_range(function, probe);
        if func.is_none() && row.is_none() {
            return false;
        }
        let file = |idx: u64| lines.and_then(|l| l.file(&self.dwarf, u.own_unit(), idx));
        let (mut file0, mut line0, mut col0, mut disc0) = (None, 0, 0, 0);
        if let Some(r) = row {
            file0 = file(r.file as u64);
            line0 = r.line;
            col0 = r.column;
            disc0 = r.discriminator;
        }
        let Some(fdie) = func else {
            out.push(RawFrame {
                name: None,
                lang: u.lang,
                file: file0,
                line: line0,
                column: col0,
                discriminator: disc0,
            });
            return true;
        };
        let detail = {
            let cached = u.details.borrow().get(&fdie.0).cloned();
            match cached {
                Some(d) => d,
                None => {
                    let mut scratch = self.scratch.borrow_mut();
                    let d = Arc::new(parse_function(u.dw(&self.dwarf), u, fdie, &mut scratch));
                    u.details.borrow_mut().insert(fdie.0, d.clone());
                    d
                }
            }
        };
        // The chain of inlined calls at `probe`, outermost first.
        let mut chain: smallchain::Chain = smallchain::Chain::new();
        let mut rest = &detail.inlined[..];
        loop {
            let depth = chain.len() as u32;
            let found = rest.binary_search_by(|x| {
                x.depth.cmp(&depth).then_with(|| {
                    if x.end <= probe {
                        std::cmp::Ordering::Less
                    } else if x.begin > probe {
                        std::cmp::Ordering::Greater
                    } else {
                        std::cmp::Ordering::Equal
                    }
                })
            });
            match found {
                Ok(i) => {
                    chain.push(&rest[i]);
                    rest = &rest[i + 1..];
                }
                Err(_) => break,
            }
        }
        // Innermost first: each frame's location is the line row for the
        // innermost, then the call site recorded in the inlined DIE below.
        let (mut f, mut l, mut c, mut d) = (file0, line0, col0, disc0);
        for inl in chain.iter().rev() {
            let site = call_site(u, inl.die()).unwrap_or_default();
            out.push(RawFrame {
                name: match site.origin {
                    Some(Origin::Unit(o)) => self.die_name(slot, o, NAME_DEPTH - 1),
                    Some(Origin::Info(at)) => self.slot_at(at).and_then(|t| {
                        let off = at - self.slot(t)?.offset;
                        self.die_name(t, UnitOffset(off), NAME_DEPTH - 1)
                    }),
                    None => self.die_name(slot, inl.die(), NAME_DEPTH),
                },
                lang: u.lang,
                file: f,
                line: l,
                column: c,
                discriminator: d,
            });
            f = site.file.and_then(file);
            l = site.line;
            c = site.column;
            d = 0;
        }
        out.push(RawFrame {
            name: self.die_name(slot, fdie, NAME_DEPTH),
            lang: u.lang,
            file: f,
            line: l,
            column: c,
            discriminator: d,
        });
        true
    }

    /// Whether the unit of `slot` is read from a split file.
    fn is_split(&self, slot: usize) -> bool {
        self.unit(slot).is_some_and(|u| u.split.is_some())
    }

    /// The name of a DIE: linkage name, else name, else its origin's.
    fn die_name(&self, slot: usize, die: UnitOffset, depth: usize) -> Option<RawName> {
        let s = self.slot(slot)?;
        // A split unit's offsets are its file's: keyed apart by slot.
        let key = if self.is_split(slot) {
            (1 << 63) | ((slot as u64) << 32) | die.0 as u64
        } else {
            (s.offset + die.0) as u64
        };
        if let Some(n) = self.names.borrow().get(&key) {
            return *n;
        }
        let n = self.die_name_uncached(slot, die, depth);
        self.names.borrow_mut().insert(key, n);
        n
    }

    fn die_name_uncached(&self, slot: usize, die: UnitOffset, depth: usize) -> Option<RawName> {
        if depth == 0 {
            return None;
        }
        let u = self.unit(slot)?;
        // The unit's table if it was walked, else just the DIE's entry.
        let one;
        let abbrevs = match u.abbrevs.get() {
            Some(Some(a)) => a,
            _ => {
                let code = u
                    .unit
                    .header
                    .range_from(die..)
                    .ok()
                    .and_then(|mut r| gimli::Reader::read_uleb128(&mut r).ok())?;
                let entry = u.index.get(code)?;
                one = Abbrevs::parse_one(u.abbrev_section, entry, u.unit.header.encoding())?;
                &one
            }
        };
        let mut c = Cursor::new(&u.unit.header, abbrevs, die)?;
        let abbrev = c.read_abbrev()??;
        let (mut linkage, mut name, mut next) = (None, None, None);
        c.attributes(abbrev, |at, value| match at {
            gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name if linkage.is_none() => {
                if let Ok(s) = u.dw(&self.dwarf).attr_string(&u.unit, value) {
                    linkage = Some(s.slice());
                }
            }
            gimli::DW_AT_name => {
                if let Ok(s) = u.dw(&self.dwarf).attr_string(&u.unit, value) {
                    name = Some(s.slice());
                }
            }
            gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                next = Some(value);
            }
            _ => {}
        })?;
        if linkage.is_some() {
            return linkage;
        }
        if let Some(n) = name {
            // C++ without a linkage name (a function of internal linkage,
            // a method of a local class): qualified by its scopes, as gdb
            // names it.
            if self.scoped.get() && scoped_language(u.lang) {
                let scopes = u.scopes.get_or_init(|| parse_scopes(u.dw(&self.dwarf), u));
                if let Some(q) = qualified(scopes, die.0, n) {
                    return Some(self.owned.stash(q));
                }
            }
            return Some(n);
        }
        match next? {
            AttributeValue::UnitRef(o) => self.die_name(slot, o, depth - 1),
            AttributeValue::DebugInfoRef(_) if u.split.is_some() => None,
            AttributeValue::DebugInfoRef(o) => {
                let target = self.slot_at(o.0)?;
                let off = o.0 - self.slot(target)?.offset;
                self.die_name(target, UnitOffset(off), depth - 1)
            }
            // An abstract origin that dwz moved into the supplementary file.
            AttributeValue::DebugInfoRefSup(o) => {
                self.sup_names.die_name(self.dwarf.sup()?, o, depth - 1)
            }
            _ => None,
        }
    }
}

impl Lines {
    fn find(&self, probe: u64) -> Option<Row> {
        let i = self.sequences.partition_point(|s| s.start <= probe);
        let seq = &self.sequences[i.checked_sub(1)?];
        if probe >= seq.end {
            return None;
        }
        seq.find(self.program.as_ref(), probe)
    }

    fn file(
        &self,
        dwarf: &gimli::Dwarf<Slice>,
        unit: &gimli::Unit<Slice>,
        index: u64,
    ) -> Option<Arc<str>> {
        if let Some(f) = self.files.borrow().get(&index) {
            return f.clone();
        }
        let f = render_file(dwarf, unit, &self.header, index).map(Arc::from);
        self.files.borrow_mut().insert(index, f.clone());
        f
    }
}

fn path_push(path: &mut String, p: &str) {
    let rooted = |s: &str| {
        s.starts_with('/')
            || s.starts_with('\\')
            || (s.len() > 2 && s.as_bytes()[1] == b':' && matches!(s.as_bytes()[2], b'/' | b'\\'))
    };
    if rooted(p) {
        path.clear();
        path.push_str(p);
    } else {
        let win = path.len() > 2 && path.as_bytes()[1] == b':' || path.starts_with('\\');
        let sep = if win { '\\' } else { '/' };
        if !path.is_empty() && !path.ends_with(sep) {
            path.push(sep);
        }
        path.push_str(p);
    }
}

fn render_file(
    dwarf: &gimli::Dwarf<Slice>,
    unit: &gimli::Unit<Slice>,
    header: &gimli::LineProgramHeader<Slice>,
    index: u64,
) -> Option<String> {
    let file = header.file(index)?;
    let mut path = match &unit.comp_dir {
        Some(d) => d.to_string_lossy().into_owned(),
        None => String::new(),
    };
    if file.directory_index() != 0 {
        if let Some(dir) = file.directory(header) {
            let d = dwarf.attr_string(unit, dir).ok()?;
            path_push(&mut path, &d.to_string_lossy());
        }
    }
    let name = dwarf.attr_string(unit, file.path_name()).ok()?;
    path_push(&mut path, &name.to_string_lossy());
    Some(path)
}

/// The unit's line table: sequences found by our interpreter, their rows
/// decoded on first use (`lines.rs`); gimli's `LineRows` for the
/// programs ours leaves to it.
#[inline(never)]
fn parse_lines(dwarf: &gimli::Dwarf<Slice>, unit: &gimli::Unit<Slice>) -> Option<Lines> {
    let incomplete = unit.line_program.as_ref()?;
    let header = incomplete.header();
    if let Some(program) = Program::new(header) {
        match program.sequences() {
            Ok(seqs) => {
                return Some(Lines {
                    header: header.clone(),
                    program: Some(program),
                    sequences: seqs.into_boxed_slice(),
                    files: RefCell::new(IntMap::default()),
                })
            }
            Err(Stop::Bad) => return None,
            Err(Stop::Unsupported) => {}
        }
    }
    parse_lines_gimli(dwarf, unit)
}

fn parse_lines_gimli(dwarf: &gimli::Dwarf<Slice>, unit: &gimli::Unit<Slice>) -> Option<Lines> {
    let _ = dwarf;
    let program = unit.line_program.clone()?;
    let mut rows = program.rows();
    let mut sequences = Vec::new();
    let mut cur: Vec<Row> = Vec::new();
    loop {
        let row = match rows.next_row() {
            Ok(Some((_, row))) => row,
            Ok(None) => break,
            Err(_) => return None,
        };
        let addr = row.address();
        if row.end_sequence() {
            if let Some(start) = cur.first().map(|r| r.addr) {
                if start < addr {
                    // Copied out at its exact size: `cur` is reused, so
                    // rows are not regrown from empty per sequence.
                    sequences.push(Sequence::decoded(start, addr, cur.as_slice().into()));
                }
                cur.clear();
            }
            continue;
        }
        let r = Row::new(
            addr,
            row.file_index(),
            row.line().map(|l| l.get()).unwrap_or(0),
            match row.column() {
                gimli::ColumnType::LeftEdge => 0,
                gimli::ColumnType::Column(c) => c.get(),
            },
            row.discriminator(),
        );
        match cur.last_mut() {
            Some(last) if last.addr == addr => *last = r,
            _ => cur.push(r),
        }
    }
    sequences.sort_by_key(|s| s.start);
    Some(Lines {
        header: rows.header().clone(),
        program: None,
        sequences: sequences.into_boxed_slice(),
        files: RefCell::new(IntMap::default()),
    })
}

/// Low/high pc and ranges attributes of one DIE.
#[derive(Default)]
struct Pc {
    low: Option<u64>,
    high: Option<u64>,
    size: Option<u64>,
    ranges: Option<gimli::RangeListsOffset<usize>>,
}

impl Pc {
    fn from_raw(dwarf: &gimli::Dwarf<Slice>, unit: &gimli::Unit<Slice>, r: RawPc) -> Pc {
        Pc {
            low: r.low,
            high: r.high,
            size: r.size,
            ranges: r.ranges.and_then(|o| {
                let v = AttributeValue::RangeListsRef(gimli::RawRangeListsOffset(o));
                dwarf.attr_ranges_offset(unit, v).ok().flatten()
            }),
        }
    }

    fn take(
        &mut self,
        dwarf: &gimli::Dwarf<Slice>,
        unit: &gimli::Unit<Slice>,
        name: gimli::DwAt,
        value: AttributeValue<Slice>,
    ) -> bool {
        match name {
            gimli::DW_AT_low_pc => {
                self.low = match value {
                    AttributeValue::Addr(a) => Some(a),
                    AttributeValue::DebugAddrIndex(i) => dwarf.address(unit, i).ok(),
                    _ => None,
                }
            }
            gimli::DW_AT_high_pc => match value {
                AttributeValue::Addr(a) => self.high = Some(a),
                AttributeValue::DebugAddrIndex(i) => self.high = dwarf.address(unit, i).ok(),
                AttributeValue::Udata(n) => self.size = Some(n),
                _ => {}
            },
            gimli::DW_AT_ranges => {
                self.ranges = dwarf.attr_ranges_offset(unit, value).ok().flatten();
            }
            _ => return false,
        }
        true
    }

    fn each(
        &self,
        dwarf: &gimli::Dwarf<Slice>,
        unit: &gimli::Unit<Slice>,
        mut f: impl FnMut(u64, u64),
    ) {
        if let Some(off) = self.ranges {
            if unit.header.version() <= 4 && bare_ranges(dwarf, unit, off.0, &mut f) {
                return;
            }
            if let Ok(mut it) = dwarf.ranges(unit, off) {
                while let Ok(Some(r)) = it.next() {
                    if r.begin < r.end {
                        f(r.begin, r.end);
                    }
                }
            }
        } else if let Some(low) = self.low {
            let end = match (self.high, self.size) {
                (Some(h), _) => h,
                (None, Some(s)) => low.wrapping_add(s),
                _ => return,
            };
            if low < end {
                f(low, end);
            }
        }
    }
}

/// A `.debug_ranges` list (DWARF 2 to 4) read by our own loop, with the
/// semantics of gimli's `RngListIter` (base address from the unit's low
/// pc or a selection entry, tombstones and empty or reversed ranges
/// skipped, the list ended by a (0, 0) pair, a truncated list cut short):
/// gimli's iterator costs some 190 instructions per entry, and inlined
/// calls in Rust have many lists. `false`, having reported nothing, for an
/// address size it does not handle.
fn bare_ranges(
    dwarf: &gimli::Dwarf<Slice>,
    unit: &gimli::Unit<Slice>,
    offset: usize,
    f: &mut impl FnMut(u64, u64),
) -> bool {
    let size = unit.header.address_size();
    if !matches!(size, 1 | 2 | 4 | 8) {
        return false;
    }
    let section = gimli::Section::reader(dwarf.ranges.debug_ranges());
    let big = gimli::Endianity::is_big_endian(gimli::Reader::endian(section));
    let Some(buf) = section.slice().get(offset..) else {
        return true;
    };
    let mask = !0u64 >> (64 - size as u32 * 8);
    let tombstone = (-2i64 as u64) & mask;
    let mut r = super::die::Bytes { buf, pos: 0 };
    let mut base = unit.low_pc;
    while r.pos < buf.len() {
        let (Some(begin), Some(end)) = (r.uint(size as usize, big), r.uint(size as usize, big))
        else {
            break;
        };
        if begin == 0 && end == 0 {
            break;
        }
        if begin == mask {
            base = end;
            continue;
        }
        if base >= tombstone {
            continue;
        }
        let (b, e) = (
            base.wrapping_add(begin) & mask,
            base.wrapping_add(end) & mask,
        );
        if b >= tombstone || b >= e {
            continue;
        }
        f(b, e);
    }
    true
}

#[inline(never)]
fn parse_functions(dwarf: &gimli::Dwarf<Slice>, u: &UnitData) -> Box<[(u64, u64, UnitOffset)]> {
    let unit = &u.unit;
    let mut out = Vec::new();
    let Some(abbrevs) = u.abbrevs() else {
        return out.into_boxed_slice();
    };
    let Some(mut c) = Cursor::new(&unit.header, abbrevs, unit.header.root_offset()) else {
        return out.into_boxed_slice();
    };
    while !c.is_empty() {
        let off = c.offset();
        let abbrev = match c.read_abbrev() {
            Some(Some(a)) => a,
            Some(None) => continue,
            None => break,
        };
        // Only a subprogram with code addresses is a function here.
        if abbrev.tag != gimli::DW_TAG_subprogram || !abbrev.has_pc {
            if c.skip_attributes(abbrev).is_none() {
                break;
            }
            continue;
        }
        let pc = match c.fixed_pc(abbrev) {
            Some(Some(raw)) => Pc::from_raw(dwarf, unit, raw),
            Some(None) => {
                let mut pc = Pc::default();
                if c.attributes(abbrev, |name, value| {
                    pc.take(dwarf, unit, name, value);
                })
                .is_none()
                {
                    break;
                }
                pc
            }
            None => break,
        };
        pc.each(dwarf, unit, |b, end| out.push((b, end, off)));
    }
    finish(out)
}

fn finish(mut v: Vec<(u64, u64, UnitOffset)>) -> Box<[(u64, u64, UnitOffset)]> {
    v.sort_unstable_by_key(|r| r.0);
    v.into_boxed_slice()
}

fn find_range(v: &[(u64, u64, UnitOffset)], probe: u64) -> Option<UnitOffset> {
    let i = v.partition_point(|r| r.0 <= probe);
    // Walk back over a few ranges in case of nesting or overlap.
    v[..i]
        .iter()
        .rev()
        .take(8)
        .find(|r| probe < r.1)
        .map(|r| r.2)
}

#[inline(never)]
fn parse_function(
    dwarf: &gimli::Dwarf<Slice>,
    u: &UnitData,
    die: UnitOffset,
    inlined: &mut Vec<Inlined>,
) -> Function {
    let unit = &u.unit;
    inlined.clear();
    (|| -> Option<()> {
        let mut c = Cursor::new(&unit.header, u.abbrevs()?, die)?;
        let base = c.depth();
        let abbrev = c.read_abbrev()??;
        c.skip_attributes(abbrev)?;
        // Stack of (tree depth, inline depth) of the enclosing inlined DIEs.
        let mut stack: Vec<(isize, u32)> = Vec::new();
        loop {
            let depth = c.depth();
            if depth <= base || c.is_empty() {
                break;
            }
            while stack.last().is_some_and(|&(d, _)| d >= depth) {
                stack.pop();
            }
            let off = c.offset();
            let abbrev = match c.read_abbrev()? {
                Some(a) => a,
                None => continue,
            };
            match abbrev.tag {
                gimli::DW_TAG_inlined_subroutine => {
                    let pc = match c.fixed_pc(abbrev)? {
                        Some(raw) => Pc::from_raw(dwarf, unit, raw),
                        None => {
                            let mut pc = Pc::default();
                            c.attributes(abbrev, |name, value| {
                                pc.take(dwarf, unit, name, value);
                            })?;
                            pc
                        }
                    };
                    let idepth = stack.last().map(|&(_, i)| i + 1).unwrap_or(0);
                    if let Ok(die) = u32::try_from(off.0) {
                        pc.each(dwarf, unit, |b, end| {
                            inlined.push(Inlined {
                                begin: b,
                                end,
                                depth: idepth,
                                die,
                            })
                        });
                    }
                    if abbrev.children {
                        stack.push((depth, idepth));
                    }
                }
                gimli::DW_TAG_subprogram => {
                    // A nested function is its own function: skip its subtree.
                    c.skip_attributes(abbrev)?;
                    if abbrev.children {
                        c.skip_subtree(depth)?;
                    }
                }
                _ => c.skip_attributes(abbrev)?,
            }
        }
        Some(())
    })();
    Function {
        inlined: sort_by_depth_then_begin(inlined),
    }
}

/// Sorts inlined ranges by (depth, begin): a stable bucketing by depth,
/// then a sort of each depth only if its ranges (in DIE order, usually
/// already by address) are not in order.
fn sort_by_depth_then_begin(v: &[Inlined]) -> Box<[Inlined]> {
    let depths = v.iter().map(|x| x.depth as usize + 1).max().unwrap_or(0);
    let mut start = vec![0usize; depths + 1];
    for x in v {
        start[x.depth as usize + 1] += 1;
    }
    for d in 1..=depths {
        start[d] += start[d - 1];
    }
    let mut next = start.clone();
    let mut out = v.to_vec();
    for x in v {
        let d = x.depth as usize;
        out[next[d]] = *x;
        next[d] += 1;
    }
    for d in 0..depths {
        let part = &mut out[start[d]..start[d + 1]];
        if !part.is_sorted_by_key(|x| x.begin) {
            part.sort_unstable_by_key(|x| x.begin);
        }
    }
    out.into_boxed_slice()
}

/// The call site and name origin of the inlined call at `die`.
fn call_site(u: &UnitData, die: UnitOffset) -> Option<CallSite> {
    let unit = &u.unit;
    let version5 = unit.header.version() >= 5;
    let mut c = Cursor::new(&unit.header, u.abbrevs()?, die)?;
    let abbrev = c.read_abbrev()??;
    let mut site = CallSite::default();
    let mut named = false;
    c.attributes(abbrev, |name, value| match name {
        gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
            site.origin = match value {
                AttributeValue::UnitRef(o) => Some(Origin::Unit(o)),
                AttributeValue::DebugInfoRef(o) if u.split.is_none() => Some(Origin::Info(o.0)),
                _ => None,
            }
        }
        gimli::DW_AT_name | gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
            named = true
        }
        gimli::DW_AT_call_file => {
            if let AttributeValue::FileIndex(fi) = value {
                if fi > 0 || version5 {
                    site.file = Some(fi);
                }
            }
        }
        gimli::DW_AT_call_line => {
            site.line = value.udata_value().unwrap_or(0).min(u32::MAX as u64) as u32
        }
        gimli::DW_AT_call_column => {
            site.column = value.udata_value().unwrap_or(0).min(u32::MAX as u64) as u32
        }
        _ => {}
    })?;
    if named {
        site.origin = None;
    }
    Some(site)
}

/// A function of the DWARF: the unit and DIE of a subprogram with code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FuncRef {
    slot: usize,
    die: UnitOffset,
}

/// What a call site calls, as its DIE says (`DW_AT_call_origin`, GNU's
/// `DW_AT_abstract_origin`, or a computed `DW_AT_call_target`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallTarget {
    /// A function defined in this DWARF, at this entry address.
    Entry(u64),
    /// A function only declared here: its linkage name (else its name),
    /// to be found in the symbol table.
    Name(RawName),
    /// Computed at run time (`DW_AT_call_target`), not said, or not
    /// readable (a target DIE without code addresses).
    Unknown,
}

/// One call-site DIE (`DW_TAG_call_site` or GNU's `DW_TAG_GNU_call_site`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallSiteRec {
    /// Its return address (`DW_AT_call_return_pc`, GNU's `DW_AT_low_pc`):
    /// for a tail call, the address just past the jump.
    pub pc: u64,
    /// Whether it is a tail call (`DW_AT_call_tail_call`).
    pub tail: bool,
    /// What it calls.
    pub target: CallTarget,
}

impl DwarfIndex {
    /// The function (`DW_TAG_subprogram` with code) containing `probe`.
    pub(crate) fn function_at(&self, probe: u64) -> Option<FuncRef> {
        let mut tried = Vec::new();
        if let Some(f) = self.function_in(self.aranges(), probe, &mut tried) {
            return Some(f);
        }
        // A unit listed there holds `probe` but no function does (assembly
        // with line rows only): no other unit will, and looking for units
        // `.debug_aranges` leaves out would read every unit header.
        if !tried.is_empty() {
            return None;
        }
        if self.aranges_cover_all() {
            return None;
        }
        self.function_in(self.all_ranges(), probe, &mut tried)
    }

    fn function_in(
        &self,
        index: &RangeIndex,
        probe: u64,
        tried: &mut Vec<usize>,
    ) -> Option<FuncRef> {
        self.first_unit_at(index, probe, tried, |slot| {
            let u = self.unit(slot)?;
            let functions = u
                .functions
                .get_or_init(|| parse_functions(u.dw(&self.dwarf), u));
            find_range(functions, probe).map(|die| FuncRef { slot, die })
        })
    }

    /// The entry address of a function: its low pc, or the start of the
    /// first of its ranges (in the order the DIE lists them).
    pub(crate) fn entry(&self, f: FuncRef) -> Option<u64> {
        match self.target_of(f.slot, f.die) {
            CallTarget::Entry(a) => Some(a),
            _ => None,
        }
    }

    /// The name of a function (linkage name, else name, else its
    /// origin's), as stored.
    pub(crate) fn function_name(&self, f: FuncRef) -> Option<RawName> {
        self.die_name(f.slot, f.die, NAME_DEPTH)
    }

    /// The call sites of function `f`, in DIE order, those of the
    /// functions inlined into it included (a nested function's are its
    /// own). Read once per function; empty for unreadable DWARF.
    pub(crate) fn call_sites(&self, f: FuncRef) -> Arc<[CallSiteRec]> {
        let Some(u) = self.unit(f.slot) else {
            return Arc::from([]);
        };
        if let Some(v) = u.call_sites.borrow().get(&f.die.0) {
            return v.clone();
        }
        let mut v = Vec::new();
        // A walk cut short by bad DWARF keeps the sites read before.
        let _ = self.read_call_sites(f, u, &mut v);
        let v: Arc<[CallSiteRec]> = v.into();
        u.call_sites.borrow_mut().insert(f.die.0, v.clone());
        v
    }

    fn read_call_sites(&self, f: FuncRef, u: &UnitData, out: &mut Vec<CallSiteRec>) -> Option<()> {
        let unit = &u.unit;
        let mut c = Cursor::new(&unit.header, u.abbrevs()?, f.die)?;
        let base = c.depth();
        let abbrev = c.read_abbrev()??;
        c.skip_attributes(abbrev)?;
        loop {
            let depth = c.depth();
            if depth <= base || c.is_empty() {
                return Some(());
            }
            let abbrev = match c.read_abbrev()? {
                Some(a) => a,
                None => continue,
            };
            match abbrev.tag {
                gimli::DW_TAG_call_site | gimli::DW_TAG_GNU_call_site => {
                    let (mut ret, mut low, mut tail) = (None, None, false);
                    let (mut origin, mut computed) = (None, false);
                    c.attributes_of(
                        abbrev,
                        super::die::call_site_attribute,
                        |name, v| match name {
                            gimli::DW_AT_call_return_pc => ret = self.address(u, v),
                            gimli::DW_AT_low_pc => low = self.address(u, v),
                            gimli::DW_AT_call_tail_call | gimli::DW_AT_GNU_tail_call => {
                                tail = matches!(v, AttributeValue::Flag(true))
                            }
                            gimli::DW_AT_call_origin | gimli::DW_AT_abstract_origin => {
                                origin = Some(v)
                            }
                            gimli::DW_AT_call_target | gimli::DW_AT_GNU_call_site_target => {
                                computed = true
                            }
                            _ => {}
                        },
                    )?;
                    let Some(pc) = ret.or(low) else { continue };
                    // A computed target wins over an origin, as in gdb.
                    let target = match (computed, origin) {
                        (false, Some(o)) => self.resolve_ref(f.slot, unit, o),
                        _ => CallTarget::Unknown,
                    };
                    out.push(CallSiteRec { pc, tail, target });
                }
                gimli::DW_TAG_subprogram => {
                    c.skip_attributes(abbrev)?;
                    if abbrev.children {
                        c.skip_subtree(depth)?;
                    }
                }
                _ => c.skip_attributes(abbrev)?,
            }
        }
    }

    fn address(&self, u: &UnitData, v: AttributeValue<Slice>) -> Option<u64> {
        match v {
            AttributeValue::Addr(a) => Some(a),
            AttributeValue::DebugAddrIndex(i) => u.dw(&self.dwarf).address(&u.unit, i).ok(),
            _ => None,
        }
    }

    /// The function a reference (from a DIE of `slot`) names.
    fn resolve_ref(
        &self,
        slot: usize,
        unit: &gimli::Unit<Slice>,
        v: AttributeValue<Slice>,
    ) -> CallTarget {
        let (t, die) = match v {
            AttributeValue::UnitRef(o) => (slot, o),
            // An offset in the split file's `.debug_info`, not ours.
            AttributeValue::DebugInfoRef(_) if self.is_split(slot) => return CallTarget::Unknown,
            AttributeValue::DebugInfoRef(o) => {
                let Some(t) = self.slot_at(o.0) else {
                    return CallTarget::Unknown;
                };
                let Some(start) = self.slot(t).map(|s| s.offset) else {
                    return CallTarget::Unknown;
                };
                (t, UnitOffset(o.0 - start))
            }
            // A DIE of a dwz supplementary file: a declaration at best.
            _ => return CallTarget::Unknown,
        };
        let _ = unit;
        self.target_of(t, die)
    }

    /// What a call to the function DIE `die` of unit `slot` reaches.
    fn target_of(&self, slot: usize, die: UnitOffset) -> CallTarget {
        let read = || -> Option<CallTarget> {
            let u = self.unit(slot)?;
            let unit = &u.unit;
            let mut c = Cursor::new(&unit.header, u.abbrevs()?, die)?;
            let abbrev = c.read_abbrev()??;
            let (mut pc, mut declaration) = (Pc::default(), false);
            c.attributes_of(abbrev, super::die::call_site_attribute, |name, v| {
                if name == gimli::DW_AT_declaration {
                    declaration = matches!(v, AttributeValue::Flag(true));
                } else {
                    pc.take(u.dw(&self.dwarf), unit, name, v);
                }
            })?;
            if declaration {
                return Some(match self.die_name(slot, die, NAME_DEPTH) {
                    Some(n) => CallTarget::Name(n),
                    None => CallTarget::Unknown,
                });
            }
            let mut entry = None;
            if pc.ranges.is_some() {
                pc.each(u.dw(&self.dwarf), unit, |b, _| {
                    entry.get_or_insert(b);
                });
            } else {
                entry = pc.low;
            }
            Some(entry.map_or(CallTarget::Unknown, CallTarget::Entry))
        };
        read().unwrap_or(CallTarget::Unknown)
    }
}

/// A small stack-allocated chain of inlined calls (deeper chains spill).
mod smallchain {
    use super::Inlined;

    pub(super) struct Chain<'a> {
        small: [Option<&'a Inlined>; 16],
        len: usize,
        spill: Vec<&'a Inlined>,
    }

    impl<'a> Chain<'a> {
        pub(super) fn new() -> Self {
            Chain {
                small: [None; 16],
                len: 0,
                spill: Vec::new(),
            }
        }
        pub(super) fn len(&self) -> usize {
            self.len
        }
        pub(super) fn push(&mut self, x: &'a Inlined) {
            if self.len < 16 {
                self.small[self.len] = Some(x);
            } else {
                self.spill.push(x);
            }
            self.len += 1;
        }
        pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = &'a Inlined> + '_ {
            self.small[..self.len.min(16)]
                .iter()
                .map(|x| x.expect("filled"))
                .chain(self.spill.iter().copied())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbolize::elf::{ElfModule, SearchPaths};

    /// Our line-program interpreter gives, for every unit of this test
    /// binary, the sequences and rows gimli's `LineRows` gives.
    #[test]
    fn line_programs_match_gimli() {
        let exe = std::env::current_exe().unwrap();
        let m = ElfModule::open(&exe, &SearchPaths::none()).unwrap();
        let d = m.dwarf.as_ref().expect("test binaries have DWARF");
        let (mut units, mut rows) = (0, 0);
        // Every unit here; under qemu-user, where this takes minutes, an
        // even spread of about 100 of them.
        let stride = match std::env::var_os("CALLSTACK_TEST_QEMU") {
            Some(_) => d.all_slots().div_ceil(100).max(1),
            None => 1,
        };
        for i in (0..d.all_slots()).step_by(stride) {
            let Some(u) = d.unit(i) else { continue };
            let ours = parse_lines(&d.dwarf, &u.unit);
            let theirs = parse_lines_gimli(&d.dwarf, &u.unit);
            let (Some(ours), Some(theirs)) = (ours, theirs) else {
                assert!(u.unit.line_program.is_none());
                continue;
            };
            assert!(ours.program.is_some());
            // Lookups in decreasing order (each sequence decoded at once).
            let again = parse_lines(&d.dwarf, &u.unit).unwrap();
            for b in theirs.sequences.iter().rev() {
                for r in b.rows(None).iter().rev() {
                    assert_eq!(again.find(r.addr), theirs.find(r.addr));
                }
            }
            assert_eq!(ours.sequences.len(), theirs.sequences.len());
            for (a, b) in ours.sequences.iter().zip(theirs.sequences.iter()) {
                assert_eq!((a.start, a.end), (b.start, b.end));
                let want = b.rows(None);
                assert_eq!(a.rows(ours.program.as_ref()), want);
                // And each row is found at its address and just before the next.
                for (k, r) in want.iter().enumerate() {
                    assert_eq!(a.find(ours.program.as_ref(), r.addr), Some(*r));
                    let next = want.get(k + 1).map(|n| n.addr).unwrap_or(a.end);
                    assert_eq!(a.find(ours.program.as_ref(), next - 1), Some(*r));
                }
                rows += want.len();
            }
            units += 1;
        }
        assert!(units > 10 && rows > 1000, "{units} units, {rows} rows");
    }

    type Reference = (u64, u64, u32, usize, usize, Option<u64>, u32, u32);

    /// The inlined calls of the function at `die`, read with gimli's
    /// `EntriesRaw` alone (what the symbolizer did before `die.rs`).
    fn gimli_inlined(
        dwarf: &gimli::Dwarf<Slice>,
        unit: &gimli::Unit<Slice>,
        die: UnitOffset,
    ) -> Vec<Reference> {
        let mut out = Vec::new();
        let version5 = unit.header.version() >= 5;
        // The unit keeps only its root's abbreviation: gimli gets all.
        let abbrevs = dwarf.abbreviations(&unit.header).unwrap();
        let mut e = unit.header.entries_raw(&abbrevs, Some(die)).unwrap();
        let base = e.next_depth();
        let abbrev = e.read_abbreviation().unwrap().unwrap();
        e.skip_attributes(abbrev.attributes()).unwrap();
        let mut stack: Vec<(isize, u32)> = Vec::new();
        loop {
            let depth = e.next_depth();
            if depth <= base || e.is_empty() {
                break;
            }
            while stack.last().is_some_and(|&(d, _)| d >= depth) {
                stack.pop();
            }
            let off = e.next_offset();
            let Some(abbrev) = e.read_abbreviation().unwrap() else {
                continue;
            };
            match abbrev.tag() {
                gimli::DW_TAG_inlined_subroutine => {
                    let mut pc = Pc::default();
                    let (mut file, mut line, mut col, mut origin, mut named) =
                        (None, 0, 0, 0, false);
                    for spec in abbrev.attributes() {
                        let attr = e.read_attribute(*spec).unwrap();
                        if pc.take(dwarf, unit, attr.name(), attr.value()) {
                            continue;
                        }
                        match attr.name() {
                            gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                                origin = match attr.value() {
                                    AttributeValue::UnitRef(o) => unit.header.offset().0 + o.0,
                                    AttributeValue::DebugInfoRef(o) => o.0,
                                    _ => 0,
                                }
                            }
                            gimli::DW_AT_name
                            | gimli::DW_AT_linkage_name
                            | gimli::DW_AT_MIPS_linkage_name => named = true,
                            gimli::DW_AT_call_file => {
                                if let AttributeValue::FileIndex(fi) = attr.value() {
                                    if fi > 0 || version5 {
                                        file = Some(fi);
                                    }
                                }
                            }
                            gimli::DW_AT_call_line => line = attr.udata_value().unwrap() as u32,
                            gimli::DW_AT_call_column => col = attr.udata_value().unwrap() as u32,
                            _ => {}
                        }
                    }
                    let idepth = stack.last().map(|&(_, i)| i + 1).unwrap_or(0);
                    let origin = if named { 0 } else { origin };
                    let mut push =
                        |b, end| out.push((b, end, idepth, off.0, origin, file, line, col));
                    // Range lists through gimli's iterator (ours is `bare_ranges`).
                    if let Some(r) = pc.ranges {
                        let mut it = dwarf.ranges(unit, r).unwrap();
                        while let Some(r) = it.next().unwrap() {
                            assert!(r.begin < r.end);
                            push(r.begin, r.end);
                        }
                    } else {
                        pc.each(dwarf, unit, push);
                    }
                    if abbrev.has_children() {
                        stack.push((depth, idepth));
                    }
                }
                gimli::DW_TAG_subprogram => {
                    e.skip_attributes(abbrev.attributes()).unwrap();
                    if abbrev.has_children() {
                        while e.next_depth() > depth && !e.is_empty() {
                            if let Some(a) = e.read_abbreviation().unwrap() {
                                e.skip_attributes(a.attributes()).unwrap();
                            }
                        }
                    }
                }
                _ => e.skip_attributes(abbrev.attributes()).unwrap(),
            }
        }
        out.sort_by_key(|x| (x.2, x.0));
        out
    }

    /// Our DIE cursor finds, for every function of this test binary, the
    /// inlined calls (ranges, depths, call sites, name origins) gimli
    /// finds.
    #[test]
    fn inlined_calls_match_gimli() {
        let exe = std::env::current_exe().unwrap();
        let m = ElfModule::open(&exe, &SearchPaths::none()).unwrap();
        let d = m.dwarf.as_ref().expect("test binaries have DWARF");
        let (mut functions, mut calls) = (0, 0);
        for i in 0..d.all_slots() {
            let Some(u) = d.unit(i) else { continue };
            let mut seen = std::collections::HashSet::new();
            for &(_, _, die) in parse_functions(&d.dwarf, u).iter() {
                if !seen.insert(die) {
                    continue;
                }
                let ours: Vec<Reference> = parse_function(&d.dwarf, u, die, &mut Vec::new())
                    .inlined
                    .iter()
                    .map(|x| {
                        let s = call_site(u, x.die()).unwrap();
                        (
                            x.begin,
                            x.end,
                            x.depth,
                            x.die as usize,
                            match s.origin {
                                Some(Origin::Unit(o)) => u.unit.header.offset().0 + o.0,
                                Some(Origin::Info(at)) => at,
                                None => 0,
                            },
                            s.file,
                            s.line,
                            s.column,
                        )
                    })
                    .collect();
                let theirs = gimli_inlined(&d.dwarf, &u.unit, die);
                assert_eq!(ours, theirs, "function DIE {:#x}", die.0);
                functions += 1;
                calls += ours.len();
            }
        }
        assert!(
            functions > 100 && calls > 100,
            "{functions} functions, {calls} calls"
        );
        let ranges = gimli::Section::reader(d.dwarf.ranges.debug_ranges());
        assert!(!ranges.is_empty(), "DWARF 4 range lists tested");
    }

    /// An address inside a unit `.debug_aranges` lists, where that unit
    /// has neither a function nor a line row (a trampoline in a top-level
    /// `asm` block of a C file, as glibc's `__restore_rt`), finds no frame
    /// without reading the unit headers after it: with a compressed
    /// `.debug_info` that would inflate all of it.
    #[test]
    fn a_listed_unit_without_rows_ends_the_search() {
        let dir = std::env::temp_dir().join(format!("cs-aranges-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.c");
        std::fs::write(
            &a,
            "__asm__(\".text\\n.globl tramp\\n.type tramp,@function\\ntramp:\\n nop\\n ret\\n.size tramp,2\\n\");\n\
             int first(int x) { return x + 1; }\n",
        )
        .unwrap();
        let b = dir.join("b.c");
        std::fs::write(&b, "int second(int x) { return x * 3; }\n").unwrap();
        let so = dir.join("two.so");
        let ok = std::process::Command::new("gcc")
            .args(["-shared", "-fPIC", "-g", "-O2", "-gdwarf-5"])
            .arg(&a)
            .arg(&b)
            .arg("-o")
            .arg(&so)
            .status()
            .unwrap()
            .success();
        assert!(ok, "gcc builds the fixture");
        let m = ElfModule::open(&so, &SearchPaths::none()).unwrap();
        let d = m.dwarf.as_ref().unwrap();
        let tramp = m.syms.iter().find(|s| s.name == "tramp").unwrap().addr;
        let mut out = Vec::new();
        d.frames(tramp, &mut out);
        assert!(out.is_empty(), "no DWARF frame for the trampoline");
        let read = d.slots.len();
        let all = ElfModule::open(&so, &SearchPaths::none()).unwrap();
        let all = all.dwarf.as_ref().unwrap().all_slots();
        assert_eq!(all, 2);
        assert!(
            read < all,
            "stopped at the listed unit: read {read} of {all} unit headers"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
