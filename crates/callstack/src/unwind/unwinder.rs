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

/// Where the unwinder gets the rule of an address (a runtime address).
///
/// Implemented by [`crate::unwind::ModuleSet`] (compiled tables of modules
/// at their load bias: core files, other processes) and by the in-process
/// source behind [`crate::capture_exact`].
pub trait RuleSource<A: Arch> {
    /// The rule of the lookup address `addr`.
    fn rule(&self, addr: u64) -> Found<A::Rule>;

    /// Evaluates the CFI of `addr` directly and applies it (for rows that
    /// are [`Arch::EVALUATE`]). Must not allocate when used in-process.
    fn evaluate<M: Memory + ?Sized>(
        &self,
        addr: u64,
        regs: &UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, UnwindError>;

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
    /// `each`, which returns whether to go on: the one loop over frames
    /// that the walks of this crate drive (in process, from a context, a
    /// core, a live process). Returns why the walk ended
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
        mut each: impl FnMut(&Frame) -> bool,
    ) -> StopReason {
        while let Some(f) = self.next(mem) {
            if !each(&f) {
                break;
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

    /// The next frame: the first call gives the starting frame (method
    /// [`Method::Context`]), each later one the caller. `None` when the walk
    /// has ended; see [`Unwinder::stop_reason`].
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    pub fn next<M: Memory + ?Sized>(&mut self, mem: &mut M) -> Option<Frame> {
        if !self.started {
            self.started = true;
            if self.regs.pc == 0 {
                self.stop = StopReason::Outermost;
                return None;
            }
            return Some(Frame {
                pc: self.regs.pc,
                sp: self.regs.sp,
                fp: self.regs.fp,
                method: Method::Context,
            });
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
        let addr = if self.exact {
            regs.pc
        } else {
            regs.pc.wrapping_sub(1)
        };
        let applied = match self.source.rule(addr) {
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
                    Some((r, m)) => self.check(&regs, r, m),
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
                self.check(&regs, r, m)
            }
            Applied::End => {
                self.stop = StopReason::Outermost;
                Ok(None)
            }
            Applied::NoCfi | Applied::Evaluate => {
                if self.source.is_signal_trampoline(regs.pc) {
                    let r = A::signal_frame(regs.sp, mem)?;
                    return self.check(&regs, r, Method::SignalFrame);
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
                                    return self.check(&regs, f, m);
                                }
                            }
                            return self.check(&regs, r, Method::FramePointer);
                        }
                    }
                    if let Some((r, m)) = self.fallback.unwind_frame(&regs, self.exact, true, mem) {
                        return self.check(&regs, r, m);
                    }
                }
                if let Some(r) = frame_pointer_step::<A, M>(&regs, mem) {
                    return self.check(&regs, r, Method::FramePointer);
                }
                let late = if self.fallback.before_frame_pointer() {
                    None // already asked above
                } else {
                    self.fallback.unwind_frame(&regs, self.exact, true, mem)
                };
                match late {
                    Some((r, m)) => self.check(&regs, r, m),
                    None => {
                        self.stop = StopReason::NoRule(regs.pc);
                        Ok(None)
                    }
                }
            }
        }
    }

    #[inline(always)]
    fn check(
        &mut self,
        old: &UnwindRegs,
        mut new: UnwindRegs,
        method: Method,
    ) -> Result<Option<(UnwindRegs, Method)>, UnwindError> {
        new.pc = self.source.return_address(new.pc, new.sp);
        if new.pc == 0 {
            self.stop = StopReason::Outermost;
            return Ok(None);
        }
        // The stack must move up, except across a signal frame (the handler
        // may run on an alternate stack above or below the thread's), and
        // out of a frame at an exact pc whose return address is still in a
        // register (a leaf on aarch64: same sp, another pc).
        let leaf = self.exact && new.sp == old.sp && new.pc != old.pc;
        // A frame of size zero whose CFI says so (CFA = sp): an exit hook's
        // trampoline, seen from another process or a core. One such step
        // at a time, to a new pc.
        let flat = method == Method::Cfi && new.sp == old.sp && new.pc != old.pc && !self.flat;
        if method != Method::SignalFrame && new.sp <= old.sp && !leaf && !flat {
            return Err(UnwindError::StackNotAdvancing(new.sp));
        }
        self.flat = flat;
        Ok(Some((new, method)))
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
    let fp = regs.fp;
    if fp < regs.sp || fp & (rec.align as u64 - 1) != 0 {
        return None;
    }
    // A record at the very top of the address space is not one.
    let sp = fp.checked_add(16)?;
    let next_fp = mem.read_u64(fp + rec.fp_offset as u64).ok()?;
    let ra = mem.read_u64(fp + rec.ra_offset as u64).ok()?;
    Some(UnwindRegs {
        pc: ra,
        sp,
        fp: next_fp,
        lr: 0,
    })
}
