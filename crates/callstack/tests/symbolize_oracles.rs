//! The Symbolizer against binutils `addr2line -f -i -C` and
//! `llvm-symbolizer`: for every instruction of the fixtures' own functions,
//! in several build modes, our chain of (function, file, line) frames,
//! innermost first, must equal the oracles' wherever the two agree.
//!
//! Normalizations, each because the oracles differ in spelling only:
//! - discriminators (`file:12 (discriminator 3)`) are dropped (the library
//!   reports them only on request; `callstack addr2line` prints them, see
//!   crates/callstack-cli/tests/addr2line.rs);
//! - llvm-symbolizer 14 keeps the hash of legacy Rust names
//!   (`sym_rust::main::h0123456789abcdef`) and their `$LT$`-style escapes:
//!   the `::h<16 hex>` suffix is cut and the escapes decoded;
//! - an unknown line (`?` or `0`) is line 0;
//! - C++ only: a few names cpp_demangle cannot demangle (libiberty can) stay
//!   mangled on our side (`cpp_o2_matches_oracles` allows at most 10%).
//!
//! Known difference of `addr2line` without `-C`, not tested: for an inlined
//! C++ function with no linkage name (anonymous namespace) binutils prints
//! the enclosing function's mangled name; we print the function's name.
#![cfg(feature = "symbolize")]

use callstack::symbolize::{Address, Symbolizer};
use std::path::{Path, PathBuf};
use std::process::Command;
use testsupport::{c_fixtures, scratch_dir, workspace_root, Gcc};

type Chain = Vec<(String, String, u32)>;

/// Instruction addresses of the functions whose symbol starts with one of
/// `prefixes` (from `objdump -d`).
fn instruction_addrs(exe: &Path, prefixes: &[&str]) -> Vec<u64> {
    let o = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(exe)
        .output()
        .expect("objdump");
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if let Some(rest) = line.split_once(" <").map(|x| x.1) {
            if line.ends_with(">:") {
                inside = !rest.contains("@plt") && prefixes.iter().any(|p| rest.starts_with(p));
                continue;
            }
        }
        if line.is_empty() {
            inside = false;
            continue;
        }
        if inside {
            if let Some((a, _)) = line.trim_start().split_once(':') {
                if let Ok(v) = u64::from_str_radix(a, 16) {
                    out.push(v);
                }
            }
        }
    }
    out
}

/// llvm-symbolizer 14 prints legacy Rust names as plain Itanium ones:
/// with the hash, and with `$LT$`-style escapes undecoded.
fn strip_rust_hash(name: &str) -> String {
    let mut name = name.to_string();
    if name.contains('$') {
        for (from, to) in [
            ("$LT$", "<"),
            ("$GT$", ">"),
            ("$C$", ","),
            ("$RF$", "&"),
            ("$BP$", "*"),
            ("$SP$", "@"),
            ("$u20$", " "),
            ("$u27$", "'"),
            ("$u5b$", "["),
            ("$u5d$", "]"),
            ("$u7b$", "{"),
            ("$u7d$", "}"),
            ("$u7e$", "~"),
            ("$u3b$", ";"),
            ("$u2b$", "+"),
            ("$u22$", "\""),
        ] {
            name = name.replace(from, to);
        }
        name = name.replace("..", "::").replace("::_<", "::<");
        if let Some(rest) = name.strip_prefix("_<") {
            name = format!("<{rest}");
        }
    }
    let name = name.as_str();
    let b = name.as_bytes();
    if b.len() > 19 && name[..b.len() - 16].ends_with("::h") {
        let tail = &name[b.len() - 16..];
        if tail.bytes().all(|c| c.is_ascii_hexdigit()) {
            return name[..b.len() - 19].to_string();
        }
    }
    name.to_string()
}

/// Parses GNU-style output (`-a -f -i`): an address line, then pairs of
/// function / file:line lines.
fn parse_gnu(text: &str) -> Vec<Chain> {
    let mut out: Vec<Chain> = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if l.starts_with("0x") && !l.contains(':') {
            out.push(Vec::new());
            continue;
        }
        let func = strip_rust_hash(l);
        let loc = lines.next().unwrap_or("??:0");
        let loc = loc.split(" (discriminator").next().unwrap();
        let (file, line) = loc.rsplit_once(':').unwrap_or((loc, "0"));
        let line = line.parse().unwrap_or(0);
        out.last_mut()
            .expect("address line first")
            .push((func, file.to_string(), line));
    }
    out
}

