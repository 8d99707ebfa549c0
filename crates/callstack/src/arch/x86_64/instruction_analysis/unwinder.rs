//! One unwind step for a frame without CFI, and a walk made of such steps.
//!
//! The order, for a frame at `pc`:
//! 1. the function's start known (symbol): prologue analysis from the start
//!    to the pc ([`super::prologue`]);
//! 2. epilogue analysis from the pc to a `ret` ([`super::epilogue`]);
//! 3. the frame pointer, if `rbp` points at a believable frame record: a
//!    frame-pointer rule is never discarded because the prologue looks
//!    unusual;
//! 4. stack scanning ([`crate::arch::scan`]), each candidate checked
//!    by prologue analysis from the call's target.
//!
//! Each candidate return address must point right after a call instruction;
//! a direct call must target the function that holds the pc (its symbol, or
//! a start at or below the pc) for the candidate to pass the strict check.
//! Candidates that only pass a lenient check (a call, but an indirect one or
//! to another function: tail calls) are used only when no strict one exists.
//!
//! A return address that follows a call that never returns (`abort`, a
//! `.cold` part's last call: the bytes after it are padding) says nothing
//! through the code after it, and in code without frame pointers `rbp` may
//! hold an outer frame's record: such a frame skips 3 and is scanned. A
//! frame record at `rbp` that passes the strict check still wins when
//! scanning found no candidate below its return-address slot (the scan
//! reached that slot, or passed it: a signal trampoline is no scan
//! candidate); only a candidate below the record makes `rbp` doubtful.

use super::{epilogue, prologue};
use crate::arch::scan::{self, CallBefore, MAX_FUNCTION_SIZE};
use crate::arch::x86_64::insn_cache::{FrameAnalysis, InsnCache, RaInfo};
use crate::arch::x86_64::signal::is_trampoline;
use crate::types::Memory;
use crate::types::{Base, CodeMemory, InsnRule, Method, UnwindRegs};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, OpKind};

/// The call instruction that ends right before `ra`, decoded.
///
/// ```text
/// e8 xx xx xx xx        call rel32        -> Direct(ra + rel32)
/// ff d0 / 41 ff d3      call rax / r11    -> Indirect
/// ff 15 xx xx xx xx     call [rip+x]      -> Indirect
/// ff 54 24 08           call [rsp+8]      -> Indirect
/// ```
pub fn call_before<C: CodeMemory + ?Sized>(code: &mut C, ra: u64) -> Option<CallBefore> {
    let mut buf = [0u8; 16];
    let start = ra.checked_sub(16)?;
    if code.read_code(start, &mut buf) != 16 {
        // Near the start of a mapping: try a shorter window.
        let mut b7 = [0u8; 7];
        let s7 = ra.checked_sub(7)?;
        if code.read_code(s7, &mut b7) != 7 {
            return None;
        }
        buf[9..].copy_from_slice(&b7);
    }
    let mut ins = Instruction::default();
    // A direct call is 5 bytes (e8 rel32); indirect ones 2 to 7 (and 9/10
    // with prefixes, rare).
    for len in [5usize, 2, 3, 6, 7, 4] {
        let s = 16 - len;
        let mut dec = Decoder::with_ip(64, &buf[s..], ra - len as u64, DecoderOptions::NONE);
        dec.decode_out(&mut ins);
        if ins.is_invalid() || ins.len() != len {
            continue;
        }
        match ins.flow_control() {
            FlowControl::Call if ins.op0_kind() == OpKind::NearBranch64 => {
                return Some(CallBefore::Direct(ins.near_branch_target()))
            }
            FlowControl::IndirectCall => return Some(CallBefore::Indirect),
            _ => {}
        }
    }
    None
}

/// Where the step found the caller, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepResult {
    /// The caller's registers (`pc` is the return address).
    pub regs: UnwindRegs,
    /// How it was found.
    pub method: Method,
}

fn read_rule<M: Memory + ?Sized>(
    rule: &InsnRule,
    regs: &UnwindRegs,
    mem: &mut M,
) -> Option<UnwindRegs> {
    rule.apply(regs, mem, 8).ok()
}

