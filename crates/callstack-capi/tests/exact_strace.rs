//! strace proves it: a warm `callstack_capture_exact` makes no system call,
//! and a cold one none beyond the one-time stack-bounds lookup of a new
//! thread (`openat`/`read`/`close` of /proc/self/maps); the main thread's
//! first capture makes none at all.

use std::process::Command;
use testsupport::{scratch_dir, Gcc};

#[test]
fn captures_make_no_system_calls() {
    if Command::new("strace").arg("-V").output().is_err() {
        panic!("strace is not installed (scripts/install-test-deps.sh installs it)");
    }
    let dir = scratch_dir("exact-strace");
    let exe = Gcc::new(&["exact_strace.c"])
        .flags("-O2 -pthread")
        .link_callstack()
        .build(&dir.join("exact_strace"));
    let log = dir.join("strace.log");
    let st = Command::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&log)
        .arg(&exe)
        .status()
        .unwrap();
    assert!(st.success());
    let text = std::fs::read_to_string(&log).unwrap();
    // Split the log at the markers, in order. A section holds only the calls
    // of the thread that made its opening marker: the other threads' calls
    // (the main thread waiting in pthread_join while the new thread makes its
    // first capture) interleave in the log but are not the captures'.
    let sections = testsupport::strace_sections(&text);
    // Markers: 0 start | 1 cold main | 2 prepare | 3 warm main | 4 pthread_create... |
    // 5 thread first | 6 thread warm | 7 join, raise | 8 handler | 9 exit.
    assert!(sections.len() >= 10, "{text}");
    let sec = |i: usize| &sections[i];
    assert!(
        sec(1).is_empty(),
        "cold first capture on the main thread: {:?}",
        sec(1)
    );
    assert!(sec(3).is_empty(), "warm captures: {:?}", sec(3));
    assert!(
        sec(5).iter().all(|c| c.contains("/proc/self/maps")
            || c.starts_with("read(")
            || c.starts_with("close(")),
        "a new thread's first capture: {:?}",
        sec(5)
    );
    assert!(sec(5).len() <= 6, "{:?}", sec(5));
    assert!(sec(6).is_empty(), "warm captures on a thread: {:?}", sec(6));
    // Between the two markers around raise(): the signal's own calls only.
    assert!(
        sec(8).iter().all(|c| c.starts_with("gettid(")
            || c.starts_with("getpid(")
            || c.starts_with("tgkill(")
            || c.starts_with("rt_sigprocmask(")
            || c.starts_with("rt_sigreturn(")
            || c.starts_with("---")),
        "captures in a signal handler: {:?}",
        sec(8)
    );
}
