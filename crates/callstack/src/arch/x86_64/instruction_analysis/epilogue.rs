//! Epilogue analysis: follow the code forward from the pc to a `ret`.
//!
//! At the `ret`, `rsp` points at the return address. Its value there, as an
//! offset from `rsp` or `rbp` at the pc, is the rule. A path that loses track
//! of `rsp` (`and rsp, -16` never undone, `mov rsp, rax` from an unknown
//! value) is abandoned and another one tried. Up to [`MAX_CANDIDATES`]
//! distinct rules are returned, in the order found; the caller checks each
//! candidate's return address (it must follow a call) and takes the first
//! that passes, which guards against a path that fell through a call to a
//! `noreturn` function into the next function's code.

use super::{search, Found, Goal, State, Val, RBP, RSP, SB};
use crate::types::{CodeMemory, FpRule, InsnRule};

/// Most candidate rules returned.
pub const MAX_CANDIDATES: usize = 4;

/// Candidate rules for the frame at `pc`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Candidates {
    /// The rules, in the order found; only `len` are valid.
    pub rules: [Option<(InsnRule, bool)>; MAX_CANDIDATES],
    /// How many.
    pub len: usize,
}

impl Candidates {
    /// The candidates: each rule and whether it came through an indirect
    /// jump (a tail call) rather than a `ret`.
    pub fn iter(&self) -> impl Iterator<Item = (InsnRule, bool)> + '_ {
        self.rules[..self.len].iter().flatten().copied()
    }

    /// The first candidate, if any.
    pub fn first(&self) -> Option<InsnRule> {
        self.iter().next().map(|c| c.0)
    }
}

/// Turns the state at a `ret` into a rule.
pub(crate) fn rule_at_return(f: &Found) -> Option<InsnRule> {
    let Val::Rel(base, off) = f.state.regs[RSP] else {
        return None;
    };
    let base = base.base()?;
    let cfa_offset = off.checked_add(8)?;
    let fp = match f.state.regs[RBP] {
        Val::Rel(SB::Fp, 0) => FpRule::Unchanged,
        Val::Load(b, o) => b.base().map_or(FpRule::Unknown, |b| FpRule::At(b, o)),
        Val::Rel(b, o) => b.base().map_or(FpRule::Unknown, |b| FpRule::Value(b, o)),
        Val::Unknown => FpRule::Unknown,
    };
    Some(InsnRule {
        cfa_base: base,
        cfa_offset,
        ra_at_cfa: Some(-8),
        ret_pop: f.ret_pop,
        fp,
    })
}

/// Analyzes the code from `pc` forward. `bounds` is the function's
/// `[start, end)` when known (it stops paths that fall out of the function).
///
/// ```text
/// pc -> 48 83 c4 18   add rsp, 0x18
///       5b            pop rbx
///       5d            pop rbp
///       c3            ret            => CFA = rsp + 0x30, rbp at CFA - 0x10
/// ```
pub fn analyze<C: CodeMemory + ?Sized>(
    code: &mut C,
    pc: u64,
    bounds: Option<(u64, u64)>,
) -> Candidates {
    let mut out = Candidates::default();
    search(code, pc, State::at_pc(), Goal::Return, bounds, |f| {
        if let Some(r) = rule_at_return(&f) {
            if !out.iter().any(|(x, _)| x == r) {
                out.rules[out.len] = Some((r, f.tail));
                out.len += 1;
            }
        }
        out.len < MAX_CANDIDATES
    });
    out
}

#[cfg(test)]
mod tests {
    use super::super::testutil::code;
    use super::*;
    use crate::arch::x86_64::instruction_analysis::MAX_STORES;
    use crate::types::Base::{self, *};

    fn first(bytes: &[u8]) -> Option<InsnRule> {
        analyze(&mut code(bytes), 0x1000, None).first()
    }

    fn rule(base: Base, off: i32, fp: FpRule) -> InsnRule {
        InsnRule {
            cfa_base: base,
            cfa_offset: off,
            ra_at_cfa: Some(-8),
            ret_pop: 0,
            fp,
        }
    }

    #[test]
    fn plain_ret() {
        // c3   ret
        assert_eq!(first(&[0xc3]), Some(rule(Sp, 8, FpRule::Unchanged)));
    }

    #[test]
    fn add_pop_ret() {
        // 48 83 c4 18   add rsp, 0x18
        // 5b            pop rbx
        // 5d            pop rbp
        // c3            ret
        let r = first(&[0x48, 0x83, 0xc4, 0x18, 0x5b, 0x5d, 0xc3]).unwrap();
        assert_eq!(r, rule(Sp, 0x30, FpRule::At(Sp, 0x20)));
    }

    #[test]
    fn leave_ret() {
        // c9   leave
        // c3   ret
        let r = first(&[0xc9, 0xc3]).unwrap();
        assert_eq!(r, rule(Fp, 16, FpRule::At(Fp, 0)));
    }

