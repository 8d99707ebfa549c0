//! Crash reports of a Rust program on Windows x86-64: `examples/win_crash.rs`,
//! built for `x86_64-pc-windows-gnu` and run under wine.
//!
//! - Panics caught with `catch_unwind` (raised by the GCC unwinder with
//!   `RaiseException`) give no report, and the program exits 0.
//! - A read through a null pointer at the end of main -> alpha -> beta ->
//!   crash: exit status 0xc0000005, the raw part's
//!   `EXCEPTION_ACCESS_VIOLATION: read of address 0x0`, the symbolized
//!   chain crash, beta, alpha, main with file and line, through Rust's
//!   runtime to the C runtime's start-up, and a minidump.
//! - A panic with `Options::panic_hook`: the panic report (message and
//!   location, then the chain from the panicking function, the panic
//!   machinery trimmed), then Rust's own message, exit status 101.
//!
//! Run by `scripts/test-windows.sh` (ignored otherwise):
//! `CALLSTACK_WINDOWS_EXAMPLES`, `CALLSTACK_WINE`, `WINEPREFIX`.
use std::path::{Path, PathBuf};
use std::process::Command;

use testsupport::{scratch_dir, windows_stage_path, workspace_root};

fn run(args: &[&str]) -> (String, String) {
    let exe = windows_stage_path("CALLSTACK_WINDOWS_EXAMPLES").join("win_crash.exe");
    let o = Command::new(windows_stage_path("CALLSTACK_WINE"))
        .arg(&exe)
        .args(args)
        .env("WINEDEBUG", "-all")
        .env("WINEDLLOVERRIDES", "winedbg.exe=d")
        .output()
        .expect("run wine");
    let out = String::from_utf8_lossy(&o.stdout).replace('\r', "");
    let err = String::from_utf8_lossy(&o.stderr).replace('\r', "");
    assert!(o.status.success(), "{args:?}: {}\n{out}\n{err}", o.status);
    (out, err)
}

fn line_of(after: &str, needle: &str) -> u32 {
    let src: PathBuf = workspace_root().join("crates/callstack/examples/win_crash.rs");
    testsupport::line_of(&src, after, needle)
}

/// The frames of the symbolized part, `  #N 0xADDR in FUNC at
/// FILE:LINE:COL`: (function, file name, line); frames without a line
/// left out.
fn symbolized(err: &str) -> Vec<(String, String, u32)> {
    let sym = &err[err
        .find("*** callstack: crash report (symbolized) ***")
        .unwrap_or_else(|| panic!("no symbolized part:\n{err}"))..];
    sym.lines()
        .take_while(|l| !l.starts_with("*** end"))
        .filter_map(|l| l.strip_prefix("  #"))
        .filter_map(|l| {
            let (f, loc) = l.split_once(" in ")?.1.split_once(" at ")?;
            let mut p = loc.rsplitn(3, ':');
            let _col = p.next();
            let line = p.next()?.parse().ok()?;
            let file = Path::new(&p.next()?.replace('\\', "/"))
                .file_name()?
                .to_string_lossy()
                .into_owned();
            Some((f.to_string(), file, line))
        })
        .collect()
}

fn own(f: &str, l: u32) -> (String, String, u32) {
    (format!("win_crash::{f}"), "win_crash.rs".to_string(), l)
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn a_panic_is_reported_by_the_panic_hook() {
    let (out, err) = run(&["run", "panic"]);
    assert!(out.contains("exit 0x65\n"), "{out}\n{err}");
    let at = line_of("fn crash(p", "panic!(");
    assert!(
        err.contains(&format!(
            "panic: panicked on purpose at crates/callstack/examples/win_crash.rs:{at}:"
        )),
        "{err}"
    );
    let frames = symbolized(&err);
    let want = [
        own("crash", at),
        own("beta", line_of("fn beta(p", "crash(p)")),
        own("alpha", line_of("fn alpha(p", "beta(p)")),
        own("main", line_of("Some(\"panic\")", "alpha(")),
    ];
    assert_eq!(frames[..4], want[..], "{err}");
    // Then Rust's own hook, which ran after ours.
    assert!(err.contains("panicked on purpose\n"), "{err}");
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn caught_panics_give_no_report() {
    let (out, err) = run(&["run", "caught"]);
    assert!(
        out.contains("caught 50\n") && out.contains("exit 0x0\n"),
        "{out}\n{err}"
    );
    assert!(!err.contains("callstack"), "{err}");
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn a_null_read_is_reported_with_its_chain_and_a_minidump() {
    let dir = scratch_dir("windows_rust_crash");
    let wine_dir = format!("Z:{}", dir.display()).replace('/', "\\");
    let (out, err) = run(&["run", "null", &wine_dir]);
    assert!(out.contains("exit 0xc0000005\n"), "{out}\n{err}");
    assert!(
        err.contains("exception: EXCEPTION_ACCESS_VIOLATION: read of address 0x0 (code 0xc0000005"),
        "{err}"
    );
    let frames = symbolized(&err);
    let want = [
        own("crash", line_of("fn crash(p", "read_volatile")),
        own("beta", line_of("fn beta(p", "crash(p)")),
        own("alpha", line_of("fn alpha(p", "beta(p)")),
        own("main", line_of("Some(\"null\")", "alpha(")),
    ];
    let at = frames
        .iter()
        .position(|f| f.0 == "win_crash::crash")
        .unwrap_or_else(|| panic!("{frames:#?}\n{err}"));
    assert_eq!(frames[at..at + 4], want[..], "{err}");
    // Above: at most `read_volatile` (a debug build keeps it a call).
    assert!(at <= 1, "{err}");
    for f in [
        "std::rt::lang_start_internal",
        "__tmainCRTStartup",
        "mainCRTStartup",
    ] {
        assert!(frames.iter().any(|g| g.0 == f), "no {f}: {err}");
    }
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("minidump: Z:"))
        .unwrap_or_else(|| panic!("no minidump line:\n{err}"));
    let path = PathBuf::from(line.split(" (").next().unwrap().replace('\\', "/"));
    assert!(path.starts_with(&dir), "{line}");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..4], b"MDMP", "{}", path.display());
}
