//! What the machine-code analyzers read and produce: code to read
//! ([`CodeMemory`]), the rules they recover ([`InsnRule`]) and the call found
//! before a candidate return address ([`CallBefore`]).

use super::{Memory, ReadError, UnwindRegs};

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

    /// Whether `addr` lies in code that is known to be executable but whose
    /// bytes this reader does not have (a module of another process whose
    /// file was found nowhere): a return address there cannot be checked
    /// against the call before it, only believed, as the last resort of
    /// the frame-pointer step and of stack scanning. In process: never.
    fn is_unread_code(&mut self, addr: u64) -> bool {
        let _ = addr;
        false
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
    pub fn apply<M: Memory + ?Sized>(
        &self,
        regs: &UnwindRegs,
        mem: &mut M,
        word: u8,
    ) -> Result<UnwindRegs, ReadError> {
        let base = |b: Base| match b {
            Base::Sp => regs.sp,
            Base::Fp => regs.fp,
        };
        let read = |mem: &mut M, a: u64| -> Result<u64, ReadError> {
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

/// The call instruction found right before a candidate return address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallBefore {
    /// A direct call to this address.
    Direct(u64),
    /// A call through a register or memory.
    Indirect,
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