/// How a candidate return address relates to the frame.
#[derive(PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
enum Check {
    Bad,
    /// In code known to be there whose bytes the reader lacks (see
    /// [`CodeMemory::is_unread_code`]): believed after every checked
    /// candidate, scanning's included.
    Unread,
    Lenient,
    Strict,
}

/// A cache and the generation read before any code was.
type CacheRef<'a> = Option<(&'a InsnCache, u32)>;

/// A code reader with the cache beside it, for stack scanning (which takes
/// a plain function to decode the call before a candidate).
struct Cached<'a, C: ?Sized> {
    code: &'a mut C,
    cache: CacheRef<'a>,
}

impl<C: CodeMemory + ?Sized> CodeMemory for Cached<'_, C> {
    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        self.code.read_code(addr, buf)
    }

    fn is_executable(&mut self, addr: u64) -> bool {
        self.code.is_executable(addr)
    }

    fn function_bounds(&mut self, addr: u64) -> Option<(u64, u64)> {
        self.code.function_bounds(addr)
    }

    fn function_entry(&mut self, addr: u64) -> Option<(u64, Option<(u64, u64)>)> {
        self.code.function_entry(addr)
    }

    fn is_return_trampoline(&mut self, addr: u64) -> bool {
        self.code.is_return_trampoline(addr)
    }

    fn is_unread_code(&mut self, addr: u64) -> bool {
        self.code.is_unread_code(addr)
    }
}

/// [`call_before`], through the cache's return-address entries.
fn call_before_cached<C: CodeMemory + ?Sized>(
    c: &mut Cached<'_, C>,
    ra: u64,
) -> Option<CallBefore> {
    if c.cache.is_none() {
        return call_before(c.code, ra);
    }
    match ra_info(c.code, c.cache, ra) {
        // The trampoline's entry does not say (no call precedes it, as a
        // return address it is taken for itself).
        Some(i) if !i.trampoline => i.call,
        _ => call_before(c.code, ra),
    }
}

/// What the code says about `ra` as a return address; `None` when it is not
/// in executable memory.
fn ra_info<C: CodeMemory + ?Sized>(code: &mut C, cache: CacheRef<'_>, ra: u64) -> Option<RaInfo> {
    if ra < 4096 {
        return None;
    }
    if let Some(info) = cache.and_then(|(c, _)| c.get_ra(ra)) {
        return Some(info);
    }
    if !code.is_executable(ra) {
        return None;
    }
    // A handler returns to the sigreturn trampoline, which no call precedes.
    let trampoline = is_trampoline(code, ra);
    let call = if trampoline {
        None
    } else {
        call_before(code, ra)
    };
    let noreturn = matches!(call, Some(CallBefore::Direct(_))) && padding_at(code, ra);
    let info = RaInfo {
        trampoline,
        call,
        noreturn,
    };
    if let Some((c, g)) = cache {
        c.put_ra(ra, g, &info);
    }
    Some(info)
}

fn check_ra<C: CodeMemory + ?Sized>(
    code: &mut C,
    cache: CacheRef<'_>,
    ra: u64,
    func_start: Option<u64>,
    pc: u64,
) -> Check {
    // An exit hook's trampoline: it replaced a checked return address.
    if code.is_return_trampoline(ra) {
        return Check::Strict;
    }
    // Code known to be there but not readable (a module whose file is
    // missing): believable, never preferred to a checked address.
    let Some(info) = ra_info(code, cache, ra) else {
        if scan::call_site_unread(code, ra) {
            return Check::Unread;
        }
        return Check::Bad;
    };
    if info.trampoline {
        return Check::Strict;
    }
    match info.call {
        None if scan::call_site_unread(code, ra) => Check::Unread,
        None => Check::Bad,
        Some(CallBefore::Indirect) => Check::Strict,
        Some(CallBefore::Direct(t)) => {
            let ok = match func_start {
                Some(s) => t == s,
                None => t <= pc && pc - t < MAX_FUNCTION_SIZE,
            };
            if ok {
                Check::Strict
            } else {
                Check::Lenient
            }
        }
    }
}

