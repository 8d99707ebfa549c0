//! Direct CFI evaluation: find the FDE of an address, run its instructions
//! with storage on the stack, and apply the resulting row.
//!
//! This is the cold path (a module whose table is not compiled yet) and the
//! fallback of compiled rows that need it. It allocates nothing and takes no
//! lock: gimli's [`UnwindContext`] runs with [`StackStorage`], fixed arrays
//! that live on the caller's stack, and DWARF expressions are evaluated by
//! [`eval_expression`] on a fixed-size stack.

use gimli::{
    BaseAddresses, CfaRule, DebugFrame, EhFrame, EhFrameHdr, EndianSlice, LittleEndian, Register,
    RegisterRule, UnwindContext, UnwindContextStorage, UnwindSection, UnwindTableRow,
};

use crate::arch::{Applied, Arch};
use crate::unwind::cfi_fast::Fast;
use crate::unwind::{Memory, UnwindError, UnwindRegs};

/// The gimli reader of every section the unwinder reads.
pub type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// Fixed-size storage for gimli's unwind context: up to 12 register rules
/// per row (x86-64 code saves at most 7: six callee-saved registers and the
/// return address) and 2 levels of `DW_CFA_remember_state`. Under 1.5 KiB,
/// on the stack of whoever evaluates; small, because gimli copies rows.
/// Signal trampolines (whose CFI describes every register) are not run
/// through it: their `S` augmentation selects the architecture's signal
/// frame layout directly.
#[derive(Clone, Copy, Debug, Default)]
pub struct StackStorage;

impl<T: gimli::ReaderOffset> UnwindContextStorage<T> for StackStorage {
    // AArch64 frames save up to 20 registers (x19-x30, d8-d15).
    type Rules = [(Register, RegisterRule<T>); MAX_VIEW_REGS];
    type Stack = [UnwindTableRow<T, Self>; 3];
}

use crate::types::row::MAX_VIEW_REGS;
pub use crate::types::{CfaView, RowView, RuleView};

impl<'a> RowView<'a> {
    /// The view of a row gimli computed, its expressions as slices of
    /// `section`.
    pub(crate) fn from_gimli<S: UnwindSection<Slice<'a>>>(
        row: &UnwindTableRow<usize, StackStorage>,
        section: &S,
        ra: u16,
    ) -> Result<Self, UnwindError> {
        let expr = |e: &gimli::UnwindExpression<usize>| -> Result<&'a [u8], UnwindError> {
            e.get(section)
                .map(|x| x.0.slice())
                .map_err(|_| UnwindError::BadCfi)
        };
        let cfa = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                CfaView::RegOffset(register.0, *offset)
            }
            CfaRule::Expression(e) => CfaView::Expression(expr(e)?),
        };
        let mut regs = [(0, RuleView::Other); MAX_VIEW_REGS];
        let mut n = 0;
        for (reg, rule) in row.registers() {
            if n == MAX_VIEW_REGS {
                return Err(UnwindError::BadCfi);
            }
            let r = match rule {
                RegisterRule::Undefined => RuleView::Undefined,
                RegisterRule::SameValue => RuleView::SameValue,
                RegisterRule::Offset(o) => RuleView::Offset(*o),
                RegisterRule::ValOffset(o) => RuleView::ValOffset(*o),
                RegisterRule::Register(r) => RuleView::Register(r.0),
                RegisterRule::Expression(e) => RuleView::Expression(expr(e)?),
                RegisterRule::ValExpression(e) => RuleView::ValExpression(expr(e)?),
                RegisterRule::Constant(c) => RuleView::Constant(*c),
                _ => RuleView::Other,
            };
            regs[n] = (reg.0, r);
            n += 1;
        }
        Ok(RowView::new(cfa, ra, &regs[..n]))
    }
}

