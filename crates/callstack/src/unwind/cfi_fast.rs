//! The cold capture's CFI interpreter: the row of one address, read straight
//! from an `.eh_frame` FDE and its CIE, for the forms compilers write.
//!
//! Our own (not gimli's) because it is the inner loop of the first capture
//! in a process, where every frame is evaluated from the CFI: gimli's
//! general parser and `UnwindContext` (rows of 12 rules copied at each
//! step, the CIE parsed again per frame) cost about four times as many
//! instructions. It handles `.eh_frame` with 32-bit lengths, CIE versions 1
//! and 3, augmentations `z`, `R`, `P`, `L`, `S`, pointers `absptr`/`pcrel`
//! of fixed size, and every register-rule instruction but the DWARF
//! expression ones. Anything else gives [`Fast::Unsupported`], and the
//! caller asks gimli, so the result is always gimli's row. The two are
//! compared on every FDE of the loaded modules by a test.
//!
//! Allocates nothing; reads only inside the given slice.

use crate::unwind::cfi::{CfaView, RowView, RuleView};

/// What the fast interpreter found for an address.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Fast {
    /// The row of the address.
    Row(FastRow),
    /// The FDE is a signal trampoline's (`S` augmentation).
    Signal,
    /// The FDE at the offset does not cover the address.
    NotCovered,
    /// A form this interpreter does not handle (or bad CFI): ask gimli.
    Unsupported,
}

/// Rules tracked per row: as many as gimli's stack storage holds.
const MAX_RULES: usize = 12;
/// `DW_CFA_remember_state` depth (gimli's storage: 2 with the initial row).
const MAX_STACK: usize = 2;

/// A register rule, compact (8 bytes: rows are copied at
/// `remember_state`, and the cold capture's stack depth matters: each new
/// stack page is a page fault). Offsets beyond `i32` are declined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    Undefined,
    SameValue,
    Offset(i32),
    ValOffset(i32),
    Register(u16),
}

impl Rule {
    fn view(self) -> RuleView<'static> {
        match self {
            Rule::Undefined => RuleView::Undefined,
            Rule::SameValue => RuleView::SameValue,
            Rule::Offset(o) => RuleView::Offset(o as i64),
            Rule::ValOffset(o) => RuleView::ValOffset(o as i64),
            Rule::Register(r) => RuleView::Register(r),
        }
    }
}

/// 128 bytes: copied inline rather than through `memcpy` (the cold
/// capture copies rows a few times a frame). CFA offsets beyond `i32` are
/// declined, like rule offsets.
#[derive(Clone, Copy, Debug)]
struct Row {
    cfa_reg: u16,
    n: u16,
    cfa_off: i32,
    regs: [u16; MAX_RULES],
    rules: [Rule; MAX_RULES],
}

const _: () = assert!(core::mem::size_of::<Row>() <= 128);

impl Row {
    const EMPTY: Row = Row {
        cfa_reg: 0,
        n: 0,
        cfa_off: 0,
        regs: [0; MAX_RULES],
        rules: [Rule::Undefined; MAX_RULES],
    };

    #[inline]
    fn set(&mut self, reg: u16, rule: Rule) -> Option<()> {
        let n = self.n as usize;
        if let Some(i) = self.regs[..n].iter().position(|&r| r == reg) {
            self.rules[i] = rule;
            return Some(());
        }
        if n == MAX_RULES {
            return None;
        }
        self.regs[n] = reg;
        self.rules[n] = rule;
        self.n += 1;
        Some(())
    }

    #[inline]
    fn get(&self, reg: u16) -> Option<Rule> {
        let n = self.n as usize;
        self.regs[..n]
            .iter()
            .position(|&r| r == reg)
            .map(|i| self.rules[i])
    }

    #[inline]
    fn clear(&mut self, reg: u16) {
        let n = self.n as usize;
        if let Some(i) = self.regs[..n].iter().position(|&r| r == reg) {
            self.regs.copy_within(i + 1..n, i);
            self.rules.copy_within(i + 1..n, i);
            self.n -= 1;
        }
    }
}