/// Whether the unwind step would take `ra`, the return address a rule of
/// epilogue analysis gave for the frame whose lookup address is `lookup`,
/// at once (the strict check of step 2: `ra` follows an indirect call or a
/// direct one into the function holding `lookup`, or is a signal or
/// exit-hook trampoline), the function's start being unknown. Through
/// `cache`'s return-address entries, as the step does.
// Used by the in-process capture (`unwind/local`) where it analyzes code.
#[cfg_attr(not(callstack_insn), allow(dead_code))]
pub(crate) fn strict_return<C: CodeMemory + ?Sized>(
    code: &mut C,
    cache: Option<&InsnCache>,
    ra: u64,
    lookup: u64,
) -> bool {
    let cache: CacheRef<'_> = cache.map(|c| (c, c.generation()));
    check_ra(code, cache, ra, None, lookup) == Check::Strict
}

/// The rule the code alone settles for the frame at a return address whose
/// analysis is `a`, where there is one: not the signal trampoline, no
/// function start known (so no prologue rule and the strict check needs
/// none), and a first epilogue candidate. [`step_cached`] takes that rule's
/// caller whenever it passes [`strict_return`] and lies above the frame,
/// before anything else (step 2); when it does not, the other candidates,
/// the frame record and scanning decide, against the stack, and are not
/// settled.
// Used by the in-process capture (`unwind/local`) where it analyzes code.
#[cfg_attr(not(callstack_insn), allow(dead_code))]
pub(crate) fn settled_rule(a: &FrameAnalysis) -> Option<InsnRule> {
    if a.trampoline || a.func_start.is_some() || a.prologue.is_some() {
        return None;
    }
    a.epilogue[0]
}

/// The analysis of the frame at `pc` up to, not including, its epilogue
/// candidates: the trampoline check, the function's start and the
/// prologue rule. Also returns the function's bounds.
fn analyze_head<C: CodeMemory + ?Sized>(
    code: &mut C,
    pc: u64,
    first: bool,
) -> (FrameAnalysis, Option<(u64, u64)>) {
    let lookup = if first { pc } else { pc.wrapping_sub(1) };
    let func = code.function_bounds(lookup);
    let prologue = code
        .function_entry(lookup)
        .and_then(|(entry, bounds)| prologue::analyze(code, entry, pc, bounds));
    let a = FrameAnalysis {
        trampoline: is_trampoline(code, pc),
        func_start: func.map(|f| f.0),
        prologue,
        epilogue: [None; epilogue::MAX_CANDIDATES],
    };
    (a, func)
}

fn fill_epilogue<C: CodeMemory + ?Sized>(
    code: &mut C,
    pc: u64,
    func: Option<(u64, u64)>,
    a: &mut FrameAnalysis,
) {
    for (slot, (rule, _tail)) in a
        .epilogue
        .iter_mut()
        .zip(epilogue::analyze(code, pc, func).iter())
    {
        *slot = Some(rule);
    }
}

/// Everything the code says about the frame at `pc` (`first`: `pc` is an
/// exact pc, looked up as is, rather than a return address): what
/// [`step_cached`] keeps in its cache. Depends on the code alone.
pub fn analyze_frame<C: CodeMemory + ?Sized>(code: &mut C, pc: u64, first: bool) -> FrameAnalysis {
    let (mut a, func) = analyze_head(code, pc, first);
    fill_epilogue(code, pc, func, &mut a);
    a
}

/// Unwinds one frame without CFI. `first` says whether `regs.pc` is the
/// exact pc of an interrupted or innermost frame (looked up as is) rather
/// than a return address (looked up at `pc - 1`). `stack_end` bounds scanning.
pub fn step<M, C>(
    regs: &UnwindRegs,
    mem: &mut M,
    code: &mut C,
    first: bool,
    stack_end: u64,
) -> Option<StepResult>
where
    M: Memory + ?Sized,
    C: CodeMemory + ?Sized,
{
    step_cached(regs, mem, code, first, stack_end, None)
}