fn binutils(exe: &Path, addrs: &[u64]) -> Vec<Chain> {
    let o = Command::new("addr2line")
        .args(["-a", "-f", "-i", "-C", "-e"])
        .arg(exe)
        .args(addrs.iter().map(|a| format!("{a:#x}")))
        .output()
        .expect("addr2line");
    parse_gnu(&String::from_utf8_lossy(&o.stdout))
}

fn llvm(exe: &Path, addrs: &[u64]) -> Option<Vec<Chain>> {
    let o = Command::new("llvm-symbolizer")
        .args(["--output-style=GNU", "-a", "-f", "-i", "-C"])
        .arg(format!("--obj={}", exe.display()))
        .args(addrs.iter().map(|a| format!("{a:#x}")))
        .output()
        .ok()?;
    Some(parse_gnu(&String::from_utf8_lossy(&o.stdout)))
}

fn ours(exe: &Path, addrs: &[u64]) -> Vec<Chain> {
    let mut s = Symbolizer::for_file(exe).expect("open fixture");
    // Compared with binutils: name addresses as it does (a symbol reaches
    // up to the next one); the default is gdb's rule.
    s.set_symbol_extent(callstack::symbolize::SymbolExtent::Section);
    addrs
        .iter()
        .map(|&a| {
            let r = s.symbolize(Address::Exact(a as usize));
            if r.frames.is_empty() {
                return vec![("??".into(), "??".into(), 0)];
            }
            r.frames
                .iter()
                .map(|f| {
                    (
                        f.function.as_deref().unwrap_or("??").to_string(),
                        f.file.as_deref().unwrap_or("??").to_string(),
                        f.line.unwrap_or(0),
                    )
                })
                .collect()
        })
        .collect()
}

/// Compares on every address; returns how many addresses the two oracles
/// agreed on (all of which we matched).
fn check(exe: &Path, prefixes: &[&str], min_addrs: usize) -> usize {
    check_with(exe, prefixes, min_addrs, false).0
}

