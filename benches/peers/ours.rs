//! Our rows: `capture_fast`, and the floor it is measured against.
use std::hint::black_box;

/// `callstack::capture_fast`: the bounded, checked frame-pointer walk.
#[inline(never)]
pub fn capture_fast(out: &mut [usize]) -> usize {
    callstack::capture_fast(0, out)
}

/// The floor: a frame-pointer loop with no check at all (no bounds, no
/// alignment, no monotonicity). It cannot know where the chain ends without
/// checks, so the harness gives it an `out` exactly as long as the chain
/// `capture_fast` found at the same spot ([`crate::Row::limit_to_ours`]); it
/// also stops at a null frame pointer. Never use this outside a benchmark.
#[inline(never)]
pub fn bare_loop(out: &mut [usize]) -> usize {
    black_box(bare(out))
}

// Built like `capture_fast`'s entry: a naked function that pushes an exact
// frame record, so the first return address is inside `bare_loop` (as
// `capture_fast`'s first is inside `capture_fast` above) and both walks
// return the same number of frames. (Reading rbp from inline asm in a normal
// function is not enough: LLVM may move the prologue after the read.)
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
extern "C" fn bare_walk_entry(out: *mut usize, len: usize) -> usize {
    // SAFETY: standard frame, rbp passed as the third argument, restored.
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "mov rdx, rbp",
        "call {walk}",
        "pop rbp",
        "ret",
        walk = sym bare_walk,
    )
}

#[cfg(target_arch = "x86_64")]
extern "C" fn bare_walk(out: *mut usize, len: usize, mut fp: usize) -> usize {
    let mut n = 0;
    while n < len && fp != 0 {
        // SAFETY: none checked: the harness limits `len` to the length of
        // the chain `capture_fast` walked from this very spot.
        unsafe {
            *out.add(n) = *((fp + 8) as *const usize);
            fp = *(fp as *const usize);
        }
        n += 1;
    }
    n
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn bare(out: &mut [usize]) -> usize {
    bare_walk_entry(out.as_mut_ptr(), out.len())
}

#[cfg(not(target_arch = "x86_64"))]
fn bare(out: &mut [usize]) -> usize {
    let _ = out;
    0
}

/// `callstack::capture_exact`: DWARF CFI from compiled tables (the harness
/// calls `callstack::prepare()` first, so this is the warm capture).
#[inline(never)]
pub fn capture_exact(out: &mut [usize]) -> usize {
    callstack::capture_exact(0, out)
}
