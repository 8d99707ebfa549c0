//! x86-64 entries of exact capture: the naked entry that hands the caller's
//! `rip`/`rsp`/`rbp` to the unwinder, and the registers of a signal context.

use super::UnwindRuleX86_64;
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

/// Words of the in-process rule cache's main array (2-way sets of
/// `key | packed rule << 48`); the wide rules follow it (see [`run_hot`]).
pub(crate) const CACHE_WORDS: usize = 8192;
/// Slots of the wide-rule table after the main array; slot 0 is unused.
pub(crate) const WIDE_SLOTS: usize = 512;

/// The packed `End` rule (`X86_64::pack(UnwindRuleX86_64::End)`): the
/// outermost frame, which the hot loop ends on without the generic
/// unwinder.
pub(crate) const PACKED_END: u16 = 3 << 14 | 1;

/// The wide form of an `Sp`/`Bp` rule whose offsets do not fit the 16-bit
/// packing (frames over about 4 KiB, up to 4 GiB): bits 0-31 `off_a`, bits
/// 32-39 `ra_at / 8`, bit 40 set when the base is `rbp`, bit 62 always set
/// (a wide word is never 0). `None` for other rules and for shapes the hot
/// loop does not apply (see `rule::fast_form`).
pub(crate) fn wide_word(rule: UnwindRuleX86_64) -> Option<u64> {
    let (from_fp, cfa, bp) = match rule {
        UnwindRuleX86_64::Sp { cfa, bp } => (false, cfa, bp),
        UnwindRuleX86_64::Bp { cfa, bp } => (true, cfa, bp),
        _ => return None,
    };
    let (off_a, ra_at) = super::rule::fast_form(cfa, bp)?;
    if ra_at / 8 > 0xff {
        return None;
    }
    Some(off_a as u64 | ((ra_at / 8) as u64) << 32 | (from_fp as u64) << 40 | 1 << 62)
}

/// The rule of a [`wide_word`].
pub(crate) fn from_wide_word(w: u64) -> UnwindRuleX86_64 {
    let off_a = w as u32;
    let ra_at = ((w >> 32) & 0xff) as u32 * 8;
    let (cfa, bp) = super::rule::from_fast_form(off_a, ra_at);
    if w & 1 << 40 != 0 {
        UnwindRuleX86_64::Bp { cfa, bp }
    } else {
        UnwindRuleX86_64::Sp { cfa, bp }
    }
}

/// How [`run_hot`] stopped.
pub(crate) mod run_exit {
    /// The output is full.
    pub(crate) const FULL: u64 = 0;
    /// A zero return address or the packed `End` rule: the outermost frame.
    pub(crate) const OUTERMOST: u64 = 1;
    /// A frame missed the cache, has a rule the loop does not apply, or
    /// failed the range check: the generic unwinder takes it.
    pub(crate) const SLOW: u64 = 2;
}

