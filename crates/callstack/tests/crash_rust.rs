//! Crash reports of a Rust program that really crashes
//! (`examples/crash_fixture.rs`, built in release mode with line tables):
//! each report has both parts, the known chain of function names with
//! file:line, and the child dies by the signal it would have died by.
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use testsupport::crash::*;

const DEADLINE: Duration = Duration::from_secs(20);

fn fixture() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let root = testsupport::workspace_root();
        let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(&root)
            .args([
                "build",
                "--release",
                "-q",
                "-p",
                "callstack",
                "--example",
                "crash_fixture",
            ])
            .status()
            .expect("cargo build the crash fixture");
        assert!(st.success());
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        target.join("release/examples/crash_fixture")
    })
}

fn run(scenario: &str, env: &[(&str, &str)]) -> Crash {
    let mut cmd = Command::new(fixture());
    cmd.arg(scenario);
    // No `callstack` binary sits next to the fixture: it symbolizes itself
    // (re-executed) unless a test names a helper.
    cmd.env_remove("CALLSTACK_CRASH_HELPER");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let c = run_crashing(cmd, DEADLINE);
    eprintln!(
        "[crash_rust {scenario}] died by {}, fault -> symbolized report: {} ms, child wall time {:?}",
        signal_label(c.signal),
        fault_to_symbolized_ms(&c.stderr).map_or("n/a".into(), |m| format!("{m:.1}")),
        c.elapsed
    );
    c
}

fn ours(name: &str) -> bool {
    name.starts_with("crash_fixture::")
}

fn chain(names: &[&str]) -> Vec<String> {
    names
        .iter()
        .map(|n| format!("crash_fixture::{n}"))
        .collect()
}

fn check(c: &Crash, signal: i32, signal_line: &str, expected: &[&str]) {
    let exp = chain(expected);
    let exp: Vec<&str> = exp.iter().map(String::as_str).collect();
    check_report(c, signal, signal_line, ours, &exp, "crash_fixture.rs");
    let raw = raw_part(&c.stderr).unwrap();
    assert!(raw.contains("\n  #0 pc 0x"), "{}", c.stderr);
}

const MAIN: [&str; 3] = ["rust_level_two", "rust_level_one", "main"];

fn with_main(first: &[&'static str]) -> Vec<&'static str> {
    first.iter().copied().chain(MAIN).collect()
}

#[test]
fn crash_rust_null_dereference() {
    let c = run("null", &[]);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x0",
        &with_main(&["rust_null_deref"]),
    );
    assert!(c.stderr.contains("thread: "), "{}", c.stderr);
}

#[test]
fn crash_rust_abort() {
    let c = run("abort", &[]);
    check(
        &c,
        libc::SIGABRT,
        "signal: SIGABRT: sent by tgkill() (raise, abort, pthread_kill), from pid",
        &with_main(&["rust_abort"]),
    );
}

#[test]
fn crash_rust_illegal_instruction() {
    let c = run("ill", &[]);
    check(
        &c,
        libc::SIGILL,
        "signal: SIGILL: illegal operand",
        &with_main(&["rust_illegal"]),
    );
}

#[test]
fn crash_rust_breakpoint_trap() {
    let c = run("trap", &[]);
    check(
        &c,
        libc::SIGTRAP,
        "signal: SIGTRAP: breakpoint instruction (int3)",
        &with_main(&["rust_trap"]),
    );
}

#[test]
fn crash_rust_stack_overflow() {
    let c = run("overflow", &[]);
    // Reported on the alternate stack, then chained to the standard
    // library's handler, which prints its message and aborts, as it would
    // have without us.
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("no raw part:\n{}", c.stderr));
    assert!(raw.contains("signal: SIGSEGV: "), "{}", c.stderr);
    assert!(
        raw.contains("(next to the stack pointer: stack overflow)"),
        "{}",
        c.stderr
    );
    let sym =
        symbolized_part(&c.stderr).unwrap_or_else(|| panic!("no symbolized part:\n{}", c.stderr));
    let frames = symbolized_frames(sym);
    let ours: Vec<_> = frames.iter().filter(|f| ours(&f.function)).collect();
    assert!(ours.len() >= 100, "{}", c.stderr);
    assert!(
        ours.iter()
            .all(|f| f.function == "crash_fixture::rust_recurse"),
        "{}",
        c.stderr
    );
    assert!(
        c.stderr.contains("has overflowed its stack"),
        "{}",
        c.stderr
    );
    assert_eq!(c.signal, Some(libc::SIGABRT), "{}", c.stderr);
}

