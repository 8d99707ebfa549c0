//! `cargo bench -p callstack-benches --bench exact_nofp`: exact capture through C
//! code without frame pointers, against libunwind, framehop and libgcc.
//!
//! The chains: a shared library built at start by gcc (`-O2
//! -fomit-frame-pointer -fPIC`, loaded with `dlopen`), two chains of 64
//! distinct functions each, every function with its own frame size (a
//! `volatile` array) and some keeping values across the call in
//! callee-saved registers (so `rbp` is saved in some frames):
//! - `nofp64`: frames of 16 to 500 bytes;
//! - `nofp64_big`: the same with 8 frames over 2 KiB, 2 of them over 64 KiB
//!   (70,000 and 200,000 bytes).
//!
//! The third chain, `distinct64`, is the Rust chain of `scenarios.rs`,
//! built with frame pointers: `capture_exact` against `capture_fast` there.
//!
//! Two phases in one process: first without `prepare()` (the rule cache
//! filled by the captures themselves), then after `prepare()`. In each,
//! every row is warmed on every chain, runs under criterion (short), then
//! an interleaved median per row (rows take turns in batches of 8 captures,
//! 300 rounds) with each row's ratio to `capture_exact`. Then the cold
//! rows: the first capture in a fresh process on `nofp64_big`, median over
//! child processes (this binary re-executed), `capture_exact` (nothing
//! prepared) against libgcc's `_Unwind_Backtrace`.
use std::ffi::{c_void, CString};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::Criterion;

#[path = "scenarios.rs"]
#[allow(dead_code)]
mod scenarios;
use scenarios::Scenario;

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
#[path = "peers/libgcc.rs"]
mod libgcc;
#[path = "peers/libunwind.rs"]
mod libunwind;
#[path = "peers/ours.rs"]
#[allow(dead_code)]
mod ours;

// ------------------------------------------------------------ the C chains

/// Frame sizes of the big chain: 8 over 2 KiB, 2 of them over 64 KiB.
fn big_size(i: usize) -> usize {
    match i {
        5 => 2600,
        13 => 3000,
        21 => 4500,
        29 => 9000,
        37 => 20_000,
        45 => 33_000,
        17 => 70_000,
        50 => 200_000,
        _ => small_size(i),
    }
}

fn small_size(i: usize) -> usize {
    16 + (i * 37) % 480
}

/// One chain of 64 functions `{p}0`..`{p}63`; the last calls `cb(arg)`.
fn chain_source(p: &str, size: fn(usize) -> usize) -> String {
    let mut s = String::new();
    for i in (0..64).rev() {
        let n = size(i);
        let call = if i == 63 {
            "cb(arg); int r = d;".to_string()
        } else {
            format!("int r = {p}{}(cb, arg, d + 1);", i + 1)
        };
        // Every fourth function keeps six values across the call: they live
        // in callee-saved registers (rbx, rbp, r12-r15), so rbp is saved.
        let (keep, used) = if i % 4 == 1 {
            (
                "int k1 = d * 3, k2 = d * 5, k3 = d * 7, k4 = d * 11, k5 = d * 13, k6 = d * 17;",
                "+ k1 + k2 + k3 + k4 + k5 + k6",
            )
        } else {
            ("", "")
        };
        s += &format!(
            "__attribute__((noinline, noclone)) int {p}{i}(cb_t cb, void *arg, int d) {{\n\
             \tvolatile char buf[{n}]; buf[0] = (char)d; buf[{n} - 1] = (char)d; {keep}\n\
             \t{call}\n\
             \treturn r + buf[0] + buf[{n} - 1] {used};\n}}\n"
        );
    }
    s
}