/// Evaluates a DWARF expression of a CFI row (the subset CFI uses: literals,
/// constants, `DW_OP_bregN`, `deref`, arithmetic, comparisons, `skip`/`bra`),
/// with `initial` pushed first when given. Memory is read through `mem`;
/// registers the unwinder does not track give [`UnwindError::Untracked`].
pub fn eval_expression<A: Arch, M: Memory + ?Sized>(
    expr: &[u8],
    regs: &UnwindRegs,
    mem: &mut M,
    initial: Option<u64>,
) -> Result<u64, UnwindError> {
    const DEPTH: usize = 16;
    let mut stack = [0u64; DEPTH];
    let mut sp = 0usize;
    macro_rules! push {
        ($v:expr) => {{
            if sp == DEPTH {
                return Err(UnwindError::BadCfi);
            }
            stack[sp] = $v;
            sp += 1;
        }};
    }
    macro_rules! pop {
        () => {{
            if sp == 0 {
                return Err(UnwindError::BadCfi);
            }
            sp -= 1;
            stack[sp]
        }};
    }
    if let Some(v) = initial {
        push!(v);
    }
    let mut pc = 0usize;
    let mut steps = 0u32;
    let byte = |pc: &mut usize| -> Result<u8, UnwindError> {
        let b = *expr.get(*pc).ok_or(UnwindError::BadCfi)?;
        *pc += 1;
        Ok(b)
    };
    let fixed = |pc: &mut usize, n: usize| -> Result<u64, UnwindError> {
        let bytes = expr.get(*pc..*pc + n).ok_or(UnwindError::BadCfi)?;
        *pc += n;
        let mut v = 0u64;
        for (i, b) in bytes.iter().enumerate() {
            v |= (*b as u64) << (8 * i);
        }
        Ok(v)
    };
    let uleb = |pc: &mut usize| -> Result<u64, UnwindError> {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let b = *expr.get(*pc).ok_or(UnwindError::BadCfi)?;
            *pc += 1;
            if shift < 64 {
                v |= ((b & 0x7f) as u64) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
    };
    let sleb = |pc: &mut usize| -> Result<i64, UnwindError> {
        let mut v = 0i64;
        let mut shift = 0;
        loop {
            let b = *expr.get(*pc).ok_or(UnwindError::BadCfi)?;
            *pc += 1;
            if shift < 64 {
                v |= ((b & 0x7f) as i64) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    v |= -1i64 << shift;
                }
                return Ok(v);
            }
        }
    };
    let sext = |v: u64, bits: u32| -> u64 { (((v << (64 - bits)) as i64) >> (64 - bits)) as u64 };
    while pc < expr.len() {
        steps += 1;
        if steps > 1000 {
            return Err(UnwindError::BadCfi);
        }
        let op = byte(&mut pc)?;
        match op {
            0x30..=0x4f => push!((op - 0x30) as u64),
            0x70..=0x8f => {
                let off = sleb(&mut pc)?;
                let v = A::reg(regs, (op - 0x70) as u16).ok_or(UnwindError::Untracked)?;
                push!(v.wrapping_add(off as u64));
            }
            0x92 => {
                let r = uleb(&mut pc)?;
                let off = sleb(&mut pc)?;
                let v = A::reg(regs, r as u16).ok_or(UnwindError::Untracked)?;
                push!(v.wrapping_add(off as u64));
            }
            0x08 => push!(fixed(&mut pc, 1)?),
            0x09 => push!(sext(fixed(&mut pc, 1)?, 8)),
            0x0a => push!(fixed(&mut pc, 2)?),
            0x0b => push!(sext(fixed(&mut pc, 2)?, 16)),
            0x0c => push!(fixed(&mut pc, 4)?),
            0x0d => push!(sext(fixed(&mut pc, 4)?, 32)),
            0x0e | 0x0f => push!(fixed(&mut pc, 8)?),
            0x10 => push!(uleb(&mut pc)?),
            0x11 => push!(sleb(&mut pc)? as u64),
            0x12 => {
                let a = pop!();
                push!(a);
                push!(a);
            }
            0x13 => {
                let _ = pop!();
            }
            0x14 => {
                if sp < 2 {
                    return Err(UnwindError::BadCfi);
                }
                push!(stack[sp - 2]);
            }
            0x15 => {
                // DW_OP_pick
                let i = byte(&mut pc)? as usize;
                if i >= sp {
                    return Err(UnwindError::BadCfi);
                }
                push!(stack[sp - 1 - i]);
            }
            0x16 => {
                let a = pop!();
                let b = pop!();
                push!(a);
                push!(b);
            }
            0x17 => {
                // DW_OP_rot: the top three entries, the top one moved third.
                let a = pop!();
                let b = pop!();
                let c = pop!();
                push!(a);
                push!(c);
                push!(b);
            }
            0x06 => {
                let a = pop!();
                push!(mem.read_u64(a).map_err(UnwindError::Read)?);
            }
            0x23 => {
                let a = pop!();
                push!(a.wrapping_add(uleb(&mut pc)?));
            }
            0x1f => {
                let a = pop!();
                push!((a as i64).wrapping_neg() as u64);
            }
            0x20 => {
                let a = pop!();
                push!(!a);
            }
            0x19 => {
                let a = pop!() as i64;
                push!(a.wrapping_abs() as u64);
            }
            0x1a | 0x1c | 0x1e | 0x21 | 0x22 | 0x24 | 0x25 | 0x26 | 0x27 | 0x29..=0x2e => {
                let b = pop!();
                let a = pop!();
                let r = match op {
                    0x1a => a & b,
                    0x1c => a.wrapping_sub(b),
                    0x1e => a.wrapping_mul(b),
                    0x21 => a | b,
                    0x22 => a.wrapping_add(b),
                    0x24 => a.checked_shl(b as u32).unwrap_or(0),
                    0x25 => a.checked_shr(b as u32).unwrap_or(0),
                    0x26 => ((a as i64) >> b.min(63)) as u64,
                    0x27 => a ^ b,
                    0x29 => (a == b) as u64,
                    0x2a => (a as i64 >= b as i64) as u64,
                    0x2b => (a as i64 > b as i64) as u64,
                    0x2c => (a as i64 <= b as i64) as u64,
                    0x2d => ((a as i64) < b as i64) as u64,
                    _ => (a != b) as u64,
                };
                push!(r);
            }
            0x2f | 0x28 => {
                let off = fixed(&mut pc, 2)? as i16 as isize;
                let take = if op == 0x2f { true } else { pop!() != 0 };
                if take {
                    let to = pc as isize + off;
                    if to < 0 || to as usize > expr.len() {
                        return Err(UnwindError::BadCfi);
                    }
                    pc = to as usize;
                }
            }
            0x96 => {} // DW_OP_nop
            _ => return Err(UnwindError::BadCfi),
        }
    }
    if sp == 0 {
        return Err(UnwindError::BadCfi);
    }
    Ok(stack[sp - 1])
}

