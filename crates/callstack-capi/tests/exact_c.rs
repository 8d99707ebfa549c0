//! `callstack_capture_exact` and `callstack_capture_from_context` against
//! gdb's `bt`, frame by frame, on C programs built with and without frame
//! pointers, through a shared library (PLT), an `alloca` frame, and a
//! SIGUSR1 handler raised by `raise()`.
//!
//! gdb runs the fixture to `probe` (called right after the capture) and a
//! gdb Python script prints gdb's own frames with their types and the name
//! of the function each captured address falls in. gdb's `TAILCALL` frames
//! (synthesized from DWARF call-site info: `pthread_kill` tail-jumps into
//! `__pthread_kill_implementation`, so no return address of it exists on
//! the stack) and `INLINE` frames are not physical frames and are dropped.
//! With `backtrace past-main`, gdb goes down to `_start`, and so must we.

use std::path::Path;
use std::process::Command;
use testsupport::{c_fixtures, scratch_dir, workspace_root, Gcc};

struct Run {
    gdb: Vec<(String, u64, String)>,
    ours: Vec<(u64, String, String)>,
}

fn gdb_run(exe: &Path, args: &str) -> Run {
    let script = workspace_root().join("tests/fixtures/gdb/exact_frames.py");
    let o = Command::new("gdb")
        .args(["-nx", "-batch", "-ex", "set pagination off"])
        .args(["-ex", "set debuginfod enabled off"])
        .args(["-ex", "set backtrace past-main on"])
        .args(["-ex", "set backtrace past-entry on"])
        .args(["-ex", "handle SIGUSR1 nostop noprint pass"])
        .args(["-ex", "break probe"])
        .args(["-ex", &format!("run {args}")])
        .arg("-x")
        .arg(&script)
        .arg(exe)
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&o.stdout);
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let mut run = Run {
        gdb: vec![],
        ours: vec![],
    };
    for l in text.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["GDB", ty, pc, name] => run.gdb.push((ty.to_string(), hex(pc), name.to_string())),
            ["OURS", a, before, at] => run.ours.push((hex(a), before.to_string(), at.to_string())),
            _ => {}
        }
    }
    assert!(
        !run.gdb.is_empty() && !run.ours.is_empty(),
        "gdb gave nothing:\n{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    run
}

/// Compares one run: gdb's physical frames below the capture point against
/// the captured chain, names for all and exact addresses for all but a
/// capture's own first entry.
fn check(run: &Run, mode: &str, what: &str) {
    let mut gdb: Vec<(u64, String)> = run
        .gdb
        .iter()
        .filter(|f| f.0 != "TAILCALL" && f.0 != "INLINE")
        .map(|f| (f.1, f.2.clone()))
        .collect();
    // Drop gdb's frames above the captured code: `probe` and, for a context
    // capture, everything down to the signal trampoline.
    if mode == "context" {
        let t = run
            .gdb
            .iter()
            .position(|f| f.0 == "SIGTRAMP")
            .expect("a signal frame");
        let tramp_pc = run.gdb[t].1;
        let i = gdb.iter().position(|f| f.0 == tramp_pc).unwrap();
        gdb.drain(..=i);
    } else {
        gdb.remove(0);
    }
    let mut ours: Vec<(u64, String)> = Vec::new();
    let mut exact_next = mode == "context";
    for (a, before, at) in &run.ours {
        let name = if exact_next || at == "__restore_rt" {
            at.clone()
        } else {
            before.clone()
        };
        exact_next = at == "__restore_rt";
        ours.push((*a, name));
    }
    let names = |v: &[(u64, String)]| v.iter().map(|x| x.1.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&ours),
        names(&gdb),
        "{what}: function chains differ\nours {ours:#x?}\ngdb  {gdb:#x?}"
    );
    let first = if mode == "context" { 0 } else { 1 };
    for i in first..ours.len() {
        assert_eq!(
            ours[i].0, gdb[i].0,
            "{what}: frame {i} address differs\nours {ours:#x?}\ngdb  {gdb:#x?}"
        );
    }
    assert_eq!(
        gdb.last().unwrap().1,
        "_start",
        "{what}: gdb should reach _start"
    );
}

fn build(tag: &str, flags: &str) -> std::path::PathBuf {
    let dir = scratch_dir(&format!("exact-{tag}"));
    let lib = dir.join("libexact_lib.so");
    Gcc::new(&["exact_lib.c"])
        .flags(flags)
        .flags("-shared -fPIC")
        .build(&lib);
    let lib_abs = lib.to_str().unwrap().to_string();
    let _ = c_fixtures();
    Gcc::new(&["exact_main.c", &lib_abs])
        .flags(flags)
        .flags(&format!("-Wl,-rpath,{}", dir.display()))
        .link_callstack()
        .build(&dir.join("exact_main"))
}

fn check_build(tag: &str, flags: &str) {
    let exe = build(tag, flags);
    for mode in ["exact", "signal", "context"] {
        for prep in ["cold", "prepare"] {
            let what = format!("{flags} {mode} {prep}");
            let run = gdb_run(&exe, &format!("{mode} {prep}"));
            check(&run, mode, &what);
        }
    }
}

#[test]
fn chains_equal_gdb_without_frame_pointers() {
    check_build("nofp", "-O2 -fomit-frame-pointer");
}

#[test]
fn chains_equal_gdb_with_frame_pointers() {
    check_build("fp", "-O2 -fno-omit-frame-pointer");
}

#[test]
fn chains_equal_gdb_at_o0() {
    check_build("o0", "-O0");
}

#[test]
fn chains_equal_gdb_without_cfi_with_frame_pointers() {
    // No .eh_frame for the program's own code: the frame-pointer rule
    // unwinds those frames; glibc's still come from CFI.
    check_build(
        "nocfi",
        "-O2 -fno-omit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables",
    );
}
