//! What a walk produces: its frames ([`Frame`], found by a [`Method`]), why
//! it ended ([`StopReason`]) and why a step failed ([`UnwindError`]).

use super::ReadError;

/// How a frame was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// The first frame: the registers the unwind started from.
    Context,
    /// DWARF CFI (compiled or evaluated).
    Cfi,
    /// The frame-pointer record (code without CFI).
    FramePointer,
    /// The registers saved by the kernel in a signal frame: the frame was
    /// interrupted at exactly `pc` (not a return address).
    SignalFrame,
    /// Instruction analysis (supplied by a fallback).
    Insn,
    /// Stack scanning (supplied by a fallback).
    Scan,
}

impl Method {
    /// The name used in JSON output and reports: `context`, `cfi`, `fp`,
    /// `signal`, `insn` or `scan`.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Context => "context",
            Method::Cfi => "cfi",
            Method::FramePointer => "fp",
            Method::SignalFrame => "signal",
            Method::Insn => "insn",
            Method::Scan => "scan",
        }
    }
}

/// One frame of an unwind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The frame's pc: the interrupted pc for the first frame of a context
    /// and for a frame found through a signal frame, a return address
    /// otherwise.
    pub pc: u64,
    /// The frame's stack pointer.
    pub sp: u64,
    /// The frame's frame pointer.
    pub fp: u64,
    /// How the frame was found.
    pub method: Method,
}

impl Frame {
    /// The address to look up (symbols, rules) for this frame: `pc` for an
    /// exact pc, `pc - 1` for a return address (which points after the call).
    pub fn lookup_address(&self) -> u64 {
        match self.method {
            Method::Context | Method::SignalFrame => self.pc,
            _ => self.pc.wrapping_sub(1),
        }
    }
}

/// Why a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Not ended yet.
    Running,
    /// The outermost frame: CFI says the return address is undefined
    /// (`_start`, a thread's `clone`/`clone3` start) or it is 0.
    Outermost,
    /// The pc is in no known module (and the fallback gave up).
    UnknownModule(u64),
    /// No CFI, no valid frame pointer, and the fallback gave up.
    NoRule(u64),
    /// An error: a read outside the readable memory, bad CFI, a stack that
    /// does not move up.
    Error(UnwindError),
    /// The caller's buffer is full (set by the capture functions).
    BufferFull,
}

/// Why one unwind step failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindError {
    /// A read of the stack failed (outside the stack, unreadable).
    Read(ReadError),
    /// The CFI could not be parsed or evaluated.
    BadCfi,
    /// The CFI computes a value from a register the unwinder does not track.
    Untracked,
    /// The caller's stack pointer is not above the frame's.
    StackNotAdvancing(u64),
}

impl core::fmt::Display for UnwindError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            UnwindError::Read(e) => write!(f, "{e}"),
            UnwindError::BadCfi => write!(f, "the CFI could not be parsed or evaluated"),
            UnwindError::Untracked => {
                write!(f, "the CFI uses a register the unwinder does not track")
            }
            UnwindError::StackNotAdvancing(sp) => {
                write!(
                    f,
                    "the caller's stack pointer {sp:#x} is not above the frame's"
                )
            }
        }
    }
}

impl std::error::Error for UnwindError {}