fn build_lib() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("callstack-exact-nofp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = String::from("typedef void (*cb_t)(void *);\n");
    src += &chain_source("g", small_size);
    src += &chain_source("h", big_size);
    src += "int start_small(cb_t cb, void *arg) { return g0(cb, arg, 0) + 1; }\n";
    src += "int start_big(cb_t cb, void *arg) { return h0(cb, arg, 0) + 1; }\n";
    let c = dir.join("nofp_chain.c");
    std::fs::write(&c, src).unwrap();
    let so = dir.join("libnofp_chain.so");
    // `CALLSTACK_TEST_CC`: the cross compiler when the bench runs under
    // qemu-user (see scripts/test-aarch64.sh).
    let cc = std::env::var("CALLSTACK_TEST_CC").unwrap_or_else(|_| "gcc".into());
    let st = std::process::Command::new(cc)
        .args(["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .status()
        .expect("gcc");
    assert!(st.success(), "gcc failed");
    so
}

type Start = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void) -> libc::c_int;

struct Lib {
    small: Start,
    big: Start,
}

static LIB: OnceLock<Lib> = OnceLock::new();

fn load(path: &Path) -> Lib {
    let p = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: loading the library just built; the symbols have the C
    // signature of `Start`.
    unsafe {
        let h = libc::dlopen(p.as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null(), "dlopen {}", path.display());
        let sym = |n: &std::ffi::CStr| {
            let s = libc::dlsym(h, n.as_ptr());
            assert!(!s.is_null());
            std::mem::transmute::<*mut c_void, Start>(s)
        };
        Lib {
            small: sym(c"start_small"),
            big: sym(c"start_big"),
        }
    }
}

extern "C" fn trampoline(arg: *mut c_void) {
    // SAFETY: `arg` is the `&mut &mut dyn FnMut()` passed by `run`, alive
    // for the call.
    let f = unsafe { &mut *(arg as *mut &mut dyn FnMut()) };
    f();
}

fn run(start: Start, mut f: &mut dyn FnMut()) {
    let arg = (&mut f) as *mut &mut dyn FnMut() as *mut c_void;
    // SAFETY: the chain calls `trampoline(arg)` once, 64 frames down.
    black_box(unsafe { start(trampoline, arg) });
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "nofp64",
        at: |f| run(LIB.get().unwrap().small, f),
    },
    Scenario {
        name: "nofp64_big",
        at: |f| run(LIB.get().unwrap().big, f),
    },
    Scenario {
        name: "distinct64",
        at: |f| scenarios::f00(f),
    },
];

// ------------------------------------------------------------ rows

struct Row {
    name: &'static str,
    capture: fn(&mut [usize]) -> usize,
}

fn capture_exact(out: &mut [usize]) -> usize {
    callstack::capture_exact(0, out)
}

fn rows() -> Vec<Row> {
    let mut v = vec![
        Row {
            name: "capture_exact",
            capture: capture_exact,
        },
        Row {
            name: "capture_fast",
            capture: ours::capture_fast,
        },
    ];
    if fh::available() {
        v.push(Row {
            name: "framehop",
            capture: fh::capture,
        });
    }
    if libunwind::available() {
        v.push(Row {
            name: "libunwind_unw_backtrace",
            capture: libunwind::capture,
        });
    }
    v.push(Row {
        name: "unwind_backtrace",
        capture: libgcc::unwind_backtrace,
    });
    v
}

fn phase(title: &str, rows: &[Row]) {
    for sc in SCENARIOS {
        for r in rows {
            for _ in 0..3 {
                (sc.at)(&mut || {
                    let mut buf = [0usize; 256];
                    (r.capture)(&mut buf);
                });
            }
        }
    }
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(500));
    for sc in SCENARIOS {
        let mut g = c.benchmark_group(format!("{title}/{}", sc.name));
        for r in rows {
            g.bench_function(r.name, |b| {
                (sc.at)(&mut || {
                    let mut buf = [0usize; 256];
                    b.iter(|| (r.capture)(black_box(&mut buf)));
                })
            });
        }
        g.finish();
    }
    println!("\n## Warm, {title}: ns per capture (interleaved median), frames, ratio row/capture_exact\n");
    let mut header = String::from("| row |");
    let mut sep = String::from("|---|");
    for sc in SCENARIOS {
        header += &format!(" {} ns | frames | x exact |", sc.name);
        sep += "---:|---:|---:|";
    }
    println!("{header}\n{sep}");
    let mut lines: Vec<String> = rows.iter().map(|r| format!("| {} |", r.name)).collect();
    let captures: Vec<_> = rows.iter().map(|r| r.capture).collect();
    for sc in SCENARIOS {
        let res = scenarios::interleaved(sc, &captures, 300, 8);
        let base = res[0].0;
        for (l, (ns, f)) in lines.iter_mut().zip(&res) {
            *l += &format!(" {:.0} | {} | {:.2} |", ns, f, ns / base);
        }
    }
    for l in lines {
        println!("{l}");
    }
}

