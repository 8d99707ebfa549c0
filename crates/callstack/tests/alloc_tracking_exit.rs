//! `Tracking` with `Capture::Fast` and the leak report printed at exit:
//! this test runs itself as a child that leaks, and reads the report the
//! child printed to standard error when it exited.

use callstack::alloc::{Capture, Tracking};
use std::alloc::System;
use std::hint::black_box;

#[global_allocator]
static A: Tracking<System> = Tracking::new(System, Capture::Fast);

#[inline(never)]
fn leak_at_exit() {
    std::mem::forget(black_box(Vec::<u8>::with_capacity(1_000_003)));
}

fn main() {
    if std::env::var_os("ALLOC_TRACKING_EXIT_CHILD").is_some() {
        A.print_leaks_at_exit(3);
        leak_at_exit();
        return;
    }
    // Under a qemu-user stage the child runs through the stage's runner.
    let o = testsupport::target_command(&std::env::current_exe().unwrap())
        .env("ALLOC_TRACKING_EXIT_CHILD", "1")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("leaks: "), "{err}");
    let at = err
        .find("alloc_tracking_exit::leak_at_exit at")
        .unwrap_or_else(|| panic!("{err}"));
    let head = err[..err[..at].rfind(" bytes live in ").unwrap()]
        .rfind('\n')
        .unwrap();
    assert!(
        err[head..].starts_with("\n  1000003 bytes live in 1 blocks"),
        "{}",
        &err[head..at]
    );
    println!("alloc_tracking_exit: ok");
}
