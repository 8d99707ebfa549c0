//! The PDB reader (`symbolize/pdb.rs`) against llvm-symbolizer, which reads
//! PDBs natively on Linux. The fixtures (tests/fixtures/c/pdb_chain.c and
//! pdb_names.cpp) are built by clang for x86_64-pc-windows-msvc with
//! CodeView debug info and linked by lld (the Rust toolchain's `rust-lld
//! -flavor link`) into a PE image and its PDB, as MSVC's linker writes
//! them; nothing runs them. For every instruction, our chain of (function,
//! file, line) frames, inlined ones first, must be llvm-symbolizer's.
//!
//! One spelling differs: llvm-symbolizer names a C function bare (`leaf`)
//! and a C++ one with its parameters (`ns::f(int)`); we give the
//! parameters of both (the PDB's function types do not say which language
//! wrote them). So a bare name of the oracle matches ours up to the `(`.
#![cfg(all(feature = "symbolize", feature = "pdb"))]

use callstack::symbolize::{Address, ErrorKind, NameSource, Symbolizer};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use testsupport::scratch_dir;

type Chain = Vec<(String, String, u32)>;

/// Builds `source` at `opt` into `dir/NAME.exe` and its PDB.
fn build(source: &str, opt: &str, dir: &Path, name: &str) -> PathBuf {
    testsupport::clang_pe_with_pdb(source, opt, dir, name)
}

/// Every instruction's address in the image's code.
fn instruction_addrs(exe: &Path) -> Vec<u64> {
    testsupport::llvm_instruction_addrs(exe)
}

/// llvm-symbolizer's chains (inlined frames first) for `addrs`.
fn oracle(exe: &Path, addrs: &[u64]) -> Vec<Chain> {
    let mut child = Command::new("llvm-symbolizer")
        .arg(format!("--obj={}", exe.display()))
        .arg("--inlines")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("llvm-symbolizer");
    let input: String = addrs.iter().map(|a| format!("{a:#x}\n")).collect();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        stdin.write_all(input.as_bytes()).unwrap();
    });
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let chains: Vec<Chain> = text
        .split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let lines: Vec<&str> = block.lines().collect();
            lines
                .chunks(2)
                .filter(|c| c.len() == 2 && c[0] != "??")
                .map(|c| {
                    // file:line:column
                    let mut parts = c[1].rsplitn(3, ':');
                    let _col = parts.next();
                    let line = parts.next().and_then(|l| l.parse().ok()).unwrap_or(0);
                    let file = parts.next().unwrap_or("?").to_string();
                    (c[0].to_string(), file, line)
                })
                .collect()
        })
        .collect();
    assert_eq!(
        chains.len(),
        addrs.len(),
        "llvm-symbolizer answered each address"
    );
    chains
}

fn ours(s: &mut Symbolizer, addr: u64) -> Chain {
    let r = s.symbolize(Address::Exact(addr as usize));
    r.frames
        .iter()
        .map(|f| {
            assert_eq!(f.source, NameSource::Pdb, "{addr:#x}: {r:?}");
            (
                f.function.as_deref().unwrap_or("??").to_string(),
                f.file.as_deref().unwrap_or("?").to_string(),
                f.line.unwrap_or(0),
            )
        })
        .collect()
}

fn same_name(ours: &str, oracle: &str) -> bool {
    ours == oracle
        || (!oracle.contains('(')
            && ours
                .strip_prefix(oracle)
                .is_some_and(|r| r.starts_with('(')))
}

/// Our chains against the oracle's at every instruction of `exe`; returns
/// our chains.
fn check_all(exe: &Path) -> Vec<(u64, Chain)> {
    let addrs = instruction_addrs(exe);
    assert!(addrs.len() > 10, "instructions of {}", exe.display());
    let want = oracle(exe, &addrs);
    let mut s = Symbolizer::for_file(exe).expect("open the image");
    let mut out = Vec::new();
    for (a, w) in addrs.iter().zip(&want) {
        let got = ours(&mut s, *a);
        // Padding between functions: llvm-symbolizer names the function
        // before it without a line; we give that function's last line.
        if w.len() == 1 && w[0].1 == "??" {
            assert!(
                got.len() == 1 && same_name(&got[0].0, &w[0].0),
                "{a:#x}: ours {got:?}, llvm-symbolizer {w:?}"
            );
            out.push((*a, got));
            continue;
        }
        let agree = got.len() == w.len()
            && got
                .iter()
                .zip(w)
                .all(|(g, o)| same_name(&g.0, &o.0) && g.1 == o.1 && g.2 == o.2);
        assert!(agree, "{a:#x}: ours {got:?}, llvm-symbolizer {w:?}");
        out.push((*a, got));
    }
    out
}

/// The functions (outermost frames) the chains name.
fn outer_functions(all: &[(u64, Chain)]) -> std::collections::BTreeSet<&str> {
    all.iter()
        .filter_map(|(_, c)| c.last())
        .map(|f| f.0.as_str())
        .collect()
}

