//! `callstack::alloc::Tracking` as this test's global allocator: known
//! allocations by known functions, counted exactly by function name.
#![cfg(feature = "symbolize")]

use callstack::alloc::{Capture, HeapSnapshot, Tracking};
use std::alloc::System;
use std::hint::black_box;

#[global_allocator]
static A: Tracking<System> = Tracking::new(System, Capture::Exact);

#[inline(never)]
fn make_leak() {
    // 777 bytes, never freed.
    std::mem::forget(black_box(Vec::<u8>::with_capacity(777)));
}

#[inline(never)]
fn churn() {
    // 50 boxes of 96 bytes, each freed.
    for _ in 0..50 {
        black_box(Box::new([7u8; 96]));
    }
}

#[inline(never)]
fn grow() {
    // A Vec<u64> pushed to 100 elements: capacity 4, 8, ..., 128 (one
    // allocation, five reallocations), dropped at the end.
    let mut v = Vec::<u64>::new();
    for i in 0..100 {
        v.push(black_box(i));
    }
    black_box(v);
}

/// (allocations, bytes, frees, freed bytes) of the sites with a frame in
/// this file's function `name`.
fn by_function(snap: &HeapSnapshot, name: &str) -> (u64, u64, u64, u64) {
    let mut sym = snap.symbolizer();
    let full = format!("alloc_tracking::{name}");
    let mut t = (0, 0, 0, 0);
    for s in &snap.sites {
        let frames = snap.site_frames(&mut sym, s);
        if frames.iter().any(|f| f.function == full) {
            t = (
                t.0 + s.allocs,
                t.1 + s.alloc_bytes,
                t.2 + s.frees,
                t.3 + s.free_bytes,
            );
        }
    }
    t
}

#[test]
fn sites_and_leaks_by_function() {
    make_leak();
    churn();
    grow();
    let snap = A.snapshot();
    assert_eq!(snap.capture, Capture::Exact);
    assert_eq!(by_function(&snap, "make_leak"), (1, 777, 0, 0));
    assert_eq!(by_function(&snap, "churn"), (50, 4800, 50, 4800));
    let g = 32 + 64 + 128 + 256 + 512 + 1024;
    assert_eq!(by_function(&snap, "grow"), (6, g, 6, g));
    assert_eq!(snap.counters.live_overflow, 0);

    // The leak report names make_leak with its 777 bytes, Rust's
    // allocation plumbing left out of the stack.
    let mut sym = snap.symbolizer();
    let leaks = snap.leak_report(&mut sym, 1000);
    let at = leaks
        .find("::make_leak at")
        .unwrap_or_else(|| panic!("{leaks}"));
    let head = leaks[..leaks[..at].rfind(" bytes live in ").unwrap()]
        .rfind('\n')
        .unwrap();
    assert!(
        leaks[head..].starts_with("\n  777 bytes live in 1 blocks"),
        "{}",
        &leaks[head..at]
    );
    let above = &leaks[head..at];
    assert!(
        !above.contains("callstack::") && !above.contains("__rust"),
        "{above}"
    );

    // The recording round-trips through its file format.
    let mut buf = Vec::new();
    snap.write_to(&mut buf).unwrap();
    let back = HeapSnapshot::read_from(&buf[..]).unwrap();
    assert_eq!(back.sites, snap.sites);
    assert_eq!(back.counters, snap.counters);
    assert!(!back.modules.is_empty());
    assert_eq!(by_function(&back, "make_leak"), (1, 777, 0, 0));

    // The top-sites report is produced for this process.
    let report = A.report(5);
    assert!(report.starts_with("heap: "), "{report}");
    assert!(report.contains("top sites by allocations:"), "{report}");
}
