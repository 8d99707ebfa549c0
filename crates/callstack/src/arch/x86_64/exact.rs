//! x86-64 entries of exact capture: the naked entry that hands the caller's
//! `rip`/`rsp`/`rbp` to the unwinder (the registers of a signal context are
//! read in `context.rs`).

// The naked entries are defined (by these macros) only where this module is
// the native architecture; elsewhere it serves cores of x86-64.
#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(unused_macros, unused_imports, dead_code)
)]

use super::UnwindRuleX86_64;

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
                ".cfi_startproc",
                "mov rcx, [rsp]",
                "lea r8, [rsp + 8]",
                "mov r9, rbp",
                "jmp {imp}",
                ".cfi_endproc",
                imp = sym exact_from_entry,
            )
        }
    };
}
pub(crate) use define_exact_entry;

/// The signal return trampoline's test, now in [`super::signal`] (kept here
/// for the remote unwinder, which still names it through `exact`).
pub use super::signal::is_sigreturn_trampoline;

/// Bytes of code the in-process rule source reads at a pc to recognise
/// the signal trampoline (`is_sigreturn_trampoline`), at most 16.
pub(crate) const LOCAL_SIGRETURN_BYTES: usize = 9;
const _: () = assert!(LOCAL_SIGRETURN_BYTES <= 16);

