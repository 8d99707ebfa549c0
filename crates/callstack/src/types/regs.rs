//! The registers the unwinder tracks from frame to frame.

/// The registers the unwinder recovers for each frame.
///
/// | field | x86-64 | AArch64 |
/// |---|---|---|
/// | `pc` | `rip` | `pc` |
/// | `sp` | `rsp` | `sp` |
/// | `fp` | `rbp` | `x29` |
/// | `lr` | unused (0) | `x30` (the link register) |
///
/// Other callee-saved registers are not tracked: CFI rows that compute the
/// CFA from them end the walk (or fall back to the frame pointer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRegs {
    /// Program counter.
    pub pc: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer.
    pub fp: u64,
    /// Link register (AArch64), 0 elsewhere.
    pub lr: u64,
}
