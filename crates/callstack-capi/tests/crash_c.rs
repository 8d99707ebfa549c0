//! Crash reports of a C program linked to libcallstack.a
//! (`tests/fixtures/c/crash_fixture.c`) that really crashes: each report has
//! both parts, the known chain of function names with file:line, and the
//! child dies by the signal it would have died by.
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use testsupport::crash::*;
use testsupport::{scratch_dir, Gcc};

const DEADLINE: Duration = Duration::from_secs(20);

const OURS: [&str; 13] = [
    "c_null_deref",
    "c_abort",
    "c_divide",
    "c_illegal",
    "c_trap",
    "c_recurse",
    "c_thread_main",
    "c_thread_overflow_main",
    "c_malloc_victim",
    "c_malloc_crash",
    "c_level_two",
    "c_level_one",
    "main",
];

fn ours(name: &str) -> bool {
    OURS.contains(&name)
}

fn build(flags: &str) -> PathBuf {
    let dir = scratch_dir("crash-c");
    let tag: String = flags
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    Gcc::new(&["crash_fixture.c"])
        .flags(flags)
        .flags("-pthread")
        .link_callstack()
        .build(&dir.join(format!("crash_fixture{tag}")))
}

fn fixture() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build("-O0 -fno-omit-frame-pointer"))
}

fn run_exe(exe: &PathBuf, args: &[&str], env: &[(&str, &str)]) -> Crash {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    cmd.env_remove("CALLSTACK_CRASH_HELPER");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let c = run_crashing(cmd, DEADLINE);
    eprintln!(
        "[crash_c {}] died by {}, fault -> symbolized report: {} ms, child wall time {:?}",
        args.join(" "),
        signal_label(c.signal),
        fault_to_symbolized_ms(&c.stderr).map_or("n/a".into(), |m| format!("{m:.1}")),
        c.elapsed
    );
    c
}

fn run(scenario: &str, env: &[(&str, &str)]) -> Crash {
    run_exe(fixture(), &[scenario], env)
}

fn check(c: &Crash, signal: i32, signal_line: &str, expected: &[&str]) {
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("no raw part:\n{}", c.stderr));
    assert!(
        raw.contains(signal_line),
        "signal line {signal_line:?} missing:\n{}",
        c.stderr
    );
    assert!(raw.contains("(build-id "), "{}", c.stderr);
    let sym =
        symbolized_part(&c.stderr).unwrap_or_else(|| panic!("no symbolized part:\n{}", c.stderr));
    assert_chain(
        &symbolized_frames(sym),
        ours,
        expected,
        "crash_fixture.c",
        &c.stderr,
    );
    assert_eq!(
        c.signal,
        Some(signal),
        "died by {}:\n{}",
        signal_label(c.signal),
        c.stderr
    );
    let ms = fault_to_symbolized_ms(&c.stderr).expect("timing line");
    assert!(ms < 10_000.0, "symbolizing took {ms} ms");
}

fn with_main(first: &[&'static str]) -> Vec<&'static str> {
    first
        .iter()
        .copied()
        .chain(["c_level_two", "c_level_one", "main"])
        .collect()
}

#[test]
fn crash_c_null_dereference() {
    let c = run("null", &[]);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x0 (signal 11, code 1 SEGV_MAPERR)",
        &with_main(&["c_null_deref"]),
    );
    // The innermost frame is the faulting function itself.
    let sym = symbolized_frames(symbolized_part(&c.stderr).unwrap());
    assert_eq!(sym[0].function, "c_null_deref", "{}", c.stderr);
}

#[test]
fn crash_c_null_dereference_optimized() {
    let exe = build("-O2 -fno-omit-frame-pointer");
    let c = run_exe(&exe, &["null"], &[]);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x0",
        &with_main(&["c_null_deref"]),
    );
}

#[test]
fn crash_c_abort() {
    let c = run("abort", &[]);
    check(
        &c,
        libc::SIGABRT,
        "signal: SIGABRT: sent by tgkill() (raise, abort, pthread_kill), from pid",
        &with_main(&["c_abort"]),
    );
}

#[test]
fn crash_c_integer_division_by_zero() {
    let c = run("fpe", &[]);
    check(
        &c,
        libc::SIGFPE,
        "signal: SIGFPE: integer divide by zero, at instruction 0x",
        &with_main(&["c_divide"]),
    );
}

#[test]
fn crash_c_illegal_instruction() {
    let c = run("ill", &[]);
    check(
        &c,
        libc::SIGILL,
        "signal: SIGILL: illegal operand",
        &with_main(&["c_illegal"]),
    );
}

#[test]
fn crash_c_breakpoint_trap() {
    let c = run("trap", &[]);
    check(
        &c,
        libc::SIGTRAP,
        "signal: SIGTRAP: breakpoint instruction (int3)",
        &with_main(&["c_trap"]),
    );
}

