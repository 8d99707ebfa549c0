//! The generic unwinder: applies rules frame by frame, whatever the source
//! of the rules (compiled tables, CFI evaluated directly) and of the memory
//! (this process, a core file, another process).

use crate::arch::{Applied, Arch};
use crate::types::{Frame, Memory, Method, StopReason, UnwindError, UnwindRegs};

/// What a [`RuleSource`] knows about an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found<R> {
    /// The address is in a known module; this is its rule
    /// ([`Arch::NO_CFI`] when the module has no CFI for it).
    Rule(R),
    /// The address is in no known module.
    Unknown,
}

/// How a [`RuleSource::fast_walk`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastEnd {
    /// It filled the slots it was given.
    Full,
    /// It reached the outermost frame (a zero return address, or a rule
    /// that says there is no caller), or the end its source's rules set
    /// (`capture_fast`'s frame records: a record that breaks the chain's
    /// rules ends the capture there).
    Outermost,
    /// The frame it stopped at needs the generic step.
    Slow,
}

/// Where the unwinder gets the rule of an address (a runtime address).
///
/// Implemented by [`crate::unwind::ModuleSet`] (compiled tables of modules
/// at their load bias: core files, other processes) and by the in-process
/// source behind [`crate::capture_exact`].
pub trait RuleSource<A: Arch> {
    /// The rule of the lookup address `addr`.
    fn rule(&self, addr: u64) -> Found<A::Rule>;

    /// The rule of an exact pc (an interrupted one: a signal's, an
    /// exception's), where a source knows more than [`RuleSource::rule`]
    /// of such a pc (Windows x64: whether it stands in an epilogue, which
    /// the unwind data does not describe). The default is `rule(pc)`.
    #[inline(always)]
    fn rule_exact(&self, pc: u64) -> Found<A::Rule> {
        self.rule(pc)
    }

    /// Evaluates the CFI of `addr` directly and applies it (for rows that
    /// are [`Arch::EVALUATE`]). Must not allocate when used in-process. The
    /// default, for a source that gives no such rows, has nothing to
    /// evaluate: [`UnwindError::Untracked`], which sends the frame on as one
    /// without CFI.
    fn evaluate<M: Memory + ?Sized>(
        &self,
        addr: u64,
        regs: &UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, UnwindError> {
        let _ = (addr, regs, mem);
        Err(UnwindError::Untracked)
    }

    /// Whether the code at `pc` (without CFI) is a signal-return trampoline.
    fn is_signal_trampoline(&self, pc: u64) -> bool {
        let _ = pc;
        false
    }

    /// The return address to report for a caller whose return address read
    /// from the stack is `ra` and whose stack pointer is `sp`: `ra` itself,
    /// except where an exit hook's trampoline stands in for the original
    /// (see [`crate::exit_hook`]; the in-process source resolves it).
    #[inline(always)]
    fn return_address(&self, ra: u64, sp: u64) -> u64 {
        let _ = sp;
        ra
    }

    /// Whether a caller's return address `ra` lies in code: a walk ends at
    /// one that does not ([`StopReason::UnknownModule`]), garbage read as a
    /// return address. The default takes every address.
    #[inline(always)]
    fn is_code(&self, ra: u64) -> bool {
        let _ = ra;
        true
    }

    /// The source's fast path, which [`Unwinder::run_pcs`] takes at every
    /// frame whose pc is a return address: walks the callers it can on its
    /// own, writing their pcs to `out` (at most `out.len()`, which is never
    /// 0) and moving `regs` to the last one written. Returns how many it
    /// wrote and how it ended; [`FastEnd::Slow`] hands the frame at `regs`
    /// to the generic step. The in-process source runs its rule cache here
    /// (no Rust per frame on x86-64: `arch/x86_64/exact.rs`); the default
    /// walks none.
    #[inline(always)]
    fn fast_walk(&self, regs: &mut UnwindRegs, out: &mut [usize]) -> (usize, FastEnd) {
        let _ = (regs, out);
        (0, FastEnd::Slow)
    }
}

/// The hook for frames that neither CFI nor a valid frame pointer can
/// unwind: instruction analysis, stack scanning, JIT code.
///
/// Called with the frame's registers and whether its pc is exact (first
/// frame, or interrupted by a signal) or a return address. Returns the
/// caller's registers and the method that found them, or `None` to end the
/// walk.
pub trait Fallback<A: Arch> {
    /// Unwinds one frame, or gives up.
    fn unwind_frame<M: Memory + ?Sized>(
        &mut self,
        regs: &UnwindRegs,
        pc_is_exact: bool,
        known_module: bool,
        mem: &mut M,
    ) -> Option<(UnwindRegs, Method)>;

