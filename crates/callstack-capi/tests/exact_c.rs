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

#[path = "../../../tests/fixtures/gdb/gdb_chain.rs"]
mod gdb_chain;

use gdb_chain::{check, gdb_run};
use testsupport::{c_fixtures, scratch_dir, Gcc};

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
