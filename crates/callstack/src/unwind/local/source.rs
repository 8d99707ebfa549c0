//! The rule source of a walk in this process: rules from the rule cache,
//! the snapshot's compiled tables or the CFI of a module only
//! `_dl_find_object` knows, and the modules whose rules went into the cache
//! that way.

use core::cell::Cell;
use core::sync::atomic::Ordering;

use super::cache::{cache_get, cache_put, cache_rule, clear_cache, unpack_cached};
use super::flags::FLAGS;
use super::hot::{hot_run, Hot};
use super::loader::{dl_find, sections_from_hdr, DlModule};
use super::snapshot::{published, unloaded, LocalModule, Snapshot};
use super::A;
use crate::arch::{Applied, Arch};
use crate::unwind::cfi::{self, FdeAt};
use crate::unwind::code::CodeCheck;
use crate::unwind::{FastEnd, Found, Memory, RuleSource, UnwindError, UnwindRegs};

pub(crate) struct LocalSource {
    snap: Option<&'static Snapshot>,
    last: Cell<Option<DlModule>>,
    /// Whether the rule cache held anything when the walk began: if not
    /// (the first capture of the process), the walk only writes it, so each
    /// of its pages is faulted in once (a read first would map the zero
    /// page, and the write then fault again).
    pub(super) read_cache: bool,
    /// The module this walk last noted in [`SEEN`] (frames in a row mostly
    /// share a module: the table is scanned once per module, not per frame).
    seen: Cell<Option<DlModule>>,
    /// The walk's last CIE (see [`crate::unwind::cfi_fast::CieMemo`]).
    cie: crate::unwind::cfi_fast::CieCache,
    /// The stack the walk starts on, `[lo, hi)`: the rule cache's fast
    /// path walks frames on it (frames on another, after a signal frame on
    /// an alternate stack, take the generic step).
    stack: (u64, u64),
    /// The executable ranges the walk has met (callers' return addresses
    /// must lie in one).
    code: Cell<CodeCheck>,
}

impl LocalSource {
    #[inline(always)]
    pub(crate) fn new(stack: (u64, u64)) -> Self {
        LocalSource {
            snap: published(),
            last: Cell::new(None),
            read_cache: FLAGS.cache_used.load(Ordering::Relaxed),
            seen: Cell::new(None),
            cie: Default::default(),
            stack,
            code: Cell::new(CodeCheck::new()),
        }
    }

    /// [`seen_module`], once per module per walk.
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn note_seen(&self, d: DlModule) -> bool {
        if self.seen.get() == Some(d) {
            return true;
        }
        let ok = seen_module(d);
        if ok {
            self.seen.set(Some(d));
        }
        ok
    }

    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn dl_module(&self, addr: u64) -> Option<DlModule> {
        if let Some(m) = self.last.get() {
            if m.start <= addr && addr < m.end {
                return Some(m);
            }
        }
        let m = dl_find(addr)?;
        self.last.set(Some(m));
        Some(m)
    }

    /// The snapshot's module holding `addr`, if it is still the object
    /// loaded there (see [`LocalModule::live`]).
    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn module(&self, addr: u64) -> Option<&'static LocalModule> {
        let s = self.snap?;
        let m = s.find(addr)?;
        if m.still_loaded(addr, |a| self.dl_module(a)) {
            return Some(m);
        }
        unloaded(s);
        None
    }
}

impl RuleSource<A> for LocalSource {
    #[inline(always)]
    fn return_address(&self, ra: u64, sp: u64) -> u64 {
        crate::unwind::hook_table::resolve(ra, sp)
    }

    /// A caller outside the code of the loaded modules is garbage read as a
    /// return address.
    #[inline(always)]
    fn is_code(&self, ra: u64) -> bool {
        let mut c = self.code.get();
        let ok = c.is_code(ra as usize);
        self.code.set(c);
        ok
    }

    /// The rule cache's hot loop ([`hot_run`]) on the walk's first stack.
    /// Before the first rule is cached (this walk may cache the first ones)
    /// the cache is not even read: its pages are then faulted in by writes
    /// only.
    #[inline(always)]
    fn fast_walk(&self, regs: &mut UnwindRegs, out: &mut [usize]) -> (usize, FastEnd) {
        let (lo, hi) = self.stack;
        if !self.read_cache || regs.sp < lo || regs.sp >= hi {
            return (0, FastEnd::Slow);
        }
        let mut hot = Hot {
            pc: regs.pc,
            sp: regs.sp,
            fp: regs.fp,
        };
        // SAFETY: `out.len()` slots at `out`; `hot.sp` lies in the stack
        // whose top is `hi`, and `hot.pc` is a return address (the
        // unwinder's promise).
        let (mut k, mut end) = unsafe { hot_run(&mut hot, hi, out.as_mut_ptr(), out.len()) };
        // A frame whose word holds a machine-code rule: taken out of line
        // (`insn_frames`) when the generic step would take it the same way.
        #[cfg(any(callstack_insn, callstack_risc_insn))]
        if end == FastEnd::Slow
            && cache_get(hot.pc.wrapping_sub(1)) & 0xf000 == crate::arch::native::exact::INSN_MARK
        {
            (k, end) = insn_frames(self, &mut hot, hi, out, k);
        }
        if k > 0 {
            *regs = UnwindRegs {
                pc: hot.pc,
                sp: hot.sp,
                fp: hot.fp,
                lr: 0,
            };
        }
        (k, end)
    }

