//! `cargo bench -p callstack-benches --bench exit_hook`: the cost of an exit hook,
//! side by side with a plain call, in one run.
//!
//! Rows (each one call of a `#[inline(never)]` function that returns a
//! value):
//! - `plain call`: the function alone;
//! - `install + hooked return`: the function installs an empty hook on its
//!   own frame (`exit_hook::install(0, ..)`), then returns through the
//!   trampoline, which runs the hook;
//! - `install + hooked return, 16 deep`: the same, called 16 frames deep
//!   (the install's exact capture only walks the frames it needs, so depth
//!   should not matter).
//!
//! The summary prints, per row, the interleaved median (rows take turns in
//! batches of 200 calls, 2000 rounds, so load changes hit every row alike),
//! and the hook's added cost: row minus `plain call`. Issue 15's bar: install
//! plus the hooked return under 50 ns together.
use callstack::exit_hook;
use criterion::Criterion;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

static HITS: AtomicU64 = AtomicU64::new(0);

#[inline(never)]
fn plain(x: u64) -> u64 {
    black_box(x + 1)
}

#[inline(never)]
fn hooked(x: u64) -> u64 {
    exit_hook::install(0, || {
        // One thread: a plain increment, not a locked one.
        HITS.store(HITS.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    })
    .unwrap();
    black_box(x + 1)
}

#[inline(never)]
fn deep(n: u32, f: fn(u64) -> u64) -> u64 {
    if n == 0 {
        return f(black_box(1));
    }
    black_box(deep(n - 1, f)) + 1
}

type Row = (&'static str, fn() -> u64);

const ROWS: &[Row] = &[
    ("plain call", || plain(black_box(1))),
    ("install + hooked return", || hooked(black_box(1))),
    ("plain call, 16 deep", || deep(16, plain)),
    ("install + hooked return, 16 deep", || deep(16, hooked)),
];

fn interleaved() -> Vec<f64> {
    const BATCH: u32 = 200;
    const ROUNDS: usize = 2000;
    let mut samples = vec![Vec::with_capacity(ROUNDS); ROWS.len()];
    for _ in 0..ROUNDS {
        for (i, (_, f)) in ROWS.iter().enumerate() {
            let t = Instant::now();
            for _ in 0..BATCH {
                black_box(f());
            }
            samples[i].push(t.elapsed().as_nanos() as f64 / BATCH as f64);
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        })
        .collect()
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    for (name, f) in ROWS {
        c.bench_function(name, |b| b.iter(f));
    }
    c.final_summary();
    let m = interleaved();
    println!("\nexit hooks, interleaved medians (ns per call):");
    println!("| row | ns | hook's added cost, ns |");
    println!("|---|---:|---:|");
    for (i, (name, _)) in ROWS.iter().enumerate() {
        let base = if i < 2 { m[0] } else { m[2] };
        let added = if i % 2 == 1 {
            format!("{:.1}", m[i] - base)
        } else {
            String::new()
        };
        println!("| {name} | {:.1} | {added} |", m[i]);
    }
    assert!(HITS.load(Ordering::Relaxed) > 0);
}
