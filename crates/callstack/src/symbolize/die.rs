//! A fast walk over a unit's DIEs: each abbreviation gets a skip plan
//! when its table is parsed (the byte size of its attributes when they all
//! have a fixed size, else a short list of steps with the fixed runs
//! merged), so stepping over a DIE nobody asked about costs a LEB128 code,
//! a table index and an addition instead of a dispatch on every
//! attribute's form. Most of the DIEs of a unit (types, parameters,
//! variables, declarations) are stepped over that way; the attributes of
//! the few DIEs that matter are then read by gimli
//! ([`Cursor::attributes`]).
//!
//! This is our own code on the hot path of symbolization (walking a
//! unit's DIEs for its functions and a function's DIEs for its inlined
//! calls was more than half of the CPU time of a cold pass with gimli's
//! `EntriesRaw`); everything it cannot decode (unknown forms, truncated
//! input) ends the walk with `None`, never a panic.

use super::elf::Slice;
use gimli::{AttributeSpecification, AttributeValue, DwTag, UnitOffset};

/// One step of a skip plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// So many bytes.
    Bytes(u16),
    /// A LEB128 number.
    Leb,
    /// A block with a 1, 2 or 4-byte length, or a LEB128 length.
    Block1,
    Block2,
    Block4,
    BlockLeb,
    /// A null-terminated string.
    CStr,
    /// `DW_FORM_indirect`: the form follows as a LEB128.
    Indirect,
    /// A form we do not know: stepping over it fails (as in gimli, an
    /// abbreviation may name one as long as no DIE uses it).
    Unknown,
}

/// How an attribute of `form` is stepped over, `None` for a form we do
/// not know (the walk stops there, as gimli's would).
fn form_op(form: gimli::DwForm, enc: gimli::Encoding) -> Option<Op> {
    let offset = enc.format.word_size() as u16;
    Some(match form {
        gimli::DW_FORM_addr => Op::Bytes(enc.address_size as u16),
        gimli::DW_FORM_flag_present | gimli::DW_FORM_implicit_const => Op::Bytes(0),
        gimli::DW_FORM_data1
        | gimli::DW_FORM_ref1
        | gimli::DW_FORM_flag
        | gimli::DW_FORM_strx1
        | gimli::DW_FORM_addrx1 => Op::Bytes(1),
        gimli::DW_FORM_data2
        | gimli::DW_FORM_ref2
        | gimli::DW_FORM_strx2
        | gimli::DW_FORM_addrx2 => Op::Bytes(2),
        gimli::DW_FORM_strx3 | gimli::DW_FORM_addrx3 => Op::Bytes(3),
        gimli::DW_FORM_data4
        | gimli::DW_FORM_ref4
        | gimli::DW_FORM_strx4
        | gimli::DW_FORM_addrx4
        | gimli::DW_FORM_ref_sup4 => Op::Bytes(4),
        gimli::DW_FORM_data8
        | gimli::DW_FORM_ref8
        | gimli::DW_FORM_ref_sig8
        | gimli::DW_FORM_ref_sup8 => Op::Bytes(8),
        gimli::DW_FORM_data16 => Op::Bytes(16),
        gimli::DW_FORM_strp
        | gimli::DW_FORM_line_strp
        | gimli::DW_FORM_sec_offset
        | gimli::DW_FORM_GNU_ref_alt
        | gimli::DW_FORM_GNU_strp_alt
        | gimli::DW_FORM_strp_sup => Op::Bytes(offset),
        gimli::DW_FORM_ref_addr => {
            if enc.version == 2 {
                Op::Bytes(enc.address_size as u16)
            } else {
                Op::Bytes(offset)
            }
        }
        gimli::DW_FORM_udata
        | gimli::DW_FORM_sdata
        | gimli::DW_FORM_ref_udata
        | gimli::DW_FORM_strx
        | gimli::DW_FORM_GNU_str_index
        | gimli::DW_FORM_addrx
        | gimli::DW_FORM_GNU_addr_index
        | gimli::DW_FORM_loclistx
        | gimli::DW_FORM_rnglistx => Op::Leb,
        gimli::DW_FORM_block1 => Op::Block1,
        gimli::DW_FORM_block2 => Op::Block2,
        gimli::DW_FORM_block4 => Op::Block4,
        gimli::DW_FORM_block | gimli::DW_FORM_exprloc => Op::BlockLeb,
        gimli::DW_FORM_string => Op::CStr,
        gimli::DW_FORM_indirect => Op::Indirect,
        _ => return None,
    })
}

/// `fixed` when every attribute has a fixed size.
const NOT_FIXED: u32 = u32::MAX;

/// One attribute of an abbreviation (8 bytes: a unit of a large Rust
/// crate has tens of thousands; `DW_FORM_implicit_const` values are kept
/// aside, in [`Abbrevs::implicits`]).
#[derive(Clone, Copy)]
pub(crate) struct Spec {
    pub(crate) name: gimli::DwAt,
    form: gimli::DwForm,
    op: Op,
}

/// One abbreviation: the DIE's tag, whether it has children, its
/// attributes and how to step over them.
pub(crate) struct Abbrev {
    pub(crate) tag: DwTag,
    pub(crate) children: bool,
    /// Whether it has `DW_AT_low_pc` or `DW_AT_ranges` (code addresses).
    pub(crate) has_pc: bool,
    /// Total size of the attributes, or [`NOT_FIXED`].
    fixed: u32,
    /// Its attributes: `Abbrevs::specs[specs.0..specs.1]`.
    specs: (u32, u32),
    /// Its skip plan when not fixed (fixed runs merged):
    /// `Abbrevs::plans[plan.0..plan.1]`.
    plan: (u32, u32),
    /// Where its entry is in `.debug_abbrev` (code to terminating pair).
    bytes: (usize, usize),
    /// Where its code-range attributes are, when it has a fixed size and
    /// they use the plain forms.
    fixed_pc: Option<FixedPc>,
}