/// A bounded little-endian reader over a slice.
struct Rd<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Rd<'a> {
    #[inline]
    fn u8(&mut self) -> Option<u8> {
        let v = *self.b.get(self.pos)?;
        self.pos += 1;
        Some(v)
    }
    #[inline]
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let v: [u8; N] = self
            .b
            .get(self.pos..self.pos.checked_add(N)?)?
            .try_into()
            .ok()?;
        self.pos += N;
        Some(v)
    }
    #[inline]
    fn u16(&mut self) -> Option<u16> {
        self.bytes::<2>().map(u16::from_le_bytes)
    }
    #[inline]
    fn u32(&mut self) -> Option<u32> {
        self.bytes::<4>().map(u32::from_le_bytes)
    }
    #[inline]
    fn u64(&mut self) -> Option<u64> {
        self.bytes::<8>().map(u64::from_le_bytes)
    }
    /// One byte (almost every operand of CFI) inline, longer ones out of line.
    #[inline(always)]
    fn uleb(&mut self) -> Option<u64> {
        match self.b.get(self.pos) {
            Some(&b) if b < 0x80 => {
                self.pos += 1;
                Some(b as u64)
            }
            _ => self.uleb_long(),
        }
    }
    // Cold, so never inlined; `#[inline]` so that it is compiled next to
    // its callers (in the cold capture's section), not in another unit.
    #[inline]
    #[cold]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn uleb_long(&mut self) -> Option<u64> {
        let mut v = 0u64;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            if shift >= 64 {
                return None;
            }
            v |= ((b & 0x7f) as u64) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
    }
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn sleb(&mut self) -> Option<i64> {
        let mut v = 0i64;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            if shift >= 64 {
                return None;
            }
            v |= ((b & 0x7f) as i64) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    v |= -1i64 << shift;
                }
                return Some(v);
            }
        }
    }
    #[inline]
    fn reg(&mut self) -> Option<u16> {
        u16::try_from(self.uleb()?).ok()
    }

    /// A pointer encoded `enc` (`absptr` or `pcrel`, fixed sizes only);
    /// `field` is the address of the byte at `pos`. `value_only` skips the
    /// application (for `pc_range`).
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn ptr(&mut self, enc: u8, field: u64, value_only: bool) -> Option<u64> {
        let v = match enc & 0x0f {
            0x00 | 0x04 => self.u64()?,
            0x02 => self.u16()? as u64,
            0x03 => self.u32()? as u64,
            0x0a => self.u16()? as i16 as i64 as u64,
            0x0b => self.u32()? as i32 as i64 as u64,
            0x0c => self.u64()?,
            _ => return None,
        };
        if value_only {
            return Some(v);
        }
        match enc & 0x70 {
            0x00 => Some(v),
            0x10 => Some(field.wrapping_add(v)),
            _ => None,
        }
    }
}

/// The CIE facts the FDE needs.
#[derive(Clone, Copy)]
struct Cie<'a> {
    code_align: u64,
    data_align: i64,
    ra: u16,
    fde_enc: u8,
    has_z: bool,
    signal: bool,
    insns: &'a [u8],
}

#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn parse_cie(eh: &[u8], off: usize) -> Option<Cie<'_>> {
    let mut r = Rd { b: eh, pos: off };
    let len = r.u32()?;
    if len == 0 || len == 0xffff_ffff {
        return None;
    }
    let end = off.checked_add(4)?.checked_add(len as usize)?;
    if end > eh.len() || r.u32()? != 0 {
        return None;
    }
    let version = r.u8()?;
    if version != 1 && version != 3 {
        return None;
    }
    let aug_start = r.pos;
    let aug_len = eh.get(aug_start..end)?.iter().position(|&c| c == 0)?;
    let aug = &eh[aug_start..aug_start + aug_len];
    r.pos = aug_start + aug_len + 1;
    let code_align = r.uleb()?;
    let data_align = r.sleb()?;
    let ra = if version == 1 {
        r.u8()? as u16
    } else {
        r.reg()?
    };
    let mut cie = Cie {
        code_align,
        data_align,
        ra,
        fde_enc: 0,
        has_z: false,
        signal: false,
        insns: &[],
    };
    if let Some((&b'z', rest)) = aug.split_first() {
        cie.has_z = true;
        let data_len = r.uleb()? as usize;
        let data_end = r.pos.checked_add(data_len)?;
        if data_end > end {
            return None;
        }
        for &c in rest {
            match c {
                b'R' => cie.fde_enc = r.u8()?,
                b'L' => {
                    r.u8()?;
                }
                b'P' => {
                    let enc = r.u8()?;
                    // Aligned pointers are not used by GNU tools.
                    if enc & 0x70 == 0x50 {
                        return None;
                    }
                    r.ptr(enc, 0, true)?;
                }
                b'S' => cie.signal = true,
                _ => return None,
            }
        }
        // The fields must lie inside the augmentation data (gimli rejects
        // a CIE whose 'R' byte, say, lies past it).
        if r.pos > data_end {
            return None;
        }
        r.pos = data_end;
    } else if !aug.is_empty() {
        return None;
    }
    cie.insns = eh.get(r.pos..end)?;
    Some(cie)
}

