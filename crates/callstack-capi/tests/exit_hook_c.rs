//! `callstack_exit_hook_install` from C (tests/fixtures/c/exit_hook.c), in
//! several build modes: every return-register class (long double and its
//! complex pair on the x87 stack, struct of two doubles, two longs,
//! __int128, float) survives a hook that clobbers them; nested hooks run in
//! order; fast and exact captures below a hooked frame equal the ones
//! without the hook; a longjmp over a hooked frame is counted; gdb's `bt`
//! inside a hooked function passes through the trampoline to the caller.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use testsupport::{gdb_batch, gdb_run, parse_gdb_bt, release_artifacts, scratch_dir, Gcc};

fn build(flags: &str, tag: &str) -> std::path::PathBuf {
    Gcc::new(&["exit_hook.c"])
        .flags(flags)
        .link_callstack()
        .build(&scratch_dir("exit-hook-c").join(format!("exit_hook_{tag}")))
}

fn check_run(flags: &str, tag: &str, frame_pointers: bool, cfi: bool) {
    let exe = build(flags, tag);
    let out = std::process::Command::new(&exe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{flags}: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |key: &str| -> &str {
        text.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("{flags}: no {key} in {text}"))
    };
    assert_eq!(line("RETURNS"), "RETURNS ok", "{flags}");
    // '1' then '2' on nest_inner (installed 1, 3 (on nest_outer), 2: the
    // last installed on a frame runs first), nest_outer's own '9', then 3.
    assert_eq!(line("NESTED"), "NESTED 2193 2", "{flags}");
    let fast: Vec<&str> = line("CAPTURE fast").split(' ').collect();
    assert_eq!(fast[2], "same", "{flags}: {text}");
    if frame_pointers {
        let n: u32 = fast[3].parse().unwrap();
        assert!(
            n >= 5,
            "{flags}: the frame-pointer walk reached main: {text}"
        );
    }
    let exact: Vec<&str> = line("CAPTURE exact").split(' ').collect();
    assert_eq!(exact[2], "same", "{flags}: {text}");
    assert!(exact[3].parse::<u32>().unwrap() >= 6, "{flags}: {text}");
    assert_eq!(line("LONGJMP"), "LONGJMP ran 0 skipped 1", "{flags}");

    if !cfi {
        // gdb needs the CFI (of the program, to reach the trampoline).
        return;
    }
    // gdb inside the hooked function: the trampoline shows as a frame of its
    // own between the hooked function and its real caller.
    let bt = gdb_run(&exe, &["gdb"], &["break gdb_leaf", "run", "bt"]);
    let names = parse_gdb_bt(&bt);
    assert_eq!(
        names,
        [
            "gdb_leaf",
            "gdb_target",
            "__callstack_exit_hook_trampoline",
            "main"
        ],
        "{flags}: {bt}"
    );
}

/// `callstack pstack` of a process stopped inside a hooked function names
/// the same frames as gdb attached to it: the trampoline, then the real
/// caller; `callstack core` of its `gcore` core names them too.
fn check_pstack(flags: &str, tag: &str) {
    let exe = build(flags, tag);
    let mut child = Command::new(&exe)
        .arg("pause")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "READY");
    let pid = child.id().to_string();
    // Past the printf: blocked in pause(2) (system call 34 on x86-64).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{pid}/syscall"))
        .unwrap_or_default()
        .starts_with("34 ")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the fixture never paused"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let ours = Command::new(&release_artifacts().cli)
        .args(["pstack", &pid])
        .output()
        .unwrap();
    let gdb = gdb_batch("gdb")
        .args(["-p", &pid, "-ex", "bt"])
        .output()
        .unwrap();
    let core = scratch_dir("exit-hook-c").join(format!("core_{tag}"));
    let g = Command::new("gcore")
        .arg("-o")
        .arg(&core)
        .arg(&pid)
        .output()
        .unwrap();
    assert!(
        g.status.success(),
        "gcore: {}",
        String::from_utf8_lossy(&g.stderr)
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let ours_text = String::from_utf8_lossy(&ours.stdout);
    let gdb_text = String::from_utf8_lossy(&gdb.stdout);
    let names = parse_gdb_bt(&ours_text);
    assert_eq!(
        names,
        [
            "__libc_pause",
            "pause_leaf",
            "pause_target",
            "__callstack_exit_hook_trampoline",
            "main"
        ],
        "{flags}: {ours_text}"
    );
    assert_eq!(
        names,
        parse_gdb_bt(&gdb_text),
        "{flags}: ours {ours_text}\ngdb {gdb_text}"
    );
    // The same process from its core file.
    let core = core.with_extension(&pid);
    let from_core = Command::new(&release_artifacts().cli)
        .arg("core")
        .arg(&exe)
        .arg(&core)
        .output()
        .unwrap();
    let core_text = String::from_utf8_lossy(&from_core.stdout);
    assert_eq!(parse_gdb_bt(&core_text), names, "{flags}: core {core_text}");
    let _ = std::fs::remove_file(&core);
}

