//! Prologue analysis: follow the code from the function's start to the pc.
//!
//! At the start, `rsp` points at the return address. The executor runs the
//! path from the start to the pc with `rsp`/`rbp` symbolic as "the values at
//! entry"; at the pc, whichever of `rsp` and `rbp` is still a known offset
//! from the entry `rsp` locates the return address, and the slot where the
//! caller's `rbp` was pushed (if it was) tells where to restore it from. This
//! serves functions that never return (`noreturn` paths end in a call, not a
//! `ret`) and cross-checks epilogue analysis. It needs the start: a symbol,
//! or the target of the direct call before a candidate return address.
//!
//! Nothing here assumes a particular prologue shape: gcc at `-O2` with frame
//! pointers may schedule `push rbp` away from `mov rbp, rsp`, put other
//! pushes in between, or set up the frame only on some paths
//! (shrink-wrapping); the executor follows whatever the code does.

use super::{search, Goal, State, Val, RBP, RSP, SB};
use crate::types::{Base, CodeMemory, FpRule, InsnRule};

/// The rule at `pc` for the function starting at `start`, when the path from
/// `start` reaches `pc` with the stack pointer (or frame pointer) known.
/// `bounds` limits the search to the function when its end is known; `pc`
/// may equal the end (the return address of a call that ends the function).
///
/// ```text
/// start: 41 54            push r12
///        55               push rbp
///        53               push rbx
///        48 83 ec 10      sub rsp, 0x10
///        48 89 e5         mov rbp, rsp
/// pc:    ...              => CFA = rsp + 0x30, rbp at CFA - 0x18
/// ```
pub fn analyze<C: CodeMemory + ?Sized>(
    code: &mut C,
    start: u64,
    pc: u64,
    bounds: Option<(u64, u64)>,
) -> Option<InsnRule> {
    // Let the search reach `pc == end` (a call as the last instruction).
    let bounds = bounds.map(|(lo, hi)| (lo, hi.max(pc.saturating_add(1))));
    let mut result = None;
    search(code, start, State::at_pc(), Goal::Reach(pc), bounds, |f| {
        result = rule_at_pc(&f.state);
        result.is_none()
    });
    result
}

