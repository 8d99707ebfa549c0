//! The method of last resort: unwinding by reading the machine code.
//!
//! For a frame with no CFI and no usable frame pointer (code built with
//! `-fomit-frame-pointer -fno-asynchronous-unwind-tables`, hand-written
//! assembly, JIT code, stripped firmware), the unwinder reads the function's
//! own instructions to learn where its return address is:
//!
//! - **x86-64, epilogue analysis**: decode *forward* from the pc along the
//!   path to the function's `ret`, tracking every effect on `rsp` and `rbp`
//!   ([`x86_64`]). Where the function's
//!   start is known (a symbol), the path from the start to the pc (the
//!   prologue) gives the same answer and also serves functions that never
//!   return.
//! - **RISC (aarch64, arm, mips, riscv64), prologue analysis**: scan the prologue for
//!   the stack adjustment and the store of the return address.
//! - **Stack scanning** ([`scan`]): as a last resort, take a stack word as a
//!   return address only if it points right after a call instruction whose
//!   target is consistent with the frame below.
//!
//! What the analysis finds at a pc depends on the code alone, so the x86-64
//! path keeps it per pc in an [`cache::InsnCache`] (lock-free, fixed-size):
//! a warm frame costs a lookup and its stack loads, like a compiled CFI row.
//! [`cache::invalidate`] clears the caches when code may have changed. A
//! rule the code alone settles for `capture_exact` goes into the rule cache
//! of CFI rules instead, as the CFI rule type (see [`cache`]'s module
//! documentation for what stays there and why).
//!
//! Everything here works on fixed-size state with bounded instruction counts:
//! no allocation, no lock, async-signal-safe when the [`CodeMemory`] and
//! [`crate::unwind::Memory`] given to it are.
//!
//! Each frame found is marked with the [`Method`] that found it, so a user can
//! judge a trace's trust.

pub use crate::arch::x86_64::insn_cache as cache;
pub mod fallback;
pub mod inprocess;
pub mod modcode;
pub use crate::arch::{risc, scan};
pub mod target;
pub mod walk;

#[cfg(test)]
mod robustness;

pub use fallback::InsnFallback;
pub use inprocess::InProcess;
pub use modcode::{ModuleCode, ModuleCodeError};
pub use target::unwind_prstatus;

pub use crate::arch::aarch64::instruction_analysis as aarch64;
pub use crate::arch::mips::instruction_analysis as mips;
pub use crate::arch::riscv64::instruction_analysis as riscv64;
/// 32-bit ARM: EHABI tables, prologue analysis and the unwind step.
pub mod arm {
    pub use crate::arch::arm::ehabi;
    pub use crate::arch::arm::instruction_analysis::*;
    pub use crate::arch::arm::unwinder;
}
pub use crate::arch::x86_64::instruction_analysis as x86_64;

/// Builds the disassembler's lazily built tables now (iced-x86 allocates
/// them on first use). Call it before the first analysis inside a signal
/// handler; [`InProcess::new`] does.
pub fn warm_up() {
    inprocess::warm_up_decoder();
    WARM.store(true, core::sync::atomic::Ordering::Release);
}

static WARM: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// The decoder is warmed up when the program (or the library holding
/// callstack) is loaded, so that the first `capture_exact` and the first
/// capture in a signal handler can read machine code without `prepare()`.
/// It costs one build of iced-x86's tables (tens of microseconds, once).
#[cfg(all(target_os = "linux", callstack_insn))]
#[used]
#[unsafe(link_section = ".init_array")]
static WARM_UP_AT_LOAD: extern "C" fn() = warm_up_at_load;

#[cfg(all(target_os = "linux", callstack_insn))]
extern "C" fn warm_up_at_load() {
    // A crash handler's helper (this program re-executed to write a
    // minidump and symbolize a crash report: `CALLSTACK_CRASH_SYMBOLIZE=1`)
    // captures nothing in process: it starts faster without the tables
    // (0.6 ms of its start; BENCHMARKS.md, "crash minidump"). The variable
    // is `crash::SYMBOLIZE_ENV`, spelled out: `unwind` does not import the
    // tools above it.
    if std::env::var_os("CALLSTACK_CRASH_SYMBOLIZE").is_some_and(|v| v == "1") {
        return;
    }
    // Unwinding across this `extern "C"` boundary would abort: a panic in
    // the decoder's set-up leaves the decoder cold instead.
    let _ = std::panic::catch_unwind(warm_up);
}

/// Keeps [`WARM_UP_AT_LOAD`] linked: a static library's object is pulled into
/// a program only for the symbols it uses, and a constructor alone uses none.
#[inline(always)]
pub(crate) fn keep_warm_up_linked() {
    #[cfg(all(target_os = "linux", callstack_insn))]
    core::hint::black_box(&WARM_UP_AT_LOAD);
}

/// Whether [`warm_up`] has run. The x86-64 fallback of the CFI unwinder
/// declines to decode before it has (the first decode would allocate, which
/// a capture in a signal handler must not do); `callstack::prepare()` warms
/// up. Tools unwinding cores or other processes call [`warm_up`] once.
pub fn is_warm() -> bool {
    WARM.load(core::sync::atomic::Ordering::Acquire)
}

pub use crate::unwind::{Method, UnwindRegs};

pub use crate::types::code::lookup_function;
pub use crate::types::{Base, CodeMemory, FpRule, InsnRule, SliceCode};

pub use crate::arch::{prstatus_word, PrstatusError};

/// Per-architecture `NT_PRSTATUS` register layouts.
pub mod core_regs {
    pub use crate::arch::aarch64::core_regs as aarch64;
    pub use crate::arch::arm::core_regs as arm;
    pub use crate::arch::mips::core_regs as mips;
    pub use crate::arch::riscv64::core_regs as riscv64;
    pub use crate::arch::x86_64::core_regs as x86_64;
}