    #[inline(always)]
    fn rule(&self, addr: u64) -> Found<<A as Arch>::Rule> {
        if self.read_cache {
            let p = cache_get(addr);
            if p != 0 {
                return Found::Rule(unpack_cached(p));
            }
        }
        self.rule_slow(addr)
    }

    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn evaluate<M: Memory + ?Sized>(
        &self,
        addr: u64,
        regs: &UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, UnwindError> {
        // Interrupted in the exit-hook trampoline where its frame is empty
        // (before it pushes the original return address, at its final
        // jump): the caller's pc is in the hook table or just below `sp`,
        // which the CFI also says but a walk's memory may not reach.
        if let Some(pc) = crate::unwind::hook_table::in_trampoline(addr, regs, mem) {
            return Ok(Applied::Caller {
                regs: UnwindRegs { pc, ..*regs },
                signal: false,
            });
        }
        if let Some(m) = self.module(addr) {
            let svma = addr.wrapping_sub(m.bias);
            let t = &m.table;
            return cfi::evaluate::<A, M>(
                &t.sections(),
                t.fde_for_evaluation(svma),
                svma,
                regs,
                mem,
            );
        }
        match self.dl_module(addr) {
            Some(d) => match sections_from_hdr(d.eh_frame_hdr, d.end) {
                Some(secs) => cfi::evaluate::<A, M>(&secs, FdeAt::Search, addr, regs, mem),
                None => Ok(Applied::NoCfi),
            },
            None => Ok(Applied::NoCfi),
        }
    }

    /// By the code at `pc`, where the architecture recognises its signal
    /// trampoline that way in process (`exact::LOCAL_SIGRETURN_BYTES`, 0
    /// where its CFI is relied on instead).
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn is_signal_trampoline(&self, pc: u64) -> bool {
        #[cfg(callstack_native)]
        {
            use crate::arch::native::exact::{is_sigreturn_trampoline, LOCAL_SIGRETURN_BYTES};
            if LOCAL_SIGRETURN_BYTES == 0 {
                return false;
            }
            let known = match self.snap {
                Some(s) => s.in_code(pc) && self.module(pc).is_some(),
                None => false,
            };
            if !known {
                return false;
            }
            // SAFETY: `pc` is at least 16 bytes (no fewer than
            // `LOCAL_SIGRETURN_BYTES`) below the end of an executable
            // segment of a module still loaded (checked with
            // `_dl_find_object` when glibc has it): mapped and readable.
            let code =
                unsafe { core::slice::from_raw_parts(pc as *const u8, LOCAL_SIGRETURN_BYTES) };
            is_sigreturn_trampoline(code)
        }
        #[cfg(not(callstack_native))]
        {
            let _ = pc;
            false
        }
    }
}

impl LocalSource {
    #[cold]
    #[inline(never)]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn rule_slow(&self, addr: u64) -> Found<<A as Arch>::Rule> {
        if let Some(m) = self.module(addr) {
            let rule = m.table.lookup(addr.wrapping_sub(m.bias));
            cache_put(addr, cache_rule(rule));
            return Found::Rule(rule);
        }
        if let Some(d) = self.dl_module(addr) {
            if self.seen.get() != Some(d) {
                FLAGS.stale.store(true, Ordering::Relaxed);
            }
            // The rule from the CFI directly, cached like a table's (so the
            // next capture through here takes the hot loop, prepared or
            // not) once the module is noted in `SEEN`.
            let Some(secs) = sections_from_hdr(d.eh_frame_hdr, d.end) else {
                return Found::Rule(A::EVALUATE);
            };
            let rule = cfi::rule_at::<A>(&secs, addr, &self.cie);
            let p = cache_rule(rule);
            if p != 0 && rule != A::EVALUATE && self.note_seen(d) {
                cache_put(addr, p);
            }
            return Found::Rule(rule);
        }
        Found::Unknown
    }
}