/// Defines a naked entry that adds the caller's `rip`/`rsp`/`rbp` (as the
/// 2nd to 4th arguments) to a request pointer and tail-jumps to `$imp`,
/// which then sees the caller of the entry as its own caller. Invoked in
/// `unwind::local`, beside the functions it jumps to.
macro_rules! request_entry {
    ($(#[$doc:meta])* $name:ident($req:ty) $(-> $ret:ty)? => $imp:path) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `req` must be a valid request.
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        pub(crate) unsafe extern "C" fn $name(req: $req) $(-> $ret)? {
            // SAFETY: as `exact_entry`, with the registers as the 2nd to 4th
            // arguments.
            core::arch::naked_asm!(
                ".cfi_startproc",
                "mov rsi, [rsp]",
                "lea rdx, [rsp + 8]",
                "mov rcx, rbp",
                "jmp {imp}",
                ".cfi_endproc",
                imp = sym $imp,
            )
        }
    };
}

pub(crate) use request_entry;

use crate::arch::rule_cache::{CACHE_WORDS, WIDE_SLOTS};
// The assembly's set index (`and 0x1ffe`) assumes 8192 words.
const _: () = assert!(CACHE_WORDS == 8192);

/// The packed `End` rule (`X86_64::pack(UnwindRuleX86_64::End)`): the
/// outermost frame, which the hot loop ends on without the generic
/// unwinder.
pub(crate) const PACKED_END: u16 = 3 << 14 | 1;

/// The packed frame-record rule (`Bp { cfa: 16, bp: -16 }`: `push rbp;
/// mov rbp, rsp`), which [`run_hot`] chains with one load a frame.
pub(crate) const PACKED_FRAME_RECORD: u16 = 2 << 14 | 1;

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

/// The mark of a packed machine-code rule (bits 15-12 = `1101`): bits
/// 15-14 = 3 with bit 13 clear are the rules the hot loop leaves to its
/// caller, and bit 12 is clear in every other rule [`X86_64::pack`] gives.
/// For the CFI such a word is an address without CFI
/// (`X86_64::unpack` gives `NoCfi`), which it is.
///
/// [`X86_64::pack`]: super::X86_64
pub(crate) const INSN_MARK: u16 = 3 << 14 | 1 << 12;

/// The packed form of a rule machine-code analysis settled for an address
/// without CFI (see `rule::from_insn`), in the rule cache beside the CFI
/// rules: [`INSN_MARK`], bit 11 set for an `rbp` base, bits 10-5 `cfa / 8`
/// (up to 504), bits 4-0 `-bp / 8` (`rbp` saved down to 248 bytes under
/// the CFA, or 0: unchanged). `None` for a rule that does not fit.
pub(crate) fn pack_insn(rule: UnwindRuleX86_64) -> Option<u16> {
    let (fp_base, cfa, bp) = match rule {
        UnwindRuleX86_64::Sp { cfa, bp } => (0u16, cfa, bp),
        UnwindRuleX86_64::Bp { cfa, bp } => (1, cfa, bp),
        _ => return None,
    };
    if cfa % 8 != 0 || cfa == 0 || cfa / 8 > 0x3f || bp % 8 != 0 || !(-0xf8..=0).contains(&bp) {
        return None;
    }
    Some(INSN_MARK | fp_base << 11 | ((cfa / 8) as u16) << 5 | (-bp / 8) as u16)
}

/// The rule of a [`pack_insn`] word, `None` for any other packed rule.
#[inline(always)]
pub(crate) fn unpack_insn(p: u16) -> Option<UnwindRuleX86_64> {
    if p & 0xf000 != INSN_MARK {
        return None;
    }
    let cfa = ((p >> 5) & 0x3f) as u32 * 8;
    let bp = -((p & 0x1f) as i16) * 8;
    Some(if p & 1 << 11 != 0 {
        UnwindRuleX86_64::Bp { cfa, bp }
    } else {
        UnwindRuleX86_64::Sp { cfa, bp }
    })
}

/// Slots of the caller-prediction table after the wide table: one `u16`
/// per cache word plus a spare one (index [`CACHE_WORDS`]) that the first
/// frame of a walk writes, having no frame before it.
pub(crate) const PRED_SLOTS: usize = CACHE_WORDS + 8;

/// How [`run_hot`] stopped.
pub(crate) mod run_exit {
    /// The output is full.
    pub(crate) const FULL: u64 = 0;
    /// The packed `End` rule: the outermost frame (a zero return address
    /// exits with `SLOW` or `FULL`, see [`run_hot`](super::run_hot)).
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
/// at index `(key ^ key >> 13) & 0x1ffe`, then [`WIDE_SLOTS`] wide words,
/// then [`PRED_SLOTS`] `u16` predictions. A packed rule `p`
/// (`X86_64::pack`) with bits 15-14 = 1 or 2 is applied from its fields;
/// bits 15-14 = 0 make `p` the index of a [`wide_word`]; the packed `End`
/// ends the walk; anything else is left to the caller.
///
/// A rule is applied relative to `a = (fp if rbp-based else sp) + off_a`,
/// the lowest stack word the frame reads: the return address is at
/// `a + ra_at`, the caller's stack pointer is `a + ra_at + 8`, and the
/// caller's frame pointer is at `a` if `ra_at != 0` (unchanged otherwise).
/// A frame is applied only if `sp <= a` and `a + ra_at + 8 <= hi`: every
/// read lies in `[sp, hi)`.
///
/// The caller is predicted: the prediction slot of a cache word holds the
/// index of the word its caller's return address was found at last time.
/// That word is loaded while the frame is being unwound (its index depends
/// only on the previous index, not on the stack), and it is only used when
/// its key equals the return address actually read from the stack; else
/// the return address is looked up by hash and the prediction rewritten
/// (one `u16` store, atomic). So on a stack seen before, a frame waits on
/// one load (the prediction), not on the return address and then its cache
/// word; a wrong or stale prediction (another thread, a replaced word)
/// costs a lookup, never a wrong rule.
///
/// Returns a [`run_exit`] code, with `regs` at the last frame written (or
/// the start) and `*o` past the last slot written. A zero return address
/// (the outermost frame) is written like any other and then stops the walk
/// (`SLOW`, or `FULL` when it took the last slot) with `regs[0] == 0`: the
/// caller drops it (checking it in the loop would cost every frame). Written in assembly:
/// thirteen live values, which the compiler spilled.
///
/// # Safety
/// `*o < end` and `*o..end` writable; `[regs[1], hi)` readable stack,
/// `hi` below `2^63`; `cache` the rule cache as above.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn run_hot(
    regs: &mut [u64; 3],
    o: &mut *mut usize,
    end: *mut usize,
    hi: u64,
    cache: *const u64,
) -> u64 {
    let [mut pc, mut sp, mut fp] = *regs;
    // Slots are written at `end + cnt * 8`, `cnt` counting up to 0.
    // SAFETY (of the arithmetic): `*o` and `end` bound the caller's slots.
    let mut cnt: i64 = unsafe { (*o).offset_from(end) } as i64;
    let code: u64;
    // SAFETY: reads only `[a, a + ra * 8 + 8)` after checking `sp <= a`
    // and `a + ra * 8 + 8 <= hi` (no wrap: `a <= hi < 2^63`, `ra < 256`),
    // inside the readable stack the caller vouches for; writes only slots
    // `end + cnt * 8` with `cnt < 0` and prediction slots below
    // PRED_SLOTS; reads the cache at indices below CACHE_WORDS + WIDE_SLOTS
    // (a prediction read back is masked by being a `u16` below 8192 only
    // if written so: every store writes an index below CACHE_WORDS, and
    // the table starts all zero). No stack use, flags clobbered.
    unsafe {
        core::arch::asm!(
            // The first frame has no frame before it: its prediction goes
            // to the spare slot.
            "mov {off:e}, {cache_words}",
            "jmp 45f",
            // 40: the frame at `pc` is the key of word `idx`; `v` = its
            // packed rule, zero-extended.
            "40:",
            "mov {idx:e}, {nidx:e}",
            "movzx {nidx:e}, word ptr [{cache} + {idx} * 2 + {pred_at}]",
            // `p + 0x4000` has bit 15 set just for `p` in
            // `0x4000..0xc000` (bits 15-14 = 1 or 2), and then bit 14 set
            // for an rbp base; bits 13-0 are `p`'s.
            "add {v:e}, 0x4000",
            "test {v:e}, 0x8000",
            "jz 29f",
            "mov {ra:e}, {v:e}",
            "and {ra:e}, 31",
            "mov {off:e}, {v:e}",
            "shr {off:e}, 2",
            "and {off:e}, 0xff8",
            // 26: `off` (bytes), `ra` (words) set, bit 14 of `v` set for
            // an rbp base.
            "26:",
            "test {v:e}, 0x4000",
            "jnz 33f",
            "lea {a}, [{sp} + {off}]",
            // 35: `a` set and `a >= sp`.
            "35:",
            "lea {off}, [{a} + {ra} * 8 + 8]",
            "cmp {off}, {hi}",
            "ja 8f",
            // A zero return address (the outermost frame) is written and
            // then fails the lookup: the caller takes it back. The saved
            // `rbp` is loaded out of line (most frames without a frame
            // pointer do not save it): the loop is bound by how many
            // instructions it issues a frame, so each one counts.
            "mov {pc}, [{a} + {ra} * 8]",
            "test {ra:e}, {ra:e}",
            "jnz 37f",
            "36:",
            "mov {sp}, {off}",
            "mov [{end} + {cnt} * 8], {pc}",
            "add {cnt}, 1",
            "jz 7f",
            // The predicted caller's word: its rule is taken from the word
            // itself, not from the word xor the return address, so the
            // next frame's stack reads wait on the prediction only, not on
            // this frame's stack read (which only checks the key). A hit
            // goes round again (`40` makes the prediction the current
            // word); a miss looks the return address up, `off` being the
            // word whose prediction it rewrites.
            "mov {v}, [{cache} + {nidx} * 8]",
            "mov {ra}, {v}",
            "shr {v}, 48",
            "xor {ra}, {pc}",
            "shl {ra}, 16",
            "jz 40b",
            "mov {off:e}, {idx:e}",
            "jmp 45f",
            // 37: the frame saved `rbp` at `a`.
            "37:",
            "mov {fp}, [{a}]",
            "jmp 36b",
            // 33: rbp-based frames; the frame record has a loop of its own.
            "33:",
            "cmp {v:e}, {frame_record} + 0x4000",
            "je 34f",
            "mov {a}, {fp}",
            "add {a}, {off}",
            "jc 8f",
            "cmp {a}, {sp}",
            "jb 8f",
            "cmp {a}, {hi}",
            "ja 8f",
            "jmp 35b",
            // 34: the frame record (`push rbp; mov rbp, rsp`): `a` is `fp`
            // itself, the next `fp` is loaded from it, nothing to decode;
            // the next frame is looked up by hash (its return address is
            // loaded no later than `fp`, so this adds no wait) and stays
            // here while it has this rule too.
            "34:",
            "cmp {fp}, {sp}",
            "jb 8f",
            "mov {off}, {fp}",
            "add {off}, 16",
            "jc 8f",
            "cmp {off}, {hi}",
            "ja 8f",
            "mov {v}, [{fp} + 8]",
            "mov {sp}, {off}",
            "mov {fp}, [{fp}]",
            "mov {pc}, {v}",
            "mov [{end} + {cnt} * 8], {v}",
            "add {cnt}, 1",
            "jz 7f",
            "mov {a:e}, {pc:e}",
            "shr {a:e}, 13",
            "xor {a:e}, {pc:e}",
            "and {a:e}, 0x1ffe",
            "mov {v}, [{cache} + {a} * 8]",
            "xor {v}, {pc}",
            "rol {v}, 16",
            "mov {off:e}, {idx:e}",
            "mov {idx:e}, {a:e}",
            "cmp {v}, {frame_record}",
            "je 34b",
            "jmp 45f",
            // 45: look `pc` up in both ways of its set; found, the index
            // becomes word `off`'s prediction (the previous frame's).
            "45:",
            "mov {a:e}, {pc:e}",
            "shr {a:e}, 13",
            "xor {a:e}, {pc:e}",
            "and {a:e}, 0x1ffe",
            "mov {v}, [{cache} + {a} * 8]",
            "xor {v}, {pc}",
            "rol {v}, 16",
            "cmp {v}, 0xffff",
            "jbe 46f",
            "add {a:e}, 1",
            "mov {v}, [{cache} + {a} * 8]",
            "xor {v}, {pc}",
            "rol {v}, 16",
            "cmp {v}, 0xffff",
            "ja 8f",
            "46:",
            "mov word ptr [{cache} + {off} * 2 + {pred_at}], {a:x}",
            "mov {nidx:e}, {a:e}",
            "jmp 40b",
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
            "shr {ra}, 32",
            "and {ra:e}, 0xff",
            "shr {a}, 26",
            "and {a:e}, 0x4000",
            "mov {v:e}, {a:e}",
            "jmp 26b",
            // 29: `v` is `p + 0x4000`, `p` a wide rule's slot or another
            // rule.
            "29:",
            "sub {v:e}, 0x4000",
            "cmp {v:e}, 0x4000",
            "jb 27b",
            // 28: other rules: `End` is the outermost frame.
            "cmp {v:e}, {end_rule}",
            "je 9f",
            "jmp 8f",
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
            cnt = inout(reg) cnt,
            a = out(reg) code,
            v = out(reg) _,
            idx = out(reg) _,
            nidx = out(reg) _,
            off = out(reg) _,
            ra = out(reg) _,
            end = in(reg) end,
            hi = in(reg) hi,
            cache = in(reg) cache,
            cache_words = const CACHE_WORDS,
            wide_slots = const WIDE_SLOTS,
            wide_at = const CACHE_WORDS * 8,
            pred_at = const (CACHE_WORDS + WIDE_SLOTS) * 8,
            end_rule = const PACKED_END as u32,
            frame_record = const PACKED_FRAME_RECORD as u32,
            options(nostack),
        )
    }
    *regs = [pc, sp, fp];
    // SAFETY: `cnt <= 0` slots before `end`, inside the caller's slots.
    *o = unsafe { end.offset(cnt as isize) };
    code
}

#[cfg(test)]
mod tests {
    use crate::arch::x86_64::{UnwindRuleX86_64, X86_64};
    use crate::arch::Arch;

    #[test]
    fn packed_end_is_the_packed_end_rule() {
        assert_eq!(super::PACKED_END, X86_64::pack(UnwindRuleX86_64::End));
        assert_eq!(
            super::PACKED_FRAME_RECORD,
            X86_64::pack(UnwindRuleX86_64::Bp { cfa: 16, bp: -16 })
        );
    }

    #[test]
    fn machine_code_rules_pack_apart() {
        use super::{pack_insn, unpack_insn, INSN_MARK};
        use UnwindRuleX86_64 as R;
        for r in [
            R::Sp { cfa: 8, bp: 0 },
            R::Sp {
                cfa: 0x38,
                bp: -0x18,
            },
            R::Bp { cfa: 16, bp: -16 },
            R::Sp { cfa: 504, bp: -248 },
        ] {
            let p = pack_insn(r).unwrap();
            assert_eq!(p & 0xf000, INSN_MARK);
            assert_eq!(unpack_insn(p), Some(r));
            // Not a rule of the CFI: an address without CFI.
            assert_eq!(X86_64::unpack(p), R::NoCfi);
            // Nor a word the hot loop applies (bits 15-14 = 3, not `End`).
            assert_eq!(p >> 14, 3);
            assert_ne!(p, super::PACKED_END);
        }
        assert_eq!(pack_insn(R::Sp { cfa: 512, bp: 0 }), None);
        assert_eq!(pack_insn(R::Sp { cfa: 12, bp: 0 }), None);
        assert_eq!(pack_insn(R::Sp { cfa: 48, bp: 8 }), None);
        assert_eq!(pack_insn(R::End), None);
        // No rule of the CFI packs as one.
        for r in [
            R::End,
            R::NoCfi,
            R::Evaluate,
            R::SignalFrame,
            R::Plt { threshold: 11 },
            R::Sp { cfa: 8, bp: -16 },
            R::Bp { cfa: 16, bp: -16 },
            R::Sp { cfa: 48, bp: 0 },
        ] {
            assert_eq!(unpack_insn(X86_64::pack(r)), None, "{r:?}");
        }
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
            R::Sp { cfa: 70_000, bp: 0 },
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
