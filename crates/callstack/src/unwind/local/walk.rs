//! The walk drivers in this process (`walk_pcs`, `walk_pcs_after`,
//! `walk_frames`): the generic unwinder's loop over [`LocalSource`], whose
//! fast path is the rule cache's hot loop (`hot.rs`).

use super::cache::cache_go_live;
use super::code::insn_fallback;
use super::hot::Hot;
use super::source::LocalSource;
use super::A;
use crate::stack::{known_stack_end, StackMemory};
use crate::unwind::{Frame, ReadError, StopReason, UnwindError, UnwindRegs, Unwinder};

/// The stack memory and the rule source of a walk from `sp`, or why there
/// is no walk (the stack holding `sp` is unknown).
#[inline(always)]
pub(super) fn walk_setup(sp: u64) -> Result<(StackMemory, LocalSource), StopReason> {
    cache_go_live();
    match StackMemory::for_sp(sp) {
        Some(m) => {
            let source = LocalSource::new((m.bounds[0].lo as u64, m.hi()));
            Ok((m, source))
        }
        None => Err(StopReason::Error(UnwindError::Read(
            ReadError::OutOfBounds(sp),
        ))),
    }
}

/// The start of [`walk_pcs`] and [`walk_frames`]: nothing to do for an
/// empty `out`, else [`walk_setup`]; `Err` is what the walk returns. With
/// no readable stack at `regs.sp` (a crafted or broken context) the walk is
/// the pc alone, written as `lone(regs)` unless skipped.
#[inline(always)]
fn walk_start<T>(
    regs: &UnwindRegs,
    skip: usize,
    out: &mut [T],
    lone: impl FnOnce(&UnwindRegs) -> T,
) -> Result<(StackMemory, LocalSource), (usize, StopReason)> {
    if out.is_empty() {
        return Err((0, StopReason::BufferFull));
    }
    match walk_setup(regs.sp) {
        Ok(s) => Ok(s),
        Err(stop) if skip == 0 && regs.pc != 0 => {
            out[0] = lone(regs);
            Err((1, stop))
        }
        Err(stop) => Err((0, stop)),
    }
}

/// Walks from `regs`, writing pcs after dropping `skip`. Returns the count
/// and why the walk ended.
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) fn walk_pcs(
    regs: UnwindRegs,
    exact: bool,
    skip: usize,
    out: &mut [usize],
) -> (usize, StopReason) {
    let (mut mem, source) = match walk_start(&regs, skip, out, |r| r.pc as usize) {
        Ok(s) => s,
        Err(end) => return end,
    };
    let fallback = insn_fallback(&mem);
    Unwinder::<A, _, _>::with_fallback(&source, regs, exact, fallback).run_pcs(&mut mem, skip, out)
}

/// The rest of a walk from `hot`, whose frame is already written (or
/// skipped) among the `n` first pcs in `out`: the warm path's way out when
/// a frame is not in the rule cache.
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(super) fn walk_pcs_after(hot: Hot, skip: usize, n: usize, out: &mut [usize]) -> usize {
    let regs = UnwindRegs {
        pc: hot.pc,
        sp: hot.sp,
        fp: hot.fp,
        lr: 0,
    };
    match walk_setup(hot.sp) {
        Ok((mut mem, source)) => {
            let fallback = insn_fallback(&mem);
            Unwinder::<A, _, _>::with_fallback(&source, regs, false, fallback)
                .resume_pcs(&mut mem, skip, out, n)
                .0
        }
        Err(_) => n,
    }
}

/// The stack's end for the warm path, where there is one: some rule has
/// been cached (before that the cache is not even read, so that its pages
/// stay unfaulted) and the end of the stack holding `sp` is known without
/// a lookup.
#[inline(always)]
pub(super) fn warm_stack_end(sp: u64) -> Option<u64> {
    if super::flags::FLAGS
        .cache_used
        .load(core::sync::atomic::Ordering::Relaxed)
    {
        known_stack_end(sp)
    } else {
        None
    }
}

/// Like [`walk_pcs`], keeping the whole frames.
pub(crate) fn walk_frames(
    regs: UnwindRegs,
    exact: bool,
    mut skip: usize,
    out: &mut [Frame],
) -> (usize, StopReason) {
    let lone = |r: &UnwindRegs| Frame {
        pc: r.pc,
        sp: r.sp,
        fp: r.fp,
        method: crate::unwind::Method::Context,
    };
    let (mut mem, source) = match walk_start(&regs, skip, out, lone) {
        Ok(s) => s,
        Err(end) => return end,
    };
    let fallback = insn_fallback(&mem);
    let mut u = Unwinder::<A, _, _>::with_fallback(&source, regs, exact, fallback);
    let mut n = 0;
    let mut stop = None;
    let why = u.run(&mut mem, |f| {
        if skip > 0 {
            skip -= 1;
            return true;
        }
        out[n] = *f;
        n += 1;
        if n == out.len() {
            stop = Some(StopReason::BufferFull);
            return false;
        }
        true
    });
    (n, stop.unwrap_or(why))
}
