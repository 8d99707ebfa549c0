//! MIPS32 little-endian (o32): cores read offline.
//!
//! - `core_regs`: the `NT_PRSTATUS` layout;
//! - `instruction_analysis`: prologue analysis (`addiu sp, sp, -N`,
//!   `sw ra, N(sp)`), as in seed 000.

pub mod core_regs;
pub mod instruction_analysis;
#[cfg(feature = "remote")]
pub mod regs;
pub mod signal;