    /// Whether to ask this fallback before the plain frame-pointer rule for
    /// a frame without CFI (it then tries the frame pointer itself, checked
    /// against the code). The default is false: frame pointer first.
    fn before_frame_pointer(&self) -> bool {
        false
    }
}

/// No fallback: frames without CFI and without a valid frame pointer end
/// the walk.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFallback;

impl<A: Arch> Fallback<A> for NoFallback {
    #[inline(always)]
    fn unwind_frame<M: Memory + ?Sized>(
        &mut self,
        _: &UnwindRegs,
        _: bool,
        _: bool,
        _: &mut M,
    ) -> Option<(UnwindRegs, Method)> {
        None
    }
}

/// Unwinds a stack frame by frame from a set of registers.
///
/// ```
/// use callstack::unwind::{Method, Unwinder};
/// // In-process: `callstack::capture_exact_with_info` drives an `Unwinder`
/// // over the process's own modules; a core-file reader drives one over a
/// // `ModuleSet` and its own `Memory`.
/// # let _ = Method::Cfi;
/// ```
pub struct Unwinder<'s, A: Arch, S: RuleSource<A>, F: Fallback<A> = NoFallback> {
    source: &'s S,
    fallback: F,
    regs: UnwindRegs,
    exact: bool,
    started: bool,
    /// The last step kept the stack pointer (a frame of size zero).
    flat: bool,
    stop: StopReason,
    _arch: core::marker::PhantomData<A>,
}

impl<'s, A: Arch, S: RuleSource<A>> Unwinder<'s, A, S, NoFallback> {
    /// Starts at `regs`. `pc_is_exact` is true when `regs.pc` is an
    /// interrupted pc (a signal context, a core's thread), false when it is a
    /// return address (the caller of a capture function).
    pub fn new(source: &'s S, regs: UnwindRegs, pc_is_exact: bool) -> Self {
        Self::with_fallback(source, regs, pc_is_exact, NoFallback)
    }
}

impl<'s, A: Arch, S: RuleSource<A>, F: Fallback<A>> Unwinder<'s, A, S, F> {
    /// Like [`Unwinder::new`], with a fallback for frames without CFI and
    /// without a valid frame pointer.
    pub fn with_fallback(source: &'s S, regs: UnwindRegs, pc_is_exact: bool, fallback: F) -> Self {
        Unwinder {
            source,
            fallback,
            regs,
            exact: pc_is_exact,
            started: false,
            flat: false,
            stop: StopReason::Running,
            _arch: core::marker::PhantomData,
        }
    }

    /// Walks to the end, handing each frame (the starting one first) to
    /// `each`, which returns whether to go on. Returns why the walk ended
    /// ([`StopReason::Running`] when `each` stopped it).
    ///
    /// ```
    /// # use callstack::unwind::*;
    /// # fn f<A: Arch, S: RuleSource<A>>(u: &mut Unwinder<'_, A, S>, mem: &mut impl Memory) {
    /// let mut pcs = Vec::new();
    /// let why = u.run(mem, |f| {
    ///     pcs.push(f.pc);
    ///     pcs.len() < 64
    /// });
    /// # let _ = why;
    /// # }
    /// ```
    #[inline]
    pub fn run<M: Memory + ?Sized>(
        &mut self,
        mem: &mut M,
        each: impl FnMut(&Frame) -> bool,
    ) -> StopReason {
        self.drive(mem, &mut EachFrame(each))
    }

    /// Walks to the end writing the frames' pcs (the starting one first) to
    /// `out`, after dropping the first `skip`, through the rule source's
    /// fast path ([`RuleSource::fast_walk`]) wherever it has one. Returns
    /// how many it wrote and why the walk ended
    /// ([`StopReason::BufferFull`] when `out` filled up).
    ///
    /// ```
    /// # use callstack::unwind::*;
    /// # fn f<A: Arch, S: RuleSource<A>>(u: &mut Unwinder<'_, A, S>, mem: &mut impl Memory) {
    /// let mut pcs = [0usize; 64];
    /// let (n, why) = u.run_pcs(mem, 0, &mut pcs);
    /// # let _ = (n, why);
    /// # }
    /// ```
    #[inline]
    pub fn run_pcs<M: Memory + ?Sized>(
        &mut self,
        mem: &mut M,
        skip: usize,
        out: &mut [usize],
    ) -> (usize, StopReason) {
        self.pcs_after(mem, skip, out, 0, false)
    }