    #[test]
    fn mov_rsp_rbp_pop_rbp() {
        // 48 89 ec   mov rsp, rbp
        // 5d         pop rbp
        // c3         ret
        let r = first(&[0x48, 0x89, 0xec, 0x5d, 0xc3]).unwrap();
        assert_eq!(r, rule(Fp, 16, FpRule::At(Fp, 0)));
    }

    #[test]
    fn lea_rsp_from_rbp() {
        // 48 8d 65 f0   lea rsp, [rbp-0x10]
        // 5b            pop rbx
        // 41 5c         pop r12
        // 5d            pop rbp
        // c3            ret
        let r = first(&[0x48, 0x8d, 0x65, 0xf0, 0x5b, 0x41, 0x5c, 0x5d, 0xc3]).unwrap();
        assert_eq!(r, rule(Fp, 16, FpRule::At(Fp, 0)));
    }

    #[test]
    fn ret_imm() {
        // 48 83 c4 08   add rsp, 8
        // c2 10 00      ret 0x10
        let r = first(&[0x48, 0x83, 0xc4, 0x08, 0xc2, 0x10, 0x00]).unwrap();
        assert_eq!(r.cfa_offset, 16);
        assert_eq!(r.ret_pop, 16);
    }

    #[test]
    fn call_is_stepped_over() {
        // e8 00 00 00 00   call next (stepped over)
        // 48 83 c4 08      add rsp, 8
        // c3               ret
        let r = first(&[0xe8, 0, 0, 0, 0, 0x48, 0x83, 0xc4, 0x08, 0xc3]).unwrap();
        assert_eq!(r, rule(Sp, 16, FpRule::Unchanged));
    }

    #[test]
    fn unconditional_jump_followed() {
        // 1000: eb 02         jmp 0x1004
        // 1002: 0f 0b         ud2 (never reached)
        // 1004: 48 83 c4 28   add rsp, 0x28
        // 1008: c3            ret
        let r = first(&[0xeb, 0x02, 0x0f, 0x0b, 0x48, 0x83, 0xc4, 0x28, 0xc3]).unwrap();
        assert_eq!(r, rule(Sp, 0x30, FpRule::Unchanged));
    }

    #[test]
    fn conditional_jump_both_paths() {
        // 1000: 74 02         je 0x1004
        // 1002: 0f 0b         ud2            (fall-through path dies)
        // 1004: 5b            pop rbx
        // 1005: c3            ret
        let r = first(&[0x74, 0x02, 0x0f, 0x0b, 0x5b, 0xc3]).unwrap();
        assert_eq!(r, rule(Sp, 16, FpRule::Unchanged));
    }

    #[test]
    fn loop_terminates() {
        // 1000: 48 ff c8      dec rax
        // 1003: 75 fb         jne 0x1000
        // 1005: eb f9         jmp 0x1000   (back to the loop: visited)
        let c = analyze(
            &mut code(&[0x48, 0xff, 0xc8, 0x75, 0xfb, 0xeb, 0xf9]),
            0x1000,
            None,
        );
        assert_eq!(c.len, 0);
    }

    #[test]
    fn stack_realignment_and_restore() {
        // gcc's main with stack realignment, from after the prologue:
        // 1000: 48 8b 4d f8   mov rcx, [rbp-8]     (saved r10 reloaded)
        // 1004: c9            leave
        // 1005: 48 8d 61 f8   lea rsp, [rcx-8]
        // 1009: c3            ret
        // The value of [rbp-8] is unknown symbolically, so rsp is lost:
        assert_eq!(
            first(&[0x48, 0x8b, 0x4d, 0xf8, 0xc9, 0x48, 0x8d, 0x61, 0xf8, 0xc3]),
            None
        );
        // ... unless the path saw it stored, as from the prologue:
        // 1000: 4c 8d 54 24 08   lea r10, [rsp+8]
        // 1005: 48 83 e4 f0      and rsp, -16
        // 1009: 41 ff 72 f8      push qword [r10-8]
        // 100d: 55               push rbp
        // 100e: 48 89 e5         mov rbp, rsp
        // 1011: 41 52            push r10
        // 1013: 4c 8b 55 f8      mov r10, [rbp-8]
        // 1017: c9               leave
        // 1018: 49 8d 62 f8      lea rsp, [r10-8]
        // 101c: c3               ret
        let bytes = [
            0x4c, 0x8d, 0x54, 0x24, 0x08, 0x48, 0x83, 0xe4, 0xf0, 0x41, 0xff, 0x72, 0xf8, 0x55,
            0x48, 0x89, 0xe5, 0x41, 0x52, 0x4c, 0x8b, 0x55, 0xf8, 0xc9, 0x49, 0x8d, 0x62, 0xf8,
            0xc3,
        ];
        assert_eq!(first(&bytes), Some(rule(Sp, 8, FpRule::Unchanged)));
    }

