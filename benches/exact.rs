//! `cargo bench -p callstack-benches --bench exact`: exact capture (DWARF CFI)
//! against the other unwinders, side by side in one run.
//!
//! Warm rows, at depths 8, 32, 64 (recursion) and 64 through 64 distinct
//! functions: `capture_exact`, `capture_fast` (frame pointers: the floor),
//! framehop (driven in-process: modules registered from their ELF files,
//! registers read at the capture, its own cache), nongnu libunwind's
//! `unw_backtrace` (loaded with `dlopen`, so that it does not take over the
//! process's `_Unwind_*`; "not installed" when `libunwind.so.8` is missing),
//! libgcc's `_Unwind_Backtrace`, glibc's `backtrace()` and
//! `backtrace::trace_unsynchronized`.
//!
//! Each row runs under criterion (short), then a summary prints, per
//! scenario, frames returned and an interleaved median (rows take turns in
//! short batches, so load changes of a shared machine hit all alike), with
//! the ratio of each row to `capture_exact`.
//!
//! Cold rows: the first capture in a fresh process, measured in child
//! processes (this binary re-executed), median over several children:
//! `capture_exact` with nothing prepared, `_Unwind_Backtrace`, framehop with
//! its module set-up, libunwind. Then `prepare()`'s compile rate and the
//! tables' size against `.eh_frame`.
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;

// ------------------------------------------------------------ scenarios

#[path = "scenarios.rs"]
mod scenarios;
use scenarios::{recurse, Scenario, SCENARIOS};

// ------------------------------------------------------------ rows

struct Row {
    name: &'static str,
    capture: fn(&mut [usize]) -> usize,
    available: fn() -> bool,
}

fn yes() -> bool {
    true
}

#[path = "peers/backtrace_rs.rs"]
mod backtrace_rs;
#[path = "peers/glibc.rs"]
mod glibc;
#[path = "peers/libgcc.rs"]
mod libgcc;
#[path = "peers/ours.rs"]
#[allow(dead_code)] // the bare loop is capture.rs's row only
mod ours;

// framehop unwinds x86-64 and AArch64 only; elsewhere its row is left out.
#[cfg_attr(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    path = "peers/framehop.rs"
)]
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    path = "peers/framehop_none.rs"
)]
mod fh;
#[path = "peers/libunwind.rs"]
mod libunwind;

const ROWS: &[Row] = &[
    Row {
        name: "capture_exact",
        capture: ours::capture_exact,
        available: yes,
    },
    Row {
        name: "capture_fast",
        capture: ours::capture_fast,
        available: yes,
    },
    Row {
        name: "framehop",
        capture: fh::capture,
        available: fh::available,
    },
    Row {
        name: "libunwind_unw_backtrace",
        capture: libunwind::capture,
        available: libunwind::available,
    },
    Row {
        name: "unwind_backtrace",
        capture: libgcc::unwind_backtrace,
        available: yes,
    },
    Row {
        name: "glibc_backtrace",
        capture: glibc::backtrace_glibc,
        available: yes,
    },
    Row {
        name: "backtrace_rs",
        capture: backtrace_rs::trace_unsynchronized,
        available: yes,
    },
];

// ------------------------------------------------------------ warm

/// 300 rounds of 8 captures per row.
fn interleaved(sc: &Scenario, rows: &[&Row]) -> Vec<(f64, usize)> {
    let captures: Vec<_> = rows.iter().map(|r| r.capture).collect();
    scenarios::interleaved(sc, &captures, 300, 8)
}

// ------------------------------------------------------------ cold

const COLD_ENV: &str = "CALLSTACK_BENCH_COLD";

/// In a child: time the first capture of `row` made 8 frames deep, print ns.
fn cold_child(row: &str) {
    let mut ns = 0u128;
    let mut n = 0;
    recurse(8, &mut || {
        let mut buf = [0usize; 256];
        let mut ru0: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru0) };
        let t = Instant::now();
        n = match row {
            "capture_exact" => callstack::capture_exact(0, &mut buf),
            "unwind_backtrace" => libgcc::unwind_backtrace(&mut buf),
            "libunwind_unw_backtrace" => libunwind::capture(&mut buf),
            "framehop" => {
                let mut st = fh::setup();
                fh::capture_with(&mut st, &mut buf)
            }
            "capture_exact_bounds_known" => {
                callstack::prepare_thread();
                let t = Instant::now();
                let n = callstack::capture_exact(0, &mut buf);
                ns = t.elapsed().as_nanos();
                println!("{ns} {n}");
                std::process::exit(0);
            }
            "capture_exact_after_prepare" => {
                callstack::prepare();
                callstack::capture_exact(0, &mut buf)
            }
            _ => 0,
        };
        ns = t.elapsed().as_nanos();
        let mut ru1: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru1) };
        if std::env::var_os("CALLSTACK_BENCH_FAULTS").is_some() {
            eprintln!("minflt {}", ru1.ru_minflt - ru0.ru_minflt);
        }
    });
    println!("{ns} {n}");
}

