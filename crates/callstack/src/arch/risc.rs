//! The unwind step for fixed-width RISC architectures (aarch64, arm, mips)
//! by prologue analysis, with the frame record and stack scanning as
//! fallbacks. Each architecture supplies its analyzer through [`RiscArch`].
//!
//! Order for a frame at `pc`:
//! 1. prologue analysis: the function's start (a symbol, or found by
//!    scanning back for the instruction that allocates the frame), then the
//!    path from it to the pc: stack adjustment, where `ra`/`lr` and the frame
//!    pointer were saved (or `ra` still in its register: a leaf);
//! 2. the architecture's frame record, when the frame pointer points at one;
//! 3. stack scanning, candidates verified by prologue analysis from the
//!    call's target.
//!
//! Every candidate return address must point right after a call.

use super::scan;
use crate::types::{CallBefore, CodeMemory, InsnRule, Memory, Method, UnwindRegs};

/// Reads the 32-bit little-endian instruction word at `addr` (every
/// aarch64 and MIPS instruction, an ARM-state one, or a literal).
pub(crate) fn insn_at<C: CodeMemory + ?Sized>(code: &mut C, addr: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    (code.read_code(addr, &mut b) == 4).then(|| u32::from_le_bytes(b))
}

/// The start of the function holding `pc`, for a prologue analyzer:
/// `entry` when known, else what `find` scans back to. `None` when that
/// start lies after `pc` or more than `max_bytes` before it (too far to be
/// this function's prologue).
pub(crate) fn function_start(
    entry: Option<u64>,
    pc: u64,
    max_bytes: u64,
    find: impl FnOnce() -> Option<u64>,
) -> Option<u64> {
    let start = match entry {
        Some(e) => e,
        None => find()?,
    };
    (start <= pc && pc - start <= max_bytes).then_some(start)
}

/// What an architecture gives the RISC unwinder.
pub trait RiscArch {
    /// Pointer size in bytes.
    const WORD: u8;
    /// Bytes from the call instruction's address to its return address
    /// (4; 8 on MIPS, which has a delay slot).
    const CALL_TO_RA: u64;

    /// The rule at `pc`. `entry` is the function's start when known (else
    /// the analyzer looks for it); `first` says `pc` is an exact pc (the
    /// innermost frame), where `ra` may still be in its register.
    fn analyze<C: CodeMemory + ?Sized>(
        code: &mut C,
        pc: u64,
        entry: Option<u64>,
        first: bool,
    ) -> Option<InsnRule>;

    /// The call that ends right before `ra`.
    fn call_before<C: CodeMemory + ?Sized>(code: &mut C, ra: u64) -> Option<CallBefore>;

    /// The caller's registers from the frame record at `regs.fp`, if the
    /// architecture has one (`None` otherwise or if unreadable).
    fn frame_record<M: Memory + ?Sized>(regs: &UnwindRegs, mem: &mut M) -> Option<UnwindRegs> {
        let _ = (regs, mem);
        None
    }

    /// The interrupted registers, when `regs.pc` is the kernel's (or
    /// qemu-user's) signal-return trampoline and `regs.sp` its frame.
    fn signal_frame<C: CodeMemory + ?Sized, M: Memory + ?Sized>(
        code: &mut C,
        regs: &UnwindRegs,
        mem: &mut M,
    ) -> Option<UnwindRegs> {
        let _ = (code, regs, mem);
        None
    }

    /// Whether `ra` is a signal-return trampoline (a handler's return
    /// address: no call precedes it).
    fn is_trampoline<C: CodeMemory + ?Sized>(code: &mut C, ra: u64) -> bool {
        let _ = (code, ra);
        false
    }

    /// The address to look the function up at (clears mode bits).
    fn code_addr(pc: u64) -> u64 {
        pc
    }
}

