//! Walks by machine code alone: the one frame loop ([`Unwinder`]) over a
//! source that knows no rules ([`NoRules`]), with an architecture's step as
//! its fallback (x86-64's instruction analysis, the RISC prologue analysis of
//! AArch64 and MIPS, ARM's EHABI tables and prologue analysis). The loop
//! writes the frames and applies the stopping rules every walk shares: a
//! zero pc ends the walk, and the stack must move up (a leaf at an exact pc
//! and a signal frame excepted).
//!
//! Used for the in-process capture by instruction analysis only
//! ([`super::InProcess`]), for the threads of ARM and MIPS cores (no CFI
//! unwinder there yet), and by [`super::unwind_prstatus`].

use crate::arch::arm::unwinder::{ArmRegs, ArmTables};
use crate::arch::risc::RiscArch;
use crate::arch::x86_64::insn_cache::InsnCache;
use crate::arch::{Applied, Arch, FrameRecordLayout};
use crate::types::{
    CodeMemory, Frame, Memory, Method, RowView, StopReason, UnwindError, UnwindRegs,
};
use crate::unwind::{Fallback, Found, RuleSource, Unwinder};

/// Why a walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The pc is 0 (the outermost frame's sentinel).
    End,
    /// No method found a believable caller (or the step did not move the
    /// stack up).
    NoCaller,
    /// The output is full.
    Full,
}

/// x86-64's instruction analysis from `regs` (the innermost frame, its exact
/// pc), writing `(pc, method)` per frame into `out` (`out[0]` is `regs.pc`
/// with [`Method::Context`]). Returns how many frames were written and why
/// the walk stopped.
pub fn x86_64<M, C>(
    regs: UnwindRegs,
    mem: &mut M,
    code: &mut C,
    stack_end: u64,
    out: &mut [(u64, Method)],
) -> (usize, Stop)
where
    M: Memory + ?Sized,
    C: CodeMemory + ?Sized,
{
    x86_64_from(regs, true, mem, code, stack_end, None, out)
}

/// [`x86_64`] from a frame whose pc is exact or, when `exact` is false, a
/// return address; with a cache of the analysis per pc.
pub(crate) fn x86_64_from<M, C>(
    regs: UnwindRegs,
    exact: bool,
    mem: &mut M,
    code: &mut C,
    stack_end: u64,
    cache: Option<&InsnCache>,
    out: &mut [(u64, Method)],
) -> (usize, Stop)
where
    M: Memory + ?Sized,
    C: CodeMemory + ?Sized,
{
    let steps = X86Steps {
        code,
        stack_end,
        cache,
    };
    run(steps, regs, exact, mem, out)
}

/// The RISC prologue analysis of architecture `A` (AArch64, MIPS) from `regs`
/// (the innermost frame: exact pc, `lr` valid), writing `(pc, method)` per
/// frame. Returns how many frames were written.
pub fn risc<A: RiscArch, M: Memory + ?Sized, C: CodeMemory + ?Sized>(
    regs: UnwindRegs,
    mem: &mut M,
    code: &mut C,
    stack_end: u64,
    out: &mut [(u64, Method)],
) -> usize {
    into_slice(out, |each| {
        risc_each::<A, M, C>(regs, mem, code, stack_end, each)
    })
    .0
}

/// [`risc`], handing each frame to `each` (which returns whether to go on).
/// Returns why the walk ended.
pub fn risc_each<A: RiscArch, M: Memory + ?Sized, C: CodeMemory + ?Sized>(
    regs: UnwindRegs,
    mem: &mut M,
    code: &mut C,
    stack_end: u64,
    each: impl FnMut(&Frame) -> bool,
) -> StopReason {
    risc_each_from::<A, M, C>(regs, true, mem, code, stack_end, each)
}

/// [`risc_each`] from `regs` whose pc is exact (the innermost frame, or
/// below a signal frame) or a return address (`exact` false: a walk that
/// starts in a caller, as `InProcess` does).
pub fn risc_each_from<A: RiscArch, M: Memory + ?Sized, C: CodeMemory + ?Sized>(
    regs: UnwindRegs,
    exact: bool,
    mem: &mut M,
    code: &mut C,
    stack_end: u64,
    each: impl FnMut(&Frame) -> bool,
) -> StopReason {
    let steps = RiscSteps::<A, C> {
        code,
        stack_end,
        arch: core::marker::PhantomData,
    };
    Unwinder::<CodeOnly, _, _>::with_fallback(&NoRules, regs, exact, steps).run(mem, each)
}