/// The hot loop of in-process exact capture on x86-64, whole: from the
/// frame whose return address is `regs[0]` (`[pc, sp, fp]`), frames whose
/// key (their return address) is in the rule cache with a rule it applies,
/// writing their return addresses at `*o` up to `end`. Rule changes are
/// decoded in the loop (no return to Rust per frame).
///
/// The cache at `cache`: [`CACHE_WORDS`] words `key | p << 48` in 2-way sets
/// at index `(key ^ key >> 13) & 0x1ffe`, then [`WIDE_SLOTS`] wide words.
/// A packed rule `p` (`X86_64::pack`) with bits 15-14 = 1 or 2 is applied
/// from its fields; bits 15-14 = 0 make `p` the index of a [`wide_word`];
/// the packed `End` ends the walk; anything else is left to the caller.
///
/// A rule is applied relative to `a = (fp if rbp-based else sp) + off_a`,
/// the lowest stack word the frame reads: the return address is at
/// `a + ra_at`, the caller's stack pointer is `a + ra_at + 8`, and the
/// caller's frame pointer is at `a` if `ra_at != 0` (unchanged otherwise).
/// A frame is applied only if `sp <= a <= hi - ra_at - 8`: every read lies
/// in `[sp, hi)`.
///
/// Consecutive frames with the same cached rule (code with frame pointers:
/// every frame) are checked with one `xor` and compare of the cache word
/// against the previous frame's, so nothing is decoded and the stack loads
/// need not wait for the cache load; the frame-record rule (`rbp`-based,
/// `off_a == 0`) chains with the single load `fp = [fp]`.
///
/// Returns a [`run_exit`] code, with `regs` at the last frame written (or
/// the start) and `*o` past the last slot written. Written in assembly:
/// thirteen live values, which the compiler spilled.
///
/// # Safety
/// `*o < end` and `*o..end` writable; `[regs[1], hi)` readable stack;
/// `cache` the rule cache as above.
#[inline(always)]
pub(crate) unsafe fn run_hot(
    regs: &mut [u64; 3],
    o: &mut *mut usize,
    end: *mut usize,
    hi: u64,
    cache: *const u64,
) -> u64 {
    let [mut pc, mut sp, mut fp] = *regs;
    let mut out = *o;
    let code: u64;
    // The tail of every applied frame: store the return address (in `v`),
    // stop when full, look up the next frame's first way and go on under
    // the same rule when its word matches, else resolve it at 23.
    macro_rules! tail {
        ($again:literal) => {
            concat!(
                "mov [{out}], {v}\n",
                "add {out}, 8\n",
                "mov {pc}, {v}\n",
                "cmp {out}, {end}\n",
                "je 7f\n",
                "mov {a:e}, {pc:e}\n",
                "shr {a:e}, 13\n",
                "xor {a:e}, {pc:e}\n",
                "and {a:e}, 0x1ffe\n",
                "mov {v}, [{cache} + {a} * 8]\n",
                "xor {v}, {pc}\n",
                "cmp {v}, {tag}\n",
                "je ",
                $again,
                "\n",
                "jmp 23b\n",
            )
        };
    }
    // A frame from a base register: `a`, range check, loads, new `sp`.
    macro_rules! general {
        ($base:literal) => {
            concat!(
                "lea {a}, [{",
                $base,
                "} + {off}]\n",
                "cmp {a}, {sp}\n",
                "jb 8f\n",
                "cmp {a}, {amax}\n",
                "ja 8f\n",
                "mov {v}, [{a} + {ra}]\n",
                "test {ra}, {ra}\n",
                "jz 3f\n",
                "mov {fp}, [{a}]\n",
                "3:\n",
                "test {v}, {v}\n",
                "jz 9f\n",
                "lea {sp}, [{a} + {ra} + 8]\n",
            )
        };
    }
    // SAFETY: reads only `[a, a + ra + 8)` after checking
    // `sp <= a <= hi - ra - 8`, inside the readable stack the caller vouches
    // for; writes only `out` below `end`; reads the cache at indices below
    // CACHE_WORDS + WIDE_SLOTS. No stack use, flags clobbered.
    unsafe {
        core::arch::asm!(
            // The first frame's lookup.
            "mov {a:e}, {pc:e}",
            "shr {a:e}, 13",
            "xor {a:e}, {pc:e}",
            "and {a:e}, 0x1ffe",
            "mov {v}, [{cache} + {a} * 8]",
            "xor {v}, {pc}",
            // 23: `v` is the first way's word xor the key, `a` the set.
            "23:",
            "mov {tag}, {v}",
            "shl {tag}, 16",
            "jz 25f",
            "mov {v}, [{cache} + {a} * 8 + 8]",
            "xor {v}, {pc}",
            "mov {tag}, {v}",
            "shl {tag}, 16",
            "jnz 8f",
            // 25: decode `v = p << 48`.
            "25:",
            "mov {tag}, {v}",
            "shr {v}, 48",
            "cmp {v:e}, 0x4000",
            "jb 27f",
            "cmp {v:e}, 0xc000",
            "jae 28f",
            "mov {ra:e}, {v:e}",
            "and {ra:e}, 31",
            "shl {ra:e}, 3",
            "mov {off:e}, {v:e}",
            "shr {off:e}, 5",
            "and {off:e}, 0x1ff",
            "shl {off:e}, 3",
            // 26: `off`, `ra` set, bit 15 of `v` set for an rbp base.
            "26:",
            "lea {a}, [{ra} + 8]",
            "mov {amax}, {hi}",
            "sub {amax}, {a}",
            "jb 8f",
            "test {v:e}, 0x8000",
            "jz 32f",
            "test {off}, {off}",
            "jnz 33f",
            "test {ra}, {ra}",
            "jz 33f",
            "jmp 34f",
            // 27: a wide rule, `v` its slot.
            "27:",
            "test {v:e}, {v:e}",
            "jz 8f",
            "cmp {v:e}, {wide_slots}",
            "jae 8f",
            "mov {a}, [{cache} + {v} * 8 + {wide_at}]",
            "test {a}, {a}",
            "jz 8f",
            "mov {off:e}, {a:e}",
            "mov {ra}, {a}",
            "shr {ra}, 29",
            "and {ra:e}, 0x7f8",
            "shr {a}, 25",
            "and {a:e}, 0x8000",
            "mov {v:e}, {a:e}",
            "jmp 26b",
            // 28: other rules: `End` is the outermost frame.
            "28:",
            "cmp {v:e}, {end_rule}",
            "je 9f",
            "jmp 8f",
            // 32: rsp-based frames.
            "32:",
            general!("sp"),
            tail!("32b"),
            // 33: rbp-based frames.
            "33:",
            general!("fp"),
            tail!("33b"),
            // 34: the frame record (`push rbp; mov rbp, rsp` and any rule
            // with the saved rbp where rbp points): `a` is `fp` itself.
            "34:",
            "cmp {fp}, {sp}",
            "jb 8f",
            "cmp {fp}, {amax}",
            "ja 8f",
            "mov {v}, [{fp} + {ra}]",
            "test {v}, {v}",
            "jz 9f",
            "lea {sp}, [{fp} + {ra} + 8]",
            "mov {fp}, [{fp}]",
            tail!("34b"),
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
            v = out(reg) _,
            tag = out(reg) _,
            off = out(reg) _,
            ra = out(reg) _,
            amax = out(reg) _,
            end = in(reg) end,
            hi = in(reg) hi,
            cache = in(reg) cache,
            wide_slots = const WIDE_SLOTS,
            wide_at = const CACHE_WORDS * 8,
            end_rule = const PACKED_END as u32,
            options(nostack),
        )
    }
    *regs = [pc, sp, fp];
    *o = out;
    code
}

#[cfg(test)]
mod tests {
    use crate::arch::x86_64::{UnwindRuleX86_64, X86_64};
    use crate::arch::Arch;

    #[test]
    fn packed_end_is_the_packed_end_rule() {
        assert_eq!(super::PACKED_END, X86_64::pack(UnwindRuleX86_64::End));
    }

    #[test]
    fn wide_words_round_trip() {
        use UnwindRuleX86_64 as R;
        for r in [
            R::Sp { cfa: 8, bp: 0 },
            R::Sp {
                cfa: 1 << 20 | 8,
                bp: -16,
            },
            R::Bp {
                cfa: 3 << 30,
                bp: -56,
            },
            R::Sp {
                cfa: 70_000,
                bp: 0,
            },
        ] {
            let w = super::wide_word(r).unwrap();
            assert_ne!(w, 0);
            assert_eq!(super::from_wide_word(w), r, "{w:#x}");
        }
        assert_eq!(super::wide_word(R::Sp { cfa: 12, bp: 0 }), None);
        assert_eq!(super::wide_word(R::Sp { cfa: 48, bp: 8 }), None);
        assert_eq!(super::wide_word(R::End), None);
    }
}
