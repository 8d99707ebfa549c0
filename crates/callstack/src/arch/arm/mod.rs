//! 32-bit ARM (armhf, EABI): cores read offline.
//!
//! - `core_regs`: the `NT_PRSTATUS` layout;
//! - `ehabi`: the `.ARM.exidx`/`.ARM.extab` unwind tables (ARM's CFI);
//! - `instruction_analysis`: prologue analysis (`push {..., r7/r11, lr}`,
//!   `sub sp, #N`) in ARM and Thumb-2 state, for code without tables.
//!
//! gcc's frame record on ARM state is `push {fp, lr}; add fp, sp, #4`: fp
//! points at the saved lr, the caller's fp sits just below it (seed 004).

pub mod core_regs;
pub mod ehabi;
pub mod instruction_analysis;
#[cfg(feature = "remote")]
pub mod regs;
pub mod signal;
pub mod unwinder;
