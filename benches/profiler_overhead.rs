//! Overhead of in-process sampling at 1 kHz on a CPU-bound workload: no
//! profiler, `callstack::profiler::Profiler`, pprof-rs 0.15 with its
//! default backtrace-rs unwinder and pprof-rs 0.14 with its frame-pointer
//! unwinder (a crate feature, hence the other version), each run in a
//! fresh process (every profiler owns SIGPROF), rounds interleaved; medians
//! of wall time and their ratios.
//!
//! `cargo bench -p callstack-benches --bench profiler_overhead` (ROUNDS=n to change
//! the 9 rounds). The frame-pointer peer is benches/pprof_fp/, built here
//! with cargo into `$CARGO_TARGET_DIR/pprof-fp`.

use std::process::Command;
use std::time::Instant;

#[path = "pprof_fp/src/workload.rs"]
mod workload;
use workload::workload;

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
    let exe = std::env::current_exe().unwrap();
    let fp_peer = build_fp_peer();
    let mut modes = vec!["none", "callstack", "pprof-rs"];
    if fp_peer.is_some() {
        modes.push("pprof-rs-fp");
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for _ in 0..rounds {
        for (i, m) in modes.iter().enumerate() {
            let o = match (*m, &fp_peer) {
                ("pprof-rs-fp", Some(peer)) => Command::new(peer).output().unwrap(),
                _ => Command::new(&exe)
                    .env("CS_PROF_BENCH_MODE", m)
                    .output()
                    .unwrap(),
            };
            if i == modes.len() - 1 && times[i].is_empty() {
                eprint!("{}", String::from_utf8_lossy(&o.stderr));
            }
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

/// Builds benches/pprof_fp (pprof-rs in frame-pointer mode, a program of
/// its own) and returns its path; None, said on stderr, when it does not
/// build.
fn build_fp_peer() -> Option<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pprof_fp");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.join("../../target"))
        .join("pprof-fp");
    let o = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match o {
        Ok(o) if o.status.success() => Some(target.join("release/pprof-fp-peer")),
        Ok(o) => {
            eprintln!(
                "pprof-rs frame-pointer mode does not build here, left out:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
            None
        }
        Err(e) => {
            eprintln!("cannot run cargo for pprof-rs frame-pointer mode ({e}), left out");
            None
        }
    }
}
