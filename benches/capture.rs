//! `cargo bench -p callstack-benches --bench capture`: every way to capture a stack,
//! side by side, in one run.
//!
//! Scenarios: the capture made 8, 32 and 64 frames deep in a recursion, and
//! 64 deep through 64 distinct functions (recursion repeats one return
//! address, which flatters any cache keyed by address).
//!
//! Rows: one entry of [`ROWS`] each, implemented in a file under
//! `benches/peers/`. To add a peer, write `benches/peers/<name>.rs` with a
//! `fn(&mut [usize]) -> usize` that captures into its argument and returns
//! how many frames it wrote, declare it below, and add a [`Row`].
//!
//! At the end a summary table prints, per scenario and row, the frames the
//! row returned at that spot, criterion's median per capture (read from
//! criterion's own `estimates.json` of this run), and an interleaved median:
//! the rows take turns in short batches (a few microseconds each, 2000
//! rounds), so a load change on a shared machine hits every row alike. The
//! ratios to `capture_fast` are given for both.
use criterion::Criterion;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

#[path = "peers/backtrace_rs.rs"]
mod backtrace_rs;
#[path = "peers/glibc.rs"]
mod glibc;
#[path = "peers/libgcc.rs"]
mod libgcc;
#[path = "peers/ours.rs"]
mod ours;

/// One row of the table: a way to capture the current stack.
pub struct Row {
    /// Name in criterion's output and in the summary table.
    pub name: &'static str,
    /// Captures into `out`, returns the number of frames written; the
    /// first is inside (or at) the function itself.
    pub capture: fn(&mut [usize]) -> usize,
    /// Give this row an `out` exactly as long as the chain `capture_fast`
    /// finds at the same spot (for a walk without checks, which could not
    /// stop safely on its own).
    pub limit_to_ours: bool,
}

/// Every row; the first is the one the others are compared to.
const ROWS: &[Row] = &[
    Row {
        name: "capture_fast",
        capture: ours::capture_fast,
        limit_to_ours: false,
    },
    Row {
        name: "capture_exact",
        capture: ours::capture_exact,
        limit_to_ours: false,
    },
    Row {
        name: "bare_fp_loop",
        capture: ours::bare_loop,
        limit_to_ours: true,
    },
    Row {
        name: "glibc_backtrace",
        capture: glibc::backtrace_glibc,
        limit_to_ours: false,
    },
    Row {
        name: "unwind_backtrace",
        capture: libgcc::unwind_backtrace,
        limit_to_ours: false,
    },
    Row {
        name: "backtrace_rs",
        capture: backtrace_rs::trace_unsynchronized,
        limit_to_ours: false,
    },
];

#[path = "scenarios.rs"]
mod scenarios;
use scenarios::SCENARIOS;

/// Frames each (scenario, row) returned, recorded outside the timing.
static FRAMES: Mutex<BTreeMap<(&'static str, &'static str), usize>> = Mutex::new(BTreeMap::new());

/// One sample: `iters` captures with `row`, all from this same frame, so
/// that `capture_fast`'s chain length measured here is the bare loop's too.
#[inline(never)]
fn measure(scenario: &'static str, row: &Row, iters: u64) -> Duration {
    let mut buf = [0usize; 256];
    let ours = (ROWS[0].capture)(&mut buf);
    let len = if row.limit_to_ours { ours } else { buf.len() };
    let capture = black_box(row.capture);
    let got = capture(&mut buf[..len]);
    FRAMES.lock().unwrap().insert((scenario, row.name), got);
    let out = &mut buf[..len];
    let start = Instant::now();
    for _ in 0..iters {
        black_box(capture(black_box(&mut *out)));
    }
    start.elapsed()
}

