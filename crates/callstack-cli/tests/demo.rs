//! `callstack demo` prints its captured frames by name (function, file,
//! line), as its `--help` promises, not as module + offset.
use std::process::Command;
use testsupport::release_artifacts;

#[test]
fn demo_prints_function_names() {
    let o = Command::new(&release_artifacts().cli)
        .args(["demo", "--runs", "10"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    // The real (not inlined) function of each of the first frames.
    let names: Vec<(&str, &str)> = out
        .lines()
        .filter(|l| l.trim_start().starts_with('#') && !l.ends_with("[inlined]"))
        .map(|l| {
            let rest = l.split_whitespace().nth(2).unwrap();
            let at = l.split(" at ").nth(1).unwrap_or("");
            (rest, at)
        })
        .collect();
    let want = [
        "callstack::demo::demo_inner",
        "callstack::demo::demo_middle",
        "callstack::demo::demo_outer",
    ];
    assert!(names.len() >= 4, "{out}");
    for (k, w) in want.iter().enumerate() {
        assert_eq!(names[k].0, *w, "{out}");
        assert!(
            names[k].1.contains("crates/callstack-cli/src/demo.rs:"),
            "{out}"
        );
    }
    assert!(names.iter().any(|n| n.0 == "callstack::main"), "{out}");
    assert!(!out.contains(" ?? "), "frames left unnamed: {out}");
}
