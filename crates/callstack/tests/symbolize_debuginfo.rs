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

const SHARED_H: &str = "struct pair { int a; long b; double c; };
static inline int shared_twice(int x) { return 2 * x + 1; }
static inline int shared_mix(struct pair *p, int k)
{
    return shared_twice(p->a + k) + (int)p->b;
}
";

fn program(v: &str) -> String {
    format!(
        "#include <stdio.h>
#include <stdlib.h>
#include \"shared.h\"
__attribute__((noinline)) int {v}_work(struct pair *p, int n)
{{
    int t = 0;
    for (int i = 0; i < n; i++)
        t += shared_mix(p, i);
    return t;
}}
int main(int argc, char **argv)
{{
    struct pair p = {{ argc, 2, 3.0 }};
    printf(\"%d\\n\", {v}_work(&p, atoi(argv[0])));
    return 0;
}}
"
    )
}

/// Every instruction address of the functions named `prefixes` (objdump).
fn instruction_addrs(exe: &Path, prefixes: &[&str]) -> Vec<u64> {
    let o = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(exe)
        .output()
        .unwrap();
    let mut inside = false;
    let mut out = Vec::new();
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        if let Some(name) = l.split('<').nth(1).and_then(|x| x.strip_suffix(">:")) {
            inside = prefixes.iter().any(|p| name.starts_with(p));
            continue;
        }
        if inside {
            if let Some(a) = l.trim().split(':').next() {
                if let Ok(a) = u64::from_str_radix(a, 16) {
                    out.push(a);
                }
            }
        }
    }
    out
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

/// Two programs sharing a header, their debug files put through
/// `dwz -m` (common DIEs and strings moved to `sup.debug`, referenced by
/// `DW_FORM_GNU_ref_alt` / `DW_FORM_GNU_strp_alt`), then stripped of
/// DWARF with a `.gnu_debuglink`. Returns (stripped one, reference one
/// with its original DWARF, sup path).
fn dwz_builds(tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = scratch_dir(&format!("symbolize-dwz-{tag}"));
    std::fs::write(dir.join("shared.h"), SHARED_H).unwrap();
    let mut debugs = Vec::new();
    for v in ["one", "two"] {
        let src = dir.join(format!("{v}.c"));
        std::fs::write(&src, program(v)).unwrap();
        let exe = dir.join(v);
        Gcc::new(&[s(&src)]).flags("-O2").build(&exe);
        std::fs::copy(&exe, dir.join(format!("{v}.ref"))).unwrap();
        let dbg = dir.join(format!("{v}.debug"));
        run(&["objcopy", "--only-keep-debug", s(&exe), s(&dbg)]);
        debugs.push(dbg);
    }
    let sup = dir.join("sup.debug");
    // `-M`: the name recorded in .gnu_debugaltlink, relative to the debug
    // files' directory here.
    run(&[
        "dwz",
        "-m",
        s(&sup),
        "-M",
        "sup.debug",
        s(&debugs[0]),
        s(&debugs[1]),
    ]);
    let exe = dir.join("one");
    run(&["strip", "--strip-debug", s(&exe)]);
    run(&[
        "objcopy",
        &format!("--add-gnu-debuglink={}", s(&debugs[0])),
        s(&exe),
    ]);
    (exe, dir.join("one.ref"), sup)
}

/// Our answers on the dwz-processed file against those on the original
/// DWARF: same frames, files, lines and columns; a function name is the
/// same, or unknown for an inlined frame whose name is only in the
/// supplementary file (never another name). Returns how many frames were
/// left unnamed.
fn compare_dwz(got: &[Symbolized], expected: &[Symbolized], addrs: &[u64]) -> usize {
    let mut unnamed = 0;
    for i in 0..addrs.len() {
        let (g, w) = (&got[i].frames, &expected[i].frames);
        assert_eq!(
            g.len(),
            w.len(),
            "{:#x}:\n{}\n{}",
            addrs[i],
            got[i],
            expected[i]
        );
        for (gf, wf) in g.iter().zip(w) {
            let ctx = || format!("{:#x}:\n{}\n{}", addrs[i], got[i], expected[i]);
            assert_eq!(
                (&gf.file, gf.line, gf.column, gf.inlined),
                (&wf.file, wf.line, wf.column, wf.inlined),
                "{}",
                ctx()
            );
            if gf.function != wf.function {
                assert!(gf.function.is_none() && gf.inlined, "{}", ctx());
                unnamed += 1;
            }
        }
        assert!(got[i].function().is_some(), "{:#x}: {}", addrs[i], got[i]);
    }
    unnamed
}

#[test]
fn dwz_debug_file_with_and_without_its_supplementary_file() {
    if !have("dwz") {
        eprintln!("skipped: dwz is not installed (scripts/install-test-deps.sh installs it)");
        return;
    }
    let (exe, reference, sup) = dwz_builds("sup");
    let dir = exe.parent().unwrap().to_path_buf();
    let addrs = instruction_addrs(&reference, &["one_work", "main"]);
    assert!(addrs.len() > 20, "{addrs:?}");
    let mut want = Symbolizer::for_file(&reference).unwrap();
    let expected = answers(&mut want, &addrs);
    let inlined = expected
        .iter()
        .flat_map(|r| &r.frames)
        .filter(|f| f.inlined)
        .count();
    assert!(inlined > 5, "the fixture should inline shared_mix");

    // The supplementary file found beside the debug file (relative
    // .gnu_debugaltlink, as dwz -M wrote it): names of DIEs kept in the
    // debug file resolve through DW_FORM_GNU_strp_alt.
    let mut sym = Symbolizer::for_file(&exe).unwrap();
    let got = answers(&mut sym, &addrs);
    let report = sym.debug_info().next().unwrap().1.clone();
    assert_eq!(report.debug_file, Some(dir.join("one.debug")), "{report:?}");
    assert_eq!(report.supplementary, Some(sup.clone()), "{report:?}");
    assert!(
        report
            .degraded
            .iter()
            .all(|e| e.kind != ErrorKind::MissingSupplementary),
        "{report:?}"
    );
    let unnamed = compare_dwz(&got, &expected, &addrs);
    // The outermost functions' names come from the DWARF (their strings are
    // in the supplementary file).
    for r in &got {
        assert_eq!(r.frames.last().unwrap().source, NameSource::Dwarf, "{r}");
    }
    // Inlined frames whose abstract origin is a DIE of the supplementary
    // file (DW_FORM_GNU_ref_alt) are named through it.
    assert_eq!(
        unnamed, 0,
        "with the supplementary file: {unnamed} of {inlined} inlined frames unnamed"
    );

    // A file of the right name but another build-id is not used.
    std::fs::rename(&sup, dir.join("sup.keep")).unwrap();
    std::fs::copy(dir.join("two.debug"), &sup).unwrap();
    let mut sym = Symbolizer::for_file(&exe).unwrap();
    let got = answers(&mut sym, &addrs);
    compare_dwz(&got, &expected, &addrs);
    let report = sym.debug_info().next().unwrap().1.clone();
    assert_eq!(report.supplementary, None, "{report:?}");
    assert!(
        report
            .skipped
            .iter()
            .any(|e| e.kind == ErrorKind::BuildIdMismatch && e.path == sup),
        "{report:?}"
    );
    // Missing: a clear degradation, right answers where the debug file has
    // them, the symbol table's names for the outermost functions.
    std::fs::remove_file(&sup).unwrap();
    let mut sym = Symbolizer::for_file(&exe).unwrap();
    let got = answers(&mut sym, &addrs);
    let report = sym.debug_info().next().unwrap().1.clone();
    assert_eq!(report.supplementary, None, "{report:?}");
    let missing: Vec<_> = report
        .degraded
        .iter()
        .filter(|e| e.kind == ErrorKind::MissingSupplementary)
        .collect();
    assert_eq!(missing.len(), 1, "{report:?}");
    assert!(missing[0].message.contains("sup.debug"), "{report:?}");
    let unnamed = compare_dwz(&got, &expected, &addrs);
    eprintln!("without it: {unnamed} of {inlined} inlined frames unnamed");
}

#[test]
fn stale_file_at_the_build_id_path_is_skipped() {
    let (exe, reference, good, stale) = split_builds("bidpath", "-Wl,--build-id");
    let dir = exe.parent().unwrap().to_path_buf();
    let funcs = functions(&reference);
    let addrs: Vec<u64> = funcs.iter().map(|f| f.0).collect();
    let id = Symbolizer::for_file(&exe)
        .unwrap()
        .modules()
        .next()
        .unwrap()
        .build_id
        .clone()
        .unwrap();
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let root = dir.join("root");
    let at = root
        .join(".build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]));
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::fs::copy(&stale, &at).unwrap();
    // The debuglink's file is where gdb looks after the build-id path.
    std::fs::copy(&good, dir.join("prog.debug")).unwrap();
    let mut sym = Symbolizer::for_file_with_debug_dirs(&exe, &[root]).unwrap();
    let report = sym.debug_info().next().unwrap().1.clone();
    assert_eq!(
        report.debug_file,
        Some(dir.join("prog.debug")),
        "{report:?}"
    );
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert_eq!(report.skipped[0].kind, ErrorKind::BuildIdMismatch);
    assert_eq!(report.skipped[0].path, at);
    let mut want = Symbolizer::for_file(&reference).unwrap();
    let got = answers(&mut sym, &addrs);
    let expected = answers(&mut want, &addrs);
    for i in 0..addrs.len() {
        assert_eq!(got[i].frames, expected[i].frames, "{:#x}", addrs[i]);
    }
}

/// Builds `<dir>/prog` from `minidebug.c` and strips it as Fedora's
/// find-debuginfo does, with MiniDebugInfo: the debug file split off
/// (`--only-keep-debug`), the program stripped of every symbol but
/// `.dynsym`, the function symbols that `.dynsym` lacks (`nm` of the debug
/// file minus `nm -D` of the program) kept in a copy of the debug file
/// stripped of everything else, that copy xz'd into `.gnu_debugdata`. The
/// debug file is then removed, as on a machine without the debuginfo
/// package. Returns the program, the copy without `.gnu_debugdata`, and
/// the function symbols of the unstripped build.
fn fedora_minidebuginfo(tag: &str, flags: &str) -> (PathBuf, PathBuf, Vec<(u64, String)>) {
    let dir = scratch_dir(&format!("symbolize-minidebug-{tag}"));
    let exe = dir.join("prog");
    // Exported functions must be in .dynsym, as in a shared library.
    Gcc::new(&["minidebug.c"])
        .flags(&format!("{flags} -rdynamic"))
        .build(&exe);
    let nm_all = |file: &Path, dynamic: bool| -> Vec<(String, String, String)> {
        let mut cmd = Command::new("nm");
        if dynamic {
            cmd.arg("-D");
        }
        let o = cmd
            .args(["--format=posix", "--defined-only"])
            .arg(file)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                Some((
                    it.next()?.into(),
                    it.next()?.into(),
                    it.next().unwrap_or("").into(),
                ))
            })
            .collect()
    };
    let all: Vec<(u64, String)> = nm_all(&exe, false)
        .into_iter()
        .filter(|(_, t, _)| matches!(t.as_str(), "T" | "t"))
        .map(|(n, _, a)| (u64::from_str_radix(&a, 16).unwrap(), n))
        .collect();
    let debug = dir.join("prog.debug");
    run(&["objcopy", "--only-keep-debug", s(&exe), s(&debug)]);
    run(&["strip", "--strip-all", s(&exe)]);
    run(&[
        "objcopy",
        &format!("--add-gnu-debuglink={}", s(&debug)),
        s(&exe),
    ]);
    let plain = dir.join("prog.plain");
    std::fs::copy(&exe, &plain).unwrap();
    let dynsyms: Vec<String> = nm_all(&exe, true).into_iter().map(|x| x.0).collect();
    let keep: Vec<String> = nm_all(&debug, false)
        .into_iter()
        .filter(|(_, t, _)| matches!(t.as_str(), "T" | "t" | "D"))
        .map(|x| x.0)
        .filter(|n| !dynsyms.contains(n))
        .collect();
    assert!(
        keep.iter().any(|n| n == "md_local_leaf"),
        "the locals to keep: {keep:?}"
    );
    let keep_file = dir.join("keep_symbols");
    std::fs::write(&keep_file, keep.join("\n") + "\n").unwrap();
    let mini = dir.join("mini_debuginfo");
    let _ = std::fs::remove_file(dir.join("mini_debuginfo.xz"));
    run(&[
        "objcopy",
        "-S",
        "--remove-section",
        ".gdb_index",
        "--remove-section",
        ".comment",
        &format!("--keep-symbols={}", s(&keep_file)),
        s(&debug),
        s(&mini),
    ]);
    run(&["xz", s(&mini)]);
    run(&[
        "objcopy",
        &format!("--add-section=.gnu_debugdata={}.xz", s(&mini)),
        s(&exe),
    ]);
    std::fs::remove_file(&debug).unwrap();
    (exe, plain, all)
}

