//! Crash reports of a C program linked to libcallstack.a
//! (`tests/fixtures/c/crash_fixture.c`) that really crashes: each report has
//! both parts, the known chain of function names with file:line, and the
//! child dies by the signal it would have died by.
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;
use testsupport::crash::*;
use testsupport::{scratch_dir, Gcc};

const DEADLINE: Duration = Duration::from_secs(20);

const OURS: [&str; 17] = [
    "c_null_deref",
    "c_bus_error",
    "c_dlopen_crash",
    "dso_crash",
    "dso_null_deref",
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

/// Builds the fixture with `flags`, once per flag set per test process
/// (tests run in parallel: rebuilding a binary another test is running
/// fails with "text file busy").
fn build(flags: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(f, _)| f == flags) {
        return p.clone();
    }
    let dir = scratch_dir("crash-c");
    let tag: String = flags
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let exe = Gcc::new(&["crash_fixture.c"])
        .flags(flags)
        .flags("-pthread")
        .link_callstack()
        .build(&dir.join(format!("crash_fixture{tag}")));
    built.push((flags.to_string(), exe.clone()));
    exe
}

fn fixture() -> PathBuf {
    build("-O0 -fno-omit-frame-pointer")
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
    run_exe(&fixture(), &[scenario], env)
}

fn check(c: &Crash, signal: i32, signal_line: &str, expected: &[&str]) {
    // crash_fixture.c, or crash_dso.c for the library's frames.
    check_report(c, signal, signal_line, ours, expected, ".c");
    let raw = raw_part(&c.stderr).unwrap();
    assert!(raw.contains("(build-id "), "{}", c.stderr);
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
    let c = run_exe(&fixture(), &["null", file.to_str().unwrap()], &[]);
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

#[test]
fn crash_c_null_dereference_without_frame_pointers() {
    // Exact unwinding (CFI) through code built without frame pointers.
    let exe = build("-O2 -fomit-frame-pointer");
    let c = run_exe(&exe, &["null"], &[]);
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x0",
        &with_main(&["c_null_deref"]),
    );
}

#[test]
fn crash_c_bus_error() {
    let c = run("bus", &[]);
    check(
        &c,
        libc::SIGBUS,
        "signal: SIGBUS: nonexistent physical address",
        &with_main(&["c_bus_error"]),
    );
}

#[test]
fn crash_c_in_a_library_loaded_after_install() {
    // Not in the install-time module snapshot: found through
    // /proc/self/maps and the ELF header mapped in memory.
    let dir = scratch_dir("crash-c-dso");
    let dso = Gcc::new(&["crash_dso.c"])
        .flags("-O0 -fno-omit-frame-pointer -fPIC -shared")
        .build(&dir.join("libcrash_dso.so"));
    let c = run("dlopen", &[("CRASH_DSO", dso.to_str().unwrap())]);
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("{}", c.stderr));
    let first = raw.lines().find(|l| l.starts_with("  #0 pc ")).unwrap();
    assert!(
        first.contains("libcrash_dso.so +0x") && first.contains("(build-id "),
        "{}",
        c.stderr
    );
    check(
        &c,
        libc::SIGSEGV,
        "signal: SIGSEGV: address not mapped, fault address 0x0",
        &with_main(&["dso_null_deref", "dso_crash", "c_dlopen_crash"]),
    );
}

#[test]
fn crash_c_previous_handler_that_returns_is_reported_once() {
    // The previous handler returns without fixing the fault three times:
    // the fault repeats, the report is written once, the handler runs each
    // time, and the process still dies by SIGSEGV.
    let c = run("prev-returns", &[]);
    assert_eq!(
        c.stderr
            .matches("*** callstack: crash report (raw) ***")
            .count(),
        1,
        "{}",
        c.stderr
    );
    assert_eq!(
        c.stderr.matches("fixture: returning handler ran").count(),
        3,
        "{}",
        c.stderr
    );
    assert!(symbolized_part(&c.stderr).is_some(), "{}", c.stderr);
    assert_eq!(c.signal, Some(libc::SIGSEGV), "{}", c.stderr);
}

