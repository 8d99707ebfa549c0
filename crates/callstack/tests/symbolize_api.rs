//! The Symbolizer's own API: in-process lookups against `file!()`/`line!()`,
//! return addresses vs exact pcs, offline module lists, and bad input
//! (truncated ELF, garbage DWARF, addresses outside every module).
#![cfg(feature = "symbolize")]

use callstack::symbolize::{Address, ErrorKind, ModuleInfo, Symbolizer};
use std::hint::black_box;
use testsupport::{scratch_dir, Gcc};

#[inline(never)]
fn capture_here(out: &mut [usize]) -> (usize, u32) {
    let line = line!() + 1;
    let n = callstack::capture_fast(0, out);
    (n, line)
}

#[inline(never)]
fn caller_of_capture() -> (usize, u32, usize) {
    let mut out = [0usize; 16];
    let line = line!() + 1;
    let (n, _) = black_box(capture_here(&mut out));
    assert!(n >= 2);
    (out[1], line, out[0])
}

#[test]
fn return_address_resolves_to_the_call_line() {
    let (ra, line, _) = caller_of_capture();
    let mut s = Symbolizer::new();
    let r = s.symbolize(Address::Return(ra)).clone();
    let f = r.frames.last().unwrap();
    assert_eq!(
        f.function.as_deref(),
        Some("symbolize_api::caller_of_capture")
    );
    assert!(
        f.file.as_deref().unwrap().ends_with("symbolize_api.rs"),
        "{r}"
    );
    assert_eq!(f.line, Some(line), "{r}");
    let m = r.module.as_ref().unwrap();
    assert_eq!(
        m.path,
        std::env::current_exe().unwrap().canonicalize().unwrap()
    );
    assert!(m.build_id.is_some());
    assert_eq!(r.offset as usize, ra - 1 - m.bias.unwrap());
    // Cached: the same answer, and the cache holds it.
    let again = s.symbolize(Address::Return(ra)).clone();
    assert_eq!(again, r);
    assert!(s.cached() >= 1);
    // The return address itself, taken as exact, is the next instruction:
    // still in the same function here, and the API keeps the two apart.
    let exact = s.symbolize(Address::Exact(ra)).clone();
    assert_eq!(exact.offset, r.offset + 1);
}

#[test]
fn offline_module_list_gives_the_same_answers() {
    let (ra, line, _) = caller_of_capture();
    // Describe this process the way a core file or a trace would: path,
    // build-id, where it was loaded, no bias (derived from the file).
    let mods = callstack::modules::loaded_modules();
    let infos: Vec<ModuleInfo> = mods
        .iter()
        .filter(|m| !m.is_vdso)
        .map(|m| {
            let (start, end) = m.range();
            ModuleInfo {
                path: m.path.clone(),
                build_id: m.build_id.clone(),
                start,
                end,
                bias: None,
            }
        })
        .collect();
    let mut s = Symbolizer::from_modules(infos);
    let r = s.symbolize(Address::Return(ra));
    assert_eq!(r.frames.last().unwrap().line, Some(line), "{r}");
    assert_eq!(r.function(), Some("symbolize_api::caller_of_capture"));
}

#[test]
fn address_outside_every_module_is_unknown() {
    let mut s = Symbolizer::new();
    for a in [0usize, 8, 0x1000, usize::MAX, usize::MAX / 2] {
        let r = s.symbolize(Address::Return(a));
        assert!(r.frames.is_empty(), "{r:?}");
        assert!(r.module.is_none());
        let _ = r.to_string();
    }
    let mut s = Symbolizer::from_modules(Vec::new());
    assert!(s.symbolize(Address::Exact(0x401000)).frames.is_empty());
}

#[test]
fn missing_and_truncated_files_are_errors() {
    let e = Symbolizer::for_file("/no/such/file").err().unwrap();
    assert_eq!(e.kind, ErrorKind::Io);
    let dir = scratch_dir("symbolize-bad");
    let exe = Gcc::new(&["sym_inline.c"])
        .flags("-O2")
        .build(&dir.join("sym_inline_bad"));
    let bytes = std::fs::read(&exe).unwrap();
    for cut in [0, 3, 16, 63, 64, 100, 1000, bytes.len() / 2] {
        let p = dir.join(format!("truncated_{cut}"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        match Symbolizer::for_file(&p) {
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::BadObject, "{e}");
                assert!(e.to_string().contains("truncated_"), "{e}");
            }
            // Cut after the headers: opens, and every lookup is safe.
            Ok(mut s) => {
                for a in (0..0x3000).step_by(7) {
                    let _ = s.symbolize(Address::Exact(a));
                }
            }
        }
    }
    // A module list pointing at a bad file: unknown frames, error listed.
    let p = dir.join("truncated_100");
    let mut s = Symbolizer::from_modules([ModuleInfo {
        path: p,
        build_id: None,
        start: 0x1000,
        end: 0x9000,
        bias: Some(0),
    }]);
    let r = s.symbolize(Address::Exact(0x1234));
    assert!(r.frames.is_empty());
    assert_eq!(r.offset, 0x1234);
    assert_eq!(s.module_errors().count(), 1);
}

/// Overwrites the contents of `section` of an ELF file with pseudo-random
/// bytes (keeping the headers valid).
fn scramble_section(bytes: &mut [u8], section: &str, seed: u64) {
    use object::{Object, ObjectSection};
    let (off, size) = {
        let f = object::File::parse(&*bytes).unwrap();
        let s = f.section_by_name(section).unwrap();
        let (o, sz) = s.file_range().unwrap();
        (o as usize, sz as usize)
    };
    let mut x = seed | 1;
    for b in &mut bytes[off..off + size] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

#[test]
fn garbage_dwarf_never_panics() {
    let dir = scratch_dir("symbolize-bad");
    let exe = Gcc::new(&["sym_inline.c"])
        .flags("-O2")
        .build(&dir.join("sym_inline_garbage"));
    let clean = std::fs::read(&exe).unwrap();
    let mut probes = Symbolizer::for_file(&exe).unwrap();
    let main = (0x1000..0x2000usize)
        .find(|&a| probes.symbolize(Address::Exact(a)).function() == Some("main"))
        .unwrap();
    for (i, sec) in [
        ".debug_info",
        ".debug_abbrev",
        ".debug_line",
        ".debug_str",
        ".debug_rnglists",
        ".debug_loclists",
        ".debug_aranges",
        ".debug_line_str",
    ]
    .iter()
    .enumerate()
    {
        for seed in 1..4u64 {
            let mut bytes = clean.clone();
            scramble_section(&mut bytes, sec, seed * 7919 + i as u64);
            let p = dir.join(format!("garbage_{i}_{seed}"));
            std::fs::write(&p, &bytes).unwrap();
            let mut s = Symbolizer::for_file(&p).unwrap();
            for a in (0x1000..0x1400).step_by(3) {
                let _ = s.symbolize(Address::Exact(a));
            }
            // The symbol table still names main.
            if *sec != ".debug_info" && *sec != ".debug_abbrev" && *sec != ".debug_str" {
                continue;
            }
            let r = s.symbolize(Address::Exact(main));
            assert!(r.function().is_some() || r.frames.is_empty(), "{r:?}");
        }
    }
}