/// The crash handler's report of a fault inside a hooked function names the
/// real caller after it (the trampoline is not a frame there: the report
/// comes from an in-process capture).
#[test]
fn a_crash_report_through_a_hooked_frame_names_the_real_caller() {
    let exe = build("-O2 -g", "crash_O2");
    let mut cmd = Command::new(&exe);
    cmd.arg("crash");
    let c = testsupport::crash::run_crashing(cmd, std::time::Duration::from_secs(60));
    assert_eq!(c.signal, Some(libc::SIGSEGV), "{}", c.stderr);
    let names: Vec<String> = c.frames().into_iter().map(|f| f.function).collect();
    let at = names
        .iter()
        .position(|n| n == "crash_leaf")
        .unwrap_or_else(|| panic!("{}", c.stderr));
    assert_eq!(
        names[at..at + 3],
        ["crash_leaf", "crash_target", "main"],
        "{}",
        c.stderr
    );
}

#[test]
fn pstack_of_a_hooked_process_agrees_with_gdb() {
    check_pstack("-O2 -g", "pstack_O2");
}

#[test]
fn exit_hooks_from_c() {
    check_run("-O0 -g", "O0", true, true);
    check_run("-O2 -g -fno-omit-frame-pointer", "O2fp", true, true);
    check_run("-O2 -g -fomit-frame-pointer", "O2nofp", false, true);
    // No CFI at all: frames found by instruction analysis and stack
    // scanning, which take the trampoline for the return address it
    // replaced.
    check_run(
        "-O2 -g0 -fomit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables",
        "O2nocfi",
        false,
        false,
    );
}

/// gdb single-steps the trampoline (`nexti`, over the call of the
/// dispatcher) of a frame returning to `main`; at every instruction its
/// `bt` is the trampoline then `main`, and `callstack core` of a `gcore` of
/// the process stopped there names the same frames (the trampoline's CFI
/// holds at every instruction, read from the core's memory).
#[test]
fn gdb_and_cores_at_every_trampoline_instruction() {
    let exe = build("-O2 -g", "step_O2");
    let dir = scratch_dir("exit-hook-c-step");
    let script = dir.join("step.py");
    std::fs::write(
        &script,
        format!(
            r#"
import gdb
gdb.execute("break *((char*)&__callstack_exit_hook_trampoline + 1)")
gdb.execute("run gdb")
lo = int(gdb.parse_and_eval("(long)&__callstack_exit_hook_trampoline"))
i = 0
while True:
    pc = int(gdb.parse_and_eval("$pc"))
    if not gdb.execute("info symbol $pc", to_string=True).startswith("__callstack_exit_hook"):
        break
    print("STEP %d %#x" % (i, pc - lo))
    gdb.execute("bt")
    gdb.execute("gcore {dir}/core_%d" % i, to_string=True)
    i += 1
    gdb.execute("nexti", to_string=True)
print("DONE %d" % i)
"#,
            dir = dir.display()
        ),
    )
    .unwrap();
    let out = gdb_batch("gdb")
        .arg("-x")
        .arg(&script)
        .arg(&exe)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let steps: Vec<&str> = text.split("STEP ").skip(1).collect();
    assert!(steps.len() >= 40, "{} steps: {text}", steps.len());
    assert!(text.contains(&format!("DONE {}", steps.len())), "{text}");
    let want = ["__callstack_exit_hook_trampoline", "main"];
    for (i, step) in steps.iter().enumerate() {
        let at = step.lines().next().unwrap_or("");
        assert_eq!(parse_gdb_bt(step), want, "gdb at step {at}: {step}");
        let core = dir.join(format!("core_{i}"));
        let ours = Command::new(&release_artifacts().cli)
            .arg("core")
            .arg(&exe)
            .arg(&core)
            .output()
            .unwrap();
        let ours_text = String::from_utf8_lossy(&ours.stdout);
        assert_eq!(
            parse_gdb_bt(&ours_text),
            want,
            "callstack core at step {at}: {ours_text}{}",
            String::from_utf8_lossy(&ours.stderr)
        );
        let _ = std::fs::remove_file(&core);
    }
}

