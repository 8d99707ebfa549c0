//! AArch64 instruction analysis for frames without CFI.
//!
//! - [`prologue::analyze`]: the function's start (a symbol, or the nearest
//!   instruction before the pc that allocates stack: `stp x29, x30, [sp,
//!   #-N]!`, `sub sp, sp, #N`, `sub sp, sp, xN` after `mov xN, #N`), then the
//!   instructions from it to the pc: the stack adjustment, where x29/x30 were
//!   stored (the frame record may sit at the *bottom* of a large frame: `sub
//!   sp, sp, x12; stp x29, x30, [sp]`), and `mov x29, sp`.
//! - [`call_before`]: `bl` / `blr` (and the pointer-authenticated `blraa`
//!   family) right before a return address.
//! - [`Arch`]: the [`RiscArch`](crate::arch::risc::RiscArch) glue.

pub mod prologue;

use crate::types::CallBefore;
use crate::types::Memory;
use crate::types::{CodeMemory, UnwindRegs};

pub(crate) use crate::arch::risc::insn_at;

/// The call that ends right before `ra`.
///
/// ```text
/// 94xxxxxx   bl   target      -> Direct(ra - 4 + imm26 * 4)
/// d63f0xx0   blr  xN          -> Indirect
/// ```
pub fn call_before<C: CodeMemory + ?Sized>(code: &mut C, ra: u64) -> Option<CallBefore> {
    let at = ra.checked_sub(4)?;
    let i = insn_at(code, at)?;
    if i & 0xfc00_0000 == 0x9400_0000 {
        let imm = ((i & 0x03ff_ffff) << 6) as i32 >> 6;
        return Some(CallBefore::Direct(at.wrapping_add((imm as i64 * 4) as u64)));
    }
    // blr xN; blraa/blrab/blraaz/blrabz
    if i & 0xffff_fc1f == 0xd63f_0000 || i & 0xfeff_f800 == 0xd63f_0800 {
        return Some(CallBefore::Indirect);
    }
    None
}

crate::arch::risc::risc_arch! {
    /// The AArch64 glue for the RISC unwinder.
    Arch {
        word: 8,
        call_to_ra: 4,
        analyze: prologue::analyze,
        call_before: call_before,
        is_trampoline: super::signal::is_trampoline,
        signal_frame: super::signal::frame,
        frame_record: frame_record,
    }
}

/// The caller's registers from the AAPCS64 frame record at x29 (the saved
/// x29, then x30), when x29 is 16-aligned and above sp.
pub fn frame_record<M: Memory + ?Sized>(regs: &UnwindRegs, mem: &mut M) -> Option<UnwindRegs> {
    if regs.fp & 15 != 0 || regs.fp <= regs.sp {
        return None;
    }
    // A record at the very top of the address space is not one.
    let sp = regs.fp.checked_add(16)?;
    let prev = mem.read_u64(regs.fp).ok()?;
    let lr = mem.read_u64(regs.fp + 8).ok()?;
    Some(UnwindRegs {
        pc: lr,
        sp,
        fp: prev,
        lr: 0,
    })
}
