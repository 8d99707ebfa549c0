//! A Rust program built WITHOUT frame pointers for the target this test was
//! built for (its own cargo build with `--target`,
//! `-C force-frame-pointers=no`, own target dir), captured with
//! `capture_exact` through generic functions and closures: the chain equals
//! gdb's physical frames, down to `_start`; and `called_from` answers
//! right in that build. Under a cross stage (qemu-user as the cargo runner)
//! the fixture runs under that runner and gdb-multiarch attaches to qemu's
//! gdb stub.

#[path = "../../../tests/fixtures/gdb/gdb_chain.rs"]
mod gdb_chain;

use std::process::Command;
use testsupport::workspace_root;

/// The Rust target triple this test was built for: the fixture is built for
/// it too, so that under qemu (the AArch64 and RISC-V 64 stages) it is that
/// architecture's code without frame pointers that is unwound.
fn own_triple() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x86_64-unknown-linux-gnu",
        "aarch64" => "aarch64-unknown-linux-gnu",
        "riscv64" => "riscv64gc-unknown-linux-gnu",
        other => panic!("no target triple known for {other}"),
    }
}

#[test]
fn rust_without_frame_pointers_matches_gdb() {
    let root = workspace_root();
    let triple = own_triple();
    let target = root.join("target/test-scratch/exact-nofp-target");
    let manifest = root.join("tests/fixtures/rust/exact_nofp/Cargo.toml");
    // The stage scripts' cargo settings for a cross target (linker, runner)
    // reach this test through its environment and so the fixture's build.
    let var = format!(
        "CARGO_TARGET_{}_RUNNER",
        triple.to_uppercase().replace('-', "_")
    );
    let runner: Vec<String> = std::env::var(&var)
        .map(|r| r.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let o = testsupport::cargo()
        .args(["build", "--release", "--offline", "-q", "--target", triple])
        .arg("--manifest-path")
        .arg(&manifest)
        .env("RUSTFLAGS", "-C force-frame-pointers=no")
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let exe = target.join(triple).join("release/exact_nofp");
    // `called_from` works in this build too (it walks with the exact
    // unwinder; frame pointers would see nothing).
    let mut cmd = match runner.split_first() {
        Some((qemu, rest)) => {
            let mut c = Command::new(qemu);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let o = cmd.arg("called_from").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "called_from true false\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for arg in ["cold", "prepare"] {
        let run = if runner.is_empty() {
            gdb_chain::gdb_run(&exe, arg)
        } else {
            gdb_chain::gdb_run_remote(&runner, &exe, arg)
        };
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