/// gdb's `bt` where the fixture crashes (gdb stops at the signal before our
/// handler runs), function names, innermost first.
fn gdb_crash_bt(exe: &PathBuf, scenario: &str) -> Vec<String> {
    let o = Command::new("gdb")
        .args(["-nx", "-batch", "-ex", "set debuginfod enabled off"])
        .args(["-ex", "run", "-ex", "bt", "--args"])
        .arg(exe)
        .arg(scenario)
        .env("CALLSTACK_CRASH_HELPER", "none")
        .output()
        .expect("run gdb");
    testsupport::parse_gdb_bt(&String::from_utf8_lossy(&o.stdout))
}

#[test]
fn crash_c_chains_equal_gdb() {
    // Every frame of the symbolized report, inlined ones included, down to
    // main, against gdb's bt at the same fault; at -O0 with frame pointers
    // and at -O2 without them.
    for flags in ["-O0 -fno-omit-frame-pointer", "-O2 -fomit-frame-pointer"] {
        let exe = build(flags);
        for scenario in ["null", "fpe", "ill", "trap", "bus"] {
            let c = run_exe(&exe, &[scenario], &[]);
            let sym = symbolized_part(&c.stderr)
                .unwrap_or_else(|| panic!("{flags} {scenario}: no symbolized part:\n{}", c.stderr));
            let ours: Vec<String> = symbolized_frames(sym)
                .into_iter()
                .map(|f| f.function)
                .collect();
            let end = ours
                .iter()
                .position(|f| f == "main")
                .map_or(ours.len(), |i| i + 1);
            let gdb = gdb_crash_bt(&exe, scenario);
            let gend = gdb
                .iter()
                .position(|f| f == "main")
                .map_or(gdb.len(), |i| i + 1);
            assert_eq!(
                ours[..end],
                gdb[..gend],
                "{flags} {scenario}: ours vs gdb\n{}",
                c.stderr
            );
        }
    }
}

/// System calls the crashing thread may make from the fault to its death:
/// the handler's (see the signal-safety rules of `callstack::crash`).
const HANDLER_SYSCALLS: [&str; 25] = [
    "restart_syscall", // nanosleep resumed after a ptrace stop
    "write",
    "openat",
    "open",
    "read",
    "close",
    "prctl",
    "getpid",
    "gettid",
    "pipe2",
    "clone",
    "fcntl",
    "rt_sigprocmask",
    "rt_sigpending",
    "rt_sigtimedwait",
    "rt_sigaction",
    "rt_sigreturn",
    "poll",
    "wait4",
    "nanosleep",
    "clock_nanosleep",
    "clock_gettime",
    "kill",
    "tgkill",
    "exit_group",
];

#[test]
fn crash_c_handler_makes_only_signal_safe_system_calls() {
    // strace the crashing thread from the signal to its death: no mmap or
    // brk (malloc), no futex (a lock), nothing outside the list.
    for scenario in ["null", "malloc"] {
        let dir = scratch_dir(&format!("crash-c-strace-{scenario}"));
        let prefix = dir.join("trace");
        let mut cmd = Command::new("strace");
        cmd.args(["-ff", "-qq", "-o"])
            .arg(&prefix)
            .arg(fixture())
            .arg(scenario);
        let c = run_crashing(cmd, DEADLINE);
        assert!(symbolized_part(&c.stderr).is_some(), "{}", c.stderr);
        // The crashing thread is the main thread: its file is trace.<pid>,
        // the one that holds the fault.
        let mut checked = false;
        for e in std::fs::read_dir(&dir).unwrap() {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            let Some(at) = text.find("--- SIGSEGV {si_signo=SIGSEGV, si_code=SEGV_MAPERR") else {
                continue;
            };
            checked = true;
            for line in text[at..].lines() {
                if line.starts_with("---") || line.starts_with("+++") || line.is_empty() {
                    continue;
                }
                let name = line.split('(').next().unwrap_or("");
                assert!(
                    HANDLER_SYSCALLS.contains(&name),
                    "{scenario}: system call {name:?} in the crash handler:\n{}",
                    &text[at..]
                );
            }
        }
        assert!(checked, "{scenario}: no trace holds the fault");
    }
}