/// 32-bit ARM (EHABI tables, then prologue analysis) from `regs` (the
/// innermost frame's sixteen core registers, its exact pc), writing
/// `(pc, method)` per frame (pcs with the Thumb bit as found). Returns how
/// many frames were written.
pub fn arm<M, C>(
    regs: ArmRegs,
    mem: &mut M,
    code: &mut C,
    stack_end: u64,
    out: &mut [(u64, Method)],
) -> usize
where
    M: Memory + ?Sized,
    C: CodeMemory + ArmTables + ?Sized,
{
    into_slice(out, |each| arm_each(regs, mem, code, stack_end, each)).0
}

/// [`arm`], handing each frame to `each` (which returns whether to go on).
/// Returns why the walk ended.
pub fn arm_each<M, C>(
    regs: ArmRegs,
    mem: &mut M,
    code: &mut C,
    stack_end: u64,
    each: impl FnMut(&Frame) -> bool,
) -> StopReason
where
    M: Memory + ?Sized,
    C: CodeMemory + ArmTables + ?Sized,
{
    let start = arm_regs(&regs);
    let steps = ArmSteps {
        code,
        stack_end,
        cur: regs,
    };
    Unwinder::<CodeOnly, _, _>::with_fallback(&NoRules, start, true, steps).run(mem, each)
}

/// The loop: frames to `out` until it is full or the walk ends.
fn run<F: Fallback<CodeOnly>, M: Memory + ?Sized>(
    steps: F,
    regs: UnwindRegs,
    exact: bool,
    mem: &mut M,
    out: &mut [(u64, Method)],
) -> (usize, Stop) {
    if out.is_empty() {
        return (0, Stop::Full);
    }
    let mut n = 0;
    let why =
        Unwinder::<CodeOnly, _, _>::with_fallback(&NoRules, regs, exact, steps).run(mem, |f| {
            out[n] = (f.pc, f.method);
            n += 1;
            n < out.len()
        });
    (n, stop_of(why, n == out.len()))
}

/// Runs `walk` with a visitor writing `(pc, method)` per frame to `out`
/// until it is full (through a `dyn` visitor: for cores, off the capture
/// path). Returns how many it wrote and why the walk stopped.
fn into_slice(
    out: &mut [(u64, Method)],
    walk: impl FnOnce(&mut dyn FnMut(&Frame) -> bool) -> StopReason,
) -> (usize, Stop) {
    if out.is_empty() {
        return (0, Stop::Full);
    }
    let mut n = 0;
    let why = walk(&mut |f| {
        out[n] = (f.pc, f.method);
        n += 1;
        n < out.len()
    });
    (n, stop_of(why, n == out.len()))
}

/// A walk's [`Stop`] from the loop's reason; `full`: the output filled up.
fn stop_of(why: StopReason, full: bool) -> Stop {
    match why {
        StopReason::Outermost => Stop::End,
        StopReason::Running | StopReason::BufferFull if full => Stop::Full,
        _ => Stop::NoCaller,
    }
}

/// The rule source of a walk by machine code: no address has a rule, so
/// every frame goes to the fallback.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoRules;

impl<A: Arch> RuleSource<A> for NoRules {
    fn rule(&self, _: u64) -> Found<A::Rule> {
        Found::Unknown
    }
}

/// The [`Arch`] of a walk that reads no CFI ([`NoRules`]): its one rule
/// says "no CFI", and nothing applies it (a frame without a rule goes to
/// the fallback, which knows the real architecture).
#[derive(Clone, Copy, Debug, Default)]
pub struct CodeOnly;