    /// [`Unwinder::run_pcs`] for a walk that has already written `n` pcs
    /// to `out`, the starting frame's among them (or skipped) as a fast
    /// path wrote it (unchecked): it is not written again.
    #[inline]
    pub(crate) fn resume_pcs<M: Memory + ?Sized>(
        &mut self,
        mem: &mut M,
        skip: usize,
        out: &mut [usize],
        n: usize,
    ) -> (usize, StopReason) {
        self.pcs_after(mem, skip + 1, out, n, true)
    }

    #[inline(always)]
    fn pcs_after<M: Memory + ?Sized>(
        &mut self,
        mem: &mut M,
        skip: usize,
        out: &mut [usize],
        n: usize,
        unchecked: bool,
    ) -> (usize, StopReason) {
        if n >= out.len() {
            return (n, StopReason::BufferFull);
        }
        let mut sink = Pcs {
            skip,
            out,
            n,
            unchecked,
        };
        // `Pcs` stops a walk itself only when `out` is full.
        let why = match self.drive(mem, &mut sink) {
            StopReason::Running => StopReason::BufferFull,
            why => why,
        };
        (sink.n, why)
    }

    /// The one loop over frames: every walk of this crate runs here (in
    /// process, from a context, a core, a live process, the crash
    /// handler). Each frame goes to `v`; at a frame whose pc is a return
    /// address, `v` may first walk callers through the rule source's fast
    /// path; then the generic step ([`Unwinder::next`]).
    #[inline(always)]
    fn drive<M: Memory + ?Sized, V: Visit<A, S>>(&mut self, mem: &mut M, v: &mut V) -> StopReason {
        // The starting frame here, not through `next`: a walk the fast path
        // takes to its end makes no call.
        let mut first = self.start();
        loop {
            let f = match first.take() {
                Some(f) => f,
                None => {
                    let next = if V::FAST {
                        self.next_out_of_line(mem)
                    } else {
                        self.next(mem)
                    };
                    match next {
                        Some(f) => f,
                        None => break,
                    }
                }
            };
            if !v.frame(&f) {
                break;
            }
            if !self.exact {
                let sp = self.regs.sp;
                if let Some(stop) = v.fast(self.source, &mut self.regs, mem) {
                    self.stop = stop;
                    break;
                }
                if self.regs.sp != sp {
                    self.flat = false;
                }
            }
        }
        self.stop
    }

    /// Why the walk ended ([`StopReason::Running`] until it has).
    pub fn stop_reason(&self) -> StopReason {
        self.stop
    }

    /// The registers of the current frame.
    pub fn regs(&self) -> &UnwindRegs {
        &self.regs
    }

    /// [`Unwinder::next`] as a call of its own: the generic step stays out
    /// of the loop's body when a fast path takes most frames, and out of
    /// the registers that path keeps.
    #[inline(never)]
    fn next_out_of_line<M: Memory + ?Sized>(&mut self, mem: &mut M) -> Option<Frame> {
        self.next(mem)
    }

    /// The starting frame (method [`Method::Context`]) if the walk has not
    /// started; starts it. `None` when it had, or when the starting pc is 0.
    #[inline(always)]
    fn start(&mut self) -> Option<Frame> {
        if self.started {
            return None;
        }
        self.started = true;
        // A return address of 0 is the outermost frame's mark; an exact pc
        // of 0 is where a context stopped (a call through a null pointer),
        // which the walk goes on from.
        if self.regs.pc == 0 && !self.exact {
            self.stop = StopReason::Outermost;
            return None;
        }
        Some(Frame {
            pc: self.regs.pc,
            sp: self.regs.sp,
            fp: self.regs.fp,
            method: Method::Context,
        })
    }

