//! `cargo bench -p callstack-benches --bench insn`: the per-frame cost of
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
//! One more scenario, `nocfi_lib`, captures from inside a C library built
//! here by gcc with `-O2 -fomit-frame-pointer` and without unwind tables
//! (tests/fixtures/c/insn_chain.c and its assembly function, or its C
//! middle frame `insn_mid.c` off x86-64, by `$CALLSTACK_TEST_CC` when set,
//! as under qemu-user): six frames
//! that only instruction analysis can walk, under the bench's own 8-deep
//! recursion. There `capture_exact` takes CFI for the Rust frames and its
//! instruction-analysis fallback for the library's, and `capture_fast`
//! stops at the first frame without a frame pointer.
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

#[cfg(target_arch = "x86_64")]
use callstack::unwind::insn::InProcess;
use criterion::Criterion;

#[path = "scenarios.rs"]
mod scenarios;
use scenarios::{Scenario, SCENARIOS};

type Entry = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void) -> c_int;
use std::ffi::{c_int, c_void};

/// `insn_entry` of the no-CFI library, built and loaded once.
fn nocfi_entry() -> Entry {
    static ENTRY: OnceLock<usize> = OnceLock::new();
    let e = *ENTRY.get_or_init(|| {
        let fx = testsupport::c_fixtures();
        let dir = testsupport::scratch_dir("bench-insn-nocfi");
        let so = dir.join("libinsn-bench-nocfi.so");
        // The cross compiler when the bench runs under qemu-user, and the
        // middle frame in C where there is no hand-written assembly for it
        // (as tests/insn_inprocess.rs builds it).
        let cc = std::env::var("CALLSTACK_TEST_CC").unwrap_or_else(|_| "gcc".into());
        let mid = if cfg!(target_arch = "x86_64") {
            "insn_asm_x86_64.S"
        } else {
            "insn_mid.c"
        };
        let ok = std::process::Command::new(cc)
            .args(["-O2", "-fomit-frame-pointer", "-fPIC", "-shared"])
            .args(["-fno-asynchronous-unwind-tables", "-fno-unwind-tables"])
            .arg(fx.join("insn_chain.c"))
            .arg(fx.join(mid))
            .arg("-o")
            .arg(&so)
            .status()
            .expect("gcc");
        assert!(ok.success(), "gcc failed");
        let c = std::ffi::CString::new(so.to_str().unwrap()).unwrap();
        // SAFETY: dlopen/dlsym with valid C strings; the library stays
        // loaded for the rest of the process.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            assert!(!h.is_null(), "dlopen {}", so.display());
            let sym = libc::dlsym(h, c"insn_entry".as_ptr());
            assert!(!sym.is_null());
            sym as usize
        }
    });
    // SAFETY: `e` is `insn_entry`'s address, of type `Entry`.
    unsafe { std::mem::transmute::<usize, Entry>(e) }
}

extern "C" fn call_closure(arg: *mut c_void) {
    // SAFETY: `arg` is the `&mut &mut dyn FnMut()` given by `in_nocfi_lib`.
    let f = unsafe { &mut *(arg as *mut &mut dyn FnMut()) };
    f();
}

/// Runs `f` under the recursion of depth 8, inside the no-CFI library.
fn in_nocfi_lib(f: &mut dyn FnMut()) {
    let entry = nocfi_entry();
    scenarios::recurse(8, &mut || {
        let mut g: &mut dyn FnMut() = &mut *f;
        // SAFETY: `insn_entry` calls `call_closure(&mut g)` once and returns.
        unsafe { entry(call_closure, &mut g as *mut &mut dyn FnMut() as *mut c_void) };
    });
}

const NOCFI: Scenario = Scenario {
    name: "nocfi_lib",
    at: in_nocfi_lib,
};

fn all_scenarios() -> Vec<&'static Scenario> {
    SCENARIOS.iter().chain([&NOCFI]).collect()
}

struct Row {
    name: &'static str,
    capture: fn(&mut [usize]) -> usize,
}

#[cfg(target_arch = "x86_64")]
fn snapshot() -> &'static InProcess {
    static SNAP: OnceLock<InProcess> = OnceLock::new();
    SNAP.get_or_init(InProcess::new)
}

#[inline(never)]
fn capture_exact(out: &mut [usize]) -> usize {
    callstack::capture_exact(0, out)
}

#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn insn_inprocess(out: &mut [usize]) -> usize {
    snapshot().capture(0, out)
}

#[inline(never)]
fn capture_fast(out: &mut [usize]) -> usize {
    callstack::capture_fast(0, out)
}

/// The rows; the machine-code-only walker `InProcess` is x86-64's.
const ROWS: &[Row] = &[
    Row {
        name: "capture_exact",
        capture: capture_exact,
    },
    #[cfg(target_arch = "x86_64")]
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
    nocfi_entry();
    callstack::prepare();
    #[cfg(target_arch = "x86_64")]
    snapshot();
    let mut c = Criterion::default().configure_from_args();
    for sc in all_scenarios() {
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
    for sc in all_scenarios() {
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