/// Notes that the rules of `d` (found by `_dl_find_object` now) go into the
/// rule cache; false when they must not (the table of modules is full).
///
/// This is how a cached rule of an unloaded library is kept from being
/// taken for another: if a noted module overlaps `d` but is not `d` (other
/// mapping or other `.eh_frame_hdr`), it was unloaded (`dlclose`) and `d`
/// loaded in its place, so the cache, which may hold its rules, is cleared
/// and its slot given to `d`. Like the snapshot's check, this runs on a
/// cache miss (the first return address of the new library that is not a
/// cached key of the old one). Lock-free, async-signal-safe.
#[cold]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn seen_module(d: DlModule) -> bool {
    if d.start == 0 || d.end <= d.start || d.eh_frame_hdr == 0 {
        return false;
    }
    let mut free = None;
    for (i, m) in FLAGS.seen.iter().enumerate() {
        let start = m.start.load(Ordering::Acquire);
        if start == 0 {
            free = free.or(Some(i));
            continue;
        }
        let end = m.end.load(Ordering::Acquire);
        let hdr = m.hdr.load(Ordering::Acquire);
        if end == 0 || hdr == 0 {
            continue;
        }
        if start == d.start && end == d.end && hdr == d.eh_frame_hdr {
            return true;
        }
        if start < d.end && d.start < end {
            // Another object was loaded here: not any more.
            clear_cache();
            m.end.store(0, Ordering::Release);
            m.hdr.store(0, Ordering::Release);
            m.start.store(d.start, Ordering::Release);
            m.end.store(d.end, Ordering::Release);
            m.hdr.store(d.eh_frame_hdr, Ordering::Release);
            return true;
        }
    }
    // A free slot (claimed against concurrent captures).
    for m in FLAGS.seen.iter().skip(free.unwrap_or(FLAGS.seen.len())) {
        if m.start
            .compare_exchange(0, d.start, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            m.end.store(d.end, Ordering::Release);
            m.hdr.store(d.eh_frame_hdr, Ordering::Release);
            return true;
        }
    }
    false
}

/// The rest of [`LocalSource::fast_walk`] from a frame whose rule-cache
/// word holds a machine-code rule (`hot`, `k` frames written to `out`):
/// such frames by [`insn_caller`] while it takes them, the hot loop between
/// them. Out of line, so that walks through CFI alone do not carry it.
#[cfg(any(callstack_insn, callstack_risc_insn))]
#[cold]
#[inline(never)]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn insn_frames(
    source: &LocalSource,
    hot: &mut Hot,
    hi: u64,
    out: &mut [usize],
    mut k: usize,
) -> (usize, FastEnd) {
    loop {
        let Some(n) = insn_caller(source, hot) else {
            return (k, FastEnd::Slow);
        };
        out[k] = n.pc as usize;
        k += 1;
        *hot = n;
        if k == out.len() {
            return (k, FastEnd::Full);
        }
        // SAFETY: `out.len() - k` slots at `out + k` (`k < out.len()`);
        // `hot.sp` lies in the stack whose top is `hi` (`insn_caller`
        // checks it), and `hot.pc` is a return address.
        let (j, end) = unsafe { hot_run(hot, hi, out.as_mut_ptr().add(k), out.len() - k) };
        k += j;
        if end != FastEnd::Slow {
            return (k, end);
        }
    }
}

// Frames the warm path took by machine-code rules from the rule cache, on
// this thread (unit tests check that a warm capture through code without
// CFI takes them).
#[cfg(all(test, any(callstack_insn, callstack_risc_insn)))]
std::thread_local! {
    pub(super) static INSN_FRAMES: Cell<usize> = const { Cell::new(0) };
}