/// Byte positions (from the first attribute) of the code-range
/// attributes of a fixed-size DIE: `DW_AT_low_pc` as `DW_FORM_addr`,
/// `DW_AT_high_pc` as an address or a constant, `DW_AT_ranges` as
/// `DW_FORM_sec_offset`. `ABSENT` where the DIE has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FixedPc {
    low: u16,
    high: u16,
    /// Size of the high pc value in bytes, and whether it is an address
    /// (else a size from the low pc).
    high_size: u8,
    high_addr: bool,
    ranges: u16,
}

const ABSENT: u16 = u16::MAX;

impl FixedPc {
    /// The layout of `specs`, if every attribute has a fixed size and the
    /// code-range ones appear at most once each, in a form read directly.
    fn of(specs: &[Spec]) -> Option<FixedPc> {
        let mut l = FixedPc {
            low: ABSENT,
            high: ABSENT,
            high_size: 0,
            high_addr: false,
            ranges: ABSENT,
        };
        let mut at: u32 = 0;
        for s in specs {
            let Op::Bytes(n) = s.op else { return None };
            let n = n as u32;
            let here = u16::try_from(at).ok().filter(|&h| h != ABSENT)?;
            match s.name {
                gimli::DW_AT_low_pc => {
                    if l.low != ABSENT || s.form != gimli::DW_FORM_addr {
                        return None;
                    }
                    l.low = here;
                }
                gimli::DW_AT_high_pc => {
                    if l.high != ABSENT {
                        return None;
                    }
                    l.high_addr = match s.form {
                        gimli::DW_FORM_addr => true,
                        gimli::DW_FORM_data1
                        | gimli::DW_FORM_data2
                        | gimli::DW_FORM_data4
                        | gimli::DW_FORM_data8 => false,
                        _ => return None,
                    };
                    l.high = here;
                    l.high_size = n as u8;
                }
                gimli::DW_AT_ranges => {
                    if l.ranges != ABSENT || s.form != gimli::DW_FORM_sec_offset {
                        return None;
                    }
                    l.ranges = here;
                }
                _ => {}
            }
            at += n;
        }
        Some(l)
    }
}

/// The code-range attributes of a DIE read by [`Cursor::fixed_pc`], as
/// gimli's `Attribute::value` would give them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawPc {
    pub(crate) low: Option<u64>,
    pub(crate) high: Option<u64>,
    pub(crate) size: Option<u64>,
    /// A `.debug_ranges`/`.debug_rnglists` offset (`RangeListsRef`).
    pub(crate) ranges: Option<usize>,
}

/// A unit's abbreviation table, indexed by code, with the attribute lists
/// and skip plans of all its entries in two flat arrays.
#[derive(Default)]
pub(crate) struct Abbrevs {
    /// `list[code - 1]` for the codes 1..=`dense` numbered in order (what
    /// compilers emit); the others through `sparse` (code, index).
    list: Vec<Abbrev>,
    dense: usize,
    sparse: Vec<(u64, u32)>,
    specs: Vec<Spec>,
    plans: Vec<Op>,
    /// (index in `specs`, value) of the `DW_FORM_implicit_const` ones.
    implicits: Vec<(u32, i64)>,
}

impl Abbrevs {
    /// Parses the table at `offset` of `.debug_abbrev`. `None` if it is
    /// malformed (truncated, tag 0, bad children flag, duplicate code).
    /// Parses the table at `offset` of `.debug_abbrev`. `None` if it is
    /// malformed (truncated, tag 0, bad children flag, duplicate code).
    #[inline(never)]
    pub(crate) fn parse(section: &[u8], offset: usize, enc: gimli::Encoding) -> Option<Abbrevs> {
        let mut r = Bytes {
            buf: section,
            pos: offset,
        };
        if offset > section.len() {
            return None;
        }
        let mut out = Abbrevs::default();
        while out.push_entry(&mut r, enc)?.is_some() {}
        // Tables are kept for the symbolizer's life: no spare capacity.
        out.list.shrink_to_fit();
        out.specs.shrink_to_fit();
        out.plans.shrink_to_fit();
        Some(out)
    }

    /// A table of the one entry at `entry` of `.debug_abbrev` (an offset
    /// from [`AbbrevIndex`]): enough to read a DIE of a unit that is not
    /// walked (a name through an abstract origin in another unit).
    pub(crate) fn parse_one(section: &[u8], entry: usize, enc: gimli::Encoding) -> Option<Abbrevs> {
        let mut r = Bytes {
            buf: section,
            pos: entry,
        };
        let mut out = Abbrevs::default();
        out.push_entry(&mut r, enc)??;
        Some(out)
    }