/// [`check`]; with `tolerate_mangled`, a frame whose name we left mangled
/// (cpp_demangle gives up on some expression templates that libiberty
/// demangles, e.g. `std::__fill_a1<int*, int>` with its `enable_if` return
/// type) counts as a match of the same frame; returns (agreed, tolerated).
fn check_with(
    exe: &Path,
    prefixes: &[&str],
    min_addrs: usize,
    tolerate_mangled: bool,
) -> (usize, usize) {
    let addrs = instruction_addrs(exe, prefixes);
    assert!(
        addrs.len() >= min_addrs,
        "{}: only {} addresses",
        exe.display(),
        addrs.len()
    );
    let b = binutils(exe, &addrs);
    let l = llvm(exe, &addrs).expect("llvm-symbolizer");
    let o = ours(exe, &addrs);
    assert_eq!(b.len(), addrs.len());
    assert_eq!(l.len(), addrs.len());
    let mut agreed = 0;
    let mut tolerated = 0;
    let mut mismatches = Vec::new();
    for i in 0..addrs.len() {
        if b[i] == l[i] {
            agreed += 1;
            let same_but_mangled = tolerate_mangled
                && o[i].len() == b[i].len()
                && o[i].iter().zip(&b[i]).all(|(x, y)| {
                    (x.1 == y.1 && x.2 == y.2) && (x.0 == y.0 || x.0.starts_with("_Z"))
                });
            if o[i] != b[i] && same_but_mangled {
                tolerated += 1;
            } else if o[i] != b[i] {
                mismatches.push(format!(
                    "{:#x}: ours {:?}\n   oracles {:?}",
                    addrs[i], o[i], b[i]
                ));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{}: {} of {} addresses differ, first:\n{}",
        exe.display(),
        mismatches.len(),
        agreed,
        mismatches[..mismatches.len().min(5)].join("\n")
    );
    (agreed, tolerated)
}

fn build(tag: &str, flags: &str) -> PathBuf {
    let dir = scratch_dir("symbolize-oracles");
    Gcc::new(&["sym_inline.c"])
        .flags(flags)
        .build(&dir.join(format!("sym_inline_{tag}")))
}

const C_FUNCS: &[&str] = &["sym_", "main>"];

#[test]
fn c_o2_inlined_matches_oracles() {
    let exe = build("o2", "-O2");
    let agreed = check(&exe, C_FUNCS, 150);
    assert!(agreed >= 150, "oracles agreed on {agreed}");
}

#[test]
fn c_o0_matches_oracles() {
    let exe = build("o0", "-O0");
    assert!(check(&exe, C_FUNCS, 250) >= 250);
}

#[test]
fn c_dwarf4_matches_oracles() {
    let exe = build("dwarf4", "-O2 -gdwarf-4");
    assert!(check(&exe, C_FUNCS, 150) >= 150);
}

#[test]
fn c_compressed_debug_sections_match_oracles() {
    let exe = build("gz", "-O2 -gz");
    let sections = Command::new("readelf")
        .arg("-S")
        .arg(&exe)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&sections.stdout);
    let info = text
        .lines()
        .zip(text.lines().skip(1))
        .find(|(l, _)| l.contains(".debug_info"))
        .expect("has .debug_info");
    assert!(
        info.1.contains('C'),
        "expected SHF_COMPRESSED .debug_info:\n{}\n{}",
        info.0,
        info.1
    );
    assert!(check(&exe, C_FUNCS, 150) >= 150);
}

#[test]
fn c_split_debug_via_debuglink_matches_oracles() {
    let exe = build("split", "-O2");
    let dbg = exe.with_extension("debug");
    let run = |args: &[&str]| {
        let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let (e, d) = (exe.to_str().unwrap(), dbg.to_str().unwrap());
    run(&["objcopy", "--only-keep-debug", e, d]);
    run(&["strip", "--strip-all", e]);
    run(&["objcopy", &format!("--add-gnu-debuglink={d}"), e]);
    // The stripped file has neither DWARF nor .symtab: every name below
    // comes from the debug file.
    let mut s = Symbolizer::for_file(&exe).unwrap();
    // objdump finds no functions in the stripped file: take the addresses
    // from an identical unstripped build (gcc is deterministic).
    let addrs = instruction_addrs(&build("split_ref", "-O2"), C_FUNCS);
    let r = s.symbolize(Address::Exact(addrs[0] as usize));
    assert!(r.function().is_some(), "{r:?}");
    let b = binutils(&exe, &addrs);
    let l = llvm(&exe, &addrs).unwrap();
    let o = ours(&exe, &addrs);
    let mut agreed = 0;
    for i in 0..addrs.len() {
        if b[i] == l[i] {
            agreed += 1;
            assert_eq!(o[i], b[i], "{:#x}", addrs[i]);
        }
    }
    assert!(agreed >= 150, "oracles agreed on {agreed}");
}

#[test]
fn c_stripped_binary_names_what_tables_name() {
    // Fully stripped: no DWARF, no .symtab; .dynsym names only imports, so
    // the fixture's functions are unknown (module + offset), as for the
    // oracles.
    let exe = build("stripped", "-O2");
    let o = Command::new("strip")
        .arg("--strip-all")
        .arg(&exe)
        .status()
        .unwrap();
    assert!(o.success());
    // objdump has no symbols left: take the addresses from an identical
    // unstripped build.
    let reference = build("stripped_ref", "-O2");
    let addrs = instruction_addrs(&reference, C_FUNCS);
    let mut s = Symbolizer::for_file(&exe).unwrap();
    for &a in &addrs {
        let r = s.symbolize(Address::Exact(a as usize));
        assert!(r.frames.is_empty(), "{a:#x}: {r:?}");
        assert_eq!(r.offset, a);
    }
    let b = binutils(&exe, &addrs);
    assert!(b
        .iter()
        .all(|c| c == &vec![("??".to_string(), "??".to_string(), 0)]));
}

#[test]
fn stripped_shared_library_names_come_from_dynsym() {
    let dir = scratch_dir("symbolize-oracles");
    let so = Gcc::new(&["sym_lib.c"])
        .flags("-O2 -fPIC -shared")
        .build(&dir.join("libsym_lib_stripped.so"));
    let reference = Gcc::new(&["sym_lib.c"])
        .flags("-O2 -fPIC -shared")
        .build(&dir.join("libsym_lib_ref.so"));
    assert!(Command::new("strip")
        .arg("--strip-all")
        .arg(&so)
        .status()
        .unwrap()
        .success());
    let addrs = instruction_addrs(&reference, &["sym_lib_"]);
    assert!(addrs.len() > 8, "{addrs:?}");
    let b = binutils(&so, &addrs);
    let o = ours(&so, &addrs);
    // Function names only (no lines without DWARF): both say ??:0 / ??:?
    // for the file, which we report as unknown.
    for i in 0..addrs.len() {
        assert_eq!(o[i][0].0, b[i][0].0, "{:#x}", addrs[i]);
    }
    let mut s = Symbolizer::for_file(&so).unwrap();
    let exported = addrs
        .iter()
        .map(|&a| {
            s.symbolize(Address::Exact(a as usize))
                .function()
                .map(str::to_string)
        })
        .collect::<Vec<_>>();
    assert!(exported
        .iter()
        .any(|n| n.as_deref() == Some("sym_lib_twice")));
    assert!(exported
        .iter()
        .any(|n| n.as_deref() == Some("sym_lib_exported")));
    let first = instruction_addrs(&reference, &["sym_lib_exported"])[0];
    let r = s.symbolize(Address::Exact(first as usize)).clone();
    assert_eq!(r.frames[0].source, callstack::symbolize::NameSource::Dynsym);
    // By default (gdb's rule) an address past a sized symbol's end has no
    // name: the stripped `static sym_lib_hidden` is not named after a
    // function around it.
    let hidden = instruction_addrs(&reference, &["sym_lib_hidden"]);
    assert!(!hidden.is_empty());
    for &a in &hidden {
        let r = s.symbolize(Address::Exact(a as usize));
        assert_eq!(r.function(), None, "{a:#x}: {r:?}");
    }
}

fn rustc(tag: &str, flags: &str) -> PathBuf {
    let dir = scratch_dir("symbolize-oracles");
    let out = dir.join(format!("sym_rust_{tag}"));
    let src = workspace_root().join("tests/fixtures/rust/sym_rust.rs");
    let o = Command::new("rustc")
        .args(flags.split_whitespace())
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("rustc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

#[test]
fn rust_o2_and_o0_match_oracles() {
    for (tag, flags) in [("o2", "-g -C opt-level=2"), ("o0", "-g -C opt-level=0")] {
        let exe = rustc(tag, flags);
        let agreed = check(&exe, &["_ZN8sym_rust"], 100);
        assert!(agreed >= 100, "{tag}: oracles agreed on {agreed}");
        // And we equal binutils everywhere (llvm differs only by hashes,
        // which the normalization removes).
        let addrs = instruction_addrs(&exe, &["_ZN8sym_rust"]);
        assert_eq!(ours(&exe, &addrs), binutils(&exe, &addrs), "{tag}");
    }
}

#[test]
fn fixtures_dir_exists() {
    assert!(c_fixtures().join("sym_inline.c").is_file());
}

#[test]
fn cpp_o2_matches_oracles() {
    let dir = scratch_dir("symbolize-oracles");
    let exe = dir.join("sym_cpp_o2");
    let o = Command::new("g++")
        .args(["-O2", "-g"])
        .arg(c_fixtures().join("sym_cpp.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("g++");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (agreed, tolerated) = check_with(&exe, &["_ZN6symcpp", "_ZNK6symcpp", "main>"], 80, true);
    assert!(agreed >= 80, "oracles agreed on {agreed}");
    assert!(
        tolerated * 10 <= agreed,
        "{tolerated} of {agreed} left mangled"
    );
    // Namespaces, templates and overloads come out demangled as binutils
    // prints them.
    let mut s = Symbolizer::for_file(&exe).unwrap();
    let names: std::collections::BTreeSet<String> =
        instruction_addrs(&exe, &["_ZN6symcpp", "_ZNK6symcpp"])
            .iter()
            .filter_map(|&a| {
                s.symbolize(Address::Exact(a as usize))
                    .function()
                    .map(str::to_string)
            })
            .collect();
    for want in [
        "symcpp::total(std::vector<int, std::allocator<int> > const&)",
        "symcpp::total(std::vector<double, std::allocator<double> > const&)",
        "symcpp::Box<int>::get(int) const",
        "symcpp::Box<double>::get(int) const",
    ] {
        assert!(names.contains(want), "{want} not in {names:?}");
    }
}