/// The caller of the frame at `hot` (its pc a return address, written),
/// when its rule-cache word holds a machine-code rule (`code::settle`) and
/// the generic step would find the same caller by it: everything the
/// generic step and the fallback's step decide against the stack is
/// checked again here, in their order. The frame has no CFI (the word says
/// so) and is not the signal trampoline (a settled rule's analysis says
/// so); a frame record at `rbp` whose return address is the signal
/// trampoline is taken by the generic step first; the rule's caller must
/// lie above the frame on this stack and its return address pass the
/// strict check (it follows a call into this function: the code's answer
/// for that address, from the analysis cache), be code and not an exit
/// hook's trampoline. `None` when anything differs or cannot be read on
/// this stack: the generic step then takes the frame, as on a cold walk.
#[cfg(callstack_insn)]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn insn_caller(source: &LocalSource, hot: &Hot) -> Option<Hot> {
    use crate::arch::native::exact::unpack_insn;
    use crate::arch::native::instruction_analysis::unwinder::strict_return;
    use crate::arch::native::UnwindRuleX86_64 as R;
    let lookup = hot.pc.wrapping_sub(1);
    let (p, mut mem, regs, hi) = insn_frame(source, hot)?;
    let rule = unpack_insn(p)?;
    if !crate::unwind::insn::is_warm() {
        return None;
    }
    let analyses = crate::unwind::insn::cache::fallback_cache();
    // The generic step's frame record (`frame_pointer_step`): one whose
    // return address is the signal trampoline is the generic step's.
    if regs.fp >= regs.sp && regs.fp % 8 == 0 {
        if let Some(end) = regs.fp.checked_add(16) {
            if end > hi {
                return None;
            }
            let ra = mem.read_u64(regs.fp + 8).ok()?;
            if source.is_signal_trampoline(ra) {
                return None;
            }
        }
    }
    // `rbp` saved under an `rbp`-based CFA: the analysis reads the slot
    // wherever it is, `apply` only at or above `rsp`.
    if let R::Bp { cfa, bp } = rule {
        if bp != 0
            && regs
                .fp
                .wrapping_add(cfa as u64)
                .wrapping_add(bp as i64 as u64)
                < regs.sp
        {
            return None;
        }
    }
    let n = match A::apply(rule, &regs, &mut mem) {
        Ok(Applied::Caller {
            regs: n,
            signal: false,
        }) => n,
        _ => return None,
    };
    if n.sp <= regs.sp || n.sp > hi || n.pc == 0 {
        return None;
    }
    let mut code = super::code::LocalCode::new();
    if !strict_return(&mut code, Some(analyses), n.pc, lookup) {
        return None;
    }
    insn_taken(source, n)
}

/// The caller of the frame at `hot` (its pc a return address, written),
/// when its rule-cache word holds a machine-code rule (`code::settle`:
/// AArch64, RISC-V 64) and the generic step would find the same caller by
/// it: the frame has no CFI (the word says so), and the generic step then
/// asks the machine-code step, which takes the rule its analysis gives
/// (the cached one: the code decides it) when the stack agrees
/// (`arch::risc::caller_by_rule`, the same check); the caller must then be
/// code and not an exit hook's trampoline. The signal trampoline is not
/// recognised by its code in process on these architectures, and a
/// settled address is none. `None` when anything differs or cannot be read
/// on this stack: the generic step then takes the frame, as on a cold
/// walk.
#[cfg(callstack_risc_insn)]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn insn_caller(source: &LocalSource, hot: &Hot) -> Option<Hot> {
    let (p, mut mem, regs, hi) = insn_frame(source, hot)?;
    let mut code = super::code::LocalCode::new();
    let n = crate::arch::risc::insn_caller::<crate::arch::native::instruction_analysis::Arch, _, _>(
        p, &regs, &mut mem, &mut code, hi,
    )?;
    insn_taken(source, n)
}

/// What both architectures' `insn_caller` start from: the marked word of
/// the frame at `hot` (its pc a return address), found under the analysis
/// cache's current generation (else the code may have changed: all are
/// dropped, the frame takes the generic step), the frame on this walk's
/// stack, a reader of that stack and the frame's registers, and the
/// stack's top.
#[cfg(any(callstack_insn, callstack_risc_insn))]
#[inline]
fn insn_frame(
    source: &LocalSource,
    hot: &Hot,
) -> Option<(u16, crate::stack::StackMemory, UnwindRegs, u64)> {
    use crate::arch::native::exact::INSN_MARK;
    if !source.read_cache || hot.pc == 0 {
        return None;
    }
    let p = cache_get(hot.pc.wrapping_sub(1));
    if p & 0xf000 != INSN_MARK {
        return None;
    }
    let analyses = crate::unwind::insn::cache::fallback_cache();
    if !super::cache::insn_words_current(analyses.generation()) {
        return None;
    }
    let (lo, hi) = source.stack;
    if hot.sp < lo || hot.sp >= hi {
        return None;
    }
    let mem = crate::stack::StackMemory::with_bounds(lo as usize, hi as usize);
    let regs = UnwindRegs {
        pc: hot.pc,
        sp: hot.sp,
        fp: hot.fp,
        lr: 0,
    };
    Some((p, mem, regs, hi))
}

/// The caller `n` that an `insn_caller` found, when the generic step's own
/// check would take it too: code, and not an exit hook's trampoline.
#[cfg(any(callstack_insn, callstack_risc_insn))]
#[inline]
fn insn_taken(source: &LocalSource, n: UnwindRegs) -> Option<Hot> {
    if n.pc == 0 || !source.is_code(n.pc) || source.return_address(n.pc, n.sp) != n.pc {
        return None;
    }
    #[cfg(test)]
    INSN_FRAMES.with(|c| c.set(c.get() + 1));
    Some(Hot {
        pc: n.pc,
        sp: n.sp,
        fp: n.fp,
    })
}