// ------------------------------------------------------------ cold

const COLD_ENV: &str = "CALLSTACK_BENCH_NOFP_COLD";
const LIB_ENV: &str = "CALLSTACK_BENCH_NOFP_LIB";

fn cold_child(row: &str) {
    let lib = std::env::var_os(LIB_ENV).expect("library path");
    let _ = LIB.set(load(Path::new(&lib)));
    let mut ns = 0u128;
    let mut n = 0;
    (SCENARIOS[1].at)(&mut || {
        let mut buf = [0usize; 256];
        let t = Instant::now();
        n = match row {
            "capture_exact" => callstack::capture_exact(0, &mut buf),
            "unwind_backtrace" => libgcc::unwind_backtrace(&mut buf),
            _ => 0,
        };
        ns = t.elapsed().as_nanos();
    });
    println!("{ns} {n}");
}

fn cold(lib: &Path) {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let rows = ["capture_exact", "unwind_backtrace"];
    let mut v: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut frames = [0usize; 2];
    for _ in 0..21 {
        for (i, row) in rows.iter().enumerate() {
            let Ok(o) = std::process::Command::new(&exe)
                .env(COLD_ENV, row)
                .env(LIB_ENV, lib)
                .output()
            else {
                continue;
            };
            let s = String::from_utf8_lossy(&o.stdout);
            let mut it = s.split_whitespace();
            if let (Some(Ok(ns)), Some(Ok(f))) = (
                it.next().map(str::parse::<f64>),
                it.next().map(str::parse::<usize>),
            ) {
                v[i].push(ns);
                frames[i] = f;
            }
        }
    }
    println!("\n## Cold: the first capture in a fresh process on nofp64_big (median of 21 children, rows interleaved)\n");
    println!("| row | first capture us | frames | x capture_exact |\n|---|---:|---:|---:|");
    let med: Vec<f64> = v
        .iter_mut()
        .map(|x| {
            x.sort_by(|a, b| a.partial_cmp(b).unwrap());
            x.get(x.len() / 2).copied().unwrap_or(f64::NAN)
        })
        .collect();
    for (i, row) in rows.iter().enumerate() {
        println!(
            "| {row} | {:.1} | {} | {:.2} |",
            med[i] / 1000.0,
            frames[i],
            med[i] / med[0]
        );
    }
}

// ------------------------------------------------------------ main

fn main() {
    if let Ok(row) = std::env::var(COLD_ENV) {
        cold_child(&row);
        return;
    }
    let lib = build_lib();
    if let Some(keep) = std::env::var_os("CALLSTACK_BENCH_NOFP_KEEP_LIB") {
        // For profiling one cold child by hand (callgrind, perf): run it with
        // CALLSTACK_BENCH_NOFP_COLD=<row> CALLSTACK_BENCH_NOFP_LIB=<this copy>.
        std::fs::copy(&lib, keep).expect("copy the chain library");
    }
    let _ = LIB.set(load(&lib));
    let rows = rows();
    if std::env::var_os("CALLSTACK_BENCH_COLD_ONLY").is_none() {
        phase("without prepare()", &rows);
        let t = Instant::now();
        callstack::prepare();
        println!("\n(prepare(): {:.1} ms)", t.elapsed().as_secs_f64() * 1e3);
        phase("after prepare()", &rows);
    }
    cold(&lib);
    let _ = std::fs::remove_dir_all(lib.parent().unwrap());
}