#[test]
fn crash_rust_on_a_second_thread() {
    let c = run("thread", &[]);
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("{}", c.stderr));
    assert!(
        raw.contains("\"crasher\""),
        "thread name missing:\n{}",
        c.stderr
    );
    let sym = symbolized_part(&c.stderr).unwrap_or_else(|| panic!("{}", c.stderr));
    assert_chain(
        &symbolized_frames(sym),
        ours,
        &[
            "crash_fixture::rust_null_deref",
            "crash_fixture::rust_thread_crash",
        ],
        "crash_fixture.rs",
        &c.stderr,
    );
    assert_eq!(c.signal, Some(libc::SIGSEGV), "{}", c.stderr);
}

#[test]
fn crash_rust_inside_malloc_with_the_lock_held() {
    let c = run("malloc", &[]);
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("no raw part:\n{}", c.stderr));
    // The fault is inside glibc (its malloc), not in our code.
    let first = raw.lines().find(|l| l.starts_with("  #0 pc ")).unwrap();
    assert!(first.contains("/libc.so"), "{}", c.stderr);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x20",
        &with_main(&["rust_malloc_victim", "rust_malloc_crash"]),
    );
    // Really inside malloc: glibc's own frames (named through libc6-dbg,
    // which scripts/install-test-deps.sh installs) come first.
    let frames = symbolized_frames(symbolized_part(&c.stderr).unwrap());
    assert_eq!(frames[0].function, "_int_malloc", "{}", c.stderr);
    assert!(frames[1].function.contains("malloc"), "{}", c.stderr);
}

#[test]
fn crash_rust_previous_handler_still_runs() {
    let c = run("prev-handler", &[]);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x0",
        &with_main(&["rust_null_deref"]),
    );
    let report_end = c.stderr.find("*** end of symbolized report").unwrap();
    let own = c
        .stderr
        .find("fixture: own SIGSEGV handler ran")
        .expect("own handler ran");
    assert!(own > report_end, "{}", c.stderr);
}

#[test]
fn crash_rust_panic_hook_reports_the_panic() {
    let c = run("panic", &[]);
    assert_eq!(c.code, Some(101), "{}", c.stderr);
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("no raw part:\n{}", c.stderr));
    assert!(
        raw.contains("panic: the fixture panics on purpose at "),
        "{}",
        c.stderr
    );
    let sym = symbolized_part(&c.stderr).unwrap_or_else(|| panic!("{}", c.stderr));
    let exp = chain(&with_main(&["rust_panicking"]));
    let exp: Vec<&str> = exp.iter().map(String::as_str).collect();
    assert_chain(
        &symbolized_frames(sym),
        ours,
        &exp,
        "crash_fixture.rs",
        &c.stderr,
    );
    // The default hook still runs after ours.
    assert!(c.stderr.contains("panicked at"), "{}", c.stderr);
}

#[test]
fn crash_rust_report_file_gets_both_parts() {
    let dir = testsupport::scratch_dir("crash-rust-file");
    let file = dir.join("report.txt");
    let _ = std::fs::remove_file(&file);
    let c = run("null", &[("CRASH_REPORT_FILE", file.to_str().unwrap())]);
    assert_eq!(c.signal, Some(libc::SIGSEGV));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        raw_part(&text).is_some_and(|r| r.contains("SIGSEGV")),
        "{text}"
    );
    let sym = symbolized_part(&text).expect("symbolized part in the file");
    assert!(sym.contains("crash_fixture::rust_null_deref"), "{text}");
}

