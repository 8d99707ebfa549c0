//! C++ exceptions and forced unwinds through frames with an exit hook
//! (tests/fixtures/c/exit_hook_cpp.cpp, built with g++ at -O0 and -O2, with
//! and without frame pointers): an exception caught by the hooked frame's
//! direct caller (`catch (...)`, by type), two frames up (past a handler of
//! another type, past a destructor), with hooks on both the thrower and its
//! caller, rethrown by the direct caller or by the hooked frame itself,
//! caught above a caller that pushes nothing (assembly);
//! `pthread_exit` and `pthread_cancel` through a hooked frame. Nothing
//! aborts (libgcc tells the trampoline's frame from its caller's by their
//! CFAs, which differ), no skipped hook runs, and each is counted in
//! `callstack_exit_hook_skipped` once the next hook on the thread has run.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use std::process::Command;
use testsupport::{release_artifacts, scratch_dir, workspace_root};

fn build(flags: &str, tag: &str) -> std::path::PathBuf {
    let a = release_artifacts();
    let out = scratch_dir("exit-hook-cpp").join(format!("exit_hook_cpp_{tag}"));
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let o = Command::new("g++")
        .args(flags.split_whitespace())
        .arg("-g")
        .arg(workspace_root().join("tests/fixtures/c/exit_hook_cpp.cpp"))
        .arg("-o")
        .arg(&tmp)
        .arg("-I")
        .arg(&a.include_dir)
        .arg(&a.static_lib)
        .args(["-lpthread", "-ldl", "-lm"])
        .output()
        .expect("run g++");
    assert!(
        o.status.success(),
        "g++ {flags}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, &out).unwrap();
    out
}

fn check(flags: &str, tag: &str) {
    let exe = build(flags, tag);
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{flags}: {:?}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "CASE direct_any 1 ran 0 skipped 1",
            "CASE direct_typed 2 ran 0 skipped 1",
            "CASE two_up 3 ran 0 skipped 1",
            "CASE guard_two_up 4 ran 0 skipped 1",
            "CASE both_hooked 5 ran 0 skipped 2",
            "CASE rethrow_caught 6 ran 0 skipped 1",
            "CASE catch_rethrown 7 ran 0 skipped 1",
            "CASE nopush_caught 11 ran 0 skipped 1",
            "GUARDS 1",
            "FORCED exit 9 ran 0 guards 1 cleanups 1",
            "FORCED cancel -1 ran 0 guards 1 cleanups 1",
        ],
        "{flags}"
    );
}

#[test]
fn exceptions_through_hooked_frames_at_o0() {
    check("-O0", "O0");
    check("-O0 -fno-omit-frame-pointer", "O0fp");
    check("-O0 -fomit-frame-pointer", "O0nofp");
}

#[test]
fn exceptions_through_hooked_frames_at_o2() {
    check("-O2", "O2");
    check("-O2 -fno-omit-frame-pointer", "O2fp");
}