    /// Parses the entry at `r` and adds it: `Some(None)` at the table's
    /// end, `None` if malformed.
    fn push_entry(&mut self, r: &mut Bytes, enc: gimli::Encoding) -> Option<Option<()>> {
        let out = self;
        let at = r.pos;
        let code = r.uleb()?;
        if code == 0 {
            return Some(None);
        }
        let tag = r.uleb()?;
        if tag == 0 || tag > u16::MAX as u64 {
            return None;
        }
        let children = match r.u8()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let (specs0, plan0) = (out.specs.len() as u32, out.plans.len() as u32);
        let mut has_pc = false;
        loop {
            let name = r.uleb()?;
            let form = r.uleb()?;
            if name == 0 && form == 0 {
                break;
            }
            if name > u16::MAX as u64 || form > u16::MAX as u64 || form == 0 {
                return None;
            }
            let (name, form) = (gimli::DwAt(name as u16), gimli::DwForm(form as u16));
            if form == gimli::DW_FORM_implicit_const {
                out.implicits.push((out.specs.len() as u32, r.sleb()?));
            }
            has_pc |= matches!(name, gimli::DW_AT_low_pc | gimli::DW_AT_ranges);
            let op = form_op(form, enc).unwrap_or(Op::Unknown);
            out.specs.push(Spec { name, form, op });
            let own_last = out.plans.len() > plan0 as usize;
            match (op, out.plans.last_mut()) {
                (Op::Bytes(0), _) => {}
                (Op::Bytes(n), Some(Op::Bytes(m))) if own_last && m.checked_add(n).is_some() => {
                    *m += n
                }
                (op, _) => out.plans.push(op),
            }
        }
        let fixed = match out.plans[plan0 as usize..] {
            [] => 0,
            [Op::Bytes(n)] => n as u32,
            _ => NOT_FIXED,
        };
        if fixed != NOT_FIXED {
            out.plans.truncate(plan0 as usize);
        }
        let fixed_pc = if fixed != NOT_FIXED {
            FixedPc::of(&out.specs[specs0 as usize..])
        } else {
            None
        };
        let a = Abbrev {
            tag: DwTag(tag as u16),
            children,
            has_pc,
            fixed,
            specs: (specs0, out.specs.len() as u32),
            plan: (plan0, out.plans.len() as u32),
            bytes: (at, r.pos),
            fixed_pc,
        };
        if code == out.list.len() as u64 + 1 && out.sparse.is_empty() {
            out.list.push(a);
            out.dense = out.list.len();
        } else {
            if out.index(code).is_some() {
                return None;
            }
            out.sparse.push((code, out.list.len() as u32));
            out.list.push(a);
            out.sparse.sort_unstable_by_key(|x| x.0);
        }
        Some(Some(()))
    }

    #[inline]
    fn index(&self, code: u64) -> Option<usize> {
        let i = (code as usize).wrapping_sub(1);
        if i < self.dense {
            return Some(i);
        }
        self.sparse
            .binary_search_by_key(&code, |x| x.0)
            .ok()
            .map(|j| self.sparse[j].1 as usize)
    }

    #[inline]
    fn get(&self, code: u64) -> Option<&Abbrev> {
        self.list.get(self.index(code)?)
    }

    /// The attributes of `a`.
    #[inline]
    pub(crate) fn specs(&self, a: &Abbrev) -> &[Spec] {
        &self.specs[a.specs.0 as usize..a.specs.1 as usize]
    }

    /// The value of the `DW_FORM_implicit_const` attribute `specs[i]`.
    fn implicit(&self, i: usize) -> i64 {
        match self.implicits.binary_search_by_key(&(i as u32), |x| x.0) {
            Ok(j) => self.implicits[j].1,
            Err(_) => 0,
        }
    }

    /// gimli's specification of `specs[i]`.
    fn gimli_spec(&self, i: usize) -> AttributeSpecification {
        let s = &self.specs[i];
        let implicit = (s.form == gimli::DW_FORM_implicit_const).then(|| self.implicit(i));
        AttributeSpecification::new(s.name, s.form, implicit)
    }

    #[inline]
    fn plan(&self, a: &Abbrev) -> &[Op] {
        &self.plans[a.plan.0 as usize..a.plan.1 as usize]
    }

    /// gimli's abbreviation table holding only the entry of `code` (the
    /// root DIE's, for `gimli::Unit::new_with_abbreviations`): parsing
    /// the whole table a second time is a cost we skip.
    pub(crate) fn gimli_one(&self, section: &[u8], code: u64) -> Option<gimli::Abbreviations> {
        let a = self.get(code)?;
        let mut one = section.get(a.bytes.0..a.bytes.1)?.to_vec();
        one.push(0);
        gimli::DebugAbbrev::new(&one, gimli::LittleEndian)
            .abbreviations(gimli::DebugAbbrevOffset(0))
            .ok()
    }
}

/// Where each entry of a unit's abbreviation table starts, by code: a
/// scan that builds nothing per attribute, for the units only read for a
/// name or two (their full [`Abbrevs`] is built when a unit is walked).
/// It refuses what [`Abbrevs::parse`] refuses.
#[derive(Default)]
pub(crate) struct AbbrevIndex {
    /// `dense[code - 1]` while codes run 1, 2, 3...; then `sparse`.
    dense: Vec<usize>,
    sparse: Vec<(u64, usize)>,
}

impl AbbrevIndex {
    #[inline(never)]
    pub(crate) fn scan(section: &[u8], offset: usize) -> Option<AbbrevIndex> {
        let mut r = Bytes {
            buf: section,
            pos: offset,
        };
        if offset > section.len() {
            return None;
        }
        let mut out = AbbrevIndex::default();
        loop {
            let at = r.pos;
            let code = r.uleb()?;
            if code == 0 {
                break;
            }
            let tag = r.uleb()?;
            if tag == 0 || tag > u16::MAX as u64 || r.u8()? > 1 {
                return None;
            }
            loop {
                let name = r.uleb()?;
                let form = r.uleb()?;
                if name == 0 && form == 0 {
                    break;
                }
                if name > u16::MAX as u64 || form > u16::MAX as u64 || form == 0 {
                    return None;
                }
                if form == gimli::DW_FORM_implicit_const.0 as u64 {
                    r.sleb()?;
                }
            }
            if code == out.dense.len() as u64 + 1 && out.sparse.is_empty() {
                out.dense.push(at);
            } else {
                if out.get(code).is_some() {
                    return None;
                }
                out.sparse.push((code, at));
                out.sparse.sort_unstable_by_key(|x| x.0);
            }
        }
        out.dense.shrink_to_fit();
        Some(out)
    }

