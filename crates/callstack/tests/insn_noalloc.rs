//! `InProcess::capture` allocates nothing (after the snapshot is taken).
#![cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn capture_does_not_allocate() {
    let snap = callstack::unwind::insn::InProcess::new();
    callstack::prepare_thread();
    let mut out = [0usize; 64];
    let before = ALLOCS.load(Ordering::SeqCst);
    let n = snap.capture(0, &mut out);
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "capture allocated");
    assert!(n >= 3, "captured {n} frames");
    // out[0] is in this function.
    let here = capture_does_not_allocate as *const () as usize;
    assert!(
        out[0] > here && out[0] < here + 4096,
        "{:#x} vs {here:#x}",
        out[0]
    );
}
