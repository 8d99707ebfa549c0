//! Exact unwinding: DWARF CFI compiled into tables, frame-pointer fallback.
//!
//! Memory is read only through [`Memory`], so the same unwinder serves this
//! process, a core file and another process.

pub mod insn;
pub mod memory;

pub use memory::{Memory, ReadError};
