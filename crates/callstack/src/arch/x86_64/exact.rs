//! x86-64 entries of exact capture: the naked entry that hands the caller's
//! `rip`/`rsp`/`rbp` to the unwinder, and the registers of a signal context.

use crate::unwind::UnwindRegs;

/// Defines the naked entry of `capture_exact` (and of the C
/// `callstack_capture_exact`), `exact_entry`, in the module that invokes it:
/// `unwind::local`, so that it is compiled with (and sits in the same
/// section as) the code of the first capture, which then faults in one
/// window of code fewer. Re-exported here as [`exact_entry`].
///
/// At entry `[rsp]` is the return address into the caller, `rsp + 8` the
/// caller's stack pointer after the return and `rbp` the caller's `rbp`
/// (callee-saved, so untouched by the call). It passes them as the 4th to
/// 6th arguments and tail-jumps into the unwinder, which returns straight to
/// the caller.
macro_rules! define_exact_entry {
    () => {
        /// The naked entry of `capture_exact` (and of the C
        /// `callstack_capture_exact`): see `arch::x86_64::exact`.
        ///
        /// # Safety
        /// `out` must be valid for `max` writes of `usize` (or `max` must be 0).
        #[unsafe(naked)]
        #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
        pub unsafe extern "C" fn exact_entry(skip: u32, max: u32, out: *mut usize) -> u32 {
            // SAFETY: reads the return address at [rsp], computes the
            // caller's rsp and copies rbp; the stack is left as it was at
            // entry, so the tail jump behaves as if the caller had called the
            // target directly.
            core::arch::naked_asm!(
                "mov rcx, [rsp]",
                "lea r8, [rsp + 8]",
                "mov r9, rbp",
                "jmp {imp}",
                imp = sym exact_from_entry,
            )
        }
    };
}
pub(crate) use define_exact_entry;

pub use crate::unwind::local::exact_entry;

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

/// How [`run_same_rule`] stopped.
pub(crate) mod run_exit {
    /// The output is full.
    pub(crate) const FULL: u64 = 0;
    /// A zero return address: the outermost frame.
    pub(crate) const OUTERMOST: u64 = 1;
    /// A frame failed the range check: the generic unwinder takes it.
    pub(crate) const SLOW: u64 = 2;
    /// The next frame's cached word is not its key with the same rule: the
    /// caller resolves it (the other way, another rule, a miss).
    pub(crate) const CHANGED: u64 = 3;
}