    /// Offset in `.debug_abbrev` of the entry of `code`.
    pub(crate) fn get(&self, code: u64) -> Option<usize> {
        match self.dense.get((code as usize).wrapping_sub(1)) {
            Some(&at) => Some(at),
            None => self
                .sparse
                .binary_search_by_key(&code, |x| x.0)
                .ok()
                .map(|i| self.sparse[i].1),
        }
    }
}

/// A bounds-checked byte reader (LEB128 as gimli reads it: the same
/// values, the same overflows refused).
pub(crate) struct Bytes<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
}

impl Bytes<'_> {
    #[inline]
    pub(crate) fn u8(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    #[inline(always)]
    pub(crate) fn uleb(&mut self) -> Option<u64> {
        let b = *self.buf.get(self.pos)?;
        if b < 0x80 {
            self.pos += 1;
            return Some(b as u64);
        }
        self.uleb_long()
    }

    #[inline(never)]
    fn uleb_long(&mut self) -> Option<u64> {
        let b = self.u8()?;
        let mut v = (b & 0x7f) as u64;
        let mut shift = 7;
        loop {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return None;
            }
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Some(v);
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
    }

    pub(crate) fn sleb(&mut self) -> Option<i64> {
        let mut v: i64 = 0;
        let mut shift = 0;
        loop {
            let b = self.u8()?;
            if shift == 63 && b != 0 && b != 0x7f {
                return None;
            }
            v |= ((b & 0x7f) as i64) << shift;
            shift += 7;
            if b < 0x80 {
                if shift < 64 && b & 0x40 != 0 {
                    v |= -1i64 << shift;
                }
                return Some(v);
            }
        }
    }

    #[inline]
    pub(crate) fn skip_leb(&mut self) -> Option<()> {
        let rest = self.buf.get(self.pos..)?;
        let n = rest.iter().position(|&b| b < 0x80)?;
        self.pos += n + 1;
        Some(())
    }

    #[inline]
    pub(crate) fn skip(&mut self, n: usize) -> Option<()> {
        let end = self.pos.checked_add(n)?;
        if end > self.buf.len() {
            return None;
        }
        self.pos = end;
        Some(())
    }

    #[inline]
    pub(crate) fn uint(&mut self, n: usize, big: bool) -> Option<u64> {
        let b = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        if !big {
            match n {
                1 => return Some(b[0] as u64),
                2 => return Some(u16::from_le_bytes([b[0], b[1]]) as u64),
                4 => return Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64),
                8 => return Some(u64::from_le_bytes(b.try_into().ok()?)),
                _ => {}
            }
        }
        let mut v = 0u64;
        if big {
            for &x in b {
                v = (v << 8) | x as u64;
            }
        } else {
            for &x in b.iter().rev() {
                v = (v << 8) | x as u64;
            }
        }
        Some(v)
    }
}

/// A cursor over the DIEs of one unit, from a given DIE on, tracking the
/// tree depth as gimli's `EntriesRaw` does: [`Cursor::depth`] is the
/// depth of the next DIE to be read.
pub(crate) struct Cursor<'a> {
    r: Bytes<'static>,
    /// Unit offset of `r.buf[0]`.
    base: usize,
    depth: isize,
    abbrevs: &'a Abbrevs,
    header: &'a gimli::UnitHeader<Slice>,
    enc: gimli::Encoding,
    big_endian: bool,
    endian: gimli::RunTimeEndian,
}

