//! The C capture against gdb, frame by frame.
//!
//! `tests/fixtures/c/chain.c` runs main -> a -> (function pointer) b x21
//! (recursion 20 deep) -> c -> d and captures inside `d` with
//! `callstack_capture_fast`. Built with gcc at -O0 and -O2 with
//! `-fno-omit-frame-pointer`, linked to `libcallstack.a`.
//!
//! Two oracles:
//! - gdb, stopped at a breakpoint on `d` in the same process (gdb disables
//!   ASLR, so the addresses the program prints are gdb's): every captured
//!   return address above frame 0 equals the pc gdb prints for that frame,
//!   and the chain ends exactly at `__libc_start_call_main`, glibc's first
//!   frame without a frame pointer.
//! - binutils addr2line on each address (module-relative, `ra - 1`), run on
//!   a normal (ASLR) execution: the function names equal gdb's `bt`.
use std::path::{Path, PathBuf};
use std::process::Command;
use testsupport::{addr2line_functions, gdb_run, parse_gdb_bt_frames, scratch_dir, Gcc};

/// The last frame the frame-pointer walk can reach in a C program: glibc
/// builds it without a frame pointer.
const LAST: &str = "__libc_start_call_main";

#[derive(Debug)]
struct Frame {
    ra: u64,
    module_base: u64,
    module: String,
}

/// Builds the fixture at `opt` into a file of its own per `test`: tests run
/// in parallel, and one must not read (run, gdb, addr2line) an executable
/// another is rewriting.
fn build(test: &str, opt: &str) -> PathBuf {
    let dir = scratch_dir("c_chain");
    Gcc::new(&["chain.c"])
        .flags(&format!("{opt} -fno-omit-frame-pointer"))
        .link_callstack()
        .build(&dir.join(format!("chain{opt}-{test}")))
}

fn parse_frames(text: &str) -> Vec<Frame> {
    text.lines()
        .filter_map(|l| l.strip_prefix("frame "))
        .map(|l| {
            let mut it = l.splitn(3, ' ');
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            Frame {
                ra: hex(it.next().unwrap()),
                module_base: hex(it.next().unwrap()),
                module: it.next().unwrap().to_string(),
            }
        })
        .collect()
}

/// Function names of captured return addresses, by addr2line on each one's
/// module at `ra - 1 - load base`: one addr2line run per module (the
/// fixture links libcallstack.a, whose debug info addr2line reads anew on
/// every run).
fn symbolize(exe: &Path, frames: &[Frame]) -> Vec<String> {
    let mut by_module: Vec<(PathBuf, Vec<(usize, u64)>)> = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        assert_ne!(
            f.module, "?",
            "captured address {:#x} is in no module",
            f.ra
        );
        let path = if f.module_base != 0 && Path::new(&f.module).exists() {
            PathBuf::from(&f.module)
        } else {
            exe.to_path_buf()
        };
        let off = f.ra - 1 - f.module_base;
        match by_module.iter_mut().find(|(p, _)| *p == path) {
            Some((_, offs)) => offs.push((i, off)),
            None => by_module.push((path, vec![(i, off)])),
        }
    }
    let mut names = vec![String::new(); frames.len()];
    for (path, offs) in by_module {
        let only: Vec<u64> = offs.iter().map(|&(_, o)| o).collect();
        for ((i, _), name) in offs.iter().zip(addr2line_functions(&path, &only)) {
            names[*i] = name;
        }
    }
    names
}

/// gdb's `bt` at a breakpoint on `d`, with `past-main` on, cut after
/// `__libc_start_call_main`; and the frames the program printed in that run.
fn gdb_truth(exe: &Path, args: &[&str]) -> (Vec<testsupport::GdbFrame>, Vec<Frame>) {
    let text = gdb_run(
        exe,
        args,
        &[
            "set backtrace past-main on",
            "break d",
            "run",
            "bt",
            "continue",
        ],
    );
    let mut bt = parse_gdb_bt_frames(&text);
    let last = bt
        .iter()
        .position(|f| f.function == LAST)
        .unwrap_or_else(|| panic!("gdb bt has no {LAST}:\n{text}"));
    bt.truncate(last + 1);
    assert_eq!(bt[0].function, "d", "gdb did not stop in d:\n{text}");
    (bt, parse_frames(&text))
}

fn run(exe: &Path, args: &[&str]) -> Vec<Frame> {
    let o = Command::new(exe).args(args).output().unwrap();
    assert!(o.status.success(), "{exe:?} failed: {o:?}");
    parse_frames(&String::from_utf8_lossy(&o.stdout))
}

fn check_chain(opt: &str) {
    let exe = build("gdb", opt);
    let (bt, in_gdb) = gdb_truth(&exe, &[]);
    let names: Vec<&str> = bt.iter().map(|f| f.function.as_str()).collect();
    // The chain the fixture promises, as gdb sees it.
    let mut expected = vec!["d", "c"];
    expected.extend(std::iter::repeat_n("b", 21));
    expected.extend(["a", "main", LAST]);
    assert_eq!(
        names, expected,
        "gdb's bt is not the fixture's chain ({opt})"
    );

    // Same process as gdb: raw return addresses equal gdb's pcs, frame by frame.
    assert_eq!(
        in_gdb.len(),
        bt.len(),
        "{opt}: {in_gdb:#x?}\nvs gdb {bt:#x?}"
    );
    for (i, (f, g)) in in_gdb.iter().zip(&bt).enumerate().skip(1) {
        assert_eq!(Some(f.ra), g.pc, "{opt}: frame #{i} ({})", g.function);
    }

    // A normal run (ASLR on), symbolized with addr2line.
    let frames = run(&exe, &[]);
    assert_eq!(symbolize(&exe, &frames), names, "{opt}: {frames:#x?}");
}

#[test]
fn capture_equals_gdb_bt_at_o0() {
    check_chain("-O0");
}

#[test]
fn capture_equals_gdb_bt_at_o2() {
    check_chain("-O2");
}

#[test]
fn skip_and_max_follow_the_contract_in_c() {
    let exe = build("skip", "-O2");
    let all = symbolize(&exe, &run(&exe, &[]));
    assert_eq!(all.len(), 26, "{all:?}");
    // skip=3 drops d, c and the innermost b.
    let skipped = symbolize(&exe, &run(&exe, &["skip=3"]));
    assert_eq!(skipped, all[3..]);
    // max=5 keeps the innermost 5.
    let short = symbolize(&exe, &run(&exe, &["max=5"]));
    assert_eq!(short, all[..5]);
    // Both: count = min(max, available - skip).
    let both = symbolize(&exe, &run(&exe, &["skip=24", "max=10"]));
    assert_eq!(both, all[24..]);
    // max=0 writes nothing.
    assert!(run(&exe, &["max=0"]).is_empty());
}