fn check_overflow(c: &Crash) {
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("no raw part:\n{}", c.stderr));
    // SEGV_MAPERR below the main stack, SEGV_ACCERR on a thread's
    // PROT_NONE guard page.
    assert!(raw.contains("signal: SIGSEGV: "), "{}", c.stderr);
    assert!(
        raw.contains("(next to the stack pointer: stack overflow)"),
        "{}",
        c.stderr
    );
    let sym =
        symbolized_part(&c.stderr).unwrap_or_else(|| panic!("no symbolized part:\n{}", c.stderr));
    let frames = symbolized_frames(sym);
    assert!(frames.len() >= 100, "{}", c.stderr);
    assert!(
        frames.iter().all(|f| f.function == "c_recurse"),
        "{}",
        c.stderr
    );
    assert_eq!(c.signal, Some(libc::SIGSEGV), "{}", c.stderr);
}

#[test]
fn crash_c_stack_overflow() {
    check_overflow(&run("overflow", &[]));
}

#[test]
fn crash_c_stack_overflow_on_a_thread_with_its_own_altstack() {
    let c = run("thread-overflow", &[]);
    assert!(c.stderr.contains("\"c-crasher\""), "{}", c.stderr);
    check_overflow(&c);
}

#[test]
fn crash_c_on_a_second_thread() {
    let c = run("thread", &[]);
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("{}", c.stderr));
    assert!(
        raw.contains("\"c-crasher\""),
        "thread name missing:\n{}",
        c.stderr
    );
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x0",
        &["c_null_deref", "c_thread_main"],
    );
}

#[test]
fn crash_c_inside_malloc_with_the_lock_held() {
    let c = run("malloc", &[]);
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("no raw part:\n{}", c.stderr));
    let first = raw.lines().find(|l| l.starts_with("  #0 pc ")).unwrap();
    assert!(first.contains("/libc.so"), "{}", c.stderr);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x20",
        &with_main(&["c_malloc_victim", "c_malloc_crash"]),
    );
    // Really inside malloc: glibc's own frames (named through libc6-dbg,
    // which scripts/install-test-deps.sh installs) come first.
    let frames = symbolized_frames(symbolized_part(&c.stderr).unwrap());
    assert_eq!(frames[0].function, "_int_malloc", "{}", c.stderr);
    assert!(frames[1].function.contains("malloc"), "{}", c.stderr);
}

#[test]
fn crash_c_inside_malloc_raw_part_and_no_hang() {
    // What already holds without exact unwinding: the fault is inside
    // glibc's malloc with its arena lock held and another thread on that
    // lock, and the report still comes out, both parts, with no deadlock.
    let c = run("malloc", &[]);
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("no raw part:\n{}", c.stderr));
    assert!(
        raw.contains("signal: SIGSEGV: address not mapped, fault address 0x20"),
        "{}",
        c.stderr
    );
    let first = raw.lines().find(|l| l.starts_with("  #0 pc ")).unwrap();
    assert!(first.contains("/libc.so"), "{}", c.stderr);
    assert!(symbolized_part(&c.stderr).is_some(), "{}", c.stderr);
    assert_eq!(c.signal, Some(libc::SIGSEGV), "{}", c.stderr);
}

#[test]
fn crash_c_previous_handler_still_runs() {
    let c = run("prev-handler", &[]);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x0",
        &with_main(&["c_null_deref"]),
    );
    let report_end = c.stderr.find("*** end of symbolized report").unwrap();
    let own = c
        .stderr
        .find("fixture: own SIGSEGV handler ran")
        .expect("own handler ran");
    assert!(own > report_end, "{}", c.stderr);
}

#[test]
fn crash_c_report_file_gets_both_parts() {
    let file = scratch_dir("crash-c-file").join("report.txt");
    let _ = std::fs::remove_file(&file);
    let c = run_exe(fixture(), &["null", file.to_str().unwrap()], &[]);
    assert_eq!(c.signal, Some(libc::SIGSEGV));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        raw_part(&text).is_some_and(|r| r.contains("SIGSEGV")),
        "{text}"
    );
    assert!(
        symbolized_part(&text).is_some_and(|s| s.contains("in c_null_deref at ")),
        "{text}"
    );
    // A saved report can be symbolized later by the CLI.
    let cli = &testsupport::release_artifacts().cli;
    let o = Command::new(cli)
        .args(["crash-report"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    let frames = symbolized_frames(symbolized_part(&out).unwrap());
    assert_chain(
        &frames,
        ours,
        &with_main(&["c_null_deref"]),
        "crash_fixture.c",
        &out,
    );
}

#[test]
fn crash_c_with_the_callstack_binary_as_helper() {
    let cli = &testsupport::release_artifacts().cli;
    let c = run("null", &[("CALLSTACK_CRASH_HELPER", cli.to_str().unwrap())]);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped",
        &with_main(&["c_null_deref"]),
    );
}

#[test]
fn crash_c_raw_part_survives_a_missing_helper() {
    let c = run("null", &[("CALLSTACK_CRASH_HELPER", "/nonexistent/helper")]);
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("{}", c.stderr));
    assert!(raw.contains("SIGSEGV: address not mapped"));
    assert!(symbolized_part(&c.stderr).is_none());
    assert!(
        c.stderr.contains("failed with exit status 127"),
        "{}",
        c.stderr
    );
    assert_eq!(c.signal, Some(libc::SIGSEGV));
}

#[test]
fn crash_c_raw_part_survives_a_hanging_helper() {
    let dir = scratch_dir("crash-c-hang");
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
