//! Rust on Windows x86-64: `capture_exact` in `examples/win_chain.rs`,
//! built for `x86_64-pc-windows-gnu` and run under wine, named on this
//! side from the PE (the Rust and mingw DWARF in it).
//!
//! The chains must be exactly main -> alpha -> beta -> leaf (and the
//! spawned thread's closure -> alpha -> beta -> leaf), each frame's
//! function, file and call line, then through Rust's runtime
//! (`std::rt::lang_start_internal`, the thread's `thread_start`) down to
//! the thread's first frame: the C runtime's `main`, `__tmainCRTStartup`
//! and `mainCRTStartup` on the main thread, kernel32 and ntdll on both.
//! Every frame's module and load bias come from
//! `callstack::modules::loaded_modules` in the program (the loader's list).
//!
//! Run by `scripts/test-windows.sh` (ignored otherwise), which builds the
//! example and says where it and wine are: `CALLSTACK_WINDOWS_EXAMPLES`
//! (the example's directory), `CALLSTACK_WINE`, `WINEPREFIX`.
use std::path::Path;
use testsupport::{run_under_wine, windows_stage_path};

use callstack::symbolize::{Address, Symbolizer};

/// A frame as named here: function, file name, line; frames of other
/// modules by their module's file name, lowercase.
#[derive(Debug, PartialEq, Eq)]
enum Named {
    Own(String, String, u32),
    Other(String),
}

fn file_name(p: &str) -> String {
    p.rsplit(['\\', '/']).next().unwrap_or("").to_string()
}

/// The frames of capture `label`, named.
fn capture(text: &str, label: &str, exe: &Path, sym: &mut Symbolizer) -> Vec<Named> {
    let head = format!("capture {label} ");
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&head));
    let n: usize = lines
        .next()
        .unwrap_or_else(|| panic!("no capture {label} in:\n{text}"))[head.len()..]
        .parse()
        .unwrap();
    let exe_name = file_name(exe.to_str().unwrap());
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let named: Vec<Named> = lines
        .take(n)
        .map(|l| {
            let mut it = l
                .strip_prefix("frame ")
                .expect("a frame line")
                .splitn(3, ' ');
            let (ra, linked, module) = (
                hex(it.next().unwrap()),
                hex(it.next().unwrap()),
                it.next().unwrap(),
            );
            assert_ne!(module, "?", "{ra:#x} is in no module");
            if !file_name(module).eq_ignore_ascii_case(&exe_name) {
                return Named::Other(file_name(module).to_lowercase());
            }
            let s = sym.symbolize(Address::Return(linked as usize));
            let f = s.frames.last().unwrap_or_else(|| panic!("{ra:#x} unnamed"));
            Named::Own(
                f.function.as_deref().unwrap_or("??").to_string(),
                f.file.as_deref().map(file_name).unwrap_or_default(),
                f.line.unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(named.len(), n, "capture {label}:\n{text}");
    named
}

/// The line of `examples/win_chain.rs` holding `needle`, the first at or
/// after the line holding `after`.
fn line_of(after: &str, needle: &str) -> u32 {
    testsupport::line_of(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/win_chain.rs"),
        after,
        needle,
    )
}

fn own(f: &str, line: u32) -> Named {
    Named::Own(f.into(), "win_chain.rs".into(), line)
}

fn function(n: &Named) -> &str {
    match n {
        Named::Own(f, _, _) => f,
        Named::Other(m) => m,
    }
}

/// `named` is `first`, then frames among which one named `through`, then
/// `last` (functions or module names).
fn check(label: &str, named: &[Named], first: &[Named], through: &str, last: &[&str]) {
    let ok = named.len() > first.len() + last.len()
        && named[..first.len()] == *first
        && named[named.len() - last.len()..]
            .iter()
            .map(function)
            .eq(last.iter().copied())
        && named[first.len()..named.len() - last.len()]
            .iter()
            .any(|n| function(n).contains(through));
    assert!(
        ok,
        "capture {label}: got {named:#?}\nwant {first:#?} first, then {through}, then {last:?}"
    );
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn capture_exact_chains_of_rust_code() {
    let exe = windows_stage_path("CALLSTACK_WINDOWS_EXAMPLES").join("win_chain.exe");
    let text = run_under_wine(&exe, &[]);
    let mut sym = Symbolizer::for_file(&exe).expect("open the PE");
    let leaf = || own("win_chain::leaf", line_of("fn leaf(", "capture_exact"));
    let beta = || own("win_chain::beta", line_of("fn beta(", "leaf(skip)"));
    let alpha = || own("win_chain::alpha", line_of("fn alpha(", "beta(skip)"));
    let main = own("win_chain::main", line_of("fn main()", "alpha(0)"));
    let main2 = own("win_chain::main", line_of("fn main()", "alpha(1)"));
    let closure = own(
        "win_chain::main::{{closure}}",
        line_of("fn main()", "spawn"),
    );
    let start = [
        "main",
        "__tmainCRTStartup",
        "mainCRTStartup",
        "kernel32.dll",
        "ntdll.dll",
    ];
    check(
        "main",
        &capture(&text, "main", &exe, &mut sym),
        &[leaf(), beta(), alpha(), main],
        "std::rt::lang_start_internal",
        &start,
    );
    check(
        "skip1",
        &capture(&text, "skip1", &exe, &mut sym),
        &[beta(), alpha(), main2],
        "std::rt::lang_start_internal",
        &start,
    );
    check(
        "thread",
        &capture(&text, "thread", &exe, &mut sym),
        &[leaf(), beta(), alpha(), closure],
        "thread_start",
        &["kernel32.dll", "ntdll.dll"],
    );
    assert!(text.contains(" main true"), "{text}");
}