/// Declares an architecture's marker type and implements [`RiscArch`] for
/// it from the pieces under its `src/arch/<arch>/`: the prologue analyzer,
/// the decoder of the call before a return address, the signal trampoline
/// (recognizer and frame restorer) and, where the ABI has one, the frame
/// record. Only the glue is shared; every piece stays in its architecture's
/// module.
///
/// ```ignore
/// risc_arch! {
///     /// The glue of some architecture.
///     Arch {
///         word: 4,
///         call_to_ra: 8,
///         analyze: prologue::analyze,
///         call_before: call_before,
///         is_trampoline: super::signal::is_trampoline, // (code, pc) -> bool
///         signal_frame: super::signal::frame,          // (code, regs, mem) -> Option<UnwindRegs>
///         frame_record: frame_record,                  // optional
///     }
/// }
/// ```
macro_rules! risc_arch {
    (
        $(#[$doc:meta])*
        $name:ident {
            word: $word:expr,
            call_to_ra: $call_to_ra:expr,
            analyze: $analyze:path,
            call_before: $call_before:path,
            is_trampoline: $is_trampoline:path,
            signal_frame: $signal_frame:path,
            $(frame_record: $frame_record:path,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name;

        impl $crate::arch::risc::RiscArch for $name {
            const WORD: u8 = $word;
            const CALL_TO_RA: u64 = $call_to_ra;

            fn analyze<C: $crate::types::CodeMemory + ?Sized>(
                code: &mut C,
                pc: u64,
                entry: Option<u64>,
                first: bool,
            ) -> Option<$crate::types::InsnRule> {
                $analyze(code, pc, entry, first)
            }

            fn call_before<C: $crate::types::CodeMemory + ?Sized>(
                code: &mut C,
                ra: u64,
            ) -> Option<$crate::types::CallBefore> {
                $call_before(code, ra)
            }

            fn signal_frame<
                C: $crate::types::CodeMemory + ?Sized,
                M: $crate::types::Memory + ?Sized,
            >(
                code: &mut C,
                regs: &$crate::types::UnwindRegs,
                mem: &mut M,
            ) -> Option<$crate::types::UnwindRegs> {
                $signal_frame(code, regs, mem)
            }

            fn is_trampoline<C: $crate::types::CodeMemory + ?Sized>(
                code: &mut C,
                ra: u64,
            ) -> bool {
                $is_trampoline(code, ra)
            }

            $(
                fn frame_record<M: $crate::types::Memory + ?Sized>(
                    regs: &$crate::types::UnwindRegs,
                    mem: &mut M,
                ) -> Option<$crate::types::UnwindRegs> {
                    $frame_record(regs, mem)
                }
            )?
        }
    };
}
pub(crate) use risc_arch;

/// Where the step found the caller, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RiscStep {
    /// The caller's registers.
    pub regs: UnwindRegs,
    /// How.
    pub method: Method,
}

fn after_call<A: RiscArch, C: CodeMemory + ?Sized>(code: &mut C, ra: u64) -> bool {
    ra > 4096 && (A::call_before(code, ra).is_some() || A::is_trampoline(code, ra))
}

/// The caller that `rule` (prologue analysis's for the frame at `regs`)
/// gives, when [`step`] takes it: the return address saved (or, at an
/// exact pc, still in the link register), the caller's stack pointer
/// above the frame's and inside the stack, and the return address right
/// after a call (or at the signal trampoline). The code decides the rule,
/// the stack the rest: the in-process walk applies a rule it cached for a
/// return address ([`return_rule`]) through this same check.
pub(crate) fn caller_by_rule<A: RiscArch, M: Memory + ?Sized, C: CodeMemory + ?Sized>(
    rule: &InsnRule,
    regs: &UnwindRegs,
    mem: &mut M,
    code: &mut C,
    first: bool,
    stack_end: u64,
) -> Option<UnwindRegs> {
    if rule.ra_at_cfa.is_none() && !first {
        return None;
    }
    let n = rule.apply(regs, mem, A::WORD).ok()?;
    let moved = n.sp > regs.sp || (first && rule.ra_at_cfa.is_none());
    let ok_sp = n.sp >= regs.sp && n.sp <= stack_end;
    (ok_sp && moved && after_call::<A, C>(code, A::code_addr(n.pc))).then_some(n)
}

/// The rule prologue analysis gives the frame whose return address is
/// `pc` (not an exact pc), as [`step`] finds it, when it saves the return
/// address: the code alone decides it, so a walk in process may keep it
/// for that address.
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "riscv64")),
    allow(dead_code)
)]
pub(crate) fn return_rule<A: RiscArch, C: CodeMemory + ?Sized>(
    code: &mut C,
    pc: u64,
) -> Option<InsnRule> {
    let pc = A::code_addr(pc);
    let entry = code.function_entry(pc.wrapping_sub(1)).map(|e| e.0);
    A::analyze(code, pc, entry, false).filter(|r| r.ra_at_cfa.is_some())
}