    /// The next frame: the first call gives the starting frame (method
    /// [`Method::Context`]), each later one the caller. `None` when the walk
    /// has ended; see [`Unwinder::stop_reason`].
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    pub fn next<M: Memory + ?Sized>(&mut self, mem: &mut M) -> Option<Frame> {
        if !self.started {
            return self.start();
        }
        if self.stop != StopReason::Running {
            return None;
        }
        match self.step(mem) {
            Ok(Some((regs, method))) => {
                self.regs = regs;
                self.exact = method == Method::SignalFrame;
                Some(Frame {
                    pc: regs.pc,
                    sp: regs.sp,
                    fp: regs.fp,
                    method,
                })
            }
            Ok(None) => None,
            Err(e) => {
                self.stop = StopReason::Error(e);
                None
            }
        }
    }

    #[inline(always)]
    fn step<M: Memory + ?Sized>(
        &mut self,
        mem: &mut M,
    ) -> Result<Option<(UnwindRegs, Method)>, UnwindError> {
        let regs = self.regs;
        // An exact pc outside code (in the first page, or in no module the
        // source knows): a call through a bad pointer, stopped at its
        // target before anything there ran. The caller's frame is as the
        // call left it, the rule at a function's entry, if that gives a
        // return address in code; else the pc takes the usual way (JIT
        // code, say, has no module and needs the fallback).
        if self.exact && (regs.pc < 4096 || !self.source.is_code(regs.pc)) {
            if let Ok(Applied::Caller { regs: r, .. }) = A::apply(A::ENTRY, &regs, mem) {
                let ra = self.source.return_address(r.pc, r.sp);
                if ra != 0 && ra >= 4096 && self.source.is_code(ra) {
                    return self.check(mem, &regs, r, Method::Insn);
                }
            }
        }
        let addr = if self.exact {
            regs.pc
        } else {
            regs.pc.wrapping_sub(1)
        };
        let found = if self.exact {
            self.source.rule_exact(addr)
        } else {
            self.source.rule(addr)
        };
        let applied = match found {
            Found::Rule(rule) => match A::apply(rule, &regs, mem)? {
                Applied::Evaluate => match self.source.evaluate(addr, &regs, mem) {
                    Ok(a) => a,
                    Err(UnwindError::Untracked) => Applied::NoCfi,
                    Err(e) => return Err(e),
                },
                a => a,
            },
            Found::Unknown => {
                return match self.fallback.unwind_frame(&regs, self.exact, false, mem) {
                    Some((r, m)) => self.check(mem, &regs, r, m),
                    None => {
                        self.stop = StopReason::UnknownModule(regs.pc);
                        Ok(None)
                    }
                };
            }
        };
        match applied {
            Applied::Caller { regs: r, signal } => {
                let m = if signal {
                    Method::SignalFrame
                } else {
                    Method::Cfi
                };
                self.check(mem, &regs, r, m)
            }
            Applied::End => {
                self.stop = StopReason::Outermost;
                Ok(None)
            }
            Applied::NoCfi | Applied::Evaluate => {
                if self.source.is_signal_trampoline(regs.pc) {
                    let r = A::signal_frame(regs.sp, mem)?;
                    return self.check(mem, &regs, r, Method::SignalFrame);
                }
                if self.fallback.before_frame_pointer() {
                    // A frame record whose return address is a signal
                    // trampoline (a handler, or a function it tail-called,
                    // returns there) is right even though no call precedes
                    // that address, which is what a fallback checks.
                    if let Some(r) = frame_pointer_step::<A, M>(&regs, mem) {
                        if r.sp > regs.sp && self.source.is_signal_trampoline(r.pc) {
                            // The record's sp (fp + its size) is the CFA only
                            // when the record tops the frame (gcc -O0 puts it
                            // at the bottom on aarch64); the signal frame is
                            // read from that sp, so take the fallback's
                            // (instruction analysis knows the frame's size)
                            // when it finds the same trampoline.
                            if let Some((f, m)) =
                                self.fallback.unwind_frame(&regs, self.exact, true, mem)
                            {
                                // At an exact pc (frame 0, or below a signal
                                // frame) a leaf's fp is still its caller's:
                                // the record would skip the caller.
                                if (f.pc == r.pc && f.sp >= r.sp) || self.exact {
                                    return self.check(mem, &regs, f, m);
                                }
                            }
                            return self.check(mem, &regs, r, Method::FramePointer);
                        }
                    }
                    if let Some((r, m)) = self.fallback.unwind_frame(&regs, self.exact, true, mem) {
                        return self.check(mem, &regs, r, m);
                    }
                }
                if let Some(r) = frame_pointer_step::<A, M>(&regs, mem) {
                    return self.check(mem, &regs, r, Method::FramePointer);
                }
                let late = if self.fallback.before_frame_pointer() {
                    None // already asked above
                } else {
                    self.fallback.unwind_frame(&regs, self.exact, true, mem)
                };
                match late {
                    Some((r, m)) => self.check(mem, &regs, r, m),
                    None => {
                        self.stop = StopReason::NoRule(regs.pc);
                        Ok(None)
                    }
                }
            }
        }
    }