/// Runs `children` rounds; each round starts one child per row, in turn,
/// so that a load change on the machine hits every row alike. Returns the
/// median ns and the frame count per row.
fn cold_rows(rows: &[&str], children: usize) -> Vec<Option<(f64, usize)>> {
    let Ok(exe) = std::env::current_exe() else {
        return vec![None; rows.len()];
    };
    let mut v: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut frames = vec![0usize; rows.len()];
    for _ in 0..children {
        for (i, row) in rows.iter().enumerate() {
            let Ok(o) = std::process::Command::new(&exe).env(COLD_ENV, row).output() else {
                continue;
            };
            let s = String::from_utf8_lossy(&o.stdout);
            let mut it = s.split_whitespace();
            if let (Some(ns), Some(f)) = (it.next(), it.next()) {
                if let (Ok(ns), Ok(f)) = (ns.parse::<f64>(), f.parse::<usize>()) {
                    v[i].push(ns);
                    frames[i] = f;
                }
            }
        }
    }
    v.into_iter()
        .zip(frames)
        .map(|(mut x, f)| {
            if x.is_empty() {
                return None;
            }
            x.sort_by(|a, b| a.partial_cmp(b).unwrap());
            Some((x[x.len() / 2], f))
        })
        .collect()
}

// ------------------------------------------------------------ main

fn main() {
    if let Ok(row) = std::env::var(COLD_ENV) {
        if row == "libunwind_unw_backtrace" && !libunwind::available() {
            println!("0 0");
            return;
        }
        cold_child(&row);
        return;
    }
    // Tables compiled once, then every row warmed.
    let t = Instant::now();
    let prep = callstack::prepare();
    let prep_time = t.elapsed();
    let rows: Vec<&Row> = ROWS.iter().filter(|r| (r.available)()).collect();
    for sc in SCENARIOS {
        for r in &rows {
            (sc.at)(&mut || {
                let mut buf = [0usize; 256];
                (r.capture)(&mut buf);
            });
        }
    }

    let cold_only = std::env::var_os("CALLSTACK_BENCH_COLD_ONLY").is_some();
    if !cold_only {
        warm(&rows);
    }
    cold();
    report_prepare(prep, prep_time);
}

fn warm(rows: &[&Row]) {
    let rows = rows.to_vec();
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(700));
    for sc in SCENARIOS {
        let mut g = c.benchmark_group(sc.name);
        for r in &rows {
            g.bench_function(r.name, |b| {
                (sc.at)(&mut || {
                    let mut buf = [0usize; 256];
                    b.iter(|| (r.capture)(black_box(&mut buf)));
                })
            });
        }
        g.finish();
    }

    println!("\n## Warm: ns per capture (interleaved median), frames, ratio row/capture_exact\n");
    let mut header = String::from("| row |");
    let mut sep = String::from("|---|");
    for sc in SCENARIOS {
        header += &format!(" {} ns | frames | x exact |", sc.name);
        sep += "---:|---:|---:|";
    }
    println!("{header}\n{sep}");
    let mut table: BTreeMap<usize, String> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        table.insert(i, format!("| {} |", r.name));
    }
    for sc in SCENARIOS {
        let res = interleaved(sc, &rows);
        let base = res[0].0;
        for (i, (ns, f)) in res.iter().enumerate() {
            *table.get_mut(&i).unwrap() += &format!(" {:.0} | {} | {:.2} |", ns, f, ns / base);
        }
    }
    for l in table.values() {
        println!("{l}");
    }
    for r in ROWS.iter().filter(|r| !(r.available)()) {
        println!("| {} | not installed |", r.name);
    }
}

fn cold() {
    println!("\n## Cold: the first capture in a fresh process (median of 21 children, rows interleaved, 8 frames deep + main's)\n");
    println!("| row | first capture us | frames | x capture_exact |\n|---|---:|---:|---:|");
    let mut rows = vec![
        "capture_exact",
        "capture_exact_bounds_known",
        "unwind_backtrace",
        "framehop",
        "capture_exact_after_prepare",
    ];
    if libunwind::available() {
        rows.insert(4, "libunwind_unw_backtrace");
    } else {
        println!("| libunwind_unw_backtrace | not installed | | |");
    }
    let res = cold_rows(&rows, 21);
    let base = res[0].map(|r| r.0).unwrap_or(1.0);
    for (row, r) in rows.iter().zip(res) {
        let note = match *row {
            "framehop" => " (module set-up included)",
            "capture_exact_bounds_known" => " (stack bounds looked up before)",
            "capture_exact_after_prepare" => " (prepare() included)",
            _ => "",
        };
        match r {
            Some((ns, f)) => println!(
                "| {row}{note} | {:.1} | {f} | {:.2} |",
                ns / 1000.0,
                ns / base
            ),
            None => println!("| {row} | failed | | |"),
        }
    }
}

fn report_prepare(prep: callstack::PrepareStats, prep_time: Duration) {
    println!(
        "\n## prepare(): {} modules, {} compiled in {:.1} ms: {} CFI rows -> {} table rows, {:.2} M CFI rows/s; tables {} KiB from {} KiB of .eh_frame ({:.0}%)",
        prep.modules,
        prep.compiled,
        prep_time.as_secs_f64() * 1e3,
        prep.cfi_rows,
        prep.rows,
        prep.cfi_rows as f64 / prep_time.as_secs_f64() / 1e6,
        prep.table_bytes / 1024,
        prep.eh_frame_bytes / 1024,
        100.0 * prep.table_bytes as f64 / prep.eh_frame_bytes.max(1) as f64
    );
}
