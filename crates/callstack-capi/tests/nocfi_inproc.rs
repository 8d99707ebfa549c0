//! In-process capture through C code with neither CFI, nor frame pointers,
//! nor debug info: `callstack_capture_exact` and
//! `callstack_capture_from_context` must reach the instruction analysis
//! without `callstack_prepare()` (the first capture of a program that never
//! heard of it) as well as with it.
//!
//! `tests/fixtures/c/nocfi_inproc.c` runs main -> run -> f1 -> f2 (a
//! 70,000-byte frame) -> f3 x5 (recursion) -> f4, then captures directly,
//! from a SIGUSR1 handler (from the context, and exact from inside the
//! handler), from SIGSEGV and SIGABRT handlers, and from a SIGSEGV in a
//! leaf that never moves the stack pointer. It is built at -O0 and -O2 with
//! `-fomit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables
//! -g0`, as one executable, as that executable stripped, and with the chain
//! in a shared library (stripped too). The expected chain is the fixture's
//! by design; names come from binutils' addr2line on the unstripped twin.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::path::{Path, PathBuf};
use std::process::Command;
use testsupport::{addr2line_functions, release_artifacts, scratch_dir, Gcc};

const NO_CFI: &str =
    "-g0 -fomit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables";

#[derive(Clone, Copy, PartialEq)]
enum Shape {
    Exe,
    Stripped,
    Lib,
}

struct Built {
    /// What runs.
    exe: PathBuf,
    /// Unstripped twin of each file the run may name, by file name.
    twins: Vec<PathBuf>,
}

fn strip(from: &Path, to: &Path) {
    let st = Command::new("strip")
        .arg("-o")
        .arg(to)
        .arg(from)
        .status()
        .unwrap();
    assert!(st.success(), "strip {from:?}");
}

fn build(opt: &str, shape: Shape) -> Built {
    let dir = scratch_dir(&format!("nocfi_inproc{opt}"));
    let flags = format!("{opt} {NO_CFI}");
    let tag = match shape {
        Shape::Exe => "exe",
        Shape::Stripped => "stripped",
        Shape::Lib => "lib",
    };
    if shape != Shape::Lib {
        let exe = Gcc::new(&["nocfi_inproc.c"])
            .flags(&flags)
            .link_callstack()
            .build(&dir.join(format!("nocfi{opt}-{tag}")));
        if shape == Shape::Exe {
            return Built {
                exe: exe.clone(),
                twins: vec![exe],
            };
        }
        let run = dir.join(format!("nocfi{opt}-{tag}.s"));
        strip(&exe, &run);
        return Built {
            exe: run,
            twins: vec![exe],
        };
    }
    // The chain in a stripped shared library, called by a stripped
    // executable built the usual way (-O2, with CFI).
    let lib_full = Gcc::new(&["nocfi_inproc.c"])
        .flags(&format!("{flags} -fPIC -shared -DNOCFI_LIB"))
        .build(&dir.join(format!("libnocfi{opt}-full.so")));
    let lib_dir = dir.join(format!("lib{opt}"));
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib = lib_dir.join("libnocfi.so");
    strip(&lib_full, &lib);
    let a = release_artifacts();
    let exe = dir.join(format!("nocfi{opt}-main"));
    let o = Command::new("gcc")
        .args(["-O2", "-DNOCFI_MAIN_ONLY"])
        .arg(testsupport::c_fixtures().join("nocfi_inproc.c"))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", lib_dir.display()))
        .arg("-lnocfi")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg(&a.static_lib)
        .args(["-lpthread", "-ldl", "-lm"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Built {
        exe: exe.clone(),
        twins: vec![exe, lib_full],
    }
}

#[derive(Debug)]
struct Frame {
    addr: u64,
    base: u64,
    module: String,
}

/// The frames of each mode, in the order printed.
fn run(b: &Built, prepare: bool) -> Vec<(String, Vec<Frame>)> {
    let mut cmd = Command::new(&b.exe);
    cmd.arg("all");
    if prepare {
        cmd.arg("prepare");
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{:?} failed: {o:?}", b.exe);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut out: Vec<(String, Vec<Frame>)> = Vec::new();
    for l in text.lines() {
        if let Some(m) = l.strip_prefix("mode ") {
            out.push((m.to_string(), Vec::new()));
        } else if let Some(f) = l.strip_prefix("frame ") {
            let p: Vec<&str> = f.splitn(3, ' ').collect();
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            out.last_mut().unwrap().1.push(Frame {
                addr: hex(p[0]),
                base: hex(p[1]),
                module: p[2].to_string(),
            });
        }
    }
    out
}

/// The fixture's own frames (those in a file with an unstripped twin),
/// named by the twin, with gcc's `.cold`/`.isra.0` suffixes dropped; and
/// whether the chain went through an address in no module.
fn own_names(b: &Built, frames: &[Frame], first_exact: bool) -> (Vec<String>, bool) {
    let mut names = Vec::new();
    let mut lost = false;
    for (i, f) in frames.iter().enumerate() {
        if f.module == "?" {
            lost = true;
            continue;
        }
        let file = Path::new(&f.module).file_name().unwrap().to_string_lossy();
        let twin = b.twins.iter().find(|t| {
            let t = t.file_name().unwrap().to_string_lossy();
            file == t || (file == "libnocfi.so" && t.starts_with("libnocfi"))
                || (file.ends_with(".s") && file.trim_end_matches(".s") == t)
        });
        let Some(twin) = twin else { continue };
        let adjust = if i == 0 && first_exact { 0 } else { 1 };
        let name = addr2line_functions(twin, &[f.addr - f.base - adjust]).remove(0);
        names.push(name.split('.').next().unwrap().to_string());
    }
    (names, lost)
}

fn expected(mode: &str) -> Vec<&'static str> {
    let mut v = match mode {
        "handler" => vec!["on_signal", "f4"],
        "leaf" => vec!["leaf", "f4"],
        _ => vec!["f4"],
    };
    v.extend(["f3"; 5]);
    v.extend(["f2", "f1", "run", "main", "_start"]);
    v
}

fn check(opt: &str, shape: Shape) {
    let b = build(opt, shape);
    for prepare in [false, true] {
        let runs = run(&b, prepare);
        assert_eq!(runs.len(), 6, "{opt}: modes run: {}", runs.len());
        for (mode, frames) in &runs {
            // From a context, frame 0 is the interrupted pc itself.
            let exact = matches!(mode.as_str(), "context" | "segv" | "abort" | "leaf");
            let (names, lost) = own_names(&b, frames, exact);
            assert_eq!(
                names,
                expected(mode),
                "{opt} {} mode {mode}, prepare() {prepare}: {frames:#x?}",
                b.exe.display()
            );
            assert!(!lost, "{opt} mode {mode}: a frame in no module: {frames:#x?}");
        }
    }
}

#[test]
fn no_cfi_executable_at_o0() {
    check("-O0", Shape::Exe);
}

#[test]
fn no_cfi_executable_at_o2() {
    check("-O2", Shape::Exe);
}

#[test]
fn no_cfi_stripped_executable_at_o0() {
    check("-O0", Shape::Stripped);
}

#[test]
fn no_cfi_stripped_executable_at_o2() {
    check("-O2", Shape::Stripped);
}

#[test]
fn no_cfi_stripped_shared_library_at_o0() {
    check("-O0", Shape::Lib);
}

#[test]
fn no_cfi_stripped_shared_library_at_o2() {
    check("-O2", Shape::Lib);
}