    #[inline(always)]
    fn check<M: Memory + ?Sized>(
        &mut self,
        mem: &mut M,
        old: &UnwindRegs,
        mut new: UnwindRegs,
        method: Method,
    ) -> Result<Option<(UnwindRegs, Method)>, UnwindError> {
        // A signal frame's pc is where the signal interrupted, not a return
        // address: at an exit hook's trampoline it is the trampoline's
        // first instruction, a frame of its own.
        if method != Method::SignalFrame {
            new.pc = self.source.return_address(new.pc, new.sp);
        }
        if new.pc == 0 {
            self.stop = StopReason::Outermost;
            return Ok(None);
        }
        // A handler's return address in no code the source knows may be a
        // signal trampoline it cannot read (qemu-user's page); the frame at
        // the caller's sp then says so, and the next step restores it.
        if !self.source.is_code(new.pc)
            && (method == Method::SignalFrame || !A::looks_like_signal_frame(new.sp, mem))
        {
            self.stop = StopReason::UnknownModule(new.pc);
            return Ok(None);
        }
        // The stack must move up, except across a signal frame (the handler
        // may run on an alternate stack above or below the thread's), and
        // out of a frame at an exact pc whose return address is still in a
        // register (a leaf on aarch64: same sp, another pc).
        let leaf = self.exact && new.sp == old.sp && new.pc != old.pc;
        // A frame whose CFI gives its caller its own sp: an exit hook's
        // trampoline returned to (seen from another process or a core), or
        // stopped before its push or at its final jump. One such step at a
        // time, to a new pc.
        let flat = method == Method::Cfi && new.sp == old.sp && new.pc != old.pc && !self.flat;
        if method != Method::SignalFrame && new.sp <= old.sp && !leaf && !flat {
            return Err(UnwindError::StackNotAdvancing(new.sp));
        }
        self.flat = flat;
        Ok(Some((new, method)))
    }
}

/// What a walk does with its frames ([`Unwinder::drive`]).
trait Visit<A: Arch, S: RuleSource<A>> {
    /// Whether the visitor takes the fast path ([`Visit::fast`]): the loop
    /// then calls the generic step out of line, which keeps the fast path's
    /// registers free; a walk by generic steps alone has it inline.
    const FAST: bool = false;

    /// Takes a frame; returns whether to go on.
    fn frame(&mut self, f: &Frame) -> bool;

    /// At a frame whose pc is a return address, before the generic step:
    /// may walk callers on its own, moving `regs`. `Some` ends the walk.
    #[inline(always)]
    fn fast<M: Memory + ?Sized>(
        &mut self,
        source: &S,
        regs: &mut UnwindRegs,
        mem: &mut M,
    ) -> Option<StopReason> {
        let _ = (source, regs, mem);
        None
    }
}

/// [`Unwinder::run`]'s visitor: whole frames to a closure.
struct EachFrame<F>(F);

impl<A: Arch, S: RuleSource<A>, F: FnMut(&Frame) -> bool> Visit<A, S> for EachFrame<F> {
    #[inline(always)]
    fn frame(&mut self, f: &Frame) -> bool {
        (self.0)(f)
    }
}

/// [`Unwinder::run_pcs`]'s visitor: pcs into a slice, through the rule
/// source's fast path.
struct Pcs<'o> {
    skip: usize,
    out: &'o mut [usize],
    /// How many pcs are in `out`.
    n: usize,
    /// The current frame's pc was written by the fast path, unchecked.
    unchecked: bool,
}

