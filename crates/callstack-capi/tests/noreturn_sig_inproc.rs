//! In-process captures through a signal handler built with frame pointers
//! and no CFI that ends in `abort()` through a function that never returns
//! (called through the PLT): from the SIGABRT handler's context
//! (`callstack_capture_from_context`) and from inside that handler
//! (`callstack_capture_exact`), the chain goes from `ns_die` through the
//! handler and the signal frame into the interrupted `kill`, then `victim`,
//! `outer`, `main` (the core of the same shape: remote.rs,
//! `core_of_a_noreturn_call_in_a_frame_pointer_handler_matches_gdb`).
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::process::Command;
use testsupport::{scratch_dir, Gcc};

#[test]
fn noreturn_call_in_a_frame_pointer_handler() {
    let flags =
        "-O2 -g0 -fno-omit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables";
    let dir = scratch_dir("noreturn-sig-inproc");
    let lib = Gcc::new(&["noreturn_sig_lib.c"])
        .flags(flags)
        .flags("-fPIC -shared")
        .build(&dir.join("libnoreturn_sig.so"));
    let exe = Gcc::new(&["noreturn_sig_inproc.c", lib.to_str().unwrap()])
        .flags(flags)
        .link_callstack()
        .build(&dir.join("noreturn_sig_inproc"));
    for (arg, handler) in [
        ("lib", &["ns_die", "ns_lib_handler"][..]),
        ("exe", &["ns_die", "ns_fatal", "exe_handler"][..]),
    ] {
        for how in ["context", "exact"] {
            let o = Command::new(&exe).args([arg, how]).output().unwrap();
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "{arg} {how}: {o:?}");
            let names: Vec<&str> = out.lines().collect();
            let at = names
                .iter()
                .position(|n| *n == "ns_die")
                .unwrap_or_else(|| panic!("{arg} {how}: no ns_die in {names:?}"));
            let rest = &names[at..];
            let n = handler.len();
            assert!(rest.len() >= n + 5, "{arg} {how}: short chain {names:?}");
            assert_eq!(&rest[..n], handler, "{arg} {how}: {names:?}");
            // The signal trampoline (`__restore_rt`: named only where
            // libc's symbol table or debug file is at hand).
            assert!(
                rest[n].contains("restore_rt") || rest[n] == "??",
                "{arg} {how}: {names:?}"
            );
            assert!(rest[n + 1].contains("kill"), "{arg} {how}: {names:?}");
            assert_eq!(
                &rest[n + 2..n + 5],
                ["victim", "outer", "main"],
                "{arg} {how}: {names:?}"
            );
        }
    }
}