fn rule_at_pc(st: &State) -> Option<InsnRule> {
    // Entry sp is SB::Sp here, entry rbp (the caller's) is SB::Fp.
    let (cfa_base, d) = match (st.regs[RSP], st.regs[RBP]) {
        (Val::Rel(SB::Sp, d), _) => (Base::Sp, d),
        (_, Val::Rel(SB::Sp, d)) => (Base::Fp, d),
        _ => return None,
    };
    let cfa_offset = 8i32.checked_sub(d)?;
    let fp = if st.regs[RBP] == Val::Rel(SB::Fp, 0) {
        FpRule::Unchanged
    } else {
        match st.find_store(Val::Rel(SB::Fp, 0)) {
            // Saved at entry_sp + k = CFA - 8 + k.
            Some((SB::Sp, k)) => FpRule::At(cfa_base, cfa_offset - 8 + k),
            Some((SB::Tmp, k)) => match (st.regs[RSP], st.regs[RBP]) {
                (Val::Rel(SB::Tmp, d2), _) => FpRule::At(Base::Sp, k - d2),
                (_, Val::Rel(SB::Tmp, d2)) => FpRule::At(Base::Fp, k - d2),
                _ => FpRule::Unknown,
            },
            _ => FpRule::Unknown,
        }
    };
    Some(InsnRule {
        cfa_base,
        cfa_offset,
        ra_at_cfa: Some(-8),
        ret_pop: 0,
        fp,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testutil::code;
    use super::*;
    use crate::types::Base::*;

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
    fn at_entry() {
        // 1000: 55   push rbp   <- pc
        assert_eq!(
            analyze(&mut code(&[0x55]), 0x1000, 0x1000, None),
            Some(rule(Sp, 8, FpRule::Unchanged))
        );
    }

    #[test]
    fn pushes_and_sub() {
        // 1000: 41 54          push r12
        // 1002: 55             push rbp
        // 1003: 53             push rbx
        // 1004: 48 83 ec 10    sub rsp, 0x10
        // 1008: e8 00 00 00 00 call ...     <- pc
        let b = [
            0x41, 0x54, 0x55, 0x53, 0x48, 0x83, 0xec, 0x10, 0xe8, 0, 0, 0, 0,
        ];
        let r = analyze(&mut code(&b), 0x1000, 0x1008, None).unwrap();
        // rbp was pushed but not changed: it still holds the caller's value.
        assert_eq!(r, rule(Sp, 0x30, FpRule::Unchanged));
        // 1008: 48 89 e5 mov rbp, rsp   (now it is changed)
        let b = [
            0x41, 0x54, 0x55, 0x53, 0x48, 0x83, 0xec, 0x10, 0x48, 0x89, 0xe5, 0x90,
        ];
        let r = analyze(&mut code(&b), 0x1000, 0x100b, None).unwrap();
        assert_eq!(r, rule(Sp, 0x30, FpRule::At(Sp, 0x30 - 0x18)));
    }

    #[test]
    fn frame_pointer_scheduled_apart() {
        // gcc -O2 -fno-omit-frame-pointer may split the frame setup:
        // 1000: 55             push rbp
        // 1001: 31 c0          xor eax, eax
        // 1003: 41 54          push r12   (in between)
        // 1005: 48 8d 6c 24 08 lea rbp, [rsp+8]   (rbp = entry_sp - 8)
        // 100a: 48 83 ec 20    sub rsp, 0x20
        // 100e: 48 29 c4       sub rsp, rax   (alloca: rsp unknown)
        // 1011: 90             nop        <- pc
        let b = [
            0x55, 0x31, 0xc0, 0x41, 0x54, 0x48, 0x8d, 0x6c, 0x24, 0x08, 0x48, 0x83, 0xec, 0x20,
            0x48, 0x29, 0xc4, 0x90,
        ];
        let r = analyze(&mut code(&b), 0x1000, 0x1011, None).unwrap();
        // rsp is lost, rbp = entry_sp - 8: CFA = rbp + 16, caller's rbp at [rbp].
        assert_eq!(r, rule(Fp, 16, FpRule::At(Fp, 0)));
    }

    #[test]
    fn noreturn_function_end() {
        // 1000: 48 83 ec 08    sub rsp, 8
        // 1004: e8 00 00 00 00 call abort
        // 1009:                <- return address = end of the function
        let b = [0x48, 0x83, 0xec, 0x08, 0xe8, 0, 0, 0, 0];
        let r = analyze(&mut code(&b), 0x1000, 0x1009, Some((0x1000, 0x1009))).unwrap();
        assert_eq!(r, rule(Sp, 16, FpRule::Unchanged));
    }

    #[test]
    fn pc_after_branches() {
        // 1000: 53             push rbx
        // 1001: 85 ff          test edi, edi
        // 1003: 74 06          je 0x100b
        // 1005: 48 83 ec 10    sub rsp, 0x10   (shrink-wrapped slow path)
        // 1009: eb 02          jmp 0x100d
        // 100b: 5b             pop rbx
        // 100c: c3             ret
        // 100d: 90             nop             <- pc
        let b = [
            0x53, 0x85, 0xff, 0x74, 0x06, 0x48, 0x83, 0xec, 0x10, 0xeb, 0x02, 0x5b, 0xc3, 0x90,
        ];
        let r = analyze(&mut code(&b), 0x1000, 0x100d, None).unwrap();
        assert_eq!(r, rule(Sp, 0x20, FpRule::Unchanged));
    }

    #[test]
    fn saved_rbp_survives_many_spills() {
        // A debug build's prologue: the pushed rbp must still be found after
        // more spills than there are store slots.
        // 1000: 55                push rbp
        // 1001: 48 89 e5          mov rbp, rsp
        // 1004: 48 81 ec 00 01 00 00  sub rsp, 0x100
        //       48 89 7d f0 ...   mov [rbp-0x10-8k], rdi   (x 16)
        let mut b = vec![
            0x55, 0x48, 0x89, 0xe5, 0x48, 0x81, 0xec, 0x00, 0x01, 0x00, 0x00,
        ];
        for k in 0..16u8 {
            b.extend_from_slice(&[0x48, 0x89, 0x7d, 0xf0u8.wrapping_sub(8 * k)]);
        }
        b.push(0x90);
        let pc = 0x1000 + b.len() as u64 - 1;
        let r = analyze(&mut code(&b), 0x1000, pc, None).unwrap();
        assert_eq!(r, rule(Sp, 0x110, FpRule::At(Sp, 0x100)));
    }

    #[test]
    fn unreachable_pc() {
        // 1000: c3 ret ; pc 0x1001 not reached
        assert_eq!(
            analyze(&mut code(&[0xc3, 0x90]), 0x1000, 0x1001, None),
            None
        );
    }
}