#[test]
fn crash_rust_with_the_callstack_binary_as_helper() {
    let cli = &testsupport::release_artifacts().cli;
    let c = run("null", &[("CALLSTACK_CRASH_HELPER", cli.to_str().unwrap())]);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x0",
        &with_main(&["rust_null_deref"]),
    );
    assert!(
        c.stderr.contains("symbolizing helper (user helper"),
        "{}",
        c.stderr
    );
}

#[test]
fn crash_rust_raw_part_survives_a_missing_helper() {
    let c = run("null", &[("CALLSTACK_CRASH_HELPER", "/nonexistent/helper")]);
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("{}", c.stderr));
    assert!(raw.contains("SIGSEGV: address not mapped"));
    assert!(raw.contains("crash_fixture +0x"), "{}", c.stderr);
    assert!(symbolized_part(&c.stderr).is_none());
    assert!(
        c.stderr.contains("failed with exit status 127"),
        "{}",
        c.stderr
    );
    assert_eq!(c.signal, Some(libc::SIGSEGV));
}

#[test]
fn crash_rust_raw_part_survives_a_hanging_helper() {
    let dir = testsupport::scratch_dir("crash-rust-hang");
    let helper = dir.join("hang.sh");
    std::fs::write(&helper, "#!/bin/sh\nexec sleep 60\n").unwrap();
    let _ = Command::new("chmod").arg("+x").arg(&helper).status();
    let c = run(
        "null",
        &[
            ("CALLSTACK_CRASH_HELPER", helper.to_str().unwrap()),
            ("CALLSTACK_CRASH_TIMEOUT_MS", "500"),
        ],
    );
    assert!(
        raw_part(&c.stderr).is_some_and(|r| r.contains("SIGSEGV")),
        "{}",
        c.stderr
    );
    assert!(
        c.stderr.contains("timed out and was killed"),
        "{}",
        c.stderr
    );
    assert_eq!(c.signal, Some(libc::SIGSEGV));
    assert!(c.elapsed < Duration::from_secs(10), "{:?}", c.elapsed);
}

#[test]
fn crash_rust_report_allocates_nothing() {
    // The fixture's global allocator counts every allocation and free from
    // just before the fault until our handler chains to the fixture's own
    // handler, after both parts of the report are out.
    let c = run("alloc-count", &[]);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x0",
        &with_main(&["rust_null_deref"]),
    );
    assert!(
        c.stderr
            .contains("fixture: allocations during the crash report: 0000"),
        "{}",
        c.stderr
    );
}

#[test]
fn crash_rust_stack_overflow_on_a_spawned_thread() {
    let c = run("thread-overflow", &[]);
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("no raw part:\n{}", c.stderr));
    assert!(raw.contains("\"overflower\""), "{}", c.stderr);
    assert!(
        raw.contains("(next to the stack pointer: stack overflow)"),
        "{}",
        c.stderr
    );
    let sym =
        symbolized_part(&c.stderr).unwrap_or_else(|| panic!("no symbolized part:\n{}", c.stderr));
    let frames = symbolized_frames(sym);
    let ours: Vec<_> = frames.iter().filter(|f| ours(&f.function)).collect();
    assert!(ours.len() >= 100, "{}", c.stderr);
    assert!(
        ours.iter()
            .all(|f| f.function == "crash_fixture::rust_recurse"),
        "{}",
        c.stderr
    );
    // Then the standard library's handler, as without us.
    assert!(
        c.stderr.contains("thread 'overflower'") && c.stderr.contains("has overflowed its stack"),
        "{}",
        c.stderr
    );
    assert_eq!(c.signal, Some(libc::SIGABRT), "{}", c.stderr);
}