/// [`step`], with the code's answers (the rules found by prologue and
/// epilogue analysis, the call before each return address) kept in `cache`
/// and taken from it when there. The stack-dependent choices (which rule's
/// return address follows a call, the frame record, scanning) are made
/// afresh on every call, so the result is [`step`]'s on the same code and
/// stack. `cache` must serve `code`'s reader alone and be cleared when the
/// code changes (see [`crate::arch::x86_64::insn_cache`]).
///
/// The cache adds no allocation, lock or system call: safe in a signal
/// handler when `code` and `mem` are.
pub fn step_cached<M, C>(
    regs: &UnwindRegs,
    mem: &mut M,
    code: &mut C,
    first: bool,
    stack_end: u64,
    cache: Option<&InsnCache>,
) -> Option<StepResult>
where
    M: Memory + ?Sized,
    C: CodeMemory + ?Sized,
{
    let pc = regs.pc;
    // The generation before any code is read: an entry computed across a
    // clear is then stored as stale.
    let cache: CacheRef<'_> = cache.map(|c| (c, c.generation()));
    let lookup = if first { pc } else { pc.wrapping_sub(1) };
    // Without a cache, epilogue analysis runs only when the prologue rule
    // does not give the caller; with one, all is analyzed at once and kept.
    // `pending`: the function's bounds, while epilogue analysis is to do.
    let (mut a, pending) = match cache {
        Some((c, g)) => match c.get_frame(pc, first) {
            Some(a) => (a, None),
            None => {
                let a = analyze_frame(code, pc, first);
                // Only code the reader has: a pc outside it may be code of
                // a module the next snapshot has.
                if code.is_executable(pc) {
                    c.put_frame(pc, first, g, &a);
                }
                (a, None)
            }
        },
        None => {
            let (a, func) = analyze_head(code, pc, first);
            (a, Some(func))
        }
    };

    // A signal frame: the handler returned to `__restore_rt` (`mov rax, 15;
    // syscall`) with sp at the ucontext; below is the interrupted code.
    if a.trampoline {
        if let Ok(r) = crate::arch::x86_64::signal::saved_regs(regs.sp, mem) {
            return Some(StepResult {
                regs: r,
                method: Method::SignalFrame,
            });
        }
    }
    let above = |n: &UnwindRegs| n.sp > regs.sp && n.sp <= stack_end;
    let mut lenient: Option<StepResult> = None;
    // The first candidate whose return address is in unread code.
    let mut blind: Option<StepResult> = None;
    // A call that may never return (`abort`, `__stack_chk_fail`, a `.cold`
    // part's last call): padding follows it, then maybe another function,
    // and `rbp` may be an outer frame's record: scanning goes first. (Padding
    // also aligns loops after calls, so the path forward is still tried.)
    let noreturn = !first && after_noreturn_call(code, cache, pc);

    // 1. Prologue analysis from a known start.
    if let Some(rule) = a.prologue {
        if let Some(n) = read_rule(&rule, regs, mem) {
            if above(&n) && check_ra(code, cache, n.pc, None, n.pc) != Check::Bad {
                return Some(StepResult {
                    regs: n,
                    method: Method::Insn,
                });
            }
        }
    }

    // 2. Epilogue analysis.
    if let Some(func) = pending {
        fill_epilogue(code, pc, func, &mut a);
    }
    for rule in a.epilogue_rules() {
        let Some(n) = read_rule(&rule, regs, mem) else {
            continue;
        };
        if !above(&n) {
            continue;
        }
        match check_ra(code, cache, n.pc, a.func_start, lookup) {
            Check::Strict => {
                return Some(StepResult {
                    regs: n,
                    method: Method::Insn,
                })
            }
            Check::Lenient if lenient.is_none() => {
                lenient = Some(StepResult {
                    regs: n,
                    method: Method::Insn,
                })
            }
            Check::Unread if blind.is_none() => {
                blind = Some(StepResult {
                    regs: n,
                    method: Method::Insn,
                })
            }
            _ => {}
        }
    }

    // 3. The frame pointer, when it points at a believable record (after a
    // call that never returns, only once scanning found nothing).
    let frame_pointer = |lenient: &mut Option<StepResult>,
                         blind: &mut Option<StepResult>,
                         mem: &mut M,
                         code: &mut C| {
        frame_pointer_candidate(
            regs,
            mem,
            code,
            cache,
            a.func_start,
            lookup,
            stack_end,
            lenient,
            blind,
        )
    };
    if !noreturn {
        if let Some(r) = frame_pointer(&mut lenient, &mut blind, mem, code) {
            return Some(r);
        }
        if let Some(l) = lenient {
            return Some(l);
        }
    }

    // 4. Scanning, verified by prologue analysis from the call's target.
    // Then the candidates whose return address is in unread code (this
    // frame's own analysis, then the frame record: as Breakpad, the record
    // before a scanned guess), then scanning's unverified guesses.
    let scanned = scan_step(regs, mem, code, cache, pc, stack_end);
    if !noreturn {
        return match scanned {
            Some(s) if s.verified => Some(s.step),
            s => blind.or(s.map(|s| s.step)),
        };
    }
    // After a call that may not return. A frame record at `rbp` whose
    // return address passes the strict check is this frame's when scanning
    // found no candidate below its return-address slot: scanning stopped
    // at that very slot (its answer keeps `rbp`, the record restores the
    // caller's), went past it (a signal trampoline follows no call, so it
    // is no scan candidate, and stale words lie above it), or found
    // nothing. A candidate below the slot means `rbp` may be an outer
    // frame's record (code without frame pointers): then a verified scan,
    // else what the epilogue found, else scanning's guess, else the record.
    let mut fp_lenient = None;
    let record = frame_pointer(&mut fp_lenient, &mut blind, mem, code);
    if let Some(r) = record {
        let slot = regs.fp + 8;
        if scanned.as_ref().is_none_or(|s| s.slot >= slot) {
            return Some(r);
        }
    }
    match scanned {
        Some(s) if s.verified => Some(s.step),
        Some(s) if s.unread => lenient.or(record).or(fp_lenient).or(blind).or(Some(s.step)),
        s => lenient
            .or(s.map(|s| s.step))
            .or(record)
            .or(fp_lenient)
            .or(blind),
    }
}

