//! Cost per tracked allocation: `callstack::alloc::Tracking` with
//! `Capture::Fast` and `Capture::Exact` (32 frames kept) beside dhat-rs,
//! on one workload in one run: at a call depth of 40 frames, rounds of
//! `alloc(32 bytes)` + `dealloc`. One global allocator switches between the
//! four (the system allocator alone is the baseline). Prints ns per
//! alloc+free pair, the cost added per tracked pair, and ratios.
//!
//! `cargo bench -p callstack-benches --bench alloc_tracking [-- N]`

use callstack::alloc::{Capture, Tracking};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::time::Instant;

static MODE: AtomicU8 = AtomicU8::new(0);
static FAST: Tracking<System> = Tracking::new(System, Capture::Fast);
static EXACT: Tracking<System> = Tracking::new(System, Capture::Exact);

struct Switch;

// SAFETY: every backend allocates from `System`, so a block may be freed
// through any of them (the trackers ignore blocks they did not see).
unsafe impl GlobalAlloc for Switch {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match MODE.load(Relaxed) {
                1 => FAST.alloc(l),
                2 => EXACT.alloc(l),
                3 => dhat::Alloc.alloc(l),
                _ => System.alloc(l),
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match MODE.load(Relaxed) {
                1 => FAST.dealloc(p, l),
                2 => EXACT.dealloc(p, l),
                3 => dhat::Alloc.dealloc(p, l),
                _ => System.dealloc(p, l),
            }
        }
    }
}

#[global_allocator]
static A: Switch = Switch;

static CAPTURE_ONLY: AtomicU8 = AtomicU8::new(0);

#[inline(never)]
fn work(n: usize) -> f64 {
    let l = Layout::from_size_align(32, 8).unwrap();
    let t = Instant::now();
    let only = CAPTURE_ONLY.load(Relaxed);
    if only != 0 {
        let mut frames = [0usize; callstack::alloc::MAX_DEPTH];
        for _ in 0..n {
            let c = if only == 1 {
                Capture::Fast
            } else {
                Capture::Exact
            };
            black_box(c.capture(0, black_box(&mut frames)));
        }
        return t.elapsed().as_nanos() as f64 / n as f64;
    }
    for _ in 0..n {
        // SAFETY: a non-zero-size layout; freed with the same layout.
        unsafe {
            let p = std::alloc::alloc(black_box(l));
            black_box(p);
            std::alloc::dealloc(p, l);
        }
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

#[inline(never)]
fn dive(depth: usize, n: usize) -> f64 {
    let r = if depth <= 1 {
        work(n)
    } else {
        dive(depth - 1, n)
    };
    black_box(r)
}

fn best_of_5(n: usize) -> f64 {
    (0..5)
        .map(|_| dive(40, n / 5))
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    callstack::prepare();
    MODE.store(0, Relaxed);
    let base = best_of_5(n);
    MODE.store(1, Relaxed);
    let fast = best_of_5(n);
    MODE.store(2, Relaxed);
    let exact = best_of_5(n);
    let dhat = {
        let _p = dhat::Profiler::builder().testing().build();
        MODE.store(3, Relaxed);
        let d = best_of_5(n / 10);
        MODE.store(0, Relaxed);
        d
    };
    MODE.store(0, Relaxed);
    CAPTURE_ONLY.store(1, Relaxed);
    let cap_fast = best_of_5(n);
    CAPTURE_ONLY.store(2, Relaxed);
    let cap_exact = best_of_5(n);
    CAPTURE_ONLY.store(0, Relaxed);
    let s = FAST.snapshot();
    let (fa, ..) = s.totals();
    println!(
        "alloc+free pairs at depth 40, {n} per tracker (dhat: {}), best of 5 rounds",
        n / 10
    );
    println!("  system alone        {base:8.1} ns/pair");
    for (name, t) in [
        ("Tracking fast", fast),
        ("Tracking exact", exact),
        ("dhat-rs", dhat),
    ] {
        println!(
            "  {name:<18}  {t:8.1} ns/pair  (+{:.1} ns per tracked pair, {:.2}x fast's)",
            t - base,
            (t - base) / (fast - base)
        );
    }
    println!("  (Tracking fast recorded {fa} allocations)");
    println!("  the capture alone (32 frames): fast {cap_fast:.1} ns, exact {cap_exact:.1} ns");
}
