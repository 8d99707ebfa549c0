//! A PE image's export table as the names of last resort: a DLL built by
//! mingw-w64 (tests/fixtures/c/win_exports.c) and stripped of its COFF
//! symbols and debug info names its exported functions by their exports,
//! and a static function between two exports by its exported predecessor,
//! as an ELF library's `.dynsym` names them. Where each function starts
//! comes from the unstripped DLL's symbols (`x86_64-w64-mingw32-nm`): the
//! strip keeps every address.
#![cfg(feature = "symbolize")]

use callstack::symbolize::{Address, NameSource, Symbolizer};
use std::collections::HashMap;
use std::process::Command;
use testsupport::{c_fixtures, scratch_dir};

#[test]
fn a_stripped_dll_is_named_by_its_exports() {
    let dir = scratch_dir("pe-exports");
    let dll = dir.join("win_exports.dll");
    let st = Command::new("x86_64-w64-mingw32-gcc")
        .args(["-O0", "-shared", "-g"])
        .arg(c_fixtures().join("win_exports.c"))
        .arg("-o")
        .arg(&dll)
        .status()
        .expect("x86_64-w64-mingw32-gcc (scripts/install-test-deps.sh installs it)");
    assert!(st.success());
    let stripped = dir.join("stripped.dll");
    let st = Command::new("x86_64-w64-mingw32-strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&dll)
        .status()
        .expect("x86_64-w64-mingw32-strip");
    assert!(st.success());

    let nm = Command::new("x86_64-w64-mingw32-nm")
        .arg(&dll)
        .output()
        .unwrap();
    let starts: HashMap<String, u64> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (a, _, name) = (w.next()?, w.next()?, w.next()?);
            Some((name.to_string(), u64::from_str_radix(a, 16).ok()?))
        })
        .collect();
    let at = |name: &str| {
        *starts
            .get(name)
            .unwrap_or_else(|| panic!("{name} in the DLL's symbols: {starts:?}"))
    };
    let (first, helper, second) = (at("first_export"), at("hidden_helper"), at("second_export"));
    assert!(first < helper && helper < second, "the fixture's layout");

    let mut s = Symbolizer::for_file(&stripped).unwrap();
    for (addr, want) in [
        (first, "first_export"),
        (first + 2, "first_export"),
        (second, "second_export"),
        (second + 3, "second_export"),
        // No export covers the static function: its predecessor's name.
        (helper + 1, "first_export"),
    ] {
        let r = s.symbolize(Address::Exact(addr as usize));
        assert_eq!(r.function(), Some(want), "{addr:#x}: {r:?}");
        assert_eq!(r.frames[0].source, NameSource::Dynsym, "{addr:#x}: {r:?}");
        assert_eq!(r.frames[0].line, None, "{addr:#x}: {r:?}");
    }

    // Unstripped, the DLL's own symbols and DWARF name the static function.
    let mut s = Symbolizer::for_file(&dll).unwrap();
    let r = s.symbolize(Address::Exact(helper as usize + 1));
    assert_eq!(r.function(), Some("hidden_helper"), "{r:?}");
}
