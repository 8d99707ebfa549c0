//! x86-64 entries of exact capture: the naked entry that hands the caller's
//! `rip`/`rsp`/`rbp` to the unwinder, and the registers of a signal context.

use crate::unwind::UnwindRegs;

/// The naked entry of `capture_exact` (and of the C `callstack_capture_exact`).
///
/// At entry `[rsp]` is the return address into the caller, `rsp + 8` the
/// caller's stack pointer after the return and `rbp` the caller's `rbp`
/// (callee-saved, so untouched by the call). It passes them as the 4th to
/// 6th arguments and tail-jumps into the unwinder, which returns straight to
/// the caller.
///
/// # Safety
/// `out` must be valid for `max` writes of `usize` (or `max` must be 0).
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn exact_entry(skip: u32, max: u32, out: *mut usize) -> u32 {
    // SAFETY: reads the return address at [rsp], computes the caller's rsp
    // and copies rbp; the stack is left as it was at entry, so the tail jump
    // behaves as if the caller had called the target directly.
    core::arch::naked_asm!(
        "mov rcx, [rsp]",
        "lea r8, [rsp + 8]",
        "mov r9, rbp",
        "jmp {imp}",
        imp = sym crate::unwind::local::exact_from_entry,
    )
}

/// The interrupted registers of a signal handler's `ucontext_t`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub fn regs_from_ucontext(uc: &libc::ucontext_t) -> UnwindRegs {
    let g = &uc.uc_mcontext.gregs;
    UnwindRegs {
        pc: g[libc::REG_RIP as usize] as u64,
        sp: g[libc::REG_RSP as usize] as u64,
        fp: g[libc::REG_RBP as usize] as u64,
        lr: 0,
    }
}

/// Whether `code` (the bytes at a pc) is the Linux x86-64 signal return
/// trampoline: `mov rax, 15` (`rt_sigreturn`), `syscall`.
pub fn is_sigreturn_trampoline(code: &[u8]) -> bool {
    code.starts_with(&[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05])
}

/// The naked entry of `capture_exact_with_info`: adds the caller's
/// `rip`/`rsp`/`rbp` to the request pointer and tail-jumps to the walk.
///
/// # Safety
/// `req` must be a valid request (see `unwind::local::InfoRequest`).
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub(crate) unsafe extern "C" fn info_entry(req: *mut crate::unwind::local::InfoRequest) -> usize {
    // SAFETY: as `exact_entry`, with the registers as the 2nd to 4th arguments.
    core::arch::naked_asm!(
        "mov rsi, [rsp]",
        "lea rdx, [rsp + 8]",
        "mov rcx, rbp",
        "jmp {imp}",
        imp = sym crate::unwind::local::info_from_entry,
    )
}

/// The hot path of in-process exact capture: a rule packed by
/// `X86_64::pack`, decoded for the hot loop as `(CFA from rbp?, CFA offset,
/// offset of the saved rbp from the CFA, 0 if unchanged)`. Only the
/// `Sp`/`Bp` shapes with the saved `rbp` below the CFA decode; any other
/// rule gives `None` and the generic unwinder takes the frame. The return
/// address is at `CFA - 8`.
#[inline(always)]
pub(crate) fn decode_fast(p: u16) -> Option<(bool, u64, i64)> {
    let from_fp = match p >> 14 {
        1 => false,
        2 => true,
        _ => return None,
    };
    let cfa = ((p >> 6) & 0xff) as u64 * 8;
    let bp = ((((p & 0x3f) as i16) << 10) >> 10) as i64 * 8;
    if bp > 0 || cfa < 8 {
        return None;
    }
    Some((from_fp, cfa, bp))
}

/// The packed `End` rule (`X86_64::pack(UnwindRuleX86_64::End)`): the
/// outermost frame, which the hot loop ends on without the generic
/// unwinder.
pub(crate) const PACKED_END: u16 = 3 << 14 | 1;

/// [`decode_fast`] of a rule it accepted, without the checks.
#[inline(always)]
pub(crate) fn decode_unchecked(p: u16) -> (bool, u64, i64) {
    let from_fp = p >> 14 == 2;
    let cfa = ((p >> 6) & 0xff) as u64 * 8;
    let bp = ((((p & 0x3f) as i16) << 10) >> 10) as i64 * 8;
    (from_fp, cfa, bp)
}

#[cfg(test)]
mod tests {
    use crate::arch::x86_64::{UnwindRuleX86_64, X86_64};
    use crate::arch::Arch;

    #[test]
    fn packed_end_is_the_packed_end_rule() {
        assert_eq!(super::PACKED_END, X86_64::pack(UnwindRuleX86_64::End));
        assert!(super::decode_fast(super::PACKED_END).is_none());
    }
}
