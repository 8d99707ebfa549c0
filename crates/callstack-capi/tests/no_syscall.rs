//! No system call during a warm capture, and none but the one-time
//! stack-bounds lookup (`openat`/`read`/`close` of `/proc/self/maps`) on a
//! thread's first capture: `tests/fixtures/c/syscalls.c` runs under
//! `strace -f` and marks each phase with a failing `write(-1, "callstack-mark-N")`.
//!
//! Skips with a message when strace is missing or cannot trace here
//! (`scripts/install-test-deps.sh` installs it).
use std::collections::HashMap;
use std::process::Command;
use testsupport::{scratch_dir, Gcc};

/// System calls of each thread, in order, as `(name, whole line)`.
fn per_thread(log: &str) -> HashMap<u32, Vec<(String, String)>> {
    let mut out: HashMap<u32, Vec<(String, String)>> = HashMap::new();
    for line in log.lines() {
        let Some((pid, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let rest = rest.trim_start();
        if rest.starts_with("<... ") {
            // The end of a call that began earlier: not a new call.
            continue;
        }
        let name = rest.split(['(', ' ']).next().unwrap_or("").to_string();
        out.entry(pid).or_default().push((name, rest.to_string()));
    }
    out
}

/// The calls one thread made between `callstack-mark-{a}` and `-{b}`.
fn between(threads: &HashMap<u32, Vec<(String, String)>>, a: u32, b: u32) -> Vec<(String, String)> {
    let ma = format!("\"callstack-mark-{a}\"");
    let mb = format!("\"callstack-mark-{b}\"");
    for calls in threads.values() {
        let Some(i) = calls.iter().position(|(_, l)| l.contains(&ma)) else {
            continue;
        };
        let j = calls
            .iter()
            .position(|(_, l)| l.contains(&mb))
            .unwrap_or_else(|| panic!("mark {b} not on the thread of mark {a}"));
        assert!(i < j);
        return calls[i + 1..j].to_vec();
    }
    panic!("mark {a} not found in the strace log");
}

fn only_the_bounds_lookup(calls: &[(String, String)], what: &str) {
    for (name, line) in calls {
        let ok = match name.as_str() {
            "openat" | "open" => line.contains("\"/proc/self/maps\""),
            "read" | "close" => true,
            _ => false,
        };
        assert!(ok, "{what}: unexpected system call: {line}");
    }
}

#[test]
fn warm_capture_makes_no_system_call() {
    if Command::new("strace").arg("-V").output().is_err() {
        eprintln!(
            "SKIPPED: strace is not installed (bash scripts/install-test-deps.sh installs it)"
        );
        return;
    }
    let dir = scratch_dir("no_syscall");
    let exe = Gcc::new(&["syscalls.c"])
        .flags("-O2 -fno-omit-frame-pointer")
        .link_callstack()
        .build(&dir.join("syscalls"));
    let log_path = dir.join("strace.log");
    let o = Command::new("strace")
        .arg("-f")
        .arg("-o")
        .arg(&log_path)
        .arg(&exe)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() && stderr.contains("ptrace") {
        eprintln!("SKIPPED: strace cannot trace here: {stderr}");
        return;
    }
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ok");
    let log = std::fs::read_to_string(&log_path).unwrap();
    let threads = per_thread(&log);

    // Warm captures: nothing at all.
    for (a, b) in [(2, 3), (5, 6), (8, 9)] {
        let calls = between(&threads, a, b);
        assert!(
            calls.is_empty(),
            "system calls during 20000 warm captures (marks {a}..{b}): {calls:#?}"
        );
    }
    // First capture on a thread (main, spawned) and callstack_prepare_thread:
    // at most the stack-bounds lookup.
    let first = between(&threads, 1, 2);
    only_the_bounds_lookup(&first, "first capture, main thread");
    // The log is read right: the one-time lookup is there.
    assert!(
        first.iter().any(|(n, _)| n == "openat" || n == "open"),
        "no bounds lookup seen on the main thread's first capture: {first:#?}"
    );
    only_the_bounds_lookup(&between(&threads, 4, 5), "first capture, new thread");
    only_the_bounds_lookup(&between(&threads, 7, 8), "callstack_prepare_thread");
}
