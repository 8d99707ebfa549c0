//! The method of last resort: unwinding by reading the machine code.
//!
//! For a frame with no CFI and no usable frame pointer (code built with
//! `-fomit-frame-pointer -fno-asynchronous-unwind-tables`, hand-written
//! assembly, JIT code, stripped firmware), the unwinder reads the function's
//! own instructions to learn where its return address is:
//!
//! - **x86-64, epilogue analysis**: decode *forward* from the pc along the
//!   path to the function's `ret`, tracking every effect on `rsp` and `rbp`
//!   ([`crate::arch`]'s `x86_64::instruction_analysis`). Where the function's
//!   start is known (a symbol), the path from the start to the pc (the
//!   prologue) gives the same answer and also serves functions that never
//!   return.
//! - **RISC (aarch64, arm, mips), prologue analysis**: scan the prologue for
//!   the stack adjustment and the store of the return address.
//! - **Stack scanning** ([`scan`]): as a last resort, take a stack word as a
//!   return address only if it points right after a call instruction whose
//!   target is consistent with the frame below.
//!
//! What the analysis finds at a pc depends on the code alone, so the x86-64
//! path keeps it per pc in an [`cache::InsnCache`] (lock-free, fixed-size):
//! a warm frame costs a lookup and its stack loads, like a compiled CFI row.
//! [`cache::invalidate`] clears the caches when code may have changed.
//!
//! Everything here works on fixed-size state with bounded instruction counts:
//! no allocation, no lock, async-signal-safe when the [`CodeMemory`] and
//! [`crate::unwind::Memory`] given to it are.
//!
//! Each frame found is marked with the [`Method`] that found it, so a user can
//! judge a trace's trust.

pub mod cache;
pub mod fallback;
pub mod inprocess;
pub mod modcode;
pub mod risc;
pub mod scan;
pub mod target;

#[cfg(test)]
mod robustness;

pub use fallback::InsnFallback;
pub use inprocess::InProcess;
pub use modcode::{ModuleCode, ModuleCodeError};
pub use target::unwind_prstatus;

pub use crate::arch::aarch64::instruction_analysis as aarch64;
pub use crate::arch::mips::instruction_analysis as mips;
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
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[used]
#[unsafe(link_section = ".init_array")]
static WARM_UP_AT_LOAD: extern "C" fn() = warm_up_at_load;

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
extern "C" fn warm_up_at_load() {
    // Unwinding across this `extern "C"` boundary would abort: a panic in
    // the decoder's set-up leaves the decoder cold instead.
    let _ = std::panic::catch_unwind(warm_up);
}

/// Keeps [`WARM_UP_AT_LOAD`] linked: a static library's object is pulled into
/// a program only for the symbols it uses, and a constructor alone uses none.
#[inline(always)]
pub(crate) fn keep_warm_up_linked() {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
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

/// Read access to code, for the analyzers.
///
/// Implementations for the current process must be async-signal-safe and must
/// not allocate (read only inside mappings known to be executable).
pub trait CodeMemory {
    /// Copies the bytes at `addr` into `buf`, stopping at the end of the
    /// executable mapping; returns how many bytes were copied (0 when `addr`
    /// is not in executable memory).
    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize;

    /// Whether `addr` lies in an executable mapping.
    fn is_executable(&mut self, addr: u64) -> bool {
        let mut b = [0u8; 1];
        self.read_code(addr, &mut b) == 1
    }

    /// The `[start, end)` of the function containing `addr`, when a symbol
    /// table says so. The default knows nothing.
    fn function_bounds(&mut self, addr: u64) -> Option<(u64, u64)> {
        let _ = addr;
        None
    }

    /// Where the function holding `addr` is entered, and the bounds a search
    /// from there may stay in. The default is the start of
    /// [`CodeMemory::function_bounds`], searched within them; a reader that
    /// knows split functions (gcc's `f.cold` parts, entered by a jump from
    /// `f`) answers `f`'s start and no bounds.
    fn function_entry(&mut self, addr: u64) -> Option<(u64, Option<(u64, u64)>)> {
        self.function_bounds(addr).map(|b| (b.0, Some(b)))
    }

    /// Whether `addr` is a return address that stands for another one (an
    /// exit hook's trampoline, see [`crate::exit_hook`]): a stack word equal
    /// to it is a return address whatever precedes it. In process only.
    fn is_return_trampoline(&mut self, addr: u64) -> bool {
        let _ = addr;
        false
    }
}

/// A [`CodeMemory`] over one byte slice mapped at `base`: for tests and for
/// code copied out of a file.
#[derive(Clone, Copy, Debug)]
pub struct SliceCode<'a> {
    /// Address of `bytes[0]`.
    pub base: u64,
    /// The code.
    pub bytes: &'a [u8],
    /// Known function bounds, if any (`[start, end)`), sorted by start.
    pub functions: &'a [(u64, u64)],
}

