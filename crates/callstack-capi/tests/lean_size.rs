//! README's size section: the lean archive (`--no-default-features`)
//! links into a trivial C program that, with `--gc-sections` and `strip`,
//! runs and stays under the bound README's size section states.
//!
//! The lean archive is built in a target directory of its own
//! (`<target>/lean`): built in the shared one, it would replace the full
//! `libcallstack.a` the other tests link.
use std::process::Command;
use testsupport::{scratch_dir, workspace_root};

/// The bound README's size section states for the lean, `--gc-sections`
/// + `strip` program ("... and keeps it under N bytes").
fn readme_lean_bound() -> u64 {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let section = readme
        .split_once("### Size of a program linked with `libcallstack.a`")
        .expect("README has the size section")
        .1;
    let after = section
        .split_once("and keeps it under ")
        .expect("README's size section states the lean program's bound")
        .1;
    let n = after.split_once(" bytes").expect("a bound in bytes").0;
    n.replace(',', "").parse().expect("a number of bytes")
}

const APP: &str = r#"#include <stdio.h>
#include "callstack.h"
int main(void) {
    uintptr_t pcs[64];
    uint32_t n = callstack_capture_exact(0, 64, pcs);
    printf("%u\n", n);
    return n == 0;
}
"#;

#[test]
fn lean_archive_program_is_as_small_as_readme_says() {
    let target = testsupport::target_dir().join("lean");
    let status = testsupport::cargo()
        .current_dir(workspace_root())
        .args([
            "build",
            "--release",
            "-q",
            "-p",
            "callstack-capi",
            "--no-default-features",
        ])
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build of the lean archive failed");
    let archive = target.join("release/libcallstack.a");

    let dir = scratch_dir("lean-size");
    let src = dir.join("app.c");
    std::fs::write(&src, APP).unwrap();
    let exe = dir.join("app");
    let o = Command::new("gcc")
        .args(["-O2"])
        .arg(&src)
        .arg("-I")
        .arg(workspace_root().join("crates/callstack-capi/include"))
        .arg(&archive)
        .args(["-lpthread", "-ldl", "-lm", "-Wl,--gc-sections", "-s", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success(), "{run:?}");
    let frames: u32 = String::from_utf8_lossy(&run.stdout).trim().parse().unwrap();
    assert!(frames >= 2, "main and its caller at least: {frames}");

    let size = std::fs::metadata(&exe).unwrap().len();
    let bound = readme_lean_bound();
    assert!(
        size < bound,
        "the lean, gc-sections + strip program is {size} bytes; README says under {bound}"
    );
}
