//! A counting global allocator: a capture allocates nothing, the first
//! capture on a fresh thread (which looks up the stack bounds) included.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;

struct Counting;

thread_local! {
    // Const-initialized, no destructor: usable inside the allocator.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn note() {
    if COUNTING.with(|c| c.get()) {
        ALLOCS.with(|a| a.set(a.get() + 1));
    }
}

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Counts allocator calls on this thread while `f` runs.
fn allocations_in(f: impl FnOnce()) -> usize {
    ALLOCS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCS.with(|a| a.get())
}

#[inline(never)]
fn nested(n: usize, out: &mut [usize]) -> usize {
    if n == 0 {
        callstack::capture_fast(0, out)
    } else {
        black_box(nested(n - 1, out))
    }
}

#[test]
fn the_counter_sees_allocations() {
    let n = allocations_in(|| {
        black_box(vec![1u8; 100]);
    });
    assert!(n >= 1);
}

#[test]
fn capture_allocates_nothing_first_call_on_a_fresh_thread_included() {
    let counts = std::thread::spawn(|| {
        let mut out = [0usize; 128];
        let mut got = 0;
        // The first capture on this thread: it reads /proc/self/maps.
        let first = allocations_in(|| got = nested(10, &mut out));
        assert!(got > 10);
        let warm = allocations_in(|| {
            for i in 0..1000 {
                black_box(nested(i % 20, &mut out));
                let t = callstack::Trace::<64>::capture_fast(0);
                black_box(t.hash());
                black_box(callstack::hash_frames(t.as_slice()));
            }
        });
        (first, warm)
    })
    .join()
    .unwrap();
    assert_eq!(counts, (0, 0), "(first capture, 1000 warm captures)");
}

#[test]
fn trace_first_on_a_fresh_thread_allocates_nothing() {
    let n = std::thread::spawn(|| {
        allocations_in(|| {
            let t = callstack::Trace::<32>::capture_fast(0);
            assert!(!t.is_empty());
        })
    })
    .join()
    .unwrap();
    assert_eq!(n, 0);
}

#[test]
fn prepare_thread_allocates_nothing() {
    let n = std::thread::spawn(|| allocations_in(callstack::prepare_thread))
        .join()
        .unwrap();
    assert_eq!(n, 0);
}

#[cfg(target_os = "linux")]
#[test]
fn heap_recorder_allocates_nothing() {
    // The tables are mapped on first use (mmap, not the allocator); every
    // record after that, including a full table's overflow, is counted too.
    static R: callstack::alloc::Recorder = callstack::alloc::Recorder::with_capacity(4, 4);
    let n = allocations_in(|| {
        let mut frames = [0usize; 32];
        for i in 0..64usize {
            let k = callstack::capture_fast(0, &mut frames);
            frames[0] ^= i; // 64 distinct sites: the table of 16 overflows
            R.record_alloc(black_box(&frames[..k]), 0x1000 + 16 * i, 8);
        }
        for i in 0..64usize {
            if let Some(t) = R.take(0x1000 + 16 * i) {
                R.commit_free(t);
            }
        }
        R.record_free(0x9999_0000); // unknown
    });
    assert_eq!(n, 0);
    let s = R.snapshot();
    assert_eq!(s.totals().0, 64);
    assert_eq!(s.counters.live_overflow, 48);
}
