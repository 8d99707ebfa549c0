//! The shared vocabulary at the bottom of the crate: registers, memory,
//! frames, CFI rows and machine-code rules. Everything else (the
//! architectures in `arch`, the unwinder in `unwind`, cores and processes in
//! `remote`, symbols in `symbolize`) builds on these types, and this module
//! depends on nothing of the crate. Private: each type has one public path,
//! where its users meet it (mostly `callstack::unwind`).

pub(crate) mod code;
pub(crate) mod frame;
pub mod memory;
mod regs;
pub(crate) mod row;

pub use code::{Base, CallBefore, CodeMemory, FpRule, InsnRule, SliceCode};
pub use frame::{Frame, Method, StopReason, UnwindError};
pub use memory::{Memory, ReadError};
pub use regs::UnwindRegs;
pub use row::{CfaView, RowView, RuleView};
