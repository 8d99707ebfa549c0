//! Architecture-specific pieces, one module per architecture.
//!
//! Each architecture module has the same shape:
//! - `FRAME_RECORD`: where the frame-pointer record keeps the caller's frame
//!   pointer and the return address,
//! - `fast_entry` (only when compiled for that architecture): the naked entry
//!   of [`crate::capture_fast`], which builds an exact frame record of its own
//!   before handing over to the portable walk.
//!
//! The architecture modules are compiled on every host, because cores of
//! other architectures are unwound offline; only the in-process entries are
//! behind `cfg(target_arch)`. `native` names the host's module.
//! A target without a module here compiles, and its captures return 0.

pub mod aarch64;
pub mod arm;
pub mod insn_cache;
mod machine;
pub mod mips;
pub mod risc;
pub mod scan;
pub mod x86_64;

pub use machine::{prstatus_word, Machine, PrstatusError, Registers};
#[cfg(feature = "remote")]
pub use machine::{PrstatusLayout, MAX_REGS};

#[cfg(target_arch = "aarch64")]
pub use self::aarch64 as native;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64 as native;

/// The host's architecture, when it has a module here (`native::MACHINE`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub const NATIVE_MACHINE: Option<Machine> = Some(native::MACHINE);
/// The host's architecture: none of the modules here.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const NATIVE_MACHINE: Option<Machine> = None;

/// Layout of a frame-pointer record: the frame pointer points at the saved
/// caller frame pointer; the return address sits `ra_offset` bytes above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRecordLayout {
    /// Offset of the caller's frame pointer from the frame pointer.
    pub fp_offset: usize,
    /// Offset of the return address from the frame pointer.
    pub ra_offset: usize,
    /// Required alignment of a frame pointer.
    pub align: usize,
}

/// What applying one unwind rule to a frame's registers gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The caller's registers. `signal` is true when the frame was a signal
    /// trampoline: the caller's pc is then an interrupted pc, looked up
    /// exactly, not a return address.
    Caller {
        /// The caller's registers.
        regs: crate::types::UnwindRegs,
        /// Whether the caller was interrupted by a signal.
        signal: bool,
    },
    /// The frame is the outermost one: its return address is undefined.
    End,
    /// There is no CFI for this address.
    NoCfi,
    /// The rule needs the CFI evaluated directly (a DWARF expression the
    /// compiled form does not cover).
    Evaluate,
}

/// What every architecture supplies to the generic unwinder: the register
/// numbers of DWARF, the compiled rule type and how to apply it, the
/// frame-pointer rule and the signal frame layout.
///
/// The architecture modules are compiled on every host, so an offline
/// unwinder (core files) may use any of them.
pub trait Arch: Copy + Default + core::fmt::Debug + Send + Sync + 'static {
    /// The compiled unwind rule of one address range: a small `Copy` value.
    type Rule: Copy + PartialEq + core::fmt::Debug + Send + Sync + 'static;
    /// A short name (`"x86_64"`).
    const NAME: &'static str;
    /// DWARF number of the stack pointer.
    const SP: u16;
    /// DWARF number of the frame pointer.
    const FP: u16;
    /// DWARF number of the return-address column.
    const RA: u16;
    /// The rule of an address without CFI.
    const NO_CFI: Self::Rule;
    /// The rule of a row that must be evaluated directly.
    const EVALUATE: Self::Rule;
    /// The rule of a signal trampoline (an FDE with the `S` augmentation).
    const SIGNAL_FRAME: Self::Rule;
    /// The rule at a function's first instruction, before it runs (the
    /// CIE's initial row): the frame as the call left it.
    const ENTRY: Self::Rule;
    /// The frame record of the frame-pointer fallback.
    const FRAME_RECORD: FrameRecordLayout;
    /// The vendor extensions this architecture's CFI may use, for gimli
    /// (AArch64's `DW_CFA_AARCH64_negate_ra_state`, written after each
    /// `paciasp`: without it gimli refuses the FDE).
    const CFI_VENDOR: gimli::Vendor = gimli::Vendor::Default;

    /// The value of DWARF register `reg` in `regs`, if tracked.
    fn reg(regs: &crate::types::UnwindRegs, reg: u16) -> Option<u64>;

    /// Compiles one CFI row into a rule, or [`Arch::EVALUATE`] when it
    /// does not fit. `signal` is whether the FDE's CIE has the `S`
    /// augmentation (a signal trampoline).
    fn compile_row(row: &crate::types::RowView<'_>, signal: bool) -> Self::Rule;

    /// Applies `rule` to `regs` (the registers of the frame whose rule it
    /// is), reading the stack through `mem`.
    fn apply<M: crate::types::Memory + ?Sized>(
        rule: Self::Rule,
        regs: &crate::types::UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, crate::types::UnwindError>;

    /// Packs `rule` into 16 bits for the in-process rule cache, or 0 when it
    /// does not fit (it is then looked up in the table each time).
    fn pack(rule: Self::Rule) -> u16;

    /// The rule [`Arch::pack`] packed.
    fn unpack(packed: u16) -> Self::Rule;

    /// The registers saved by the kernel in a signal frame, when the
    /// trampoline's frame has stack pointer `sp`.
    fn signal_frame<M: crate::types::Memory + ?Sized>(
        sp: u64,
        mem: &mut M,
    ) -> Result<crate::types::UnwindRegs, crate::types::UnwindError>;
}
