//! A Rust program built WITHOUT frame pointers (its own cargo build with
//! `-C force-frame-pointers=no`, own target dir), captured with
//! `capture_exact` through generic functions and closures: the chain equals
//! gdb's physical frames, down to `_start`; and `called_from` answers
//! right in that build.

#[path = "../../../tests/fixtures/gdb/gdb_chain.rs"]
mod gdb_chain;

use std::process::Command;
use testsupport::workspace_root;

#[test]
fn rust_without_frame_pointers_matches_gdb() {
    let root = workspace_root();
    let target = root.join("target/test-scratch/exact-nofp-target");
    let manifest = root.join("tests/fixtures/rust/exact_nofp/Cargo.toml");
    let o = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--offline", "-q", "--manifest-path"])
        .arg(&manifest)
        .env("RUSTFLAGS", "-C force-frame-pointers=no")
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let exe = target.join("release/exact_nofp");
    // `called_from` works in this build too (it walks with the exact
    // unwinder; frame pointers would see nothing).
    let o = Command::new(&exe).arg("called_from").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "called_from true false\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for arg in ["cold", "prepare"] {
        let run = gdb_chain::gdb_run(&exe, arg);
        let names: Vec<&str> = run.ours.iter().map(|o| o.1.as_str()).collect();
        for want in [
            "exact_nofp::generic_level<&str, fn()>",
            "exact_nofp::generic_level<usize, &dyn core::ops::function::Fn<(), Output=()>>",
            "exact_nofp::main::{closure#0}",
            "exact_nofp::with_closure<exact_nofp::main::{closure_env#0}>",
            "std::rt::lang_start_internal",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        gdb_chain::check(&run, "exact", &format!("rust no-fp {arg}"));
    }
}