/// Applies a CFI row to `regs` directly (no compiled rule): computes the CFA
/// and reads the return address and the frame pointer as the row says.
pub fn apply_row<A: Arch, M: Memory + ?Sized>(
    row: &RowView<'_>,
    regs: &UnwindRegs,
    mem: &mut M,
    signal: bool,
) -> Result<Applied, UnwindError> {
    let cfa = match row.cfa {
        CfaView::RegOffset(r, off) => A::reg(regs, r)
            .ok_or(UnwindError::Untracked)?
            .wrapping_add(off as u64),
        CfaView::Expression(e) => eval_expression::<A, M>(e, regs, mem, None)?,
    };
    let value = |rule: RuleView<'_>, same: u64, m: &mut M| -> Result<Option<u64>, UnwindError> {
        Ok(Some(match rule {
            RuleView::Undefined => return Ok(None),
            RuleView::SameValue => same,
            RuleView::Offset(o) => m
                .read_u64(cfa.wrapping_add(o as u64))
                .map_err(UnwindError::Read)?,
            RuleView::ValOffset(o) => cfa.wrapping_add(o as u64),
            RuleView::Register(r) => A::reg(regs, r).ok_or(UnwindError::Untracked)?,
            RuleView::Expression(e) => {
                let a = eval_expression::<A, M>(e, regs, m, Some(cfa))?;
                m.read_u64(a).map_err(UnwindError::Read)?
            }
            RuleView::ValExpression(e) => eval_expression::<A, M>(e, regs, m, Some(cfa))?,
            RuleView::Constant(c) => c,
            RuleView::Other => return Err(UnwindError::BadCfi),
        }))
    };
    let ra_same = A::reg(regs, A::RA).unwrap_or(0);
    let Some(ra) = value(row.reg(A::RA), ra_same, mem)? else {
        return Ok(Applied::End);
    };
    let fp = value(row.reg(A::FP), regs.fp, mem)?.unwrap_or(0);
    // The caller's stack pointer is the CFA unless the row gives it a rule
    // of its own (the exit-hook trampoline's CFA lies 4 bytes above it).
    let sp = match row.reg(A::SP) {
        RuleView::SameValue | RuleView::Undefined => cfa,
        rule => value(rule, cfa, mem)?.unwrap_or(cfa),
    };
    if signal {
        mem.note_stack(cfa);
    }
    Ok(Applied::Caller {
        regs: UnwindRegs {
            pc: ra,
            sp,
            fp,
            lr: 0,
        },
        signal,
    })
}

/// The CFI sections of one module, as bytes at their stated addresses (SVMA:
/// the addresses in the file; in-process, runtime addresses minus the bias).
#[derive(Clone, Copy, Debug, Default)]
pub struct CfiSections<'a> {
    /// `.eh_frame_hdr` and its address, if any (used to find FDEs quickly).
    pub eh_frame_hdr: Option<(&'a [u8], u64)>,
    /// `.eh_frame` and its address, if any.
    pub eh_frame: Option<(&'a [u8], u64)>,
    /// `.debug_frame` (addresses inside it are absolute SVMAs), if any.
    pub debug_frame: Option<&'a [u8]>,
    /// Address of `.text` (for `DW_EH_PE_textrel` pointers; rarely used).
    pub text: u64,
    /// Address of `.got` (for `DW_EH_PE_datarel` pointers on some targets).
    pub got: u64,
}

impl<'a> CfiSections<'a> {
    pub(crate) fn bases(&self) -> BaseAddresses {
        let mut b = BaseAddresses::default()
            .set_text(self.text)
            .set_got(self.got);
        if let Some((_, a)) = self.eh_frame_hdr {
            b = b.set_eh_frame_hdr(a);
        }
        if let Some((_, a)) = self.eh_frame {
            b = b.set_eh_frame(a);
        }
        b
    }
}

/// Where a CFI lookup found the FDE of an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdeAt {
    /// An FDE at this offset of `.eh_frame`.
    EhFrame(usize),
    /// An FDE at this offset of `.debug_frame`.
    DebugFrame(usize),
    /// Search `.eh_frame_hdr`'s table.
    Search,
}