/// The last CIE a walk parsed, with the row its initial instructions give:
/// consecutive frames mostly share their module's one or two CIEs, and a
/// cold capture would otherwise parse the CIE and run its instructions again
/// for every frame. Kept by the caller (on its stack, per walk: no shared
/// state, no page of its own to fault in).
///
/// Three cells, so that a hit compares the key and copies the row once.
#[derive(Default)]
pub(crate) struct CieMemo {
    /// `.eh_frame` address and CIE offset; `(0, 0)`: empty.
    key: core::cell::Cell<(u64, usize)>,
    cie: core::cell::Cell<Option<Cie<'static>>>,
    initial: core::cell::Cell<Row>,
}

impl Default for Row {
    fn default() -> Row {
        Row::EMPTY
    }
}

/// A walk's [`CieMemo`].
pub(crate) type CieCache = CieMemo;

/// The row for `addr` from the FDE at offset `off` of `eh` (an `.eh_frame`
/// mapped at `eh_addr`).
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) fn row_for(eh: &[u8], eh_addr: u64, off: usize, addr: u64) -> Fast {
    match row_inner(eh, eh_addr, off, addr, None) {
        Some(f) => f,
        None => Fast::Unsupported,
    }
}

/// [`row_for`], reusing (and updating) the walk's last CIE (keyed by the
/// `.eh_frame`'s address and the CIE's offset).
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) fn row_for_cached(
    eh: &[u8],
    eh_addr: u64,
    off: usize,
    addr: u64,
    memo: &CieCache,
) -> Fast {
    match row_inner(eh, eh_addr, off, addr, Some(memo)) {
        Some(f) => f,
        None => Fast::Unsupported,
    }
}

/// The CIE at `cie_off` and its initial row, from `memo` when it holds that
/// CIE, else parsed and run (and kept in `memo` when there is one).
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn cie_and_initial<'a>(
    eh: &'a [u8],
    eh_addr: u64,
    cie_off: usize,
    memo: Option<&CieCache>,
) -> Option<(Cie<'a>, Row)> {
    if let Some(m) = memo {
        if m.key.get() == (eh_addr, cie_off) {
            if let Some(cie) = m.cie.get() {
                return Some((cie, m.initial.get()));
            }
        }
    }
    let cie = parse_cie(eh, cie_off)?;
    let mut row = Row::EMPTY;
    let mut stack = [Row::EMPTY; MAX_STACK];
    // The CIE's initial instructions: no location advances expected.
    run(&cie, cie.insns, None, &mut row, &mut stack, u64::MAX, 0)?;
    if let Some(m) = memo {
        m.key.set((eh_addr, cie_off));
        m.cie.set(Some(without_insns(cie)));
        m.initial.set(row);
    }
    Some((cie, row))
}