/// Whether the return address `pc` follows a direct call that does not
/// return here (see [`RaInfo::noreturn`]); cached with the rest of what the
/// code says of `pc`.
fn after_noreturn_call<C: CodeMemory + ?Sized>(code: &mut C, cache: CacheRef<'_>, pc: u64) -> bool {
    ra_info(code, cache, pc).is_some_and(|i| i.noreturn)
}

/// Whether the bytes at `addr` are alignment padding: `int3`, a multi-byte
/// `nop`, or a one-byte `nop` followed by more padding (gcc -O0 puts a lone
/// `nop` after a function's last call, before its epilogue).
fn padding_at<C: CodeMemory + ?Sized>(code: &mut C, addr: u64) -> bool {
    let mut b = [0u8; 4];
    code.read_code(addr, &mut b) == 4
        && matches!(
            b,
            [0x90, 0x90 | 0x66 | 0x0f | 0xcc, ..]
                | [0xcc, ..]
                | [0x0f, 0x1f, ..]
                | [0x66, 0x0f, 0x1f, _]
                | [0x66, 0x2e, 0x0f, 0x1f]
                | [0x66, 0x66, 0x2e, 0x0f]
                | [0x66, 0x90, ..]
        )
}

/// Step 3 of [`step_cached`]: the frame record at `rbp`, when believable.
/// Returns a strict candidate; a lenient one goes into `lenient` if empty.
#[allow(clippy::too_many_arguments)]
fn frame_pointer_candidate<M, C>(
    regs: &UnwindRegs,
    mem: &mut M,
    code: &mut C,
    cache: CacheRef<'_>,
    func_start: Option<u64>,
    lookup: u64,
    stack_end: u64,
    lenient: &mut Option<StepResult>,
    blind: &mut Option<StepResult>,
) -> Option<StepResult>
where
    M: Memory + ?Sized,
    C: CodeMemory + ?Sized,
{
    // `rbp == rsp`: the record at the frame's bottom (`push rbp; mov rbp,
    // rsp` and no locals, as before a last call that does not return).
    if regs.fp >= regs.sp
        && regs.fp & 7 == 0
        && regs.fp.checked_add(16).is_some_and(|e| e <= stack_end)
    {
        if let (Ok(next_fp), Ok(ra)) = (mem.read_u64(regs.fp), mem.read_u64(regs.fp + 8)) {
            let n = UnwindRegs {
                pc: ra,
                sp: regs.fp + 16,
                fp: next_fp,
                lr: 0,
            };
            let c = check_ra(code, cache, ra, func_start, lookup);
            if c == Check::Strict {
                return Some(StepResult {
                    regs: n,
                    method: Method::FramePointer,
                });
            }
            if c == Check::Lenient && lenient.is_none() {
                *lenient = Some(StepResult {
                    regs: n,
                    method: Method::FramePointer,
                });
            }
            if c == Check::Unread && blind.is_none() {
                *blind = Some(StepResult {
                    regs: n,
                    method: Method::FramePointer,
                });
            }
        }
    }
    None
}