fn main() {
    // capture_exact's row is the warm capture: tables compiled first
    // (benches/exact.rs measures the cold one and the other unwinders).
    callstack::prepare();
    let dir = criterion_dir();
    let started = SystemTime::now();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
        .output_directory(&dir)
        .configure_from_args();
    for s in SCENARIOS {
        let mut group = c.benchmark_group(s.name);
        for row in ROWS {
            group.bench_function(row.name, |b| {
                (s.at)(&mut || b.iter_custom(|iters| measure(s.name, row, iters)));
            });
        }
        group.finish();
    }
    c.final_summary();
    let mut interleaved = Vec::new();
    for s in SCENARIOS {
        let mut medians = Vec::new();
        (s.at)(&mut || medians = interleaved_medians(s.name));
        interleaved.push(medians);
    }
    summary(&dir, started, &interleaved);
}

/// Median ns per capture of every row, the rows taking turns in batches of
/// about `BATCH_NS` each, from this same frame.
#[inline(never)]
fn interleaved_medians(scenario: &'static str) -> Vec<f64> {
    const ROUNDS: usize = 2000;
    const BATCH_NS: f64 = 5_000.0;
    // Calibrate: iterations per batch for each row.
    let iters: Vec<u64> = ROWS
        .iter()
        .map(|row| {
            let t = measure(scenario, row, 64).as_nanos() as f64 / 64.0;
            (BATCH_NS / t.max(1.0)).clamp(1.0, 10_000.0) as u64
        })
        .collect();
    let mut samples = vec![Vec::with_capacity(ROUNDS); ROWS.len()];
    for _ in 0..ROUNDS {
        for (i, row) in ROWS.iter().enumerate() {
            let d = measure(scenario, row, iters[i]);
            samples[i].push(d.as_nanos() as f64 / iters[i] as f64);
        }
    }
    samples
        .iter_mut()
        .map(|v| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        })
        .collect()
}

/// `target/criterion`, next to the bench binary's `target/<profile>/deps`.
fn criterion_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .nth(3)
        .map(|t| t.join("criterion"))
        .unwrap_or_else(|| PathBuf::from("target/criterion"))
}

/// Criterion's median (ns) for one benchmark, if measured in this run.
fn median_ns(dir: &Path, group: &str, row: &str, since: SystemTime) -> Option<f64> {
    let path = dir.join(group).join(row).join("new/estimates.json");
    let meta = std::fs::metadata(&path).ok()?;
    if meta.modified().ok()? < since {
        return None; // left over from an earlier run
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    v["median"]["point_estimate"].as_f64()
}

fn summary(dir: &Path, since: SystemTime, interleaved: &[Vec<f64>]) {
    let frames = FRAMES.lock().unwrap();
    println!();
    println!("Summary: ns per capture (criterion median, interleaved median), frames returned,");
    println!("and ratio to capture_fast");
    println!(
        "| {:<11} | {:<17} | {:>6} | {:>14} | {:>9} | {:>16} | {:>9} |",
        "scenario", "row", "frames", "criterion ns", "ratio", "interleaved ns", "ratio"
    );
    println!(
        "|{:-<13}|{:-<19}|{:->8}|{:->16}|{:->11}|{:->18}|{:->11}|",
        "", "", "", "", "", "", ""
    );
    for (s, inter) in SCENARIOS.iter().zip(interleaved) {
        let ours = median_ns(dir, s.name, ROWS[0].name, since);
        for (i, row) in ROWS.iter().enumerate() {
            let n = frames.get(&(s.name, row.name)).copied().unwrap_or(0);
            let crit = median_ns(dir, s.name, row.name, since);
            let (c_ns, c_ratio) = match (crit, ours) {
                (Some(ns), Some(o)) => (format!("{ns:.1}"), format!("{:.2}x", ns / o)),
                (Some(ns), None) => (format!("{ns:.1}"), "-".into()),
                _ => ("-".into(), "-".into()),
            };
            println!(
                "| {:<11} | {:<17} | {:>6} | {:>14} | {:>9} | {:>16.1} | {:>9} |",
                s.name,
                row.name,
                n,
                c_ns,
                c_ratio,
                inter[i],
                format!("{:.2}x", inter[i] / inter[0])
            );
        }
    }
}
