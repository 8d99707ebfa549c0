//! Finding the right debug info: `.gnu_debuglink` checked (CRC32 or
//! build-id) so that a stale debug file of another build is never used,
//! the search order of gdb, and dwz supplementary files
//! (`.gnu_debugaltlink`).
#![cfg(feature = "symbolize")]

use callstack::symbolize::{Address, ErrorKind, NameSource, Symbolized, Symbolizer};
use std::path::{Path, PathBuf};
use std::process::Command;
use testsupport::{scratch_dir, Gcc};

fn run(args: &[&str]) {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The fixture's own functions (`sym_*` and `main`) and their addresses,
/// from `nm` of a file with a `.symtab`.
fn functions(exe: &Path) -> Vec<(u64, String)> {
    let o = Command::new("nm")
        .arg("--defined-only")
        .arg(exe)
        .output()
        .unwrap();
    assert!(o.status.success());
    let mut v: Vec<(u64, String)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (a, t, n) = (it.next()?, it.next()?, it.next()?);
            (matches!(t, "T" | "t") && (n.starts_with("sym_") || n == "main"))
                .then(|| (u64::from_str_radix(a, 16).ok().unwrap(), n.to_string()))
        })
        .collect();
    v.sort();
    assert!(v.len() >= 4, "{v:?}");
    v
}

fn answers(s: &mut Symbolizer, addrs: &[u64]) -> Vec<Symbolized> {
    addrs
        .iter()
        .map(|&a| s.symbolize(Address::Exact(a as usize)).clone())
        .collect()
}

/// Builds `<dir>/prog` (-O2, stripped of DWARF but keeping `.symtab`, with
/// a `.gnu_debuglink` to `prog.debug`), the matching debug file (moved to
/// `<dir>/good/prog.debug`), an unstripped reference copy, and the debug
/// file of another build of the same source (-O0) at `<dir>/stale.debug`.
fn split_builds(tag: &str, extra: &str) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let dir = scratch_dir(&format!("symbolize-debuginfo-{tag}"));
    let exe = dir.join("prog");
    let reference = dir.join("prog.ref");
    Gcc::new(&["sym_inline.c"])
        .flags(&format!("-O2 {extra}"))
        .build(&exe);
    std::fs::copy(&exe, &reference).unwrap();
    let dbg = dir.join("prog.debug");
    run(&["objcopy", "--only-keep-debug", s(&exe), s(&dbg)]);
    run(&["strip", "--strip-debug", s(&exe)]);
    run(&[
        "objcopy",
        &format!("--add-gnu-debuglink={}", s(&dbg)),
        s(&exe),
    ]);
    std::fs::create_dir_all(dir.join("good")).unwrap();
    let good = dir.join("good/prog.debug");
    std::fs::rename(&dbg, &good).unwrap();
    let other = dir.join("other");
    Gcc::new(&["sym_inline.c"])
        .flags(&format!("-O0 {extra}"))
        .build(&other);
    let stale = dir.join("stale.debug");
    run(&["objcopy", "--only-keep-debug", s(&other), s(&stale)]);
    (exe, reference, good, stale)
}

fn stale_debuglink_is_skipped(tag: &str, extra: &str, why: ErrorKind) {
    let (exe, reference, good, stale) = split_builds(tag, extra);
    let dir = exe.parent().unwrap().to_path_buf();
    let funcs = functions(&reference);
    let addrs: Vec<u64> = funcs.iter().map(|f| f.0).collect();

    // Only the stale file, under the right name beside the binary.
    std::fs::copy(&stale, dir.join("prog.debug")).unwrap();
    let mut sym = Symbolizer::for_file(&exe).unwrap();
    let report = sym.debug_info().next().unwrap().1.clone();
    assert_eq!(report.debug_file, None, "{report:?}");
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert_eq!(report.skipped[0].kind, why, "{report:?}");
    assert_eq!(report.skipped[0].path, dir.join("prog.debug"));
    // Names from .symtab, no lines: never the stale file's.
    for (r, (a, name)) in answers(&mut sym, &addrs).iter().zip(&funcs) {
        assert_eq!(r.frames.len(), 1, "{a:#x}: {r:?}");
        let f = &r.frames[0];
        assert_eq!(f.function.as_deref(), Some(name.as_str()), "{a:#x}: {r:?}");
        assert_eq!(f.source, NameSource::Symtab, "{a:#x}: {r:?}");
        assert_eq!(f.line, None, "{a:#x}: {r:?}");
    }

    // The right one in the `.debug/` subdirectory: the stale one is passed
    // over, the search goes on and finds it.
    std::fs::create_dir_all(dir.join(".debug")).unwrap();
    std::fs::copy(&good, dir.join(".debug/prog.debug")).unwrap();
    let mut sym = Symbolizer::for_file(&exe).unwrap();
    let report = sym.debug_info().next().unwrap().1.clone();
    assert_eq!(report.debug_file, Some(dir.join(".debug/prog.debug")));
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert_eq!(report.skipped[0].kind, why);
    let mut want = Symbolizer::for_file(&reference).unwrap();
    let got = answers(&mut sym, &addrs);
    let expected = answers(&mut want, &addrs);
    for i in 0..addrs.len() {
        assert_eq!(got[i].frames, expected[i].frames, "{:#x}", addrs[i]);
        let last = got[i].frames.last().unwrap();
        assert_eq!(last.source, NameSource::Dwarf);
        assert!(last.line.is_some(), "{:?}", got[i]);
    }

    // The same under a debug dir (`<root>/<the binary's dir>/prog.debug`).
    std::fs::remove_file(dir.join(".debug/prog.debug")).unwrap();
    let root = dir.join("root");
    let under = root.join(dir.strip_prefix("/").unwrap());
    std::fs::create_dir_all(&under).unwrap();
    std::fs::copy(&good, under.join("prog.debug")).unwrap();
    let mut sym = Symbolizer::for_file_with_debug_dirs(&exe, &[root]).unwrap();
    let report = sym.debug_info().next().unwrap().1.clone();
    assert_eq!(report.debug_file, Some(under.join("prog.debug")));
    let got = answers(&mut sym, &addrs);
    for i in 0..addrs.len() {
        assert_eq!(got[i].frames, expected[i].frames, "{:#x}", addrs[i]);
    }
}

#[test]
fn stale_debuglink_without_build_id_fails_the_crc_check() {
    // No build-id: the CRC32 of `.gnu_debuglink` is all that tells the
    // builds apart.
    stale_debuglink_is_skipped(
        "crc",
        "-Wl,--build-id=none",
        ErrorKind::DebugLinkCrcMismatch,
    );
}

#[test]
fn stale_debuglink_with_build_id_fails_the_build_id_check() {
    stale_debuglink_is_skipped("bid", "-Wl,--build-id", ErrorKind::BuildIdMismatch);
}