/// What [`scan_step`] found.
struct Scanned {
    /// The caller.
    step: StepResult,
    /// Whether prologue analysis from the call's target checked the hit.
    verified: bool,
    /// Whether the hit is in unread code (believed, not checked).
    unread: bool,
    /// Where the return address was on the stack.
    slot: u64,
}

/// Step 4 of [`step_cached`]: stack scanning, each candidate verified by
/// prologue analysis from the call's target where it can be.
fn scan_step<M, C>(
    regs: &UnwindRegs,
    mem: &mut M,
    code: &mut C,
    cache: CacheRef<'_>,
    pc: u64,
    stack_end: u64,
) -> Option<Scanned>
where
    M: Memory + ?Sized,
    C: CodeMemory + ?Sized,
{
    let above = |n: &UnwindRegs| n.sp > regs.sp && n.sp <= stack_end;
    // Which word is taken depends on the stack, and is decided afresh; what
    // the code says of each candidate (the call before it, the rule from
    // the call's target to the pc) comes from the cache when there.
    let mut found_rule: Option<InsnRule> = None;
    let sp0 = regs.sp;
    let fp0 = regs.fp;
    let pc_cacheable = cache.is_some() && code.is_executable(pc);
    let mut verify = |code: &mut Cached<'_, C>, target: u64, slot: u64| -> bool {
        let cached = code.cache.and_then(|(c, _)| c.get_scan_check(pc, target));
        let rule = match cached {
            Some(r) => r,
            None => {
                let b = code.function_bounds(target).filter(|b| b.0 == target);
                let r = prologue::analyze(code, target, pc, b);
                // Both ends in code the reader has (see `step_cached`).
                let keep = pc_cacheable && code.is_executable(target);
                if let Some((c, g)) = code.cache.filter(|_| keep) {
                    c.put_scan_check(pc, target, g, r.as_ref());
                }
                r
            }
        };
        match rule {
            Some(rule) => {
                let base = match rule.cfa_base {
                    Base::Sp => sp0,
                    Base::Fp => fp0,
                };
                let ra_slot = base
                    .wrapping_add(rule.cfa_offset as i64 as u64)
                    .wrapping_sub(8);
                if ra_slot == slot {
                    found_rule = Some(rule);
                    true
                } else {
                    false
                }
            }
            None => false,
        }
    };
    let mut cached = Cached { code, cache };
    let hit = scan::scan(
        mem,
        &mut cached,
        pc,
        regs.sp,
        stack_end,
        8,
        call_before_cached::<C>,
        Some(&mut verify),
    )?;
    if let Some(rule) = found_rule.filter(|_| hit.verified) {
        if let Some(n) = read_rule(&rule, regs, mem) {
            if above(&n) && n.pc == hit.ra {
                return Some(Scanned {
                    step: StepResult {
                        regs: n,
                        method: Method::Scan,
                    },
                    verified: true,
                    unread: false,
                    slot: hit.slot,
                });
            }
        }
    }
    Some(Scanned {
        step: StepResult {
            regs: UnwindRegs {
                pc: hit.ra,
                sp: hit.slot + 8,
                fp: regs.fp,
                lr: 0,
            },
            method: Method::Scan,
        },
        verified: hit.verified,
        unread: hit.unread,
        slot: hit.slot,
    })
}
