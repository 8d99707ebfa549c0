//! Crash reports of a Rust program that really crashes
//! (`tests/fixtures/rust/crash_fixture`, built in release mode with line
//! tables):
//! each report has both parts, the known chain of function names with
//! file:line, and the child dies by the signal it would have died by.
use std::path::PathBuf;
use std::sync::OnceLock;
use testsupport::crash::*;

/// The fixture (`tests/fixtures/rust/crash_fixture`), built in release
/// mode for the architecture this test runs on: on the host with the CLI
/// and the C API ([`testsupport::release_artifacts`], one release build of
/// `callstack` for all); under a qemu-user stage for its target
/// (`--target`), run through the stage's runner by `Suite::run`.
fn fixture() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let Some(t) = testsupport::cross_target() else {
            return testsupport::release_artifacts().crash_fixture.clone();
        };
        let root = testsupport::workspace_root();
        let st = testsupport::cargo()
            .current_dir(&root)
            .args([
                "build",
                "--release",
                "-q",
                "-p",
                "crash_fixture",
                "--target",
                &t,
            ])
            .status()
            .expect("cargo build the crash fixture");
        assert!(st.success());
        testsupport::target_dir()
            .join(t)
            .join("release/crash_fixture")
    })
    .clone()
}

/// The signal line of the `ill` scenario: x86-64's `ud2` is an illegal
/// operand; AArch64's `udf` and RISC-V's `unimp` are an illegal opcode to
/// the kernel (qemu-aarch64 says operand).
const ILL_LINE: &str = if cfg!(target_arch = "x86_64") {
    "signal: SIGILL: illegal operand"
} else {
    "signal: SIGILL: illegal op"
};

/// The signal line of the `trap` scenario: x86-64's `int3` is reported by
/// the kernel as `SI_KERNEL`, AArch64's `brk` and RISC-V's `ebreak` as
/// `TRAP_BRKPT`.
const TRAP_LINE: &str = if cfg!(target_arch = "x86_64") {
    "signal: SIGTRAP: breakpoint instruction (int3)"
} else {
    "signal: SIGTRAP: process breakpoint"
};

const S: Suite = Suite {
    label: "crash_rust",
    exe: fixture,
    ours: |name| name.starts_with("crash_fixture::"),
    prefix: "crash_fixture::",
    main: &["rust_level_two", "rust_level_one", "main"],
    file_suffix: "crash_fixture.rs",
    raw_mark: "\n  #0 pc 0x",
};

const NULL_LINE: &str = "signal: SIGSEGV: address not mapped, fault address 0x0";

#[test]
fn crash_rust_null_dereference() {
    let c = S.run("null", &[]);
    S.check(&c, libc::SIGSEGV, NULL_LINE, &["rust_null_deref"]);
    assert!(c.stderr.contains("thread: "), "{}", c.stderr);
}

/// A crash below frames with exit hooks pending: the report names their
/// real callers, not the trampoline.
#[test]
fn crash_rust_below_hooked_frames() {
    let c = S.run("hooked", &[]);
    S.check(
        &c,
        libc::SIGSEGV,
        NULL_LINE,
        &["rust_null_deref", "rust_hooked"],
    );
    assert!(
        !c.stderr.contains("__callstack_exit_hook_trampoline"),
        "{}",
        c.stderr
    );
}

/// A call through a null function pointer: its caller is named (the
/// return address the call left: on the stack on x86-64, in x30 on
/// AArch64).
#[test]
fn crash_rust_call_through_a_null_pointer() {
    let c = S.run("call-null", &[]);
    S.check(&c, libc::SIGSEGV, NULL_LINE, &["rust_call_null"]);
}

#[test]
fn crash_rust_abort() {
    let c = S.run("abort", &[]);
    let line = "signal: SIGABRT: sent by tgkill() (raise, abort, pthread_kill), from pid";
    S.check(&c, libc::SIGABRT, line, &["rust_abort"]);
}

#[test]
fn crash_rust_illegal_instruction() {
    let c = S.run("ill", &[]);
    S.check(&c, libc::SIGILL, ILL_LINE, &["rust_illegal"]);
}

