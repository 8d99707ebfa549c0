//! Overhead of in-process sampling at 1 kHz on a CPU-bound workload: no
//! profiler, `callstack::profiler::Profiler`, and pprof-rs (its default
//! backtrace-rs unwinder), each run in a fresh process (both profilers
//! own SIGPROF), rounds interleaved; medians of wall time and their ratios.
//!
//! `cargo bench -p callstack --bench profiler_overhead` (ROUNDS=n to change
//! the 9 rounds).

use std::process::Command;
use std::time::Instant;

#[inline(never)]
fn leaf(mut x: u64, n: u64) -> u64 {
    for _ in 0..n {
        x = std::hint::black_box(
            x.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        );
    }
    x
}

#[inline(never)]
fn middle(x: u64, n: u64, depth: u32) -> u64 {
    if depth == 0 {
        leaf(x, n)
    } else {
        middle(x ^ depth as u64, n, depth - 1) ^ 1
    }
}

/// About a second of CPU, stacks ~20 frames deep.
fn workload() -> u64 {
    let mut x = 1;
    for i in 0..8000u64 {
        x ^= middle(x, 100_000 + (i % 7) * 1000, 12 + (i % 5) as u32);
    }
    x
}

fn child(mode: &str) {
    let t = Instant::now();
    let r = match mode {
        "none" => workload(),
        "callstack" => {
            let t0 = Instant::now();
            let p = callstack::profiler::Profiler::start(1000).unwrap();
            let t1 = Instant::now();
            let r = workload();
            let t2 = Instant::now();
            let prof = p.stop();
            eprintln!(
                "start {:?}, stop {:?}, {} samples",
                t1 - t0,
                t2.elapsed(),
                prof.total(0)
            );
            // Start and stop included in the time: they are part of the cost.
            let _ = (t1, t2);
            assert!(prof.total(0) > 0);
            r
        }
        "pprof-rs" => {
            let g = pprof::ProfilerGuardBuilder::default()
                .frequency(1000)
                .build()
                .unwrap();
            let r = workload();
            let rep = g.report().build().unwrap();
            assert!(!rep.data.is_empty());
            r
        }
        m => panic!("unknown mode {m}"),
    };
    std::hint::black_box(r);
    println!("{}", t.elapsed().as_nanos());
}

fn main() {
    if let Ok(mode) = std::env::var("CS_PROF_BENCH_MODE") {
        child(&mode);
        return;
    }
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(9);
    let modes = ["none", "callstack", "pprof-rs"];
    let exe = std::env::current_exe().unwrap();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for _ in 0..rounds {
        for (i, m) in modes.iter().enumerate() {
            let o = Command::new(&exe)
                .env("CS_PROF_BENCH_MODE", m)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "{m}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let ns: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
            times[i].push(ns / 1e6);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let base = median(&mut times[0].clone());
    println!("workload at 1 kHz, {rounds} rounds, median wall time:");
    for (i, m) in modes.iter().enumerate() {
        let med = median(&mut times[i]);
        println!("  {m:<10} {med:8.1} ms  x{:.4} of none", med / base);
    }
}