/// gdb's name of each address (`info symbol`) in `exe`, at its link-time
/// addresses; `None` where gdb has none.
fn gdb_info_symbol(exe: &Path, addrs: &[u64]) -> Vec<Option<String>> {
    let mut cmd = testsupport::gdb_batch("gdb");
    for a in addrs {
        cmd.args(["-ex", &format!("info symbol {a:#x}")]);
    }
    let o = cmd.arg(exe).output().expect("run gdb");
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("No symbol matches") || l.contains(" in section "))
        .collect();
    assert_eq!(lines.len(), addrs.len(), "gdb said:\n{text}");
    lines
        .iter()
        .map(|l| {
            (!l.starts_with("No symbol")).then(|| l.split_whitespace().next().unwrap().to_string())
        })
        .collect()
}

/// Whether this machine's gdb reads MiniDebugInfo (built with lzma).
fn gdb_has_lzma() -> bool {
    Command::new("gdb")
        .arg("--configuration")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--with-lzma"))
}

/// A program stripped as Fedora strips its packages: the names of its
/// static functions come only from `.gnu_debugdata`, and each function's
/// addresses are named as gdb names them; without the
/// section, the static functions have no name (gdb's sized-symbol rule).
#[test]
fn minidebuginfo_names_local_functions_as_gdb_does() {
    for (tag, flags) in [("O0", "-O0"), ("O2", "-O2 -fno-inline")] {
        let (exe, plain, all) = fedora_minidebuginfo(tag, flags);
        let ours: Vec<(u64, String)> = all
            .iter()
            .filter(|(_, n)| n.starts_with("md_") || n == "main")
            .cloned()
            .collect();
        assert!(ours.len() >= 5, "{ours:?}");
        // Each function of the fixture (a `.cold` part included) at its
        // start, in its middle and at its second byte.
        let mut starts: Vec<u64> = all.iter().map(|x| x.0).collect();
        starts.sort();
        let mut addrs = Vec::new();
        for (a, _) in &ours {
            let next = starts.iter().copied().find(|&b| b > *a).unwrap_or(a + 16);
            addrs.extend([*a, a + (next - a) / 2, a + 1]);
        }
        let mut sym = Symbolizer::for_file(&exe).unwrap();
        let got: Vec<Option<String>> = answers(&mut sym, &addrs)
            .iter()
            .map(|x| x.function().map(String::from))
            .collect();
        let report = sym.debug_info().next().unwrap().1.clone();
        assert!(report.mini_debuginfo, "{report:?}");
        assert!(report.degraded.is_empty(), "{report:?}");
        for (i, (a, name)) in ours.iter().enumerate() {
            assert_eq!(got[3 * i].as_deref(), Some(name.as_str()), "{tag} {a:#x}");
            assert_eq!(
                got[3 * i + 2].as_deref(),
                Some(name.as_str()),
                "{tag} {a:#x}+1"
            );
        }
        if gdb_has_lzma() {
            // gdb prints a `.cold` part of `f` as `f[cold]`, a display
            // convention of its own for the symbol table's `f.cold`.
            let gdb: Vec<Option<String>> = gdb_info_symbol(&exe, &addrs)
                .into_iter()
                .map(|n| n.map(|n| n.replace("[cold]", ".cold")))
                .collect();
            assert_eq!(got, gdb, "{tag}: {addrs:x?}");
        }
        // The same program without .gnu_debugdata: the locals are unnamed.
        let mut bare = Symbolizer::for_file(&plain).unwrap();
        let leaf = ours.iter().find(|x| x.1 == "md_local_leaf").unwrap().0;
        assert_eq!(
            bare.symbolize(Address::Exact(leaf as usize)).function(),
            None,
            "{tag}"
        );
        assert!(!bare.debug_info().next().unwrap().1.mini_debuginfo);
    }
}

