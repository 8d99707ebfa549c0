//! Replays the regression corpus of every fuzz target (fuzz/corpus/<target>)
//! on every `cargo test`, through the very functions the targets run
//! (fuzz/fuzz_targets/common/mod.rs): truncated and scrambled ELF files and
//! DWARF, core files, trace files, crash reports, EHABI tables, machine
//! code, CFI sections, maps lines, mangled names, and the inputs the fuzzers
//! found crashing (named `crash_*`). Any answer or error is fine; a panic,
//! an overflow or an abort is not.
#![cfg(all(feature = "symbolize", feature = "remote", target_os = "linux"))]

#[path = "../../../fuzz/fuzz_targets/common/mod.rs"]
mod targets;

use testsupport::workspace_root;

fn corpus(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = workspace_root().join("fuzz/corpus").join(name);
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "empty corpus {name}");
    v
}

/// Runs `f` on each corpus file of `target`, naming the file if it panics.
fn replay<T>(target: &str, f: impl Fn(&[u8]) -> T) -> Vec<(String, T)> {
    corpus(target)
        .into_iter()
        .map(|(name, data)| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&data)))
                .unwrap_or_else(|_| panic!("{target}: {name} panicked"));
            (name, r)
        })
        .collect()
}

#[test]
fn symbolize_elf_corpus() {
    let runs = replay("symbolize_elf", targets::symbolize_elf);
    assert!(runs.len() >= 20);
    let opened = runs.iter().filter(|r| r.1.is_some()).count();
    let named: usize = runs.iter().filter_map(|r| r.1).sum();
    // The intact files and most scrambled ones open and name something.
    assert!(opened >= 10, "{opened}");
    assert!(named > 0);
}

#[test]
fn tracefile_corpus() {
    let runs = replay("tracefile", targets::tracefile);
    let mut ok = 0;
    for (name, t) in runs {
        if let Some(t) = t {
            ok += 1;
            if name.ends_with("/valid") {
                assert_eq!(t.modules.len(), 1);
                assert_eq!(t.stacks.len(), 2);
                assert_eq!(t.stacks[1].tag, Some(42));
                assert!(t.stacks[0].first_is_exact);
            }
        }
    }
    assert!(ok >= 3);
}

#[test]
fn core_file_corpus() {
    let runs = replay("core_file", targets::core_file);
    // The real (shrunk) cores open and have their threads.
    for (name, threads) in &runs {
        if name.ends_with("/gcore_5threads") {
            assert_eq!(*threads, Some(5), "{name}");
        }
    }
}

#[test]
fn crash_report_corpus() {
    let runs = replay("crash_report", targets::crash_report);
    assert!(runs.iter().any(|r| r.1 > 0));
}

#[test]
fn ehabi_corpus() {
    replay("ehabi", targets::ehabi);
}

#[test]
fn insn_code_corpus() {
    replay("insn_code", targets::insn_code);
}

#[test]
fn unwind_table_corpus() {
    replay("unwind_table", targets::unwind_table);
}

#[test]
fn cfi_eval_corpus() {
    replay("cfi_eval", targets::cfi_eval);
}

#[test]
fn demangle_corpus() {
    replay("demangle", targets::demangle);
}

#[test]
fn minidump_corpus() {
    let runs = replay("minidump", targets::minidump);
    // The real dump opens and has its threads.
    for (name, threads) in &runs {
        if name.ends_with("/mdw_5threads") {
            assert_eq!(*threads, Some(5), "{name}");
        }
    }
}

#[test]
fn proc_maps_corpus() {
    let runs = replay("proc_maps", targets::proc_maps);
    assert!(runs.iter().all(|r| r.1 > 0));
}

#[test]
fn jitdump_corpus() {
    let runs = replay("jitdump", targets::jitdump);
    let named = |n: &str| runs.iter().find(|r| r.0.ends_with(n)).unwrap().1;
    assert_eq!(named("/two_functions_with_lines"), Some(2));
    assert_eq!(named("/cut_short"), Some(1));
    assert_eq!(named("/magic_only"), None);
}

#[test]
fn perf_map_corpus() {
    let runs = replay("perf_map", targets::perf_map);
    let named = |n: &str| runs.iter().find(|r| r.0.ends_with(n)).unwrap().1;
    assert_eq!(named("/node_and_python"), Some(3));
    assert_eq!(named("/overlaps"), Some(3));
    assert_eq!(named("/bad_start"), None);
    assert_eq!(named("/wraps"), None);
}

#[test]
fn python_lines_corpus() {
    let runs = replay("python_lines", targets::python_lines);
    let named = |n: &str| runs.iter().find(|r| r.0.ends_with(n)).unwrap().1;
    // Real tables (seeds from python3.9 to 3.13) give lines.
    for seed in ["/py39", "/py310", "/py311", "/py313"] {
        assert!(named(seed).is_some_and(|n| n > 0), "{seed}");
    }
}

#[test]
fn remote_image_corpus() {
    let runs = replay("remote_image", targets::remote_image);
    // The intact library names its functions.
    let tiny = runs.iter().find(|r| r.0.ends_with("/tiny_dso")).unwrap();
    assert!(tiny.1 > 0, "{tiny:?}");
}