impl<'a> Cursor<'a> {
    /// A cursor at the DIE at unit offset `at` (depth 0).
    pub(crate) fn new(
        header: &'a gimli::UnitHeader<Slice>,
        abbrevs: &'a Abbrevs,
        at: UnitOffset,
    ) -> Option<Cursor<'a>> {
        let base = header.header_size();
        let entries = header.range_from(UnitOffset(base)..).ok()?;
        let pos = at.0.checked_sub(base)?;
        if pos > entries.len() {
            return None;
        }
        Some(Cursor {
            r: Bytes {
                buf: entries.slice(),
                pos,
            },
            base,
            depth: 0,
            abbrevs,
            header,
            enc: header.encoding(),
            big_endian: gimli::Endianity::is_big_endian(gimli::Reader::endian(&entries)),
            endian: gimli::Reader::endian(&entries),
        })
    }

    /// Unit offset of the next byte.
    #[inline]
    pub(crate) fn offset(&self) -> UnitOffset {
        UnitOffset(self.base + self.r.pos)
    }

    /// Depth of the next DIE (the first one is at 0).
    #[inline]
    pub(crate) fn depth(&self) -> isize {
        self.depth
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.r.pos >= self.r.buf.len()
    }

    /// Reads the next DIE's abbreviation code: `Some(None)` for a null
    /// DIE (the end of a list of children), `None` on bad input.
    #[inline]
    pub(crate) fn read_abbrev(&mut self) -> Option<Option<&'a Abbrev>> {
        let code = self.r.uleb()?;
        if code == 0 {
            self.depth -= 1;
            return Some(None);
        }
        let a = self.abbrevs.get(code)?;
        if a.children {
            self.depth += 1;
        }
        Some(Some(a))
    }

    /// Steps over the attributes of the DIE whose abbreviation was just read.
    #[inline]
    pub(crate) fn skip_attributes(&mut self, a: &Abbrev) -> Option<()> {
        if a.fixed != NOT_FIXED {
            return self.r.skip(a.fixed as usize);
        }
        for &op in self.abbrevs.plan(a) {
            // The common steps here, the rare ones out of line.
            match op {
                Op::Bytes(n) => self.r.skip(n as usize)?,
                Op::BlockLeb => {
                    let n = usize::try_from(self.r.uleb()?).ok()?;
                    self.r.skip(n)?
                }
                Op::Leb => self.r.skip_leb()?,
                _ => self.step(op)?,
            }
        }
        Some(())
    }

    #[inline(never)]
    fn step(&mut self, mut op: Op) -> Option<()> {
        loop {
            let big = self.big_endian;
            let n = match op {
                Op::Bytes(n) => n as usize,
                Op::Leb => return self.r.skip_leb(),
                Op::Block1 => self.r.uint(1, big)? as usize,
                Op::Block2 => self.r.uint(2, big)? as usize,
                Op::Block4 => self.r.uint(4, big)? as usize,
                Op::BlockLeb => usize::try_from(self.r.uleb()?).ok()?,
                Op::CStr => {
                    let rest = self.r.buf.get(self.r.pos..)?;
                    let n = rest.iter().position(|&b| b == 0)?;
                    n + 1
                }
                Op::Unknown => return None,
                Op::Indirect => {
                    let f = self.r.uleb()?;
                    op = form_op(gimli::DwForm(u16::try_from(f).ok()?), self.enc)?;
                    continue;
                }
            };
            return self.r.skip(n);
        }
    }

    /// For a DIE whose abbreviation has a [`FixedPc`] layout: its
    /// code-range attributes, read at their known places, and the cursor
    /// moved past its attributes. `Some(None)`, moving nothing, for other
    /// DIEs (read them with [`Cursor::attributes`]); `None` on bad input.
    #[inline]
    pub(crate) fn fixed_pc(&mut self, a: &Abbrev) -> Option<Option<RawPc>> {
        let Some(l) = a.fixed_pc else {
            return Some(None);
        };
        let start = self.r.pos;
        self.r.skip(a.fixed as usize)?;
        let big = self.big_endian;
        let block = Bytes {
            buf: &self.r.buf[start..self.r.pos],
            pos: 0,
        };
        let at = |pos: u16, n: usize| -> Option<u64> {
            if pos == ABSENT {
                return None;
            }
            Bytes {
                buf: block.buf,
                pos: pos as usize,
            }
            .uint(n, big)
        };
        let mut out = RawPc {
            low: at(l.low, self.enc.address_size as usize),
            ..RawPc::default()
        };
        let high = at(l.high, l.high_size as usize);
        if l.high_addr {
            out.high = high;
        } else {
            out.size = high;
        }
        out.ranges = at(l.ranges, self.enc.format.word_size() as usize)
            .and_then(|o| usize::try_from(o).ok());
        Some(Some(out))
    }

    /// Steps over the rest of the subtree of the DIE just read (at depth
    /// `depth`): its children, if any, and theirs.
    pub(crate) fn skip_subtree(&mut self, depth: isize) -> Option<()> {
        while self.depth > depth && !self.is_empty() {
            if let Some(a) = self.read_abbrev()? {
                self.skip_attributes(a)?;
            }
        }
        Some(())
    }

    /// Reads the attributes of the DIE whose abbreviation was just read
    /// and moves past them, calling `f` with the name and value of each
    /// attribute the symbolizer uses (see [`wanted`]), the value as gimli's
    /// `Attribute::value` gives it; the others are stepped over. The
    /// common forms are decoded here, the rare ones by gimli. `None` on bad
    /// input.
    pub(crate) fn attributes(
        &mut self,
        a: &Abbrev,
        f: impl FnMut(gimli::DwAt, AttributeValue<Slice>),
    ) -> Option<()> {
        self.attributes_of(a, wanted, f)
    }

    /// [`Cursor::attributes`] handing out the attributes `keep` names
    /// (those of call sites: [`call_site_attribute`]).
    pub(crate) fn attributes_of(
        &mut self,
        a: &Abbrev,
        keep: fn(gimli::DwAt) -> bool,
        mut f: impl FnMut(gimli::DwAt, AttributeValue<Slice>),
    ) -> Option<()> {
        let abbrevs = self.abbrevs;
        for (i, spec) in abbrevs.specs(a).iter().enumerate() {
            if !keep(spec.name) {
                self.step(spec.op)?;
                continue;
            }
            let i = a.specs.0 as usize + i;
            let v = match self.raw_value(spec, i)? {
                Some(v) => v,
                None => {
                    // A rare form: gimli reads it (and gives its meaning).
                    let empty = gimli::Abbreviations::default();
                    let mut e = self.header.entries_raw(&empty, Some(self.offset())).ok()?;
                    let attr = e.read_attribute(abbrevs.gimli_spec(i)).ok()?;
                    self.r.pos = e.next_offset().0.checked_sub(self.base)?;
                    f(spec.name, attr.value());
                    continue;
                }
            };
            f(spec.name, by_name(spec.name, v));
        }
        Some(())
    }

    /// The raw value of a common form (as gimli's attribute parser reads
    /// it); `Some(None)`, reading nothing, for a form left to gimli.
    #[inline]
    fn raw_value(&mut self, spec: &Spec, i: usize) -> Option<Option<AttributeValue<Slice>>> {
        use AttributeValue as V;
        let big = self.big_endian;
        let word = self.enc.format.word_size() as usize;
        let r = &mut self.r;
        Some(Some(match spec.form {
            gimli::DW_FORM_addr => V::Addr(r.uint(self.enc.address_size as usize, big)?),
            gimli::DW_FORM_addrx | gimli::DW_FORM_GNU_addr_index => {
                V::DebugAddrIndex(gimli::DebugAddrIndex(usize::try_from(r.uleb()?).ok()?))
            }
            gimli::DW_FORM_addrx1 => {
                V::DebugAddrIndex(gimli::DebugAddrIndex(r.uint(1, big)? as usize))
            }
            gimli::DW_FORM_addrx2 => {
                V::DebugAddrIndex(gimli::DebugAddrIndex(r.uint(2, big)? as usize))
            }
            gimli::DW_FORM_addrx4 => {
                V::DebugAddrIndex(gimli::DebugAddrIndex(r.uint(4, big)? as usize))
            }
            // data4/data8 may be section offsets for DW_AT_ranges: gimli's.
            gimli::DW_FORM_data1 => V::Data1(r.uint(1, big)? as u8),
            gimli::DW_FORM_data2 => V::Data2(r.uint(2, big)? as u16),
            gimli::DW_FORM_data4 if spec.name != gimli::DW_AT_ranges => {
                V::Data4(r.uint(4, big)? as u32)
            }
            gimli::DW_FORM_data8 if spec.name != gimli::DW_AT_ranges => V::Data8(r.uint(8, big)?),
            gimli::DW_FORM_udata => V::Udata(r.uleb()?),
            gimli::DW_FORM_sdata => V::Sdata(r.sleb()?),
            gimli::DW_FORM_implicit_const => V::Sdata(self.abbrevs.implicit(i)),
            gimli::DW_FORM_ref1 => V::UnitRef(UnitOffset(r.uint(1, big)? as usize)),
            gimli::DW_FORM_ref2 => V::UnitRef(UnitOffset(r.uint(2, big)? as usize)),
            gimli::DW_FORM_ref4 => V::UnitRef(UnitOffset(r.uint(4, big)? as usize)),
            gimli::DW_FORM_ref8 => V::UnitRef(UnitOffset(usize::try_from(r.uint(8, big)?).ok()?)),
            gimli::DW_FORM_ref_udata => V::UnitRef(UnitOffset(usize::try_from(r.uleb()?).ok()?)),
            gimli::DW_FORM_ref_addr => {
                let n = if self.enc.version == 2 {
                    self.enc.address_size as usize
                } else {
                    word
                };
                V::DebugInfoRef(gimli::DebugInfoOffset(
                    usize::try_from(r.uint(n, big)?).ok()?,
                ))
            }
            gimli::DW_FORM_sec_offset => V::SecOffset(usize::try_from(r.uint(word, big)?).ok()?),
            gimli::DW_FORM_strp => V::DebugStrRef(gimli::DebugStrOffset(
                usize::try_from(r.uint(word, big)?).ok()?,
            )),
            gimli::DW_FORM_line_strp => V::DebugLineStrRef(gimli::DebugLineStrOffset(
                usize::try_from(r.uint(word, big)?).ok()?,
            )),
            gimli::DW_FORM_strx | gimli::DW_FORM_GNU_str_index => V::DebugStrOffsetsIndex(
                gimli::DebugStrOffsetsIndex(usize::try_from(r.uleb()?).ok()?),
            ),
            gimli::DW_FORM_strx1 => {
                V::DebugStrOffsetsIndex(gimli::DebugStrOffsetsIndex(r.uint(1, big)? as usize))
            }
            gimli::DW_FORM_strx2 => {
                V::DebugStrOffsetsIndex(gimli::DebugStrOffsetsIndex(r.uint(2, big)? as usize))
            }
            gimli::DW_FORM_strx4 => {
                V::DebugStrOffsetsIndex(gimli::DebugStrOffsetsIndex(r.uint(4, big)? as usize))
            }
            gimli::DW_FORM_string => {
                let rest = r.buf.get(r.pos..)?;
                let n = rest.iter().position(|&b| b == 0)?;
                r.pos += n + 1;
                V::String(gimli::EndianSlice::new(&rest[..n], self.endian))
            }
            gimli::DW_FORM_rnglistx => {
                V::DebugRngListsIndex(gimli::DebugRngListsIndex(usize::try_from(r.uleb()?).ok()?))
            }
            gimli::DW_FORM_flag => V::Flag(r.uint(1, big)? != 0),
            gimli::DW_FORM_flag_present => V::Flag(true),
            _ => return Some(None),
        }))
    }
}