/// Evaluates the CFI of `addr` (an SVMA lookup address) directly and applies
/// it to `regs`. Allocates nothing; the unwind context lives on this stack.
///
/// Returns [`Applied::NoCfi`] when no FDE covers `addr`.
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub fn evaluate<A: Arch, M: Memory + ?Sized>(
    secs: &CfiSections<'_>,
    at: FdeAt,
    addr: u64,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Result<Applied, UnwindError> {
    match evaluate_fast::<A, M>(secs, at, addr, regs, mem) {
        Ok(r) => r,
        Err(at) => evaluate_gimli::<A, M>(secs, at, addr, regs, mem),
    }
}

/// [`evaluate`] for `.eh_frame` FDEs of the forms `cfi_fast` reads: the
/// cold capture's path, kept shallow (each new stack page a capture
/// touches is a page fault). `Err` hands gimli where the FDE is.
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn evaluate_fast<A: Arch, M: Memory + ?Sized>(
    secs: &CfiSections<'_>,
    at: FdeAt,
    addr: u64,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Result<Result<Applied, UnwindError>, FdeAt> {
    let Some((bytes, eh_addr)) = secs.eh_frame else {
        return Err(at);
    };
    let off = match (at, secs.eh_frame_hdr) {
        (FdeAt::EhFrame(off), _) => off,
        (FdeAt::Search, Some((hdr, hdr_addr))) => match hdr_search(hdr, hdr_addr, eh_addr, addr) {
            HdrSearch::Found(off) => off,
            HdrSearch::NotCovered => return Ok(Ok(Applied::NoCfi)),
            HdrSearch::OtherEncoding => return Err(at),
        },
        _ => return Err(at),
    };
    match crate::unwind::cfi_fast::row_for(bytes, eh_addr, off, addr) {
        Fast::Row(row) => Ok(finish_fast::<A, M>(&row, regs, mem)),
        Fast::Signal => {
            Ok(A::signal_frame(regs.sp, mem).map(|regs| Applied::Caller { regs, signal: true }))
        }
        Fast::NotCovered => Ok(Ok(Applied::NoCfi)),
        Fast::Unsupported => Err(FdeAt::EhFrame(off)),
    }
}

/// The compiled rule of `addr` from the CFI directly (`.eh_frame_hdr`
/// search and `cfi_fast`'s row, no table): what a compiled table would
/// give, for the forms `cfi_fast` reads; [`Arch::EVALUATE`] for the rest
/// (the caller then evaluates them with [`evaluate`]), [`Arch::NO_CFI`]
/// when no FDE covers `addr`. Allocates nothing; async-signal-safe.
///
/// `memo` is the walk's last CIE (see [`crate::unwind::cfi_fast::CieMemo`]).
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) fn rule_at<A: Arch>(
    secs: &CfiSections<'_>,
    addr: u64,
    memo: &crate::unwind::cfi_fast::CieCache,
) -> A::Rule {
    let (Some((bytes, eh_addr)), Some((hdr, hdr_addr))) = (secs.eh_frame, secs.eh_frame_hdr) else {
        return A::EVALUATE;
    };
    let off = match hdr_search(hdr, hdr_addr, eh_addr, addr) {
        HdrSearch::Found(off) => off,
        HdrSearch::NotCovered => return A::NO_CFI,
        HdrSearch::OtherEncoding => return A::EVALUATE,
    };
    match crate::unwind::cfi_fast::row_for_cached(bytes, eh_addr, off, addr, memo) {
        Fast::Row(row) => A::compile_row(&row.view(), false),
        Fast::Signal => A::SIGNAL_FRAME,
        Fast::NotCovered => A::NO_CFI,
        // A form the fast interpreter declines (more register rules than
        // its rows hold: AArch64 functions that save x19-x28 and d8-d15,
        // an expression): the row through gimli, compiled as a table's row
        // is, so that the rule is cached once instead of evaluated at
        // every capture.
        Fast::Unsupported => rule_gimli::<A>(secs, off, addr),
    }
}

/// The rule of `addr` from the FDE at `off` of `.eh_frame`, its row run by
/// gimli ([`rule_at`]'s way for the rows `cfi_fast` declines).
#[cold]
#[inline(never)]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn rule_gimli<A: Arch>(secs: &CfiSections<'_>, off: usize, addr: u64) -> A::Rule {
    let Some((bytes, _)) = secs.eh_frame else {
        return A::EVALUATE;
    };
    let bases = secs.bases();
    let mut sec = EhFrame::new(bytes, LittleEndian);
    sec.set_vendor(A::CFI_VENDOR);
    let Ok(fde) = sec.fde_from_offset(&bases, off.into(), EhFrame::cie_from_offset) else {
        return A::EVALUATE;
    };
    if !fde.contains(addr) {
        return A::NO_CFI;
    }
    if fde.is_signal_trampoline() {
        return A::SIGNAL_FRAME;
    }
    let mut ctx: UnwindContext<usize, StackStorage> = UnwindContext::new_in();
    match fde.unwind_info_for_address(&sec, &bases, &mut ctx, addr) {
        Ok(row) => match RowView::from_gimli(row, &sec, A::RA) {
            Ok(v) => A::compile_row(&v, false),
            Err(_) => A::EVALUATE,
        },
        Err(_) => A::EVALUATE,
    }
}