/// The CIE's facts with its instructions dropped (the memo keeps the row
/// they give instead), which makes it `'static`.
#[inline(always)]
fn without_insns(c: Cie<'_>) -> Cie<'static> {
    Cie {
        code_align: c.code_align,
        data_align: c.data_align,
        ra: c.ra,
        fde_enc: c.fde_enc,
        has_z: c.has_z,
        signal: c.signal,
        insns: &[],
    }
}

#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn row_inner(
    eh: &[u8],
    eh_addr: u64,
    off: usize,
    addr: u64,
    memo: Option<&CieCache>,
) -> Option<Fast> {
    let mut r = Rd { b: eh, pos: off };
    let len = r.u32()?;
    if len == 0 || len == 0xffff_ffff {
        return None;
    }
    let end = off.checked_add(4)?.checked_add(len as usize)?;
    if end > eh.len() {
        return None;
    }
    let cie_ptr = r.u32()? as usize;
    let cie_off = (off + 4).checked_sub(cie_ptr)?;
    if cie_ptr == 0 {
        return None; // a CIE, not an FDE
    }
    let (cie, initial) = cie_and_initial(eh, eh_addr, cie_off, memo)?;
    let field = eh_addr.wrapping_add(r.pos as u64);
    let begin = r.ptr(cie.fde_enc, field, false)?;
    let range = r.ptr(cie.fde_enc, 0, true)?;
    // A range wrapping past the top of the address space is corrupt (gimli
    // rejects the FDE): decline, as gimli would.
    begin.checked_add(range)?;
    if addr < begin || addr - begin >= range {
        return Some(Fast::NotCovered);
    }
    if cie.signal {
        return Some(Fast::Signal);
    }
    if cie.has_z {
        let n = r.uleb()? as usize;
        r.pos = r.pos.checked_add(n)?;
    }
    let insns = eh.get(r.pos..end)?;

    let mut row = initial;
    let mut stack = [Row::EMPTY; MAX_STACK];
    run(
        &cie,
        insns,
        Some(&initial),
        &mut row,
        &mut stack,
        addr,
        begin,
    )?;
    Some(Fast::Row(FastRow { row, ra: cie.ra }))
}

/// A row found by [`row_for`]: small, so that the caller builds the
/// [`RowView`] only in the frame that applies it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastRow {
    row: Row,
    ra: u16,
}

impl FastRow {
    /// The row as the unwinder's view.
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    pub(crate) fn view(&self) -> RowView<'static> {
        let row = &self.row;
        RowView::from_fn(
            CfaView::RegOffset(row.cfa_reg, row.cfa_off as i64),
            self.ra,
            row.n as usize,
            |i| (row.regs[i], row.rules[i].view()),
        )
    }
}

