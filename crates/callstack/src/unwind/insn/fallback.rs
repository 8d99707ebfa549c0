//! The instruction-analysis fallback of the CFI [`Unwinder`](crate::unwind::Unwinder).
//!
//! [`InsnFallback`] implements [`Fallback`] for x86-64 (epilogue and
//! prologue analysis, validated frame pointer, verified stack scanning),
//! AArch64 and RISC-V 64 (prologue analysis, frame record, scanning): plug it into
//! [`Unwinder::with_fallback`](crate::unwind::Unwinder::with_fallback) with a
//! [`CodeMemory`] for the code of the process or core being unwound.
//!
//! It asks to run *before* the plain frame-pointer rule
//! ([`Fallback::before_frame_pointer`]): in code built without frame
//! pointers `rbp`/`x29` is an ordinary register that may well point into the
//! stack, and only the code tells whether it is a frame pointer. The
//! analysis itself tries the frame record too, accepting it when the return
//! address it gives follows a call instruction.
//!
//! For the current process, give it the process's analysis cache
//! ([`InsnFallback::with_cache`] and [`super::cache::fallback_cache`]): a
//! warm frame then reuses the rules found the first time (x86-64).
//!
//! ```
//! use callstack::unwind::insn::{InsnFallback, SliceCode};
//! // Code of a core's executable at its address; the stack ends at 0x7ffe0000.
//! let code = [0xc3u8]; // ret
//! let fallback = InsnFallback::new(SliceCode::new(0x401000, &code), 0x7ffe_0000);
//! # let _ = fallback;
//! ```

use super::cache::InsnCache;
use super::{CodeMemory, Method};
use crate::arch::aarch64::Aarch64;
use crate::arch::riscv64::Riscv64;
use crate::arch::x86_64::X86_64;
use crate::unwind::{Fallback, Memory, UnwindRegs};

/// Instruction analysis and stack scanning over `code`, for a stack that
/// ends at `stack_end` (scanning never reads at or above it).
#[derive(Debug, Clone)]
pub struct InsnFallback<C: CodeMemory> {
    /// The code reader.
    pub code: C,
    /// One past the highest stack address.
    pub stack_end: u64,
    /// Where the x86-64 analysis keeps its results per pc, if anywhere.
    cache: Option<&'static InsnCache>,
}

impl<C: CodeMemory> InsnFallback<C> {
    /// A fallback reading code through `code`, without a cache.
    pub fn new(code: C, stack_end: u64) -> Self {
        InsnFallback {
            code,
            stack_end,
            cache: None,
        }
    }

    /// Keeps the x86-64 analysis results in `cache` (see
    /// [`super::cache`]): the cache must serve this kind of code reader
    /// over this code alone, and be cleared when the code changes. For
    /// `capture_exact` over this process's module snapshot that is
    /// [`super::cache::fallback_cache`], cleared by `callstack::prepare()`.
    ///
    /// ```
    /// use callstack::unwind::insn::{cache::InsnCache, InsnFallback, SliceCode};
    /// static CACHE: InsnCache = InsnCache::new();
    /// let code = [0xc3u8]; // ret
    /// let f = InsnFallback::new(SliceCode::new(0x401000, &code), 0x7ffe_0000)
    ///     .with_cache(&CACHE);
    /// # let _ = f;
    /// ```
    pub fn with_cache(mut self, cache: &'static InsnCache) -> Self {
        self.cache = Some(cache);
        self
    }
}

impl<C: CodeMemory> Fallback<X86_64> for InsnFallback<C> {
    fn unwind_frame<M: Memory + ?Sized>(
        &mut self,
        regs: &UnwindRegs,
        pc_is_exact: bool,
        _known_module: bool,
        mem: &mut M,
    ) -> Option<(UnwindRegs, Method)> {
        if !super::is_warm() {
            super::keep_warm_up_linked();
            return None;
        }
        let s = super::x86_64::unwinder::step_cached(
            regs,
            mem,
            &mut self.code,
            pc_is_exact,
            self.stack_end,
            self.cache,
        )?;
        Some((s.regs, s.method))
    }

    fn before_frame_pointer(&self) -> bool {
        true
    }
}

impl<C: CodeMemory> Fallback<Aarch64> for InsnFallback<C> {
    fn unwind_frame<M: Memory + ?Sized>(
        &mut self,
        regs: &UnwindRegs,
        pc_is_exact: bool,
        _known_module: bool,
        mem: &mut M,
    ) -> Option<(UnwindRegs, Method)> {
        let s = super::risc::step::<super::aarch64::Arch, M, C>(
            regs,
            mem,
            &mut self.code,
            pc_is_exact,
            self.stack_end,
        )?;
        Some((s.regs, s.method))
    }

    fn before_frame_pointer(&self) -> bool {
        true
    }
}

impl<C: CodeMemory> Fallback<Riscv64> for InsnFallback<C> {
    /// The `rt_sigreturn` trampoline without CFI (qemu-user's, or a vDSO
    /// whose CFI was not found), then prologue analysis, the frame record
    /// below `s0` and stack scanning (`arch/riscv64/instruction_analysis`).
    fn unwind_frame<M: Memory + ?Sized>(
        &mut self,
        regs: &UnwindRegs,
        pc_is_exact: bool,
        _known_module: bool,
        mem: &mut M,
    ) -> Option<(UnwindRegs, Method)> {
        let s = super::risc::step::<super::riscv64::Arch, M, C>(
            regs,
            mem,
            &mut self.code,
            pc_is_exact,
            self.stack_end,
        )?;
        Some((s.regs, s.method))
    }

    fn before_frame_pointer(&self) -> bool {
        true
    }
}
