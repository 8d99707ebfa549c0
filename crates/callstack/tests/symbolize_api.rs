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
    // Where gcc puts `main` depends on the target's layout (x86-64:
    // 0x1000-0x2000; AArch64: after 64 KiB-aligned headers, or not).
    let main = (0x400..0x20000usize)
        .step_by(4)
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

/// `Symbolizer::tail_calls` on the fuzz seed `tailcalls_dwarf` (gcc -O2 -g
/// of this C, text at 0x1000):
///
/// ```text
/// int leaf(int x);                                   1000
/// int mid2(int x) { sink += 2; return leaf(x); }     1010: ... 101f jmp leaf
/// int mid1(int x) { sink += 1; return leaf(x*3); }   1030: ... 1042 jmp leaf
/// int split(int x) { if (x & 4) return mid1(x);      1050: ... 1056 jmp mid2
///                    return mid2(x); }                          1060 jmp mid1
/// int b(int x) { sink += 5; return split(x); }       1070: ... 107f jmp split
/// int a(int x) { int r = b(x + 1); return r + sink; } 1090: ... 1097 call b
/// void _start(void) { a(1); for (;;); }              10b0: ... 10b9 call a
/// ```
///
/// and on two corrupted copies (call targets making cycles, call targets
/// pointing out of the unit or at DIEs that are no functions).
#[test]
fn tail_calls_follow_the_call_sites() {
    let seed = |n: &str| {
        let p = testsupport::workspace_root()
            .join("fuzz/corpus/symbolize_elf")
            .join(n);
        Symbolizer::for_bytes(std::fs::read(p).unwrap()).unwrap()
    };
    let mut s = seed("tailcalls_dwarf");
    // a's call of b returns to 0x109c.
    let from_a = |s: &mut Symbolizer, callee: usize| s.tail_calls(0x109c, Address::Exact(callee));
    // One chain to split and to mid2: every jump, innermost first.
    assert_eq!(from_a(&mut s, 0x1055), vec![0x1081]);
    assert_eq!(from_a(&mut s, 0x1015), vec![0x1058, 0x1081]);
    // Two chains to leaf (through mid1 or mid2): only b's jump is common.
    assert_eq!(from_a(&mut s, 0x1005), vec![0x1081]);
    // A return address in leaf (the callee's own frame was a call).
    assert_eq!(s.tail_calls(0x109c, Address::Return(0x1006)), vec![0x1081]);
    // The call's target itself, and a caller that is not at a call site.
    assert_eq!(from_a(&mut s, 0x1075), Vec::<usize>::new());
    assert_eq!(
        s.tail_calls(0x10be, Address::Exact(0x1095)),
        Vec::<usize>::new()
    );
    assert_eq!(
        s.tail_calls(0x109b, Address::Exact(0x1005)),
        Vec::<usize>::new()
    );
    // Each tail-call frame is named at its jump.
    assert_eq!(s.symbolize(Address::Return(0x1081)).function(), Some("b"));

    // mid1 -> b and mid2 -> split: leaf is out of reach; mid1 is reached
    // directly from split or through mid2 and split again.
    let mut s = seed("tailcalls_cycles");
    assert_eq!(from_a(&mut s, 0x1005), Vec::<usize>::new());
    assert_eq!(from_a(&mut s, 0x1035), vec![0x1062, 0x1081]);
    // Bad references: no frames, no panic.
    let mut s = seed("tailcalls_badrefs");
    for callee in [0x1005, 0x1015, 0x1035, 0x1055, 0x1075] {
        assert_eq!(from_a(&mut s, callee), Vec::<usize>::new());
    }
}

/// An untyped symbol in code (an assembly label without `.type`, such as
/// the dynamic loader's `_start`) names its code, as gdb's `info symbol`
/// and binutils do; a data label does not name anything.
#[test]
fn untyped_labels_in_code_are_named_like_gdb() {
    let dir = scratch_dir("sym-notype");
    let src = dir.join("notype.c");
    std::fs::write(
        &src,
        "__asm__(\".text\\n.globl entry_label\\nentry_label:\\n call target_fn\\n nop\\n ret\\n\
         .data\\ndata_label:\\n .quad 0\\n\");\n\
         __attribute__((noinline)) int target_fn(void) { return 1; }\n",
    )
    .unwrap();
    let so = dir.join("notype.so");
    let ok = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(&src)
        .status()
        .unwrap()
        .success();
    assert!(ok, "gcc builds the fixture");
    let nm = std::process::Command::new("nm").arg(&so).output().unwrap();
    let nm = String::from_utf8_lossy(&nm.stdout);
    let addr = |name: &str| {
        nm.lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .and_then(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
            .unwrap_or_else(|| panic!("{name} in nm's output:\n{nm}"))
    };
    let entry = addr("entry_label");
    let readelf = std::process::Command::new("readelf")
        .args(["-sW"])
        .arg(&so)
        .output()
        .unwrap();
    let readelf = String::from_utf8_lossy(&readelf.stdout);
    assert!(
        readelf
            .lines()
            .any(|l| l.contains("NOTYPE") && l.ends_with(" entry_label")),
        "the label is untyped:\n{readelf}"
    );
    // The return address of `call target_fn` (5 bytes), inside the label.
    let ra = entry + 5;
    let gdb = std::process::Command::new("gdb")
        .args(["-nx", "-batch", "-ex"])
        .arg(format!("info symbol {ra:#x}"))
        .arg(&so)
        .output()
        .unwrap();
    let gdb = String::from_utf8_lossy(&gdb.stdout);
    assert!(
        gdb.starts_with("entry_label + 5 in section .text"),
        "gdb: {gdb}"
    );
    let mut s = Symbolizer::for_file(&so).unwrap();
    let r = s.symbolize(Address::Exact(ra as usize)).clone();
    assert_eq!(
        r.frames.last().and_then(|f| f.function.as_deref()),
        Some("entry_label"),
        "{r}"
    );
    let data = addr("data_label");
    let r = s.symbolize(Address::Exact(data as usize)).clone();
    assert!(
        r.frames
            .iter()
            .all(|f| f.function.as_deref() != Some("data_label")),
        "{r}"
    );
}