#[test]
fn crash_rust_breakpoint_trap() {
    let c = S.run("trap", &[]);
    S.check(&c, libc::SIGTRAP, TRAP_LINE, &["rust_trap"]);
}

#[test]
fn crash_rust_stack_overflow() {
    // Reported on the alternate stack, then chained to the standard
    // library's handler, which prints its message and aborts, as it would
    // have without us.
    let c = S.run("overflow", &[]);
    S.check_overflow(&c, "rust_recurse", libc::SIGABRT);
    assert!(
        c.stderr.contains("has overflowed its stack"),
        "{}",
        c.stderr
    );
}

#[test]
fn crash_rust_on_a_second_thread() {
    let c = S.run("thread", &[]);
    assert!(
        c.raw().contains("\"crasher\""),
        "thread name missing:\n{}",
        c.stderr
    );
    let chain = ["rust_null_deref", "rust_thread_crash"].map(|n| format!("crash_fixture::{n}"));
    S.check_names(&c, libc::SIGSEGV, NULL_LINE, &chain);
}

#[test]
fn crash_rust_inside_malloc_with_the_lock_held() {
    let c = S.run("malloc", &[]);
    S.check_inside_malloc(&c, &["rust_malloc_victim", "rust_malloc_crash"]);
}

#[test]
fn crash_rust_previous_handler_still_runs() {
    let c = S.run("prev-handler", &[]);
    S.check_previous_handler(&c, "rust_null_deref", "fixture: own SIGSEGV handler ran");
}

#[test]
fn crash_rust_panic_hook_reports_the_panic() {
    let c = S.run("panic", &[]);
    assert_eq!(c.code, Some(101), "{}", c.stderr);
    let line = "panic: the fixture panics on purpose at ";
    assert!(c.raw().contains(line), "{}", c.stderr);
    let exp = S.from_main(&["rust_panicking"]);
    let exp: Vec<&str> = exp.iter().map(String::as_str).collect();
    assert_chain(&c.frames(), S.ours, &exp, S.file_suffix, &c.stderr);
    // The default hook still runs after ours.
    assert!(c.stderr.contains("panicked at"), "{}", c.stderr);
}

#[test]
fn crash_rust_report_file_gets_both_parts() {
    let file = testsupport::scratch_dir("crash-rust-file").join("report.txt");
    let _ = std::fs::remove_file(&file);
    let c = S.run("null", &[("CRASH_REPORT_FILE", file.to_str().unwrap())]);
    let text = S.check_report_file(&c, &file);
    let sym = symbolized_part(&text).unwrap();
    assert!(sym.contains("crash_fixture::rust_null_deref"), "{text}");
}

#[test]
fn crash_rust_with_the_callstack_binary_as_helper() {
    S.check_callstack_binary_as_helper("rust_null_deref");
}

#[test]
fn crash_rust_raw_part_survives_a_missing_helper() {
    let c = S.check_missing_helper();
    assert!(c.raw().contains("crash_fixture +0x"), "{}", c.stderr);
}

#[test]
fn crash_rust_raw_part_survives_a_hanging_helper() {
    S.check_hanging_helper();
}

#[test]
fn crash_rust_report_allocates_nothing() {
    // The fixture's global allocator counts every allocation and free from
    // just before the fault until our handler chains to the fixture's own
    // handler, after both parts of the report are out.
    let c = S.run("alloc-count", &[]);
    S.check(&c, libc::SIGSEGV, NULL_LINE, &["rust_null_deref"]);
    let line = "fixture: allocations during the crash report: 0000";
    assert!(c.stderr.contains(line), "{}", c.stderr);
}

#[test]
fn crash_rust_stack_overflow_on_a_spawned_thread() {
    let c = S.run("thread-overflow", &[]);
    assert!(c.raw().contains("\"overflower\""), "{}", c.stderr);
    S.check_overflow(&c, "rust_recurse", libc::SIGABRT);
    // Then the standard library's handler, as without us.
    assert!(
        c.stderr.contains("thread 'overflower'") && c.stderr.contains("has overflowed its stack"),
        "{}",
        c.stderr
    );
}
