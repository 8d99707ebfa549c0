//! The C API links and captures from a C program.
use testsupport::{scratch_dir, Gcc};

#[test]
fn c_program_links_and_captures() {
    let dir = scratch_dir("smoke");
    let exe = Gcc::new(&["smoke.c"])
        .flags("-O2 -fno-omit-frame-pointer")
        .link_callstack()
        .build(&dir.join("smoke"));
    let out = std::process::Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    // d, c, b, main, __libc_start_call_main
    assert_eq!(
        text.lines().filter(|l| l.starts_with("0x")).count(),
        5,
        "{text}"
    );
}
