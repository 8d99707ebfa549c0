//! One unwind step for a frame without CFI, and a walk made of such steps.
//!
//! The order, for a frame at `pc`:
//! 1. the function's start known (symbol): prologue analysis from the start
//!    to the pc ([`super::prologue`]);
//! 2. epilogue analysis from the pc to a `ret` ([`super::epilogue`]);
//! 3. the frame pointer, if `rbp` points at a believable frame record: a
//!    frame-pointer rule is never discarded because the prologue looks
//!    unusual;
//! 4. stack scanning ([`crate::unwind::insn::scan`]), each candidate checked
//!    by prologue analysis from the call's target.
//!
//! Each candidate return address must point right after a call instruction;
//! a direct call must target the function that holds the pc (its symbol, or
//! a start at or below the pc) for the candidate to pass the strict check.
//! Candidates that only pass a lenient check (a call, but an indirect one or
//! to another function: tail calls) are used only when no strict one exists.

use super::{epilogue, prologue};
use crate::unwind::insn::scan::{self, CallBefore, MAX_FUNCTION_SIZE};
use crate::unwind::insn::{Base, CodeMemory, InsnRule, Method, UnwindRegs};
use crate::unwind::Memory;
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, OpKind};

/// Why a walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The pc is 0 (the outermost frame's sentinel).
    End,
    /// No method found a believable caller.
    NoCaller,
    /// The output is full.
    Full,
}

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
    Lenient,
    Strict,
}

fn check_ra<C: CodeMemory + ?Sized>(
    code: &mut C,
    ra: u64,
    func: Option<(u64, u64)>,
    pc: u64,
) -> Check {
    if ra < 4096 || !code.is_executable(ra) {
        return Check::Bad;
    }
    // A handler returns to the sigreturn trampoline, which no call precedes.
    let mut tramp = [0u8; 9];
    if code.read_code(ra, &mut tramp) == 9
        && crate::arch::x86_64::exact::is_sigreturn_trampoline(&tramp)
    {
        return Check::Strict;
    }
    match call_before(code, ra) {
        None => Check::Bad,
        Some(CallBefore::Indirect) => Check::Strict,
        Some(CallBefore::Direct(t)) => {
            let ok = match func {
                Some((s, _)) => t == s,
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
    let pc = regs.pc;
    // A signal frame: the handler returned to `__restore_rt` (`mov rax, 15;
    // syscall`) with sp at the ucontext; below is the interrupted code.
    let mut tramp = [0u8; 9];
    if code.read_code(pc, &mut tramp) == 9
        && crate::arch::x86_64::exact::is_sigreturn_trampoline(&tramp)
    {
        if let Ok(r) =
            <crate::arch::x86_64::X86_64 as crate::arch::Arch>::signal_frame(regs.sp, mem)
        {
            return Some(StepResult {
                regs: r,
                method: Method::SignalFrame,
            });
        }
    }
    let lookup = if first { pc } else { pc.wrapping_sub(1) };
    let func = code.function_bounds(lookup);
    let above = |n: &UnwindRegs| n.sp > regs.sp && n.sp <= stack_end;
    let mut lenient: Option<StepResult> = None;

    // 1. Prologue analysis from a known start.
    if let Some((entry, search_bounds)) = code.function_entry(lookup) {
        if let Some(rule) = prologue::analyze(code, entry, pc, search_bounds) {
            if let Some(n) = read_rule(&rule, regs, mem) {
                if above(&n) {
                    match check_ra(code, n.pc, None, n.pc) {
                        Check::Bad => {}
                        _ => {
                            return Some(StepResult {
                                regs: n,
                                method: Method::Insn,
                            })
                        }
                    }
                }
            }
        }
    }

    // 2. Epilogue analysis.
    let cands = epilogue::analyze(code, pc, func);
    for (rule, _tail) in cands.iter() {
        let Some(n) = read_rule(&rule, regs, mem) else {
            continue;
        };
        if !above(&n) {
            continue;
        }
        match check_ra(code, n.pc, func, lookup) {
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
            _ => {}
        }
    }

    // 3. The frame pointer, when it points at a believable record.
    if regs.fp > regs.sp
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
            let c = check_ra(code, ra, func, lookup);
            if c == Check::Strict {
                return Some(StepResult {
                    regs: n,
                    method: Method::FramePointer,
                });
            }
            if c == Check::Lenient && lenient.is_none() {
                lenient = Some(StepResult {
                    regs: n,
                    method: Method::FramePointer,
                });
            }
        }
    }
    if let Some(l) = lenient {
        return Some(l);
    }

    // 4. Scanning, verified by prologue analysis from the call's target.
    let mut found_rule: Option<InsnRule> = None;
    let sp0 = regs.sp;
    let fp0 = regs.fp;
    let mut verify = |code: &mut C, target: u64, slot: u64| -> bool {
        let b = code.function_bounds(target).filter(|b| b.0 == target);
        match prologue::analyze(code, target, pc, b) {
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
    let hit = scan::scan(
        mem,
        code,
        pc,
        regs.sp,
        stack_end,
        8,
        call_before::<C>,
        Some(&mut verify),
    )?;
    if let Some(rule) = found_rule.filter(|_| hit.verified) {
        if let Some(n) = read_rule(&rule, regs, mem) {
            if above(&n) && n.pc == hit.ra {
                return Some(StepResult {
                    regs: n,
                    method: Method::Scan,
                });
            }
        }
    }
    Some(StepResult {
        regs: UnwindRegs {
            pc: hit.ra,
            sp: hit.slot + 8,
            fp: regs.fp,
            lr: 0,
        },
        method: Method::Scan,
    })
}

/// Walks from `regs` (the innermost frame, its exact pc) using only the
/// methods of this module, writing `(pc, method)` per frame into `out`
/// (`out[0]` is `regs.pc` with [`Method::Context`]). Returns how many frames
/// were written and why the walk stopped.
pub fn walk<M, C>(
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
    if out.is_empty() {
        return (0, Stop::Full);
    }
    out[0] = (regs.pc, Method::Context);
    let mut n = 1;
    let mut cur = regs;
    let mut first = true;
    loop {
        if n == out.len() {
            return (n, Stop::Full);
        }
        let Some(s) = step(&cur, mem, code, first, stack_end) else {
            return (n, Stop::NoCaller);
        };
        if s.regs.pc == 0 {
            return (n, Stop::End);
        }
        out[n] = (s.regs.pc, s.method);
        n += 1;
        cur = s.regs;
        first = s.method == Method::SignalFrame;
    }
}