    #[test]
    fn push_then_pop_restores() {
        // prologue seen from its first instruction:
        // 55            push rbp
        // 48 89 e5      mov rbp, rsp
        // 48 83 ec 20   sub rsp, 0x20
        // c9            leave
        // c3            ret
        let r = first(&[0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0xc9, 0xc3]).unwrap();
        assert_eq!(r, rule(Sp, 8, FpRule::Unchanged));
    }

    #[test]
    fn indirect_jump_is_a_tail_call_candidate() {
        // 48 83 c4 08   add rsp, 8
        // ff e0         jmp rax
        let c = analyze(
            &mut code(&[0x48, 0x83, 0xc4, 0x08, 0xff, 0xe0]),
            0x1000,
            None,
        );
        assert_eq!(
            c.iter().next(),
            Some((rule(Sp, 16, FpRule::Unchanged), true))
        );
    }

    #[test]
    fn bounds_stop_fall_through() {
        // 1000: e8 00 00 00 00   call abort-like (never returns)
        // 1005: 5b               pop rbx  <- next function, outside bounds
        // 1006: c3               ret
        let mut c = code(&[0xe8, 0, 0, 0, 0, 0x5b, 0xc3]);
        assert_eq!(analyze(&mut c, 0x1000, Some((0x1000, 0x1005))).len, 0);
        assert_eq!(analyze(&mut c, 0x1000, None).len, 1);
    }

    #[test]
    fn enter_leave() {
        // c8 10 00 00   enter 0x10, 0
        // c9            leave
        // c3            ret
        let r = first(&[0xc8, 0x10, 0x00, 0x00, 0xc9, 0xc3]).unwrap();
        assert_eq!(r, rule(Sp, 8, FpRule::Unchanged));
    }

    #[test]
    fn truncated_code_gives_nothing() {
        // 48 83   (add rsp, .. cut off)
        assert_eq!(first(&[0x48, 0x83]), None);
        assert_eq!(first(&[]), None);
    }

    /// The shape of a naked entry without CFI that passes its registers on
    /// and jumps to an unoptimized function: that function spills the
    /// caller's rbp (passed in rcx) and other values to more slots than are
    /// remembered. The pushed rbp must survive (or, forgotten, read as
    /// unknown), never be read back from the stack as it was at the pc.
    #[test]
    fn tail_jump_into_a_function_that_spills_more_than_is_remembered() {
        let mut b = vec![
            0x48, 0x89, 0xe9, // mov rcx, rbp
            0x48, 0x8d, 0x54, 0x24, 0x08, // lea rdx, [rsp + 8]
            0xe9, 0x00, 0x00, 0x00, 0x00, // jmp next
            0x55, // push rbp
            0x48, 0x89, 0xe5, // mov rbp, rsp
            0x41, 0x57, // push r15
            0x53, // push rbx
            0x48, 0x81, 0xec, 0x00, 0x02, 0x00, 0x00, // sub rsp, 0x200
        ];
        // Spill rcx and rdx (stack addresses and the caller's rbp) over and
        // over: mov [rbp - 0x18 - 8k], rcx / rdx.
        for k in 0..24u8 {
            let reg = if k % 2 == 0 { 0x4d } else { 0x55 }; // rcx / rdx
            b.extend_from_slice(&[0x48, 0x89, reg, 0xe8u8.wrapping_sub(8 * k)]);
        }
        b.extend_from_slice(&[
            0x48, 0x81, 0xc4, 0x00, 0x02, 0x00, 0x00, // add rsp, 0x200
            0x5b, // pop rbx
            0x41, 0x5f, // pop r15
            0x5d, // pop rbp
            0xc3, // ret
        ]);
        let r = analyze(&mut code(&b), 0x1000, None).first().unwrap();
        assert_eq!(r.cfa_base, Sp);
        assert_eq!(r.cfa_offset, 8);
        assert!(
            matches!(r.fp, FpRule::Unchanged | FpRule::Unknown),
            "rbp read from a slot the path overwrote: {:?}",
            r.fp
        );
    }

    /// With every slot taken by distinct stack addresses, a load from a
    /// slot that had to be forgotten is unknown.
    #[test]
    fn a_forgotten_slot_reads_as_unknown() {
        let mut b = vec![
            0x55, // push rbp       (slot -8: the caller's rbp)
        ];
        // lea rax, [rsp + 8k]; push rax: distinct stack addresses.
        for k in 0..(MAX_STORES as u8 + 2) {
            b.extend_from_slice(&[0x48, 0x8d, 0x44, 0x24, 8 * k, 0x50]);
        }
        // add rsp, 8 * (MAX_STORES + 2) (imm32); pop rbp; ret
        b.extend_from_slice(&[0x48, 0x81, 0xc4, 8 * (MAX_STORES as u8 + 2), 0, 0, 0]);
        b.extend_from_slice(&[0x5d, 0xc3]);
        let r = analyze(&mut code(&b), 0x1000, None).first().unwrap();
        assert_eq!((r.cfa_base, r.cfa_offset), (Sp, 8));
        assert!(
            matches!(r.fp, FpRule::Unchanged | FpRule::Unknown),
            "{:?}",
            r.fp
        );
    }
}
