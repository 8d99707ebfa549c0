//! Unwinding a thread of another process, one frame at a time.
//!
//! [`step`] is the one place that decides how the caller's registers are
//! recovered from a frame: today the frame-pointer record; the CFI unwinder
//! of `crate::unwind` (and instruction analysis) plug in there.

use super::{Arch, Frame, Method, Registers, Snapshot, Thread};
use crate::unwind::Memory;

/// The frames of one thread and why the walk ended early, if it did.
#[derive(Clone, Debug, Default)]
pub struct Unwound {
    /// Innermost first.
    pub frames: Vec<Frame>,
    /// Set when the walk stopped before the outermost frame: why.
    pub stop: Option<String>,
}

/// Unwinds thread `t` of `snap`, reading memory through `mem`, at most `max` frames.
pub fn unwind_thread<M: Memory + ?Sized>(
    snap: &Snapshot,
    mem: &mut M,
    t: &Thread,
    max: usize,
) -> Unwound {
    let mut out = Unwound::default();
    let mut regs = t.registers;
    let Some(pc) = regs.pc() else {
        out.stop = Some("no program counter in the thread's registers".into());
        return out;
    };
    out.frames.push(Frame {
        pc,
        lookup: pc,
        method: Method::Context,
    });
    while out.frames.len() < max {
        match step(snap, mem, &regs) {
            Ok(Some((next, method))) => {
                let pc = next.pc().unwrap_or(0);
                out.frames.push(Frame {
                    pc,
                    lookup: pc.wrapping_sub(1),
                    method,
                });
                regs = next;
            }
            Ok(None) => break,
            Err(why) => {
                out.stop = Some(why);
                break;
            }
        }
    }
    out
}

/// Recovers the caller's registers from the frame described by `regs`.
/// `Ok(None)`: the outermost frame was reached.
fn step<M: Memory + ?Sized>(
    snap: &Snapshot,
    mem: &mut M,
    regs: &Registers,
) -> Result<Option<(Registers, Method)>, String> {
    frame_pointer_step(snap, mem, regs)
}

/// The frame-pointer rule: the frame pointer points at the caller's saved
/// frame pointer, with the return address one word above it.
fn frame_pointer_step<M: Memory + ?Sized>(
    snap: &Snapshot,
    mem: &mut M,
    regs: &Registers,
) -> Result<Option<(Registers, Method)>, String> {
    let arch = regs.arch;
    if !matches!(arch, Arch::X86_64 | Arch::Aarch64) {
        return Err(format!("no frame-pointer rule for {arch:?}"));
    }
    let (Some(fp), Some(sp)) = (regs.fp(), regs.sp()) else {
        return Err("frame pointer or stack pointer unknown".into());
    };
    if fp == 0 {
        return Ok(None);
    }
    if fp % 8 != 0 || fp < sp {
        return Err(format!(
            "frame pointer {fp:#x} is not a frame record (stack pointer {sp:#x})"
        ));
    }
    let ra = mem
        .read_u64(fp + 8)
        .map_err(|e| format!("reading the return address: {e}"))?;
    let caller_fp = mem
        .read_u64(fp)
        .map_err(|e| format!("reading the saved frame pointer: {e}"))?;
    if ra == 0 {
        return Ok(None);
    }
    if !snap.modules.is_empty() && snap.module_at(ra.wrapping_sub(1)).is_none() {
        return Err(format!("return address {ra:#x} is outside every module"));
    }
    let mut next = Registers::new(arch);
    next.set(arch.pc_reg(), ra);
    next.set(arch.sp_reg(), fp + 16);
    // A caller frame pointer below this frame is not a frame record: the
    // caller was built without one. Keep the frame, end the chain after it.
    if caller_fp > fp {
        next.set(arch.fp_reg(), caller_fp);
    } else {
        next.set(arch.fp_reg(), 0);
    }
    Ok(Some((next, Method::Fp)))
}
