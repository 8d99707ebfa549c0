//! `Tracking::sampled` as this test's global allocator: two functions
//! allocate known totals in blocks of different sizes; the sampled
//! snapshot's estimates of each equal the truth within five standard
//! deviations of the sampling, and blocks freed are taken off again.
#![cfg(feature = "symbolize")]
#![allow(clippy::vec_box)] // the boxes are the allocations measured

use callstack::alloc::{Capture, HeapSnapshot, Tracking};
use std::alloc::System;
use std::hint::black_box;

const MEAN: u64 = 8 * 1024;

#[global_allocator]
static A: Tracking<System> = Tracking::sampled(System, Capture::Exact, MEAN);

/// 400 000 boxes of 64 bytes; every tenth kept.
#[inline(never)]
fn small_boxes(keep: &mut Vec<Box<[u8; 64]>>) {
    for i in 0..400_000u32 {
        let b = black_box(Box::new([i as u8; 64]));
        if i % 10 == 0 {
            keep.push(b);
        }
    }
}

/// 2 000 vectors of 20 000 bytes, all freed.
#[inline(never)]
fn big_vecs() {
    for i in 0..2_000u32 {
        black_box(vec![i as u8; 20_000]);
    }
}

/// Estimated (allocations, bytes, live bytes) of the sites with a frame in
/// this file's function `name`.
fn by_function(snap: &HeapSnapshot, name: &str) -> (u64, u64, u64) {
    let mut sym = snap.symbolizer();
    let full = format!("alloc_sampled::{name}");
    let mut t = (0, 0, 0);
    for s in &snap.sites {
        if snap
            .site_frames(&mut sym, s)
            .iter()
            .any(|f| f.function == full)
        {
            t = (t.0 + s.allocs, t.1 + s.alloc_bytes, t.2 + s.live_bytes());
        }
    }
    t
}

/// Five standard deviations of an estimate of `truth` bytes made of
/// blocks of `size` bytes, relative.
fn tolerance(truth: u64, size: u64) -> f64 {
    let p = 1.0 - (-(size as f64) / MEAN as f64).exp();
    let samples = truth as f64 / size as f64 * p;
    5.0 * ((1.0 - p) / samples).sqrt() + 0.002
}

fn near(what: &str, est: u64, truth: u64, tol: f64) {
    let r = est as f64 / truth as f64;
    assert!(
        (r - 1.0).abs() < tol,
        "{what}: {est} for {truth} (ratio {r:.3}, tolerance {tol:.3})"
    );
}

#[test]
fn sampled_estimates_match_the_truth() {
    let mut keep = Vec::with_capacity(50_000);
    small_boxes(&mut keep);
    big_vecs();
    let snap = A.snapshot();
    assert_eq!(snap.sample_bytes, MEAN);
    let (n, bytes, live) = by_function(&snap, "small_boxes");
    let t = tolerance(400_000 * 64, 64);
    assert!(t < 0.1, "too few samples: {t}");
    near("small_boxes allocations", n, 400_000, t);
    near("small_boxes bytes", bytes, 400_000 * 64, t);
    near(
        "small_boxes live bytes",
        live,
        40_000 * 64,
        tolerance(40_000 * 64, 64),
    );
    let (n, bytes, live) = by_function(&snap, "big_vecs");
    let t = tolerance(2_000 * 20_000, 20_000);
    near("big_vecs allocations", n, 2_000, t);
    near("big_vecs bytes", bytes, 2_000 * 20_000, t);
    assert_eq!(live, 0, "every big vector was freed");
    drop(keep);
    let (_, _, live) = by_function(&A.snapshot(), "small_boxes");
    assert_eq!(live, 0, "every kept box was freed");
    // Frees of blocks never sampled are no unknown frees.
    assert!(snap.counters.unknown_frees < 10, "{:?}", snap.counters);
}