/// The machine-code word for the frame whose return address is `pc`: the
/// packed rule prologue analysis settles ([`return_rule`]) when it has one
/// of the packed shapes (`aarch64::pack_insn`, the word space RISC-V 64
/// shares), else `INSN_UNPACKED` (looked at, nothing to keep). What the
/// in-process walk keeps in the rule cache for that address, to take the
/// frame by [`insn_caller`] on later walks, or to leave it to the generic
/// step without analysing its code twice.
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "riscv64")),
    allow(dead_code)
)]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) fn settle_insn<A: RiscArch, C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> u16 {
    return_rule::<A, C>(code, pc)
        .and_then(|rule| super::aarch64::pack_insn(&rule))
        .unwrap_or(super::aarch64::INSN_UNPACKED)
}

/// The caller of the frame at `regs` (its pc a return address) by the
/// machine-code rule of cache word `p` ([`settle_insn`]), when the
/// machine-code step would take it ([`caller_by_rule`]); `None` for a word
/// that holds none, or when the stack says otherwise.
#[cfg_attr(
    not(any(target_arch = "aarch64", target_arch = "riscv64")),
    allow(dead_code)
)]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) fn insn_caller<A: RiscArch, M: Memory + ?Sized, C: CodeMemory + ?Sized>(
    p: u16,
    regs: &UnwindRegs,
    mem: &mut M,
    code: &mut C,
    stack_end: u64,
) -> Option<UnwindRegs> {
    let rule = super::aarch64::unpack_insn(p)?;
    caller_by_rule::<A, M, C>(&rule, regs, mem, code, false, stack_end)
}

/// Unwinds one frame of architecture `A`.
pub fn step<A: RiscArch, M: Memory + ?Sized, C: CodeMemory + ?Sized>(
    regs: &UnwindRegs,
    mem: &mut M,
    code: &mut C,
    first: bool,
    stack_end: u64,
) -> Option<RiscStep> {
    let pc = A::code_addr(regs.pc);
    // A signal frame: the handler returned to the trampoline; the frame
    // below is the interrupted code, at its exact pc.
    if let Some(n) = A::signal_frame(code, regs, mem) {
        return Some(RiscStep {
            regs: n,
            method: Method::SignalFrame,
        });
    }
    let lookup = if first { pc } else { pc.wrapping_sub(1) };
    let entry = code.function_entry(lookup).map(|e| e.0);
    let ok_sp = |n: &UnwindRegs| n.sp >= regs.sp && n.sp <= stack_end;

    if let Some(rule) = A::analyze(code, pc, entry, first) {
        if let Some(n) = caller_by_rule::<A, M, C>(&rule, regs, mem, code, first, stack_end) {
            return Some(RiscStep {
                regs: n,
                method: Method::Insn,
            });
        }
    }

    if let Some(n) = A::frame_record(regs, mem) {
        if ok_sp(&n) && n.sp > regs.sp && after_call::<A, C>(code, A::code_addr(n.pc)) {
            return Some(RiscStep {
                regs: n,
                method: Method::FramePointer,
            });
        }
    }

    // Scan, verified by prologue analysis from the call's target.
    let mut found: Option<InsnRule> = None;
    let (sp0, fp0) = (regs.sp, regs.fp);
    let mut verify = |code: &mut C, target: u64, slot: u64| -> bool {
        match A::analyze(code, pc, Some(A::code_addr(target)), false) {
            Some(rule) => {
                let Some(ra_off) = rule.ra_at_cfa else {
                    return false;
                };
                let base = match rule.cfa_base {
                    crate::types::Base::Sp => sp0,
                    crate::types::Base::Fp => fp0,
                };
                let cfa = base.wrapping_add(rule.cfa_offset as i64 as u64);
                if cfa.wrapping_add(ra_off as i64 as u64) == slot {
                    found = Some(rule);
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
        A::WORD,
        call_before_masked::<A, C>,
        Some(&mut verify),
    )?;
    if let Some(rule) = found.filter(|_| hit.verified) {
        if let Ok(n) = rule.apply(regs, mem, A::WORD) {
            if ok_sp(&n) && n.pc == hit.ra {
                return Some(RiscStep {
                    regs: n,
                    method: Method::Scan,
                });
            }
        }
    }
    Some(RiscStep {
        regs: UnwindRegs {
            pc: hit.ra,
            sp: hit.slot + A::WORD as u64,
            fp: regs.fp,
            lr: 0,
        },
        method: Method::Scan,
    })
}

fn call_before_masked<A: RiscArch, C: CodeMemory + ?Sized>(
    code: &mut C,
    ra: u64,
) -> Option<CallBefore> {
    A::call_before(code, A::code_addr(ra))
}
