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
pub mod mips;
pub mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use self::aarch64 as native;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64 as native;

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