/// The attributes [`Cursor::attributes`] hands out: those the symbolizer
/// reads (code ranges, names, origins, call sites).
#[inline]
pub(crate) fn wanted(name: gimli::DwAt) -> bool {
    matches!(
        name,
        gimli::DW_AT_low_pc
            | gimli::DW_AT_high_pc
            | gimli::DW_AT_ranges
            | gimli::DW_AT_name
            | gimli::DW_AT_linkage_name
            | gimli::DW_AT_MIPS_linkage_name
            | gimli::DW_AT_abstract_origin
            | gimli::DW_AT_specification
            | gimli::DW_AT_call_file
            | gimli::DW_AT_call_line
            | gimli::DW_AT_call_column
    )
}

/// The attributes of call-site DIEs (`DW_TAG_call_site`, GNU's
/// `DW_TAG_GNU_call_site`) and of the functions they call, which the
/// tail-call search reads (`tailcall.rs`).
#[inline]
pub(crate) fn call_site_attribute(name: gimli::DwAt) -> bool {
    matches!(
        name,
        gimli::DW_AT_low_pc
            | gimli::DW_AT_high_pc
            | gimli::DW_AT_ranges
            | gimli::DW_AT_call_return_pc
            | gimli::DW_AT_call_tail_call
            | gimli::DW_AT_GNU_tail_call
            | gimli::DW_AT_call_origin
            | gimli::DW_AT_abstract_origin
            | gimli::DW_AT_call_target
            | gimli::DW_AT_GNU_call_site_target
            | gimli::DW_AT_declaration
    )
}

