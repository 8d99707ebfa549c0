//! MIPS32 (o32, little-endian) instruction analysis for frames without CFI,
//! the method of seed 000: find `addiu sp, sp, -N` (the frame allocation)
//! and `sw ra, M(sp)` (where the return address went).
//!
//! - [`prologue::analyze`]: the function's start (a symbol, or the nearest
//!   `addiu sp, sp, -N` before the pc), then the instructions from it to the
//!   pc: the allocation, the saves of `ra` and `s8`/`fp`, and, for a pc past
//!   a mid-function return (`jr ra` with the frame popped in its delay
//!   slot), the state before that epilogue.
//! - [`call_before`]: `jal`, `bal` or `jalr` 8 bytes before a return address
//!   (the call and its delay slot).

pub mod prologue;

use crate::types::CallBefore;
use crate::types::CodeMemory;

pub(crate) use crate::arch::risc::insn_at;

/// The call 8 bytes before `ra` (a call, then its delay slot).
///
/// ```text
/// 0c1001c0   jal   0x400700      -> Direct
/// 0411ffda   bal   pc+4-0x94     -> Direct
/// 0320f809   jalr  t9            -> Indirect
/// ```
pub fn call_before<C: CodeMemory + ?Sized>(code: &mut C, ra: u64) -> Option<CallBefore> {
    let at = ra.checked_sub(8)?;
    let i = insn_at(code, at)?;
    if i & 0xfc00_0000 == 0x0c00_0000 {
        let t = ((at + 4) & 0xf000_0000) | (((i & 0x03ff_ffff) as u64) << 2);
        return Some(CallBefore::Direct(t));
    }
    if i & 0xffff_0000 == 0x0411_0000 {
        let off = ((i & 0xffff) as i16 as i64) << 2;
        return Some(CallBefore::Direct((at as i64 + 4 + off) as u64));
    }
    // jalr rs (rd = ra): SPECIAL, funct 9.
    if i & 0xfc1f_f83f == 0x0000_f809 {
        return Some(CallBefore::Indirect);
    }
    None
}

crate::arch::risc::risc_arch! {
    /// The MIPS glue for the RISC unwinder (o32 has no frame record at a
    /// fixed place from s8).
    Arch {
        word: 4,
        call_to_ra: 8,
        analyze: prologue::analyze,
        call_before: call_before,
        is_trampoline: super::signal::at_trampoline,
        signal_frame: super::signal::frame,
    }
}
