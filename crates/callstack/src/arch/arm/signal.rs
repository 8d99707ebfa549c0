//! 32-bit ARM signal frames (as the kernel and qemu-user lay them out).
//!
//! A handler returns to a trampoline `mov r7, #NR; svc 0` (ARM), `movs
//! r7, #NR; svc 0` (Thumb, the kernel's and qemu's) or `mov.w r7, #NR; svc
//! 0` (glibc's `__default_sa_restorer`, Thumb-2): 119 (`sigreturn`, a frame set up without
//! `SA_SIGINFO`) or 173 (`rt_sigreturn`). At the trampoline, sp is the frame:
//!
//! ```text
//! sigframe:     struct ucontext uc; ...          sigcontext at uc + 20
//! rt_sigframe:  siginfo (128); struct sigframe
//! sigcontext:   trap_no, error_code, oldmask, r0..r10, fp, ip, sp, lr, pc, cpsr
//! ```

use super::instruction_analysis::{half_at, word_at};
use crate::types::CodeMemory;
use crate::types::Memory;

/// Offset of saved r0 from sp at the trampoline (`rt`: `rt_sigframe`).
pub fn r0_offset(rt: bool) -> u64 {
    (if rt { 128 } else { 0 }) + 20 + 12
}

/// `Some(rt)` when `pc` (bit 0: Thumb) is a sigreturn trampoline.
pub fn is_trampoline<C: CodeMemory + ?Sized>(code: &mut C, pc: u64) -> Option<bool> {
    let a = pc & !1;
    if pc & 1 != 0 {
        let (h0, h1) = (half_at(code, a)?, half_at(code, a + 2)?);
        return match (h0, h1) {
            (0x2777, 0xdf00) => Some(false),
            (0x27ad, 0xdf00) => Some(true),
            // glibc's __default_sa_restorer: mov.w r7, #NR; svc 0
            (0xf04f, 0x0777) if half_at(code, a + 4)? == 0xdf00 => Some(false),
            (0xf04f, 0x07ad) if half_at(code, a + 4)? == 0xdf00 => Some(true),
            _ => None,
        };
    }
    match (word_at(code, a)?, word_at(code, a + 4)?) {
        (0xe3a0_7077, 0xef00_0000) | (0xef90_0077, _) => Some(false),
        (0xe3a0_70ad, 0xef00_0000) | (0xef90_00ad, _) => Some(true),
        _ => None,
    }
}

/// The interrupted r0..r15 (r15 with the Thumb bit from cpsr) saved by the
/// signal frame at `sp`.
pub fn restore<M: Memory + ?Sized>(sp: u32, mem: &mut M, rt: bool) -> Option<[u32; 16]> {
    let base = sp as u64 + r0_offset(rt);
    let mut r = [0u32; 16];
    for (i, x) in r.iter_mut().enumerate() {
        *x = mem.read_u32(base + 4 * i as u64).ok()?;
    }
    let cpsr = mem.read_u32(base + 64).ok()?;
    if cpsr & (1 << 5) != 0 {
        r[15] |= 1;
    }
    Some(r)
}