/// Runs `insns` from location `loc` until the row that covers `addr`.
/// `initial` is the CIE's row (None while running the CIE itself).
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn run(
    cie: &Cie<'_>,
    insns: &[u8],
    initial: Option<&Row>,
    row: &mut Row,
    stack: &mut [Row; MAX_STACK],
    addr: u64,
    mut loc: u64,
) -> Option<()> {
    let mut r = Rd { b: insns, pos: 0 };
    let mut depth = 0;
    let daf = cie.data_align;
    // Advancing past `addr` ends the row: `true` means stop.
    let advance = |delta: u64, loc: &mut u64| -> Option<bool> {
        let d = delta.checked_mul(cie.code_align)?;
        let next = loc.checked_add(d)?;
        if next > addr {
            return Some(true);
        }
        *loc = next;
        Some(false)
    };
    while r.pos < insns.len() {
        let op = r.u8()?;
        match op >> 6 {
            1 => {
                if advance((op & 0x3f) as u64, &mut loc)? {
                    break;
                }
                continue;
            }
            2 => {
                let off = (r.uleb()? as i64).checked_mul(daf)?;
                row.set((op & 0x3f) as u16, Rule::Offset(i32::try_from(off).ok()?))?;
                continue;
            }
            3 => {
                restore(row, initial?, (op & 0x3f) as u16)?;
                continue;
            }
            _ => {}
        }
        match op {
            0x00 => {}
            0x02 => {
                let d = r.u8()? as u64;
                if advance(d, &mut loc)? {
                    break;
                }
            }
            0x03 => {
                let d = r.u16()? as u64;
                if advance(d, &mut loc)? {
                    break;
                }
            }
            0x04 => {
                let d = r.u32()? as u64;
                if advance(d, &mut loc)? {
                    break;
                }
            }
            0x05 => {
                let reg = r.reg()?;
                let off = (r.uleb()? as i64).checked_mul(daf)?;
                row.set(reg, Rule::Offset(i32::try_from(off).ok()?))?;
            }
            0x06 => {
                let reg = r.reg()?;
                restore(row, initial?, reg)?;
            }
            0x07 => {
                let reg = r.reg()?;
                row.set(reg, Rule::Undefined)?;
            }
            0x08 => {
                let reg = r.reg()?;
                row.set(reg, Rule::SameValue)?;
            }
            0x09 => {
                let reg = r.reg()?;
                let from = r.reg()?;
                row.set(reg, Rule::Register(from))?;
            }
            0x0a => {
                // In a CIE's initial instructions (never emitted by
                // compilers) gimli keeps the remembered row under the
                // initial rules, a stack shape this interpreter does not
                // model: decline.
                if depth == MAX_STACK || initial.is_none() {
                    return None;
                }
                stack[depth] = *row;
                depth += 1;
            }
            0x0b => {
                if depth == 0 {
                    return None;
                }
                depth -= 1;
                *row = stack[depth];
            }
            0x0c => {
                row.cfa_reg = r.reg()?;
                row.cfa_off = i32::try_from(r.uleb()?).ok()?;
            }
            0x0d => row.cfa_reg = r.reg()?,
            0x0e => row.cfa_off = i32::try_from(r.uleb()?).ok()?,
            0x11 => {
                let reg = r.reg()?;
                let off = r.sleb()?.checked_mul(daf)?;
                row.set(reg, Rule::Offset(i32::try_from(off).ok()?))?;
            }
            0x12 => {
                row.cfa_reg = r.reg()?;
                row.cfa_off = i32::try_from(r.sleb()?.checked_mul(daf)?).ok()?;
            }
            0x13 => row.cfa_off = i32::try_from(r.sleb()?.checked_mul(daf)?).ok()?,
            0x14 => {
                let reg = r.reg()?;
                let off = (r.uleb()? as i64).checked_mul(daf)?;
                row.set(reg, Rule::ValOffset(i32::try_from(off).ok()?))?;
            }
            0x15 => {
                let reg = r.reg()?;
                let off = r.sleb()?.checked_mul(daf)?;
                row.set(reg, Rule::ValOffset(i32::try_from(off).ok()?))?;
            }
            0x2e => {
                r.uleb()?;
            }
            // set_loc, expressions, vendor extensions: gimli's job. (That
            // includes 0x2f, DW_CFA_GNU_negative_offset_extended, which gimli
            // rejects: declining keeps the two in agreement.)
            _ => return None,
        }
    }
    Some(())
}

#[inline]
fn restore(row: &mut Row, initial: &Row, reg: u16) -> Option<()> {
    match initial.get(reg) {
        Some(rule) => row.set(reg, rule),
        None => {
            row.clear(reg);
            Some(())
        }
    }
}

/// gimli's row for `addr` from the FDE at `off` of `eh`: the reference the
/// fast interpreter must agree with (its test and the `cfi_eval` fuzz target).
fn gimli_row(eh: &[u8], eh_addr: u64, off: usize, addr: u64) -> Option<RowView<'_>> {
    use crate::unwind::cfi::StackStorage;
    use gimli::{EhFrame, LittleEndian, UnwindContext, UnwindSection};
    let bases = gimli::BaseAddresses::default().set_eh_frame(eh_addr);
    let sec = EhFrame::new(eh, LittleEndian);
    let fde = sec
        .fde_from_offset(&bases, off.into(), EhFrame::cie_from_offset)
        .ok()?;
    // As `cfi::evaluate_gimli`: gimli's rows can run past the FDE's range.
    if !fde.contains(addr) {
        return None;
    }
    let mut ctx: Box<UnwindContext<usize, StackStorage>> = Box::new(UnwindContext::new_in());
    let row = fde
        .unwind_info_for_address(&sec, &bases, &mut ctx, addr)
        .ok()?;
    RowView::from_gimli(row, &sec, fde.cie().return_address_register().0).ok()
}

fn same(a: &RowView<'_>, b: &RowView<'_>) -> bool {
    a.cfa == b.cfa && (0..40u16).all(|r| a.reg(r) == b.reg(r))
}

