//! `cargo bench -p callstack --bench insn`: the per-frame cost of
//! instruction-analysis unwinding (issue 7) against the CFI path, on the
//! same chains in one run.
//!
//! Rows, at the shared scenarios (recursion 8, 32 and 64 deep; 64 distinct
//! functions):
//! - `capture_exact`: compiled DWARF CFI (warm: tables prepared first);
//! - `insn_inprocess`: [`callstack::unwind::insn::InProcess::capture`], the
//!   same stack walked by machine-code analysis alone (no CFI, no frame
//!   pointers; the snapshot of mappings and symbols is taken first);
//! - `capture_fast`: the frame-pointer walk, the floor.
//!
//! Criterion runs each row (short); then a summary prints, per scenario,
//! the frames each row returned and an interleaved median (rows take turns
//! in short batches, so a shared machine's load hits all alike), the cost
//! per frame (median / frames), and the ratio to `capture_exact`. Last, the
//! marginal cost of one more frame: (median at depth 64 - median at depth
//! 8) / (frames at 64 - frames at 8), which leaves out the fixed cost of a
//! capture (the walk to the test harness's frames and the thread's start).
use std::hint::black_box;
use std::sync::OnceLock;

use callstack::unwind::insn::InProcess;
use criterion::Criterion;

#[path = "scenarios.rs"]
mod scenarios;
use scenarios::SCENARIOS;

struct Row {
    name: &'static str,
    capture: fn(&mut [usize]) -> usize,
}

fn snapshot() -> &'static InProcess {
    static SNAP: OnceLock<InProcess> = OnceLock::new();
    SNAP.get_or_init(InProcess::new)
}

#[inline(never)]
fn capture_exact(out: &mut [usize]) -> usize {
    callstack::capture_exact(0, out)
}

#[inline(never)]
fn insn_inprocess(out: &mut [usize]) -> usize {
    snapshot().capture(0, out)
}

#[inline(never)]
fn capture_fast(out: &mut [usize]) -> usize {
    callstack::capture_fast(0, out)
}

const ROWS: &[Row] = &[
    Row {
        name: "capture_exact",
        capture: capture_exact,
    },
    Row {
        name: "insn_inprocess",
        capture: insn_inprocess,
    },
    Row {
        name: "capture_fast",
        capture: capture_fast,
    },
];

fn main() {
    callstack::prepare();
    snapshot();
    let mut c = Criterion::default().configure_from_args();
    for sc in SCENARIOS {
        let mut g = c.benchmark_group(format!("insn/{}", sc.name));
        for r in ROWS {
            g.bench_function(r.name, |b| {
                (sc.at)(&mut || {
                    let mut buf = [0usize; 256];
                    b.iter(|| (r.capture)(black_box(&mut buf)));
                });
            });
        }
        g.finish();
    }
    c.final_summary();

    println!("\nsummary (interleaved medians; ratio to capture_exact):");
    println!(
        "{:<12} {:<16} {:>6} {:>12} {:>10} {:>8}",
        "scenario", "row", "frames", "median ns", "ns/frame", "ratio"
    );
    let mut by_depth = Vec::new();
    for sc in SCENARIOS {
        let captures: Vec<_> = ROWS.iter().map(|r| r.capture).collect();
        let res = scenarios::interleaved(sc, &captures, 200, 4);
        let base = res[0].0;
        for (r, (ns, n)) in ROWS.iter().zip(&res) {
            println!(
                "{:<12} {:<16} {:>6} {:>12.0} {:>10.1} {:>7.2}x",
                sc.name,
                r.name,
                n,
                ns,
                ns / (*n).max(1) as f64,
                ns / base
            );
        }
        by_depth.push((sc.name, res));
    }
    let at = |name: &str| by_depth.iter().find(|d| d.0 == name).map(|d| &d.1);
    if let (Some(d8), Some(d64)) = (at("depth8"), at("depth64")) {
        println!("\nmarginal cost of one more frame (depth64 - depth8):");
        let base = (d64[0].0 - d8[0].0) / (d64[0].1 as f64 - d8[0].1 as f64);
        for (i, r) in ROWS.iter().enumerate() {
            let frames = d64[i].1 as f64 - d8[i].1 as f64;
            let per = (d64[i].0 - d8[i].0) / frames;
            println!(
                "{:<16} {:>8.1} ns/frame over {} frames, {:.2}x capture_exact",
                r.name,
                per,
                frames,
                per / base
            );
        }
    }
}