impl Arch for CodeOnly {
    type Rule = ();
    const NAME: &'static str = "machine code";
    const SP: u16 = u16::MAX;
    const FP: u16 = u16::MAX;
    const RA: u16 = u16::MAX;
    const NO_CFI: () = ();
    const EVALUATE: () = ();
    const SIGNAL_FRAME: () = ();
    const ENTRY: () = ();
    /// Never read: no frame takes the frame-pointer rule without a rule.
    const FRAME_RECORD: FrameRecordLayout = FrameRecordLayout {
        below: 0,
        fp_offset: 0,
        ra_offset: 8,
        align: 16,
    };

    fn reg(_: &UnwindRegs, _: u16) -> Option<u64> {
        None
    }

    fn compile_row(_: &RowView<'_>, _: bool) {}

    fn apply<M: Memory + ?Sized>(_: (), _: &UnwindRegs, _: &mut M) -> Result<Applied, UnwindError> {
        Ok(Applied::NoCfi)
    }

    fn pack(_: ()) -> u16 {
        0
    }

    fn unpack(_: u16) {}

    fn signal_frame<M: Memory + ?Sized>(_: u64, _: &mut M) -> Result<UnwindRegs, UnwindError> {
        Err(UnwindError::Untracked)
    }
}

/// x86-64's instruction analysis (with stack scanning) as the loop's
/// fallback.
struct X86Steps<'a, C: ?Sized> {
    code: &'a mut C,
    stack_end: u64,
    cache: Option<&'a InsnCache>,
}

impl<A: Arch, C: CodeMemory + ?Sized> Fallback<A> for X86Steps<'_, C> {
    fn unwind_frame<M: Memory + ?Sized>(
        &mut self,
        regs: &UnwindRegs,
        pc_is_exact: bool,
        _: bool,
        mem: &mut M,
    ) -> Option<(UnwindRegs, Method)> {
        crate::arch::x86_64::instruction_analysis::unwinder::step_cached(
            regs,
            mem,
            self.code,
            pc_is_exact,
            self.stack_end,
            self.cache,
        )
        .map(|s| (s.regs, s.method))
    }
}

/// The RISC prologue analysis of `R` as the loop's fallback.
struct RiscSteps<'a, R, C: ?Sized> {
    code: &'a mut C,
    stack_end: u64,
    arch: core::marker::PhantomData<R>,
}

impl<A: Arch, R: RiscArch, C: CodeMemory + ?Sized> Fallback<A> for RiscSteps<'_, R, C> {
    fn unwind_frame<M: Memory + ?Sized>(
        &mut self,
        regs: &UnwindRegs,
        pc_is_exact: bool,
        _: bool,
        mem: &mut M,
    ) -> Option<(UnwindRegs, Method)> {
        crate::arch::risc::step::<R, M, C>(regs, mem, self.code, pc_is_exact, self.stack_end)
            .map(|s| (s.regs, s.method))
    }
}

/// ARM's step as the loop's fallback. The step reads and gives all sixteen
/// core registers (EHABI restores any of them), more than the loop tracks:
/// the fallback keeps the current frame's, and hands the loop their
/// [`UnwindRegs`] (pc with its Thumb bit, sp, r11, lr).
struct ArmSteps<'a, C: ?Sized> {
    code: &'a mut C,
    stack_end: u64,
    /// The registers of the frame the loop is at: the loop asks for the
    /// caller of each frame once, in order, and ends the walk when it
    /// rejects one.
    cur: ArmRegs,
}

impl<A: Arch, C: CodeMemory + ArmTables + ?Sized> Fallback<A> for ArmSteps<'_, C> {
    fn unwind_frame<M: Memory + ?Sized>(
        &mut self,
        regs: &UnwindRegs,
        pc_is_exact: bool,
        _: bool,
        mem: &mut M,
    ) -> Option<(UnwindRegs, Method)> {
        debug_assert_eq!(*regs, arm_regs(&self.cur));
        let (next, method) = crate::arch::arm::unwinder::step(
            &self.cur,
            mem,
            self.code,
            pc_is_exact,
            self.stack_end,
        )?;
        self.cur = next;
        Some((arm_regs(&next), method))
    }
}

/// What the loop tracks of ARM's registers.
fn arm_regs(r: &ArmRegs) -> UnwindRegs {
    UnwindRegs {
        pc: r[15] as u64,
        sp: r[13] as u64,
        fp: r[11] as u64,
        lr: r[14] as u64,
    }
}