/// Checks [`row_for`] against gimli on one FDE and address: the same row,
/// or a decline. Not on any capture path: for the `cfi_eval` fuzz target
/// (through `crate::fuzzing`).
pub(crate) fn check_against_gimli(
    eh: &[u8],
    eh_addr: u64,
    off: usize,
    addr: u64,
) -> Result<(), String> {
    match (
        row_for(eh, eh_addr, off, addr),
        gimli_row(eh, eh_addr, off, addr),
    ) {
        (Fast::Row(f), Some(g)) if !same(&f.view(), &g) => {
            Err(format!("at {addr:#x}: fast {:?}, gimli {g:?}", f.view()))
        }
        (Fast::Row(f), None) => Err(format!("at {addr:#x}: fast {:?}, gimli fails", f.view())),
        (Fast::NotCovered, Some(g)) => Err(format!("at {addr:#x}: fast not covered, gimli {g:?}")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every FDE of every loaded module (this test binary, libc, libgcc,
    /// the vDSO...), at each of its first 64 bytes and then every 7th: the
    /// fast interpreter's row is gimli's, or it declines.
    #[test]
    fn agrees_with_gimli_on_loaded_modules() {
        let (mut checked, mut declined, mut fdes) = (0usize, 0usize, 0usize);
        for m in crate::modules::loaded_modules() {
            let Some(hdr) = m.eh_frame_hdr else { continue };
            let end = m.range().1 as u64;
            let Some(secs) = crate::unwind::local::sections_from_hdr(hdr as u64, end) else {
                continue;
            };
            let (hb, ha) = secs.eh_frame_hdr.unwrap();
            let (eb, ea) = secs.eh_frame.unwrap();
            assert_eq!(hb[3], 0x3b, "{}: table encoding", m.path.display());
            let count = u32::from_le_bytes(hb[8..12].try_into().unwrap()) as usize;
            // Every FDE of the small modules (libc's hand-written ones among
            // them), an even spread of at most about 3000 of a large one
            // (this test binary has some 30,000: all of them take half a
            // minute here and ten under qemu-user, for no other kind of
            // row); 300 under qemu-user, still well over a thousand in all.
            let most = if std::env::var_os("CALLSTACK_TEST_QEMU").is_some() {
                300
            } else {
                3000
            };
            let stride = count.div_ceil(most).max(1);
            for i in (0..count).step_by(stride) {
                let w = |k: usize| i32::from_le_bytes(hb[k..k + 4].try_into().unwrap()) as i64;
                let start = ha.wrapping_add(w(12 + 8 * i) as u64);
                let fde = ha.wrapping_add(w(16 + 8 * i) as u64);
                let off = (fde - ea) as usize;
                fdes += 1;
                let mut a = start;
                while a < start + 1024 {
                    let fast = row_for(eb, ea, off, a);
                    let slow = gimli_row(eb, ea, off, a);
                    match (fast, slow) {
                        (Fast::Row(f), Some(g)) => {
                            let f = f.view();
                            assert!(
                                same(&f, &g),
                                "{} at {a:#x}: fast {f:?} gimli {g:?}",
                                m.path.display()
                            );
                            checked += 1;
                        }
                        (Fast::NotCovered, None) | (Fast::Signal, _) => {}
                        (Fast::NotCovered, Some(_)) => {
                            panic!("{} at {a:#x}: fast says not covered", m.path.display())
                        }
                        (Fast::Row(f), None) => {
                            panic!("{} at {a:#x}: fast {f:?}, gimli fails", m.path.display())
                        }
                        (Fast::Unsupported, _) => declined += 1,
                    }
                    if matches!(fast, Fast::NotCovered) {
                        break;
                    }
                    a += if a - start < 64 { 1 } else { 7 };
                }
            }
        }
        assert!(fdes > 1000, "{fdes} FDEs");
        assert!(checked > 10 * fdes, "{checked} rows checked");
        // Declined: the PLT's expression rows and a few hand-written ones.
        assert!(declined * 50 < checked, "{declined} declined of {checked}");
        eprintln!("{fdes} FDEs, {checked} rows equal, {declined} declined");
    }
}
