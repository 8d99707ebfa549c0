//! The one walk of the machine-code unwinders: frame after frame through
//! an architecture's `step` (x86-64's instruction analysis, the RISC
//! prologue analysis of AArch64 and MIPS, ARM's EHABI and prologue
//! analysis), until the outermost frame, a frame nobody can step, or a
//! full buffer. The architectures provide [`InsnStep`]; the loop and its
//! stopping rules are written once, here.

use crate::types::{Method, UnwindRegs};

/// Why `walk` stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The pc is 0 (the outermost frame's sentinel).
    End,
    /// No method found a believable caller (or the step did not move).
    NoCaller,
    /// The output is full.
    Full,
}

/// The registers of a frame, as the walk reads them.
pub(crate) trait WalkRegs: Copy {
    /// The program counter, as written to the output (ARM keeps its Thumb
    /// bit).
    fn pc(&self) -> u64;
    /// The stack pointer.
    fn sp(&self) -> u64;
}

impl WalkRegs for UnwindRegs {
    fn pc(&self) -> u64 {
        self.pc
    }
    fn sp(&self) -> u64 {
        self.sp
    }
}

/// 32-bit ARM's sixteen core registers (`r13` is sp, `r15` pc).
impl WalkRegs for [u32; 16] {
    fn pc(&self) -> u64 {
        self[15] as u64
    }
    fn sp(&self) -> u64 {
        self[13] as u64
    }
}

/// One architecture's step from a frame to its caller, by reading code.
pub(crate) trait InsnStep {
    /// The registers a step reads and gives.
    type Regs: WalkRegs;
    /// The caller of the frame `cur` and how it was found; `exact`: `cur`'s
    /// pc is an exact pc (frame 0, or the frame a signal interrupted)
    /// rather than a return address.
    fn step(&mut self, cur: &Self::Regs, exact: bool) -> Option<(Self::Regs, Method)>;
}

/// Walks from `regs` (the innermost frame), writing `(pc, method)` per
/// frame into `out`: `out[0]` is `regs`' pc with [`Method::Context`].
/// `exact`: that pc is exact, not a return address. Returns how many frames
/// were written and why the walk stopped. A step that gives back the same
/// pc and stack pointer ends the walk (it would repeat forever).
pub(crate) fn walk<S: InsnStep>(
    steps: &mut S,
    regs: S::Regs,
    exact: bool,
    out: &mut [(u64, Method)],
) -> (usize, Stop) {
    if out.is_empty() {
        return (0, Stop::Full);
    }
    out[0] = (regs.pc(), Method::Context);
    let (mut n, mut cur, mut exact) = (1, regs, exact);
    loop {
        if n == out.len() {
            return (n, Stop::Full);
        }
        let Some((next, method)) = steps.step(&cur, exact) else {
            return (n, Stop::NoCaller);
        };
        if next.pc() == 0 {
            return (n, Stop::End);
        }
        if next.pc() == cur.pc() && next.sp() == cur.sp() {
            return (n, Stop::NoCaller);
        }
        out[n] = (next.pc(), method);
        n += 1;
        cur = next;
        // Below a signal frame the pc is the interrupted one, exact.
        exact = method == Method::SignalFrame;
    }
}