/// Applies a row of `cfi_fast`: its own frame, so that the row view and
/// the reading of the FDE never sit on the stack together.
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn finish_fast<A: Arch, M: Memory + ?Sized>(
    row: &crate::unwind::cfi_fast::FastRow,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Result<Applied, UnwindError> {
    finish::<A, M>(&row.view(), false, regs, mem)
}

/// [`evaluate`] through gimli: the forms `cfi_fast` declines.
#[inline(never)]
fn evaluate_gimli<A: Arch, M: Memory + ?Sized>(
    secs: &CfiSections<'_>,
    at: FdeAt,
    addr: u64,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Result<Applied, UnwindError> {
    let bases = secs.bases();
    let mut ctx: UnwindContext<usize, StackStorage> = UnwindContext::new_in();
    match at {
        FdeAt::DebugFrame(off) => {
            let Some(bytes) = secs.debug_frame else {
                return Ok(Applied::NoCfi);
            };
            let mut sec = DebugFrame::new(bytes, LittleEndian);
            sec.set_address_size(8);
            sec.set_vendor(A::CFI_VENDOR);
            let fde = match sec.fde_from_offset(&bases, off.into(), DebugFrame::cie_from_offset) {
                Ok(f) => f,
                Err(_) => return Err(UnwindError::BadCfi),
            };
            apply_fde::<A, M, _>(&sec, &bases, &mut ctx, &fde, addr, regs, mem)
        }
        FdeAt::EhFrame(_) | FdeAt::Search => {
            let Some((bytes, _)) = secs.eh_frame else {
                return Ok(Applied::NoCfi);
            };
            let mut sec = EhFrame::new(bytes, LittleEndian);
            sec.set_vendor(A::CFI_VENDOR);
            let fde = if let FdeAt::EhFrame(off) = at {
                sec.fde_from_offset(&bases, off.into(), EhFrame::cie_from_offset)
            } else {
                let Some((hdr, hdr_addr)) = secs.eh_frame_hdr else {
                    return Ok(Applied::NoCfi);
                };
                let eh_addr = secs.eh_frame.map(|e| e.1).unwrap_or(0);
                match hdr_search(hdr, hdr_addr, eh_addr, addr) {
                    HdrSearch::Found(off) => {
                        return evaluate_gimli::<A, M>(secs, FdeAt::EhFrame(off), addr, regs, mem)
                    }
                    HdrSearch::NotCovered => return Ok(Applied::NoCfi),
                    HdrSearch::OtherEncoding => {}
                }
                let parsed = EhFrameHdr::new(hdr, LittleEndian)
                    .parse(&bases, 8)
                    .map_err(|_| UnwindError::BadCfi)?;
                let Some(table) = parsed.table() else {
                    return Ok(Applied::NoCfi);
                };
                // A row is at least 4 bytes: a count the header cannot hold
                // is corrupt (and gimli's search multiplies it unchecked).
                let rows = Iterator::size_hint(&table.iter(&bases)).0;
                if rows > hdr.len() / 4 {
                    return Err(UnwindError::BadCfi);
                }
                // gimli's `fde_for_address` subtracts the FDE pointer from
                // `eh_frame_ptr` unchecked: a table entry below `.eh_frame`
                // would overflow; here it is BadCfi.
                let fde_ptr = table.lookup(addr, &bases).and_then(|p| p.direct());
                let eh_ptr = parsed.eh_frame_ptr().direct();
                match (fde_ptr, eh_ptr) {
                    (Ok(p), Ok(e)) => {
                        let off = p.checked_sub(e).ok_or(UnwindError::BadCfi)?;
                        let off = usize::try_from(off).map_err(|_| UnwindError::BadCfi)?;
                        sec.fde_from_offset(
                            &bases,
                            gimli::EhFrameOffset(off),
                            EhFrame::cie_from_offset,
                        )
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            };
            let fde = match fde {
                Ok(f) => f,
                Err(gimli::Error::NoUnwindInfoForAddress) => return Ok(Applied::NoCfi),
                Err(_) => return Err(UnwindError::BadCfi),
            };
            apply_fde::<A, M, _>(&sec, &bases, &mut ctx, &fde, addr, regs, mem)
        }
    }
}

/// Applies the row of `addr` in `fde` (of `.eh_frame` or `.debug_frame`,
/// `sec`): no CFI when the FDE does not cover `addr`, the kernel's signal
/// frame for a signal trampoline's FDE.
fn apply_fde<'a, A: Arch, M: Memory + ?Sized, S: UnwindSection<Slice<'a>>>(
    sec: &S,
    bases: &gimli::BaseAddresses,
    ctx: &mut UnwindContext<usize, StackStorage>,
    fde: &gimli::FrameDescriptionEntry<Slice<'a>>,
    addr: u64,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Result<Applied, UnwindError> {
    if !fde.contains(addr) {
        return Ok(Applied::NoCfi);
    }
    if fde.is_signal_trampoline() {
        let regs = A::signal_frame(regs.sp, mem)?;
        return Ok(Applied::Caller { regs, signal: true });
    }
    let row = fde
        .unwind_info_for_address(sec, bases, ctx, addr)
        .map_err(|_| UnwindError::BadCfi)?;
    let view = RowView::from_gimli(row, sec, A::RA)?;
    finish::<A, M>(&view, false, regs, mem)
}

/// What [`hdr_search`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HdrSearch {
    /// The FDE that may cover the address, at this offset of `.eh_frame`.
    Found(usize),
    /// No FDE starts at or below the address.
    NotCovered,
    /// The header uses encodings other than the standard ones: ask gimli.
    OtherEncoding,
}

/// Reads a little-endian `i32` at `at` of `b`.
#[inline]
fn le_i32(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The `.eh_frame` address a standard `.eh_frame_hdr` at `hdr_addr` points
/// at (`eh_frame_ptr` encoded `DW_EH_PE_pcrel | sdata4`), or `None` for
/// other encodings.
pub fn hdr_eh_frame_ptr(hdr: &[u8], hdr_addr: u64) -> Option<u64> {
    if hdr.len() < 12 || hdr[0] != 1 || hdr[1] != 0x1b {
        return None;
    }
    Some(
        hdr_addr
            .wrapping_add(4)
            .wrapping_add(le_i32(hdr, 4)? as i64 as u64),
    )
}

/// Binary search of `.eh_frame_hdr`'s table for the FDE of `addr`, for the
/// encodings every GNU linker writes (`eh_frame_ptr` pcrel sdata4,
/// `fde_count` udata4, table datarel sdata4). Our own because it is the
/// cold capture's inner loop and gimli's generic pointer decoding costs
/// about ten times more; other encodings give
/// [`HdrSearch::OtherEncoding`].
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub fn hdr_search(hdr: &[u8], hdr_addr: u64, eh_frame_addr: u64, addr: u64) -> HdrSearch {
    if hdr.len() < 12 || hdr[0] != 1 || hdr[1] != 0x1b || hdr[2] != 0x03 || hdr[3] != 0x3b {
        return HdrSearch::OtherEncoding;
    }
    let count = u32::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]) as usize;
    if count == 0 || hdr.len() < 12 + count.saturating_mul(8) {
        return HdrSearch::NotCovered;
    }
    // The table's (initial location, FDE) pairs, compared as offsets from
    // the header: `addr` is turned into one once, and each probe is one
    // 4-byte load (the length was checked above).
    let table = &hdr[12..12 + 8 * count];
    let at = |i: usize| {
        let b: [u8; 4] = table[i..i + 4].try_into().unwrap_or([0; 4]);
        i32::from_le_bytes(b) as i64
    };
    let key = addr.wrapping_sub(hdr_addr) as i64;
    // The last entry whose initial location is <= addr.
    let (mut lo, mut hi) = (0usize, count);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if at(8 * mid) <= key {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if at(8 * lo) > key {
        return HdrSearch::NotCovered;
    }
    let fde = hdr_addr.wrapping_add(at(8 * lo + 4) as u64);
    match fde.checked_sub(eh_frame_addr) {
        Some(off) => HdrSearch::Found(off as usize),
        None => HdrSearch::NotCovered,
    }
}

#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn finish<A: Arch, M: Memory + ?Sized>(
    view: &RowView<'_>,
    signal: bool,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Result<Applied, UnwindError> {
    let rule = A::compile_row(view, signal);
    if rule != A::EVALUATE {
        return A::apply(rule, regs, mem);
    }
    apply_row::<A, M>(view, regs, mem, signal)
}

/// Runs `f(start, end, rule, fde)` for each row of every FDE of `secs`, in
/// section order, with each row compiled for `A`. Used by the table compiler.
pub(crate) fn for_each_row<A: Arch>(
    secs: &CfiSections<'_>,
    mut f: impl FnMut(u64, u64, A::Rule, FdeAt),
) -> Result<RowStats, UnwindError> {
    let bases = secs.bases();
    let mut ctx: Box<UnwindContext<usize, StackStorage>> = Box::new(UnwindContext::new_in());
    let mut stats = RowStats::default();
    if let Some((bytes, _)) = secs.eh_frame {
        let mut sec = EhFrame::new(bytes, LittleEndian);
        sec.set_vendor(A::CFI_VENDOR);
        walk_section::<A, _>(&sec, &bases, &mut ctx, &mut stats, &mut |s, e, r, o| {
            f(s, e, r, FdeAt::EhFrame(o))
        })?;
    }
    if let Some(bytes) = secs.debug_frame {
        let mut sec = DebugFrame::new(bytes, LittleEndian);
        sec.set_address_size(8);
        sec.set_vendor(A::CFI_VENDOR);
        walk_section::<A, _>(&sec, &bases, &mut ctx, &mut stats, &mut |s, e, r, o| {
            f(s, e, r, FdeAt::DebugFrame(o))
        })?;
    }
    Ok(stats)
}

/// Counters of a table compilation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowStats {
    /// FDEs compiled.
    pub fdes: usize,
    /// CFI rows seen.
    pub rows: usize,
    /// FDEs skipped because they could not be parsed.
    pub bad_fdes: usize,
}

fn walk_section<'a, A: Arch, S>(
    sec: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize, StackStorage>,
    stats: &mut RowStats,
    f: &mut dyn FnMut(u64, u64, A::Rule, usize),
) -> Result<(), UnwindError>
where
    S: UnwindSection<Slice<'a>>,
{
    let mut entries = sec.entries(bases);
    loop {
        let entry = match entries.next() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            // A broken entry ends the section: its length cannot be trusted.
            Err(_) => {
                stats.bad_fdes += 1;
                break;
            }
        };
        let partial = match entry {
            gimli::CieOrFde::Cie(_) => continue,
            gimli::CieOrFde::Fde(p) => p,
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            stats.bad_fdes += 1;
            continue;
        };
        let off = fde.offset();
        if fde.is_signal_trampoline() {
            // Its CFI describes every register; the architecture's signal
            // frame layout replaces it (see `StackStorage`).
            stats.fdes += 1;
            stats.rows += 1;
            f(
                fde.initial_address(),
                fde.end_address(),
                A::SIGNAL_FRAME,
                off,
            );
            continue;
        }
        let signal = false;
        let Ok(mut rows) = fde.rows(sec, bases, ctx) else {
            stats.bad_fdes += 1;
            continue;
        };
        stats.fdes += 1;
        loop {
            match rows.next_row() {
                Ok(Some(row)) => {
                    stats.rows += 1;
                    let rule = match RowView::from_gimli(row, sec, A::RA) {
                        Ok(v) => A::compile_row(&v, signal),
                        Err(_) => A::EVALUATE,
                    };
                    f(row.start_address(), row.end_address(), rule, off);
                }
                Ok(None) => break,
                Err(_) => {
                    stats.bad_fdes += 1;
                    break;
                }
            }
        }
    }
    Ok(())
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use crate::arch::x86_64::exit_hook::LOOKUP_EXPR;
    use crate::arch::{hash, PROBES, SLOTS};
    use crate::types::{Memory, ReadError, UnwindRegs};

    /// Memory of a fake table and its offset word, and the stack words of
    /// `stack` (address, value).
    struct Fake {
        base: u64,
        words: Vec<u64>,
        stack: Vec<(u64, u64)>,
    }

    impl Memory for Fake {
        fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
            if let Some(&(_, v)) = self.stack.iter().find(|w| w.0 == addr) {
                return Ok(v);
            }
            let i = addr.wrapping_sub(self.base) / 8;
            if addr % 8 != 0 || i >= self.words.len() as u64 {
                return Err(ReadError::OutOfBounds(addr));
            }
            Ok(self.words[i as usize])
        }
    }

    /// Lays out `[offset word][TRAMPOLINE - 1 ...]` then the table at
    /// `base + 64`, fills `entries` (key, value), and evaluates the
    /// expression for the trampoline frame of the hooked frame whose CFA is
    /// `key`: the trampoline's CFA is `key + 4`, and the hooked frame's
    /// return address slot (`key - 8`) holds `TRAMPOLINE`. The pc plays no
    /// part (the expression holds at any instruction before the push).
    fn eval(entries: &[(u64, u64)], key: u64) -> u64 {
        let base = 0x5000_0000u64;
        let table = base + 64;
        let mut words = vec![0u64; 8 + 2 * (SLOTS + PROBES)];
        words[0] = table - base;
        for &(k, v) in entries {
            let mut i = hash(k);
            while words[8 + 2 * i] != 0 {
                i += 1;
            }
            words[8 + 2 * i] = k;
            words[8 + 2 * i + 1] = v;
        }
        let mut mem = Fake {
            base,
            words,
            stack: vec![(key - 8, base + 9)],
        };
        let regs = UnwindRegs {
            pc: 0x1234,
            sp: key,
            fp: 0,
            lr: 0,
        };
        super::eval_expression::<crate::arch::x86_64::X86_64, _>(
            &LOOKUP_EXPR,
            &regs,
            &mut mem,
            Some(key + 4),
        )
        .unwrap()
    }

    #[test]
    /// The exit-hook trampoline's return-address expression
    /// (`arch::x86_64::exit_hook`), evaluated here.
    fn the_exit_hook_expression_finds_the_entry_of_its_cfa() {
        let k = 0x7ffd_1234_5670u64;
        assert_eq!(eval(&[(k, 0xabcd)], k), 0xabcd);
        // Colliding keys: same hash, found in their probe order.
        let mut same = vec![];
        let mut c = k + 16;
        while same.len() < 3 {
            if hash(c) == hash(k) {
                same.push(c);
            }
            c += 16;
        }
        let entries = [(k, 1), (same[0], 2), (same[1], 3), (same[2], 4)];
        for (i, &(key, v)) in entries.iter().enumerate() {
            assert_eq!(eval(&entries, key), v, "entry {i}");
        }
        // A key not in the table: 0, which ends a walk.
        assert_eq!(eval(&entries, k + 8), 0);
    }
}