/// A `.gnu_debugdata` that is not an xz stream: reported as degraded, the
/// `.dynsym` names still given, no panic.
#[test]
fn corrupt_minidebuginfo_is_reported_not_fatal() {
    let (exe, _, all) = fedora_minidebuginfo("corrupt", "-O0");
    let bad = exe.with_file_name("prog.bad");
    let junk = exe.with_file_name("junk.xz");
    let mut bytes = std::fs::read(format!(
        "{}.xz",
        exe.with_file_name("mini_debuginfo").display()
    ))
    .unwrap();
    let half = bytes.len() / 2;
    bytes.truncate(half);
    std::fs::write(&junk, &bytes).unwrap();
    std::fs::copy(&exe, &bad).unwrap();
    run(&[
        "objcopy",
        &format!("--update-section=.gnu_debugdata={}", s(&junk)),
        s(&bad),
    ]);
    let mut sym = Symbolizer::for_file(&bad).unwrap();
    let middle = all.iter().find(|x| x.1 == "md_exported_middle").unwrap().0;
    assert_eq!(
        sym.symbolize(Address::Exact(middle as usize)).function(),
        Some("md_exported_middle")
    );
    let report = sym.debug_info().next().unwrap().1.clone();
    assert!(!report.mini_debuginfo);
    assert_eq!(report.degraded.len(), 1, "{report:?}");
    assert_eq!(report.degraded[0].kind, ErrorKind::BadObject);
}