impl<'a> SliceCode<'a> {
    /// Code `bytes` mapped at `base`, without function bounds.
    pub fn new(base: u64, bytes: &'a [u8]) -> Self {
        SliceCode {
            base,
            bytes,
            functions: &[],
        }
    }
}

impl CodeMemory for SliceCode<'_> {
    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        let Some(off) = addr.checked_sub(self.base) else {
            return 0;
        };
        if off >= self.bytes.len() as u64 {
            return 0;
        }
        let src = &self.bytes[off as usize..];
        let n = src.len().min(buf.len());
        buf[..n].copy_from_slice(&src[..n]);
        n
    }

    fn function_bounds(&mut self, addr: u64) -> Option<(u64, u64)> {
        lookup_function(self.functions, addr)
    }
}

/// Finds the function containing `addr` in a sorted list of `[start, end)`.
pub fn lookup_function(functions: &[(u64, u64)], addr: u64) -> Option<(u64, u64)> {
    let i = functions.partition_point(|&(s, _)| s <= addr);
    if i == 0 {
        return None;
    }
    let (s, e) = functions[i - 1];
    (addr < e).then_some((s, e))
}

/// The register a location or value is relative to, as found at the frame's
/// pc (before unwinding it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Base {
    /// The stack pointer.
    Sp,
    /// The frame pointer (`rbp`, `x29`, `r11`/`r7`, `fp`/`s8`).
    Fp,
}

/// How the caller's frame pointer is recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FpRule {
    /// The function does not change it (or restores it from a register).
    Unchanged,
    /// Saved in memory at `base + offset`.
    At(Base, i32),
    /// Equal to `base + offset`.
    Value(Base, i32),
    /// Not known: the function clobbers it and the analysis lost track.
    Unknown,
}

/// A rule recovered from machine code: how to find the caller's registers.
///
/// `CFA = base + cfa_offset` is the stack pointer just after the return
/// instruction (before any `ret imm` pop); on x86-64 the return address is at
/// `CFA - 8`, on the RISC targets wherever `ra` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InsnRule {
    /// The register the CFA is computed from.
    pub cfa_base: Base,
    /// Offset added to it.
    pub cfa_offset: i32,
    /// Where the return address is: saved at `CFA + offset`, or `None` when it
    /// is still in the link register (a RISC leaf).
    pub ra_at_cfa: Option<i32>,
    /// Extra bytes popped by the return (`ret imm16`); the caller's stack
    /// pointer is `CFA + ret_pop`.
    pub ret_pop: u16,
    /// How to find the caller's frame pointer.
    pub fp: FpRule,
}

impl InsnRule {
    /// Applies the rule to `regs`, reading saved values through `mem`.
    /// `word` is the pointer size (8 or 4). Returns the caller's registers
    /// (`lr` is cleared: it is not preserved across calls).
    pub fn apply<M: crate::unwind::Memory + ?Sized>(
        &self,
        regs: &UnwindRegs,
        mem: &mut M,
        word: u8,
    ) -> Result<UnwindRegs, crate::unwind::ReadError> {
        let base = |b: Base| match b {
            Base::Sp => regs.sp,
            Base::Fp => regs.fp,
        };
        let read = |mem: &mut M, a: u64| -> Result<u64, crate::unwind::ReadError> {
            if word == 4 {
                mem.read_u32(a).map(u64::from)
            } else {
                mem.read_u64(a)
            }
        };
        let mask = if word == 4 { 0xffff_ffff } else { u64::MAX };
        let cfa = base(self.cfa_base).wrapping_add(self.cfa_offset as i64 as u64) & mask;
        let pc = match self.ra_at_cfa {
            Some(off) => read(mem, cfa.wrapping_add(off as i64 as u64) & mask)?,
            None => regs.lr,
        };
        let fp = match self.fp {
            FpRule::Unchanged | FpRule::Unknown => regs.fp,
            FpRule::At(b, off) => read(mem, base(b).wrapping_add(off as i64 as u64) & mask)?,
            FpRule::Value(b, off) => base(b).wrapping_add(off as i64 as u64) & mask,
        };
        Ok(UnwindRegs {
            pc,
            sp: cfa.wrapping_add(self.ret_pop as u64) & mask,
            fp,
            lr: 0,
        })
    }
}

pub use crate::arch::{prstatus_word, PrstatusError};

/// Per-architecture `NT_PRSTATUS` register layouts.
pub mod core_regs {
    pub use crate::arch::aarch64::core_regs as aarch64;
    pub use crate::arch::arm::core_regs as arm;
    pub use crate::arch::mips::core_regs as mips;
    pub use crate::arch::x86_64::core_regs as x86_64;
}