fn run_fixture(source: &str, flags: &str, tag: &str, args: &[&str]) -> String {
    let exe = Gcc::new(&[source])
        .flags(flags)
        .link_callstack()
        .build(&scratch_dir("exit-hook-c").join(tag));
    let out = Command::new(&exe).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{tag} {args:?}: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.trim().to_string()
}

/// Hooks pending on several stacks of one thread (tests/fixtures/c/
/// exit_hook_stacks.c): main and two `makecontext` coroutines (stacks in
/// one `.bss` mapping, two heap blocks either way round, or two arrays in
/// main's frame on the thread's own stack) switch back
/// and forth with hooks pending on each and return in interleaved order;
/// a longjmp inside a coroutine is counted once. A SIGUSR1 handler on an
/// alternate stack above the thread's frames (a mapping, or an array in
/// the thread's start function) hooks frames while the interrupted ones
/// have hooks pending. No entry of another stack is taken for stale.
#[test]
fn hooks_pending_on_several_stacks_of_a_thread() {
    for (flags, tag) in [("-O0 -g", "O0"), ("-O2 -g", "O2")] {
        let tag = format!("exit_hook_stacks_{tag}");
        for mode in ["coro-static", "coro-heap", "coro-heap-rev", "coro-local"] {
            assert_eq!(
                run_fixture("exit_hook_stacks.c", flags, &tag, &[mode]),
                "CORO nmBb2Aa1 skipped 1",
                "{flags} {mode}"
            );
        }
        for (mode, want) in [
            ("late-local", "LATE a1m skipped 0"),
            ("late-heap", "LATE a1m skipped 0"),
            ("alt-mapped", "ALT mapped sHhjio skipped 0"),
            ("alt-local", "ALT local sHhjio skipped 0"),
        ] {
            assert_eq!(
                run_fixture("exit_hook_stacks.c", flags, &tag, &[mode]),
                want,
                "{flags} {mode}"
            );
        }
    }
}

/// 12,000 threads end with four hooks pending each (pthread_exit,
/// cancellation, or a longjmp over the hooked frames and a return from the
/// start function; tests/fixtures/c/exit_hook_threads.c): every skipped
/// hook is counted exactly once, none runs, and the table never fills
/// (fresh threads still install).
#[test]
fn threads_ending_with_hooks_pending_free_and_count_them() {
    for (flags, tag) in [("-O0 -g", "O0"), ("-O2 -g", "O2")] {
        let tag = format!("exit_hook_threads_{tag}");
        assert_eq!(
            run_fixture("exit_hook_threads.c", flags, &tag, &["12000"]),
            "THREADS ran 12064 skipped 48000 never 0",
            "{flags}"
        );
    }
}