/// The AArch64 trampoline's expression, on every host (the arch module is
/// compiled everywhere): it finds the table through `x30`.
#[cfg(test)]
mod aarch64_hook_tests {
    use crate::arch::aarch64::exit_hook::LOOKUP_EXPR;
    use crate::arch::{hash, PROBES, SLOTS};
    use crate::types::{Memory, ReadError, UnwindRegs};

    struct Fake {
        base: u64,
        words: Vec<u64>,
    }

    impl Memory for Fake {
        fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
            let i = addr.wrapping_sub(self.base) / 8;
            if addr % 8 != 0 || i >= self.words.len() as u64 {
                return Err(ReadError::OutOfBounds(addr));
            }
            Ok(self.words[i as usize])
        }
    }

    /// Lays out `[offset word][symbol: 4 bytes][TRAMPOLINE ...]` then the
    /// table at `base + 64`, and evaluates the expression for the
    /// trampoline frame of the hooked frame whose CFA is `key` (the
    /// trampoline's CFA `key + 8`, `x30` the trampoline).
    fn eval(entries: &[(u64, u64)], key: u64) -> u64 {
        let base = 0x5000_0000u64;
        let table = base + 64;
        let mut words = vec![0u64; 8 + 2 * (SLOTS + PROBES)];
        words[0] = table - base;
        for &(k, v) in entries {
            let mut i = hash(k);
            while words[8 + 2 * i] != 0 {
                i += 1;
            }
            words[8 + 2 * i] = k;
            words[8 + 2 * i + 1] = v;
        }
        let mut mem = Fake { base, words };
        let regs = UnwindRegs {
            pc: 0x1234,
            sp: key,
            fp: 0,
            lr: base + 12,
        };
        super::eval_expression::<crate::arch::aarch64::Aarch64, _>(
            &LOOKUP_EXPR,
            &regs,
            &mut mem,
            Some(key + 8),
        )
        .unwrap()
    }

    #[test]
    fn the_aarch64_exit_hook_expression_finds_the_entry_of_its_cfa() {
        let k = 0xffff_f7ff_e230u64;
        assert_eq!(eval(&[(k, 0xabcd)], k), 0xabcd);
        let mut same = vec![];
        let mut c = k + 16;
        while same.len() < 3 {
            if hash(c) == hash(k) {
                same.push(c);
            }
            c += 16;
        }
        let entries = [(k, 1), (same[0], 2), (same[1], 3), (same[2], 4)];
        for (i, &(key, v)) in entries.iter().enumerate() {
            assert_eq!(eval(&entries, key), v, "entry {i}");
        }
        assert_eq!(eval(&entries, k + 16), 0);
    }
}
