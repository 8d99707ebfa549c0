//! Crash reports of a C program linked to libcallstack.a
//! (`tests/fixtures/c/crash_fixture.c`) that really crashes: each report has
//! both parts, the known chain of function names with file:line, and the
//! child dies by the signal it would have died by.
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use testsupport::crash::*;
use testsupport::{scratch_dir, Gcc};

const OURS: [&str; 19] = [
    "c_null_deref",
    "c_bus_error",
    "c_dlopen_crash",
    "dso_crash",
    "dso_null_deref",
    "c_call_null",
    "c_call_bad",
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

const S: Suite = Suite {
    label: "crash_c",
    exe: fixture,
    ours,
    prefix: "",
    main: &["c_level_two", "c_level_one", "main"],
    // crash_fixture.c, or crash_dso.c for the library's frames.
    file_suffix: ".c",
    raw_mark: "(build-id ",
};

const NULL_LINE: &str = "signal: SIGSEGV: address not mapped, fault address 0x0";

#[test]
fn crash_c_null_dereference() {
    let c = S.run("null", &[]);
    let line =
        "signal: SIGSEGV: address not mapped, fault address 0x0 (signal 11, code 1 SEGV_MAPERR)";
    S.check(&c, libc::SIGSEGV, line, &["c_null_deref"]);
    // The innermost frame is the faulting function itself.
    assert_eq!(c.frames()[0].function, "c_null_deref", "{}", c.stderr);
}

/// A call through a null function pointer: the crash is at pc 0, in no
/// module; the caller is named all the same (its return address is on top
/// of the stack), as gdb names it.
#[test]
fn crash_c_call_through_a_null_pointer() {
    let c = S.run("call-null", &[]);
    let line =
        "signal: SIGSEGV: address not mapped, fault address 0x0 (signal 11, code 1 SEGV_MAPERR)";
    S.check(&c, libc::SIGSEGV, line, &["c_call_null"]);
    assert!(c.raw().contains("#0 pc 0x0"), "{}", c.stderr);
}

/// A call through a pointer to unmapped memory: the caller is named too.
#[test]
fn crash_c_call_through_a_bad_pointer() {
    let c = S.run("call-bad", &[]);
    let line = "signal: SIGSEGV: address not mapped, fault address 0x12345678 (signal 11, code 1 SEGV_MAPERR)";
    S.check(&c, libc::SIGSEGV, line, &["c_call_bad"]);
}

#[test]
fn crash_c_null_dereference_optimized() {
    let c = S.run_exe(&build("-O2 -fno-omit-frame-pointer"), &["null"], &[]);
    S.check(&c, libc::SIGSEGV, NULL_LINE, &["c_null_deref"]);
}

#[test]
fn crash_c_abort() {
    let c = S.run("abort", &[]);
    let line = "signal: SIGABRT: sent by tgkill() (raise, abort, pthread_kill), from pid";
    S.check(&c, libc::SIGABRT, line, &["c_abort"]);
}

#[test]
fn crash_c_integer_division_by_zero() {
    let c = S.run("fpe", &[]);
    let line = "signal: SIGFPE: integer divide by zero, at instruction 0x";
    S.check(&c, libc::SIGFPE, line, &["c_divide"]);
}

#[test]
fn crash_c_illegal_instruction() {
    let c = S.run("ill", &[]);
    S.check(
        &c,
        libc::SIGILL,
        "signal: SIGILL: illegal operand",
        &["c_illegal"],
    );
}

#[test]
fn crash_c_breakpoint_trap() {
    let c = S.run("trap", &[]);
    let line = "signal: SIGTRAP: breakpoint instruction (int3)";
    S.check(&c, libc::SIGTRAP, line, &["c_trap"]);
}

/// A C stack overflow: every symbolized frame (not only ours) is
/// `c_recurse`, and the process dies by SIGSEGV.
fn check_overflow(c: &Crash) {
    let frames = S.check_overflow(c, "c_recurse", libc::SIGSEGV);
    assert!(
        frames.iter().all(|f| f.function == "c_recurse"),
        "{}",
        c.stderr
    );
}

#[test]
fn crash_c_stack_overflow() {
    check_overflow(&S.run("overflow", &[]));
}

#[test]
fn crash_c_stack_overflow_on_a_thread_with_its_own_altstack() {
    let c = S.run("thread-overflow", &[]);
    assert!(c.stderr.contains("\"c-crasher\""), "{}", c.stderr);
    check_overflow(&c);
}

#[test]
fn crash_c_on_a_second_thread() {
    let c = S.run("thread", &[]);
    assert!(
        c.raw().contains("\"c-crasher\""),
        "thread name missing:\n{}",
        c.stderr
    );
    let chain = ["c_null_deref", "c_thread_main"].map(String::from);
    S.check_names(&c, libc::SIGSEGV, NULL_LINE, &chain);
}

#[test]
fn crash_c_inside_malloc_with_the_lock_held() {
    let c = S.run("malloc", &[]);
    S.check_inside_malloc(&c, &["c_malloc_victim", "c_malloc_crash"]);
}

#[test]
fn crash_c_inside_malloc_raw_part_and_no_hang() {
    // What already holds without exact unwinding: the fault is inside
    // glibc's malloc with its arena lock held and another thread on that
    // lock, and the report still comes out, both parts, with no deadlock.
    let c = S.run("malloc", &[]);
    let raw = c.raw();
    let line = "signal: SIGSEGV: address not mapped, fault address 0x20";
    assert!(raw.contains(line), "{}", c.stderr);
    let first = raw.lines().find(|l| l.starts_with("  #0 pc ")).unwrap();
    assert!(first.contains("/libc.so"), "{}", c.stderr);
    assert!(symbolized_part(&c.stderr).is_some(), "{}", c.stderr);
    assert_eq!(c.signal, Some(libc::SIGSEGV), "{}", c.stderr);
}

#[test]
fn crash_c_previous_handler_still_runs() {
    let c = S.run("prev-handler", &[]);
    S.check_previous_handler(&c, "c_null_deref", "fixture: own SIGSEGV handler ran");
}

#[test]
fn crash_c_report_file_gets_both_parts() {
    let file = scratch_dir("crash-c-file").join("report.txt");
    let _ = std::fs::remove_file(&file);
    let c = S.run_exe(&fixture(), &["null", file.to_str().unwrap()], &[]);
    let text = S.check_report_file(&c, &file);
    let sym = symbolized_part(&text).unwrap();
    assert!(sym.contains("in c_null_deref at "), "{text}");
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
    let exp = S.from_main(&["c_null_deref"]);
    let exp: Vec<&str> = exp.iter().map(String::as_str).collect();
    assert_chain(&frames, ours, &exp, "crash_fixture.c", &out);
}

#[test]
fn crash_c_with_the_callstack_binary_as_helper() {
    S.check_callstack_binary_as_helper("c_null_deref");
}

#[test]
fn crash_c_raw_part_survives_a_missing_helper() {
    S.check_missing_helper();
}

#[test]
fn crash_c_raw_part_survives_a_hanging_helper() {
    S.check_hanging_helper();
}

#[test]
fn crash_c_null_dereference_without_frame_pointers() {
    // Exact unwinding (CFI) through code built without frame pointers.
    let c = S.run_exe(&build("-O2 -fomit-frame-pointer"), &["null"], &[]);
    S.check(&c, libc::SIGSEGV, NULL_LINE, &["c_null_deref"]);
}

#[test]
fn crash_c_bus_error() {
    let c = S.run("bus", &[]);
    let line = "signal: SIGBUS: nonexistent physical address";
    S.check(&c, libc::SIGBUS, line, &["c_bus_error"]);
}

#[test]
fn crash_c_in_a_library_loaded_after_install() {
    // Not in the install-time module snapshot: found through
    // /proc/self/maps and the ELF header mapped in memory.
    let dir = scratch_dir("crash-c-dso");
    let dso = Gcc::new(&["crash_dso.c"])
        .flags("-O0 -fno-omit-frame-pointer -fPIC -shared")
        .build(&dir.join("libcrash_dso.so"));
    let c = S.run("dlopen", &[("CRASH_DSO", dso.to_str().unwrap())]);
    let first = c.raw().lines().find(|l| l.starts_with("  #0 pc ")).unwrap();
    assert!(
        first.contains("libcrash_dso.so +0x") && first.contains("(build-id "),
        "{}",
        c.stderr
    );
    let own = ["dso_null_deref", "dso_crash", "c_dlopen_crash"];
    S.check(&c, libc::SIGSEGV, NULL_LINE, &own);
}

#[test]
fn crash_c_previous_handler_that_returns_is_reported_once() {
    // The previous handler returns without fixing the fault three times:
    // the fault repeats, the report is written once, the handler runs each
    // time, and the process still dies by SIGSEGV.
    let c = S.run("prev-returns", &[]);
    let count = |s: &str| c.stderr.matches(s).count();
    assert_eq!(
        count("*** callstack: crash report (raw) ***"),
        1,
        "{}",
        c.stderr
    );
    assert_eq!(count("fixture: returning handler ran"), 3, "{}", c.stderr);
    assert!(symbolized_part(&c.stderr).is_some(), "{}", c.stderr);
    assert_eq!(c.signal, Some(libc::SIGSEGV), "{}", c.stderr);
}

#[test]
fn crash_c_report_survives_a_sigchld_handler_that_reaps_all_children() {
    // The program reaps every child in its SIGCHLD handler (waitpid(-1)),
    // and a child of its own ends while the report is being symbolized:
    // the report still waits for its helper and gets its exit status, and
    // the program's handler still reaps its own child (once the helper is
    // done).
    let dir = scratch_dir("crash-c-sigchld");
    let helper = dir.join("slow-failing-helper.sh");
    let script = "#!/bin/sh\ncat >/dev/null\nsleep 0.5\necho 'helper: done' >&2\nexit 3\n";
    std::fs::write(&helper, script).unwrap();
    let _ = Command::new("chmod").arg("+x").arg(&helper).status();
    let c = S.run(
        "sigchld",
        &[("CALLSTACK_CRASH_HELPER", helper.to_str().unwrap())],
    );
    assert!(c.raw().contains(NULL_LINE), "{}", c.stderr);
    let reaped = "fixture: SIGCHLD handler reaped a child";
    assert!(c.stderr.contains(reaped), "{}", c.stderr);
    let done = c
        .stderr
        .find("helper: done")
        .expect("the helper ran to its end");
    let status = c.stderr.find("failed with exit status 3");
    assert!(status.is_some_and(|s| s > done), "{}", c.stderr);
    assert_eq!(c.signal, Some(libc::SIGSEGV), "{}", c.stderr);
}

#[test]
fn crash_c_symbolized_report_with_a_sigchld_handler_that_reaps_all_children() {
    let c = S.run("sigchld", &[]);
    S.check(&c, libc::SIGSEGV, NULL_LINE, &["c_null_deref"]);
    assert!(c.stderr.contains(") finished after "), "{}", c.stderr);
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
            let c = S.run_exe(&exe, &[scenario], &[]);
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
        if scenario == "malloc" {
            // With a minidump to write: the handler also sends the crash
            // context and lets its helper trace it (prctl), nothing more.
            // (Under strace the helper cannot attach: strace is the
            // tracer; the dump fails, the report does not.)
            cmd.env(
                "CALLSTACK_CRASH_MINIDUMP_DIR",
                scratch_dir("crash-c-strace-dumps"),
            );
        }
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
