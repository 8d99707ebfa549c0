//! The Thread Environment Block: the current thread's stack, the process's
//! PEB. Plain loads through the TEB's self pointer: no system call, no
//! lock, nothing allocated, safe in an exception handler.
//!
//! x64 layout (winternl.h, `NT_TIB` at the TEB's start):
//!
//! ```text
//!   TEB + 0x08  StackBase   one past the stack's highest address
//!   TEB + 0x10  StackLimit  the lowest committed address of the stack
//!   TEB + 0x30  Self        the TEB's own address (read through gs)
//!   TEB + 0x60  ProcessEnvironmentBlock
//! ```
//!
//! `StackLimit` moves down as the stack grows (each guard-page fault
//! commits more): everything in `[StackLimit, StackBase)` is committed,
//! readable memory, and the stack pointer of running code is inside it.
//! `SwitchToFiber` rewrites both, so they describe the running fiber's
//! stack.

const STACK_BASE: usize = 0x08;
const STACK_LIMIT: usize = 0x10;
const PEB: usize = 0x60;

/// The current thread's TEB (0 where this architecture has no reader).
#[inline(always)]
fn teb() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        super::x86_64::teb()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// The current thread's stack as its TEB records it: `(StackLimit,
/// StackBase)`, `(0, 0)` when unknown.
#[inline(always)]
pub fn stack() -> (usize, usize) {
    let t = teb();
    if t == 0 {
        return (0, 0);
    }
    // SAFETY: the TEB of the running thread is mapped for the thread's
    // life; these are two pointer-sized fields of its `NT_TIB`.
    let (base, limit) = unsafe {
        (
            core::ptr::read_volatile((t + STACK_BASE) as *const usize),
            core::ptr::read_volatile((t + STACK_LIMIT) as *const usize),
        )
    };
    if limit < base {
        (limit, base)
    } else {
        (0, 0)
    }
}

/// The process's PEB (0 when unknown).
#[inline]
pub fn peb() -> usize {
    let t = teb();
    if t == 0 {
        return 0;
    }
    // SAFETY: a pointer-sized field of the running thread's TEB.
    unsafe { core::ptr::read_volatile((t + PEB) as *const usize) }
}