/// What gimli's `Attribute::value` makes of a raw value, for the
/// [`wanted`] attributes: sizes and call sites are unsigned constants, a
/// call file is a file index, a range-list offset is typed.
#[inline]
fn by_name(name: gimli::DwAt, v: AttributeValue<Slice>) -> AttributeValue<Slice> {
    use AttributeValue as V;
    match name {
        gimli::DW_AT_high_pc => match v {
            V::Addr(_) | V::DebugAddrIndex(_) => v,
            _ => v.udata_value().map(V::Udata).unwrap_or(v),
        },
        gimli::DW_AT_call_line | gimli::DW_AT_call_column => {
            v.udata_value().map(V::Udata).unwrap_or(v)
        }
        gimli::DW_AT_call_file => v.udata_value().map(V::FileIndex).unwrap_or(v),
        gimli::DW_AT_ranges => match v {
            V::SecOffset(o) => V::RangeListsRef(gimli::RawRangeListsOffset(o)),
            _ => v,
        },
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc() -> gimli::Encoding {
        gimli::Encoding {
            format: gimli::Format::Dwarf32,
            version: 4,
            address_size: 8,
        }
    }

    #[test]
    fn plans_merge_fixed_runs() {
        // code 1: subprogram, children, low_pc addr, high_pc data4, name strp
        // code 2: variable, no children, name string, location exprloc
        // code 3 (sparse: after a gap): base_type, implicit_const
        let t = [
            1, 0x2e, 1, 0x11, 0x01, 0x12, 0x06, 0x03, 0x0e, 0, 0, //
            2, 0x34, 0, 0x03, 0x08, 0x02, 0x18, 0, 0, //
            7, 0x24, 0, 0x0b, 0x21, 0x7f, 0, 0, //
            0,
        ];
        let a = Abbrevs::parse(&t, 0, enc()).unwrap();
        let s = a.get(1).unwrap();
        assert_eq!(
            (s.tag, s.children, s.has_pc, s.fixed),
            (gimli::DW_TAG_subprogram, true, true, 16)
        );
        let v = a.get(2).unwrap();
        assert_eq!(v.fixed, NOT_FIXED);
        assert_eq!(a.plan(v), &[Op::CStr, Op::BlockLeb]);
        let b = a.get(7).unwrap();
        assert_eq!((b.fixed, a.implicit(b.specs.0 as usize)), (0, -1));
        assert!(a.get(3).is_none() && a.get(0).is_none());
        // The index finds each entry where the full parse did, and one
        // entry parsed alone is the same entry.
        let index = AbbrevIndex::scan(&t, 0).unwrap();
        for code in [1, 2, 7] {
            let at = index.get(code).unwrap();
            assert_eq!(at, a.get(code).unwrap().bytes.0);
            let one = Abbrevs::parse_one(&t, at, enc()).unwrap();
            let (x, y) = (one.get(code).unwrap(), a.get(code).unwrap());
            assert_eq!((x.tag, x.fixed, x.bytes), (y.tag, y.fixed, y.bytes));
        }
        assert!(index.get(3).is_none() && index.get(0).is_none());
    }

    #[test]
    fn bad_tables_are_refused() {
        // An unknown form is refused only when a DIE uses it.
        let a = Abbrevs::parse(&[1, 0x2e, 0, 0x03, 0x7e, 0, 0, 0], 0, enc()).unwrap();
        assert_eq!(a.plan(a.get(1).unwrap()), &[Op::Unknown]);
        // Tag 0, bad children flag, truncated, duplicate code.
        for t in [
            &[1u8, 0, 0, 0, 0, 0][..],
            &[1, 0x2e, 2, 0, 0, 0],
            &[1, 0x2e, 0, 0x03],
            &[2, 0x2e, 0, 0, 0, 2, 0x2e, 0, 0, 0, 0],
        ] {
            assert!(Abbrevs::parse(t, 0, enc()).is_none(), "{t:?}");
            assert!(AbbrevIndex::scan(t, 0).is_none(), "{t:?}");
        }
        assert!(Abbrevs::parse(&[0], 5, enc()).is_none());
    }

    fn uleb(out: &mut Vec<u8>, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    /// Every form the symbolizer meets, read by our cursor and by gimli:
    /// the same values for the wanted attributes, the same end offsets,
    /// the same depths, whether attributes are read or stepped over.
    #[test]
    fn cursor_reads_what_gimli_reads() {
        use gimli::constants::*;
        type Entry = (u64, DwTag, bool, Vec<(DwAt, DwForm, i64)>);
        let abbrevs: Vec<Entry> = vec![
            (
                1,
                DW_TAG_compile_unit,
                true,
                vec![
                    (DW_AT_name, DW_FORM_string, 0),
                    (DW_AT_low_pc, DW_FORM_addr, 0),
                    (DW_AT_high_pc, DW_FORM_data4, 0),
                ],
            ),
            (
                2,
                DW_TAG_subprogram,
                true,
                vec![
                    (DW_AT_low_pc, DW_FORM_addrx1, 0),
                    (DW_AT_high_pc, DW_FORM_udata, 0),
                    (DW_AT_name, DW_FORM_strx1, 0),
                    (DW_AT_linkage_name, DW_FORM_strp, 0),
                    (DW_AT_specification, DW_FORM_ref_addr, 0),
                    (DW_AT_ranges, DW_FORM_sec_offset, 0),
                    (DW_AT_location, DW_FORM_exprloc, 0),
                    (DW_AT_producer, DW_FORM_string, 0),
                    (DW_AT_external, DW_FORM_flag_present, 0),
                    (DW_AT_const_value, DW_FORM_block1, 0),
                    (DW_AT_frame_base, DW_FORM_indirect, 0),
                ],
            ),
            (
                3,
                DW_TAG_inlined_subroutine,
                false,
                vec![
                    (DW_AT_abstract_origin, DW_FORM_ref4, 0),
                    (DW_AT_call_file, DW_FORM_data1, 0),
                    (DW_AT_call_line, DW_FORM_data2, 0),
                    (DW_AT_call_column, DW_FORM_implicit_const, 7),
                    (DW_AT_ranges, DW_FORM_rnglistx, 0),
                    (DW_AT_high_pc, DW_FORM_sdata, 0),
                    (DW_AT_low_pc, DW_FORM_addrx3, 0),
                    (DW_AT_name, DW_FORM_indirect, 0),
                ],
            ),
            (
                9,
                DW_TAG_inlined_subroutine,
                false,
                vec![
                    (DW_AT_ranges, DW_FORM_data8, 0),
                    (DW_AT_call_line, DW_FORM_udata, 0),
                    (DW_AT_call_file, DW_FORM_sdata, 0),
                    (DW_AT_high_pc, DW_FORM_addr, 0),
                    (DW_AT_name, DW_FORM_strx4, 0),
                    (DW_AT_specification, DW_FORM_ref_udata, 0),
                    (DW_AT_abstract_origin, DW_FORM_ref8, 0),
                    (DW_AT_call_column, DW_FORM_data4, 0),
                ],
            ),
        ];
        let mut table = Vec::new();
        for (code, tag, children, attrs) in &abbrevs {
            uleb(&mut table, *code);
            uleb(&mut table, tag.0 as u64);
            table.push(*children as u8);
            for (n, f, c) in attrs {
                uleb(&mut table, n.0 as u64);
                uleb(&mut table, f.0 as u64);
                if *f == DW_FORM_implicit_const {
                    table.push((*c as u8) & 0x7f);
                }
            }
            table.extend([0, 0]);
        }
        table.push(0);
        let mut dies = vec![1u8];
        dies.extend(b"cu\0");
        dies.extend(0x1000u64.to_le_bytes());
        dies.extend(0x100u32.to_le_bytes());
        dies.extend([2, 3, 0xac, 0x02, 5]);
        dies.extend(0x10u32.to_le_bytes());
        dies.extend(0x20u32.to_le_bytes());
        dies.extend(0x30u32.to_le_bytes());
        dies.extend([2, 0x91, 0x00, b'p', 0, 1, 0xff, 0x0b, 9]);
        dies.push(3);
        dies.extend(0x2au32.to_le_bytes());
        dies.extend([2, 0x34, 0x12, 4, 0x7d, 1, 0, 0, 0x1a, 9]);
        dies.push(9);
        dies.extend(0x55u64.to_le_bytes());
        dies.extend([0x81, 0x01, 0x7f]);
        dies.extend(0x2000u64.to_le_bytes());
        dies.extend(6u32.to_le_bytes());
        dies.push(0x40);
        dies.extend(0x18u64.to_le_bytes());
        dies.extend(5u32.to_le_bytes());
        dies.extend([0, 0]);
        // DWARF 5 compile unit header: length, version, type, address size,
        // abbreviation offset.
        let mut info = Vec::new();
        info.extend(((dies.len() + 8) as u32).to_le_bytes());
        info.extend(5u16.to_le_bytes());
        info.extend([1, 8]);
        info.extend(0u32.to_le_bytes());
        info.extend(&dies);
        let info: &'static [u8] = Box::leak(info.into_boxed_slice());
        let header = gimli::DebugInfo::new(info, gimli::RunTimeEndian::Little)
            .units()
            .next()
            .unwrap()
            .unwrap();
        let theirs = gimli::DebugAbbrev::new(&table, gimli::LittleEndian)
            .abbreviations(gimli::DebugAbbrevOffset(0))
            .unwrap();
        let ours = Abbrevs::parse(&table, 0, header.encoding()).unwrap();
        for read in [true, false] {
            let mut g = header.entries_raw(&theirs, None).unwrap();
            let mut c = Cursor::new(&header, &ours, header.root_offset()).unwrap();
            let mut dies = 0;
            while !g.is_empty() {
                assert_eq!(g.next_offset(), c.offset());
                let ga = g.read_abbreviation().unwrap();
                let ca = c.read_abbrev().unwrap();
                assert_eq!(g.next_depth(), c.depth());
                let (Some(ga), Some(ca)) = (ga, ca) else {
                    assert!(ga.is_none() && ca.is_none());
                    continue;
                };
                dies += 1;
                assert_eq!((ga.tag(), ga.has_children()), (ca.tag, ca.children));
                let mut want = Vec::new();
                for spec in ga.attributes() {
                    let a = g.read_attribute(*spec).unwrap();
                    if wanted(a.name()) {
                        want.push((a.name(), a.value()));
                    }
                }
                if read {
                    let mut got = Vec::new();
                    c.attributes(ca, |n, v| got.push((n, v))).unwrap();
                    assert_eq!(got, want);
                } else {
                    c.skip_attributes(ca).unwrap();
                }
                assert_eq!(g.next_offset(), c.offset());
            }
            assert!(c.is_empty());
            assert_eq!(dies, 4);
        }
    }
}