impl<A: Arch, S: RuleSource<A>> Visit<A, S> for Pcs<'_> {
    const FAST: bool = true;

    #[inline(always)]
    fn frame(&mut self, f: &Frame) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return true;
        }
        self.out[self.n] = f.pc as usize;
        self.n += 1;
        self.n < self.out.len()
    }

    #[inline(always)]
    fn fast<M: Memory + ?Sized>(
        &mut self,
        source: &S,
        regs: &mut UnwindRegs,
        mem: &mut M,
    ) -> Option<StopReason> {
        loop {
            let (k, end) = if self.skip > 0 {
                // Where the fast path writes the frames it skips.
                let mut scratch = [0usize; 8];
                let m = self.skip.min(scratch.len());
                let (k, e) = source.fast_walk(regs, &mut scratch[..m]);
                self.skip -= k;
                (k, e)
            } else {
                let (k, e) = source.fast_walk(regs, &mut self.out[self.n..]);
                self.n += k;
                (k, e)
            };
            self.unchecked |= k > 0;
            match end {
                FastEnd::Full if self.n == self.out.len() => return Some(StopReason::BufferFull),
                FastEnd::Full => continue,
                FastEnd::Outermost => return Some(StopReason::Outermost),
                FastEnd::Slow => {}
            }
            // The fast path stops at a return address it has no rule for,
            // after writing it: an exit hook's trampoline is one, which
            // stands for the original return address (its own rule, a DWARF
            // expression, is the slow way to the same caller).
            let ra = source.return_address(regs.pc, regs.sp);
            let written = self.n > 0 && self.out[self.n - 1] == regs.pc as usize;
            if ra == regs.pc {
                // The fast path writes a return address before it looks for
                // its rule: one it found none for may be garbage read
                // through a corrupt frame, which the generic step would not
                // have given (its callers are checked in `check`, which
                // also lets a signal frame's unreadable trampoline pass).
                if core::mem::take(&mut self.unchecked)
                    && !source.is_code(regs.pc)
                    && !A::looks_like_signal_frame(regs.sp, mem)
                {
                    self.n -= written as usize;
                    return Some(StopReason::UnknownModule(regs.pc));
                }
                return None;
            }
            if ra == 0 {
                self.n -= written as usize;
                return Some(StopReason::Outermost);
            }
            if written {
                self.out[self.n - 1] = ra as usize;
            }
            regs.pc = ra;
            self.unchecked = false;
        }
    }
}

/// The frame-pointer rule: the frame record at `fp` holds the caller's
/// frame pointer and return address. `None` when `fp` is not a plausible
/// record (below `sp`, misaligned, unreadable).
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub fn frame_pointer_step<A: Arch, M: Memory + ?Sized>(
    regs: &UnwindRegs,
    mem: &mut M,
) -> Option<UnwindRegs> {
    let rec = A::FRAME_RECORD;
    // The record's start (the frame pointer itself but on RISC-V).
    let at = regs.fp.checked_sub(rec.below as u64)?;
    if at < regs.sp || at & (rec.align as u64 - 1) != 0 {
        return None;
    }
    // A record at the very top of the address space is not one.
    let sp = at.checked_add(16)?;
    let next_fp = mem.read_u64(at + rec.fp_offset as u64).ok()?;
    let ra = mem.read_u64(at + rec.ra_offset as u64).ok()?;
    Some(UnwindRegs {
        pc: ra,
        sp,
        fp: next_fp,
        lr: 0,
    })
}

#[cfg(test)]
mod tests {
    //! The loop's handling of a rule source's fast path, with a scripted
    //! source: which frames it may write, and what the generic step does
    //! after it.
    use super::*;
    use crate::arch::x86_64::X86_64;
    use crate::types::ReadError;

    const CODE: u64 = 0x40_0000;
    /// In the code: the fast path writes [`GARBAGE`] from here.
    const TO_GARBAGE: u64 = CODE + 0x10;
    /// In the code: the fast path writes [`GOOD`] from here.
    const TO_GOOD: u64 = CODE + 0x20;
    const GOOD: u64 = CODE + 0x30;
    const GARBAGE: u64 = 0x7f98_eed2_0000_5621;
    const STACK: u64 = 0x10_0000;

    /// Code in `[CODE, CODE + 4096)` without CFI (the frame-pointer rule).
    struct Scripted;

    impl RuleSource<X86_64> for Scripted {
        fn rule(&self, addr: u64) -> Found<<X86_64 as Arch>::Rule> {
            if self.is_code(addr) {
                Found::Rule(X86_64::NO_CFI)
            } else {
                Found::Unknown
            }
        }

        fn is_code(&self, ra: u64) -> bool {
            ra.wrapping_sub(CODE) < 4096
        }