fn names(chain: &Chain) -> Vec<&str> {
    chain.iter().map(|f| f.0.as_str()).collect()
}

#[test]
fn c_at_o0_and_o2_matches_llvm_symbolizer() {
    let dir = scratch_dir("pdb-c");
    for opt in ["-O0", "-O2"] {
        let exe = build("pdb_chain.c", opt, &dir.join(opt), "chain");
        let all = check_all(&exe);
        let functions = outer_functions(&all);
        for f in ["leaf(int)", "middle(int)", "outer(int, long)", "entry()"] {
            assert!(functions.contains(f), "{opt}: {f} among {functions:?}");
        }
        if opt == "-O2" {
            // The call of leaf inlined from middle_inl into middle.
            let inlined: Vec<_> = all.iter().filter(|(_, c)| c.len() > 1).collect();
            assert!(!inlined.is_empty(), "{opt}: an inlined frame somewhere");
            for (a, c) in inlined {
                assert_eq!(names(c), ["middle_inl(int)", "middle(int)"], "{a:#x}");
                assert!(c[0].1.ends_with("pdb_chain.c"), "{a:#x}: {c:?}");
            }
        }
    }
}

#[test]
fn cpp_names_match_llvm_symbolizer() {
    let dir = scratch_dir("pdb-cpp");
    let exe = build("pdb_names.cpp", "-O1", &dir, "names");
    let all = check_all(&exe);
    let functions = outer_functions(&all);
    for f in [
        "shapes::Widget::run(int)",
        "shapes::Widget::make(int, long)",
        "shapes::twice<long>(long)",
        "entry()",
    ] {
        assert!(functions.contains(f), "{f} among {functions:?}");
    }
}

/// The GUID of the image's CodeView record as a symbol store spells its
/// directory (`llvm-readobj --coff-debug-directory`): the GUID's fields as
/// numbers, then the age, in upper-case hex.
fn store_key(exe: &Path) -> String {
    let o = Command::new("llvm-readobj")
        .arg("--coff-debug-directory")
        .arg(exe)
        .output()
        .expect("llvm-readobj");
    let text = String::from_utf8_lossy(&o.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("{name} in {text}"))
    };
    let g: Vec<u8> = field("PDBGUID:")
        .trim_matches(|c| c == '(' || c == ')')
        .split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    let age: u32 = field("PDBAge:").parse().unwrap();
    let mut key = format!(
        "{:08X}{:04X}{:04X}",
        u32::from_le_bytes([g[0], g[1], g[2], g[3]]),
        u16::from_le_bytes([g[4], g[5]]),
        u16::from_le_bytes([g[6], g[7]])
    );
    for b in &g[8..] {
        key.push_str(&format!("{b:02X}"));
    }
    key + &format!("{age:X}")
}

#[test]
fn a_pdb_of_another_build_is_skipped_and_a_symbol_store_is_searched() {
    let dir = scratch_dir("pdb-find");
    let exe = build("pdb_chain.c", "-O2", &dir.join("a"), "chain");
    let key = store_key(&exe);
    // Another link of the same program: another GUID.
    let other = build("pdb_chain.c", "-O2", &dir.join("b"), "chain");
    // The image moved away from its PDB (the recorded path is gone), with
    // the other build's PDB beside it, and its own in a symbol store.
    let moved = dir.join("c");
    std::fs::create_dir_all(&moved).unwrap();
    std::fs::copy(&exe, moved.join("chain.exe")).unwrap();
    std::fs::copy(other.with_extension("pdb"), moved.join("chain.pdb")).unwrap();
    let store = dir.join("store");
    let in_store = store.join("chain.pdb").join(&key);
    std::fs::create_dir_all(&in_store).unwrap();
    std::fs::rename(exe.with_extension("pdb"), in_store.join("chain.pdb")).unwrap();
    let image = moved.join("chain.exe");
    let leaf = instruction_addrs(&image)[0];

    let mut s = Symbolizer::for_file(&image).unwrap();
    let r = s.symbolize(Address::Exact(leaf as usize)).clone();
    assert!(
        r.frames.iter().all(|f| f.source != NameSource::Pdb),
        "{r:?}"
    );
    let (_, report) = s.debug_info().next().expect("the image is open");
    assert_eq!(report.pdb, None);
    assert!(
        report
            .skipped
            .iter()
            .any(|e| e.kind == ErrorKind::BuildIdMismatch && e.path == moved.join("chain.pdb")),
        "{:?}",
        report.skipped
    );

    let mut s = Symbolizer::for_file_with_debug_dirs(&image, std::slice::from_ref(&store)).unwrap();
    let r = s.symbolize(Address::Exact(leaf as usize));
    assert_eq!(r.function(), Some("leaf(int)"), "{r:?}");
    assert_eq!(r.frames[0].source, NameSource::Pdb);
    let (_, report) = s.debug_info().next().unwrap();
    assert_eq!(report.pdb.as_deref(), Some(&*in_store.join("chain.pdb")));
}