/// The hot loop's inner run on x86-64: unwinds frames under one fast rule
/// for as long as the next frame's cached word is its key with that same
/// rule (see `unwind::local::hot_loop`, which decodes rules and resolves
/// the rest). Registers in `regs` (`[pc, sp, fp]`), output at `*o`, up to
/// `end`.
///
/// The rule, relative to `a = (fp if from_fp else sp) + off_a`, the lowest
/// stack word the frame reads: the return address is at `a + ra_at`, the
/// caller's stack pointer is `a + ra_at + 8`, the caller's frame pointer is
/// at `a` if `ra_at != 0` (unchanged otherwise). A frame is applied only if
/// `sp <= a <= a_max` (`a_max = hi - ra_at - 8`): every read lies in
/// `[sp, hi)`. `tag` is the rule as it sits in a cache word (`rule << 48`);
/// the cache is `CACHE_SIZE` words at `cache`, 2-way sets at index
/// `(key ^ key >> 13) & 0x1ffe`, the key of a return address being itself.
///
/// Returns the exit code and, for [`run_exit::CHANGED`], the next frame's
/// cached word (first way) xor its key. Written in assembly because it is
/// the whole per-frame cost: twelve live values, which the compiler spilled
/// (the frame pointer through memory on every frame).
///
/// # Safety
/// `*o..end` must be writable; `[regs[1], hi)` must be readable stack with
/// `a_max` derived from that `hi` as above; `cache` must point at the rule
/// cache (8192 words).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_same_rule(
    regs: &mut [u64; 3],
    o: &mut *mut usize,
    end: *mut usize,
    from_fp: bool,
    tag: u64,
    off_a: u64,
    ra_at: u64,
    a_max: u64,
    cache: *const u64,
) -> (u64, u64) {
    let [mut pc, mut sp, mut fp] = *regs;
    let mut out = *o;
    let code: u64;
    let word: u64;
    // One frame under the rule: check, load, advance `sp` (and `fp`), with
    // the return address in `v`; then the shared tail stores it and looks
    // up the next frame.
    macro_rules! run {
        ($apply:expr) => {
            // SAFETY: reads only `[a, a + ra_at + 8)` after checking
            // `sp <= a <= a_max`, inside the readable stack the caller
            // vouches for; writes only `out` below `end`; reads the cache
            // at an index below 8192. No stack use, flags clobbered.
            unsafe {
                core::arch::asm!(
                    "2:",
                    $apply,
                    "mov [{out}], {v}",
                    "add {out}, 8",
                    "mov {pc}, {v}",
                    "cmp {out}, {end}",
                    "je 7f",
                    "mov {a:e}, {pc:e}",
                    "shr {a:e}, 13",
                    "xor {a:e}, {pc:e}",
                    "and {a:e}, 0x1ffe",
                    "mov {v}, [{cache} + {a} * 8]",
                    "xor {v}, {pc}",
                    "cmp {v}, {tag}",
                    "je 2b",
                    "mov {a:e}, 3",
                    "jmp 6f",
                    "7:",
                    "xor {a:e}, {a:e}",
                    "jmp 6f",
                    "8:",
                    "mov {a:e}, 2",
                    "jmp 6f",
                    "9:",
                    "mov {a:e}, 1",
                    "6:",
                    pc = inout(reg) pc,
                    sp = inout(reg) sp,
                    fp = inout(reg) fp,
                    out = inout(reg) out,
                    a = out(reg) code,
                    v = out(reg) word,
                    end = in(reg) end,
                    tag = in(reg) tag,
                    off_a = in(reg) off_a,
                    ra_at = in(reg) ra_at,
                    a_max = in(reg) a_max,
                    cache = in(reg) cache,
                    options(nostack),
                )
            }
        };
    }
    // `a` from a base register; the caller's fp at `a` when `ra_at != 0`.
    macro_rules! general {
        ($base:literal) => {
            concat!(
                "lea {a}, [{",
                $base,
                "} + {off_a}]\n",
                "cmp {a}, {sp}\n",
                "jb 8f\n",
                "cmp {a}, {a_max}\n",
                "ja 8f\n",
                "mov {v}, [{a} + {ra_at}]\n",
                "test {ra_at}, {ra_at}\n",
                "jz 3f\n",
                "mov {fp}, [{a}]\n",
                "3:\n",
                "test {v}, {v}\n",
                "jz 9f\n",
                "lea {sp}, [{a} + {ra_at} + 8]",
            )
        };
    }
    if from_fp && off_a == 0 && ra_at != 0 {
        // The frame record of code with frame pointers (`push rbp; mov
        // rbp, rsp`: CFA = rbp + 16, rbp saved at CFA - 16, and any rule
        // with the saved rbp where rbp points): `a` is `fp` itself, so the
        // chain from one frame to the next is the one load `fp = [fp]`, as
        // in a frame-pointer walk.
        run!(concat!(
            "/* {off_a} */\n",
            "cmp {fp}, {sp}\n",
            "jb 8f\n",
            "cmp {fp}, {a_max}\n",
            "ja 8f\n",
            "mov {v}, [{fp} + {ra_at}]\n",
            "test {v}, {v}\n",
            "jz 9f\n",
            "lea {sp}, [{fp} + {ra_at} + 8]\n",
            "mov {fp}, [{fp}]",
        ));
    } else if from_fp {
        run!(general!("fp"));
    } else {
        run!(general!("sp"));
    }
    *regs = [pc, sp, fp];
    *o = out;
    (code, word)
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
