//! The accuracy report of machine-code unwinding (issue 7's bar): on the
//! fixture chain built without CFI (x86-64, `-O0`/`-O2`, stripped or not,
//! without frame pointers, plus `-O2` with frame pointers, gdb's known trap),
//! how many frames each tool gets right, against the truth of the same code
//! built with CFI (gdb on that build's core; `.text` identical, ASLR off):
//! - ours: `unwind::insn` on the no-CFI core (no CFI used at all, not even
//!   libc's);
//! - gdb: `bt` on the same no-CFI core;
//! - libunwind: `unw_backtrace` inside the same no-CFI program (dlopened
//!   `libunwind.so.8`), just before the crash.
//!
//! "Whole chain" counts frames 1..=main of the crash (libc's abort frames,
//! then the program's); "own frames" counts the program's frames from `d` to
//! `main`, which all three tools can be scored on. A frame counts if it and
//! every frame before it are right. Run with `--nocapture` to see the table.
// The cores are read through `callstack::remote`.
#![cfg(feature = "remote")]
#![cfg(target_arch = "x86_64")]

mod common;
use common::chain::*;

struct Row {
    name: String,
    total: usize,
    ours: usize,
    cli: usize,
    cli_methods: String,
    gdb: usize,
    own_total: usize,
    own_ours: usize,
    own_gdb: usize,
    own_lu: Option<usize>,
}

fn measure(opt: &'static str, strip: bool, fp: bool) -> Row {
    let dir = testsupport::scratch_dir(&format!(
        "insn-acc-{}-{strip}-{fp}",
        opt.trim_start_matches('-')
    ));
    let truth_exe = build_exe(
        &dir,
        &Variant {
            opt,
            strip: false,
            cfi: true,
            fp,
        },
    );
    let v = Variant {
        opt,
        strip,
        cfi: false,
        fp,
    };
    let exe = build_exe(&dir, &v);
    assert_eq!(text(&truth_exe), text(&exe));
    let (truth_core, _) = make_core(&truth_exe, "");
    let truth = physical_frames(
        &truth_exe,
        &truth_core,
        &gdb_core_pcs(&truth_exe, &truth_core),
    );
    let (main, size) = symbol(&truth_exe, "main").unwrap();
    let base = 0x5555_5555_4000u64;
    let end = truth
        .iter()
        .position(|&p| p > base + main && p <= base + main + size)
        .unwrap();
    let truth = &truth[..=end];
    // d's frame: the first after `crash`.
    let (crash, csize) = symbol(&truth_exe, "crash").unwrap();
    let in_crash = |p: u64| p > base + crash && p <= base + crash + csize;
    let cold = symbol(&truth_exe, "crash.cold");
    let in_cold = |p: u64| cold.is_some_and(|(c, s)| p > base + c && p <= base + c + s);
    let d_idx = truth
        .iter()
        .position(|&p| in_crash(p) || in_cold(p))
        .unwrap()
        + 1;

    let (core, _) = make_core(&exe, "");
    let ours: Vec<u64> = our_core_chain(&exe, &core).iter().map(|f| f.0).collect();
    let gdb = physical_frames(&exe, &core, &gdb_core_pcs(&exe, &core));
    // The integrated tool: `callstack core --json --methods`.
    let (report, cli_pcs) = common::cores::cli_core_json(&["--methods"], &exe, &core);
    let cli_methods = report["methods"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, n)| n.as_u64() != Some(0))
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let (_, out) = make_core(&exe, "libunwind");
    let lu = libunwind_pcs(&out);
    Row {
        name: v.name(),
        total: truth.len() - 1,
        ours: frames_right(truth, 1, &ours),
        cli: frames_right(truth, 1, &cli_pcs),
        cli_methods,
        gdb: frames_right(truth, 1, &gdb),
        own_total: truth.len() - d_idx,
        own_ours: frames_right(truth, d_idx, &ours),
        own_gdb: frames_right(truth, d_idx, &gdb),
        own_lu: lu.map(|l| frames_right(truth, d_idx, &l)),
    }
}

#[test]
fn accuracy_table() {
    let mut rows = Vec::new();
    for opt in ["-O0", "-O2"] {
        for strip in [false, true] {
            rows.push(measure(opt, strip, false));
        }
    }
    let fp_row = measure("-O2", false, true);
    let pct = |a: usize, b: usize| 100.0 * a as f64 / b.max(1) as f64;
    println!("\n| build (no CFI) | whole chain: ours | `callstack core` | gdb | own frames: ours | gdb | libunwind | `callstack core --methods` |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut sums = [0usize; 7];
    for r in rows.iter().chain([&fp_row]) {
        let lu = r
            .own_lu
            .map_or("n/a".to_string(), |x| format!("{x}/{}", r.own_total));
        println!(
            "| {} | {}/{} | {}/{} | {}/{} | {}/{} | {}/{} | {} | {} |",
            r.name,
            r.ours,
            r.total,
            r.cli,
            r.total,
            r.gdb,
            r.total,
            r.own_ours,
            r.own_total,
            r.own_gdb,
            r.own_total,
            lu,
            r.cli_methods
        );
    }
    for r in &rows {
        sums[0] += r.total;
        sums[1] += r.ours;
        sums[2] += r.gdb;
        sums[3] += r.own_total;
        sums[4] += r.own_ours;
        sums[5] += r.own_gdb;
        sums[6] += r.own_lu.unwrap_or(0);
    }
    println!(
        "| **no-FP matrix** | **{:.0}%** | | **{:.0}%** | **{:.0}%** | **{:.0}%** | **{:.0}%** | |",
        pct(sums[1], sums[0]),
        pct(sums[2], sums[0]),
        pct(sums[4], sums[3]),
        pct(sums[5], sums[3]),
        pct(sums[6], sums[3])
    );
    assert!(
        pct(sums[1], sums[0]) >= 95.0,
        "ours below 95% on the matrix"
    );
    assert_eq!(fp_row.ours, fp_row.total, "-O2 with frame pointers, no CFI");
}
