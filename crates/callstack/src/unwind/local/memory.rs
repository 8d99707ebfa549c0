//! The stack-bounded memory of a walk in this process: reads of this
//! thread's stacks only.

use crate::stack::{self, StackBounds};
use crate::unwind::{Memory, ReadError};

/// Reads of this thread's stacks only: the stack the walk started on and
/// any stack a signal frame leads to. Async-signal-safe, never faults.
pub(crate) struct StackMemory {
    pub(super) bounds: [StackBounds; 2],
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    /// Set by the dynamic loader: the stack pointer at the program's entry
    /// (the address of `argc`), near the top of the main thread's stack.
    static __libc_stack_end: *const libc::c_void;
}

/// The main thread's stack from `sp` up, without reading `/proc`: when this
/// function's own frame lies less than 8 MiB (the default `RLIMIT_STACK`)
/// below `__libc_stack_end`, it runs on the main thread's stack, which is one
/// mapping from here to its top (the kernel keeps other mappings a guard gap
/// away from it); a `sp` between here and the top is then on that mapping,
/// and `[sp, __libc_stack_end + 8)` is readable. (A `sp` merely near the
/// stack's top, from a crafted or foreign context, may lie below the
/// stack's mapping: it takes the lookup.)
#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(super) fn main_stack_bounds(sp: u64) -> Option<StackBounds> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: a pointer-sized variable of the loader, written once before
        // any of our code runs.
        let end = unsafe { core::ptr::read_volatile(&raw const __libc_stack_end) } as u64;
        let marker = 0u8;
        let here = core::hint::black_box(&marker) as *const u8 as u64;
        if here <= sp && end > sp && end - here < 8 << 20 {
            return Some(StackBounds {
                lo: sp as usize,
                hi: end as usize + 8,
            });
        }
        None
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = sp;
        None
    }
}

impl StackMemory {
    /// One past the top of the stack the walk started on.
    #[inline]
    pub(crate) fn hi(&self) -> u64 {
        self.bounds[0].hi as u64
    }

    /// Reads of `[lo, hi)` only, a stack whose bounds the caller knows.
    #[inline(always)]
    pub(crate) fn with_bounds(lo: usize, hi: usize) -> Self {
        StackMemory {
            bounds: [StackBounds { lo, hi }, StackBounds::default()],
        }
    }

    #[inline]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    pub(crate) fn for_sp(sp: u64) -> Option<Self> {
        // The thread's cached bounds when it has them; on the main thread,
        // the loader's stack end (no system call); else the one-time lookup.
        let b = match stack::cached_bounds_for(sp as usize) {
            Some(b) => b,
            None => match main_stack_bounds(sp) {
                Some(b) => b,
                None => stack::bounds_for(sp as usize)?,
            },
        };
        Some(StackMemory {
            bounds: [b, StackBounds::default()],
        })
    }

    #[cold]
    #[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
    fn read_other(&self, addr: u64) -> Result<u64, ReadError> {
        let a = addr as usize;
        let b = &self.bounds[1];
        if a >= b.lo && a < b.hi && b.hi - a >= 8 {
            // SAFETY: [a, a + 8) lies inside a mapped, readable stack of
            // this thread (see `stack`): the read cannot fault.
            return Ok(unsafe { core::ptr::read_unaligned(a as *const u64) });
        }
        Err(ReadError::OutOfBounds(addr))
    }
}

impl Memory for StackMemory {
    #[inline(always)]
    fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
        let a = addr as usize;
        let b = &self.bounds[0];
        if a >= b.lo && a < b.hi && b.hi - a >= 8 {
            // SAFETY: [a, a + 8) lies inside a mapped, readable stack of
            // this thread (see `stack`): the read cannot fault.
            return Ok(unsafe { core::ptr::read_unaligned(a as *const u64) });
        }
        self.read_other(addr)
    }

    fn note_stack(&mut self, sp: u64) {
        let a = sp as usize;
        if self.bounds.iter().any(|b| b.contains(a)) {
            return;
        }
        if let Some(b) = stack::bounds_for(a) {
            self.bounds[1] = b;
        }
    }
}