        fn fast_walk(&self, regs: &mut UnwindRegs, out: &mut [usize]) -> (usize, FastEnd) {
            let next = match regs.pc {
                TO_GARBAGE => GARBAGE,
                TO_GOOD => GOOD,
                _ => return (0, FastEnd::Slow),
            };
            out[0] = next as usize;
            regs.pc = next;
            regs.sp += 16;
            (1, FastEnd::Slow)
        }
    }

    /// Words at `STACK`: one frame record, `[0, GOOD]`.
    struct Record;

    impl Memory for Record {
        fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
            match addr.wrapping_sub(STACK) {
                0 => Ok(0),
                8 => Ok(GOOD),
                _ => Err(ReadError::OutOfBounds(addr)),
            }
        }
    }

    fn walk(pc: u64, exact: bool, skip: usize, len: usize) -> (Vec<u64>, StopReason) {
        let regs = UnwindRegs {
            pc,
            sp: STACK,
            fp: STACK,
            lr: 0,
        };
        let mut out = vec![0usize; len];
        let (n, why) = Unwinder::new(&Scripted, regs, exact).run_pcs(&mut Record, skip, &mut out);
        (out[..n].iter().map(|&p| p as u64).collect(), why)
    }

    #[test]
    fn a_fast_path_frame_outside_code_is_dropped() {
        assert_eq!(
            walk(TO_GARBAGE, false, 0, 8),
            (vec![TO_GARBAGE], StopReason::UnknownModule(GARBAGE))
        );
        assert_eq!(
            walk(TO_GARBAGE, false, 1, 8),
            (vec![], StopReason::UnknownModule(GARBAGE))
        );
    }

    #[test]
    fn a_fast_path_frame_in_code_takes_the_generic_step() {
        // GOOD has no rule but the frame pointer's, and its frame pointer
        // (STACK) now lies below its stack pointer: the walk ends there.
        assert_eq!(
            walk(TO_GOOD, false, 0, 8),
            (vec![TO_GOOD, GOOD], StopReason::NoRule(GOOD))
        );
        assert_eq!(
            walk(TO_GOOD, false, 0, 1),
            (vec![TO_GOOD], StopReason::BufferFull)
        );
    }

    #[test]
    fn no_fast_path_at_an_exact_pc() {
        // From an exact pc the generic step reads the record at STACK.
        assert_eq!(
            walk(TO_GARBAGE, true, 0, 8),
            (vec![TO_GARBAGE, GOOD], StopReason::NoRule(GOOD))
        );
    }

    #[test]
    fn an_exact_pc_in_the_first_page_is_a_call_through_a_null_pointer() {
        // The caller's return address is where the call left it, on top of
        // the stack (at STACK + 8 here: the rule at a function's entry reads
        // [sp], so start one word lower), not in the frame record.
        let regs = UnwindRegs {
            pc: 0,
            sp: STACK + 8,
            fp: STACK,
            lr: 0,
        };
        let mut out = [0usize; 8];
        let (n, _) = Unwinder::new(&Scripted, regs, true).run_pcs(&mut Record, 0, &mut out);
        assert_eq!(&out[..2], &[0, GOOD as usize]);
        assert!(n >= 2);
        // A return address of 0 still ends a walk before it starts.
        let regs = UnwindRegs { pc: 0, ..regs };
        let (n, why) = Unwinder::new(&Scripted, regs, false).run_pcs(&mut Record, 0, &mut out);
        assert_eq!((n, why), (0, StopReason::Outermost));
    }

    #[test]
    fn the_entry_rule_is_the_frame_a_call_leaves() {
        use crate::arch::aarch64::Aarch64;
        // AArch64: the return address still in x30, sp unchanged.
        let regs = UnwindRegs {
            pc: 0,
            sp: STACK,
            fp: 7,
            lr: GOOD,
        };
        let want = UnwindRegs {
            pc: GOOD,
            sp: STACK,
            fp: 7,
            lr: 0,
        };
        assert_eq!(
            Aarch64::apply(Aarch64::ENTRY, &regs, &mut Record),
            Ok(Applied::Caller {
                regs: want,
                signal: false
            })
        );
        // x86-64: the return address on top of the stack, popped.
        let regs = UnwindRegs {
            sp: STACK + 8,
            ..regs
        };
        let want = UnwindRegs {
            sp: STACK + 16,
            ..want
        };
        assert_eq!(
            X86_64::apply(X86_64::ENTRY, &regs, &mut Record),
            Ok(Applied::Caller {
                regs: want,
                signal: false
            })
        );
    }
}
