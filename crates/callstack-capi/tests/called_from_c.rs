//! `callstack_called_from` and `callstack_called_from_any` from a C program
//! (tests/fixtures/c/called_from.c) linked with `libcallstack.a`, at -O0
//! and -O2 with and without frame pointers: the answers of each designed
//! chain, cold and then warm. The same fixture runs under wine in
//! tests/windows_c.rs.
use testsupport::{scratch_dir, Gcc};

/// What the fixture prints: each line three times (cold, then warm).
const WANT: [&str; 2] = [
    "middle outer=1 middle=1 other=0 main=1 none=0 any=1 null=-1",
    "other outer=0 middle=0 other=1 main=1 none=0 any=0 null=-1",
];

fn check(flags: &str) {
    let tag: String = flags.split_whitespace().collect();
    let exe = Gcc::new(&["called_from.c"])
        .flags(flags)
        .link_callstack()
        .build(&scratch_dir("called_from_c").join(format!("called_from{tag}")));
    let out = std::process::Command::new(&exe).output().unwrap();
    assert!(out.status.success(), "{flags}: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let want: Vec<&str> = (0..3).flat_map(|_| WANT).collect();
    assert_eq!(lines, want, "{flags}");
}

#[test]
fn called_from_at_o0() {
    check("-O0");
}

#[test]
fn called_from_at_o2_with_frame_pointers() {
    check("-O2 -fno-omit-frame-pointer");
}

#[test]
fn called_from_at_o2_without_frame_pointers() {
    check("-O2 -fomit-frame-pointer");
}
