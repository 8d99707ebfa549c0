//! `callstack record` on a C program whose CPU time is split 70/20/10
//! between three functions by construction (tests/fixtures/c/prof_hot.c),
//! built with CFI and no frame pointers, with frame pointers and no CFI,
//! and with neither; then `callstack report`: the shares by function name
//! within 5 points, the pprof file read back by the real `go tool pprof`,
//! the flamegraph SVG well-formed and naming the hot functions. The same
//! for its Rust twin (tests/fixtures/rust/prof_hot.rs, built by rustc at
//! test time) with and without frame pointers. And `record --preload`, the
//! in-process sampler `record` falls back to without perf events.

use std::path::{Path, PathBuf};
use std::process::Command;
use testsupport::{release_artifacts, scratch_dir, Gcc};

const HOT: [(&str, f64); 3] = [
    ("hot_seventy", 70.0),
    ("warm_twenty", 20.0),
    ("cool_ten", 10.0),
];

fn perf_allowed() -> bool {
    // perf_event_open on our own children: root, or paranoid <= 2.
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .is_some_and(|p| p <= 2)
}

fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Records `exe 0.6 2` (two threads, 0.6 s of CPU each) into DIR/name.data.
fn record(dir: &Path, exe: &Path, name: &str) -> PathBuf {
    let data = dir.join(format!("{name}.data"));
    run(Command::new(&release_artifacts().cli)
        .args(["record", "-q", "-F", "999", "-o"])
        .arg(&data)
        .arg("--")
        .arg(exe)
        .args(["0.6", "2"]));
    data
}

/// Each hot function's inclusive share (percent) of the folded stacks.
fn shares(folded: &str) -> Vec<f64> {
    let mut total = 0u64;
    let mut by = [0u64; 3];
    for line in folded.lines() {
        let (path, v) = line.rsplit_once(' ').unwrap();
        let v: u64 = v.parse().unwrap();
        total += v;
        let frames: Vec<&str> = path.split(';').collect();
        for (i, (f, _)) in HOT.iter().enumerate() {
            // C names, or Rust paths ending in the name.
            if frames
                .iter()
                .any(|x| x == f || x.strip_suffix(f).is_some_and(|p| p.ends_with("::")))
            {
                by[i] += v;
            }
        }
    }
    assert!(total > 0, "empty profile");
    by.iter()
        .map(|&v| 100.0 * v as f64 / total as f64)
        .collect()
}

fn check_shares(name: &str, data: &Path) {
    check_shares_of(name, data, true, 5.0)
}

/// [`check_shares`]; `kernel`: expect the kernel's frames (perf events, as
/// root); `within`: the allowed distance from each function's share.
fn check_shares_of(name: &str, data: &Path, kernel: bool, within: f64) {
    let folded = run(Command::new(&release_artifacts().cli)
        .args(["report", "--top", "0", "--folded", "-"])
        .arg(data));
    let s = shares(&folded);
    eprintln!("{name}: {s:.1?}");
    // As root, the kernel's frames too (the fixture spends most of its time
    // in clock_gettime's system call), `_[k]`: named from the kernel
    // symbols the recording holds (read from /proc/kallsyms when recording).
    // SAFETY: geteuid has no preconditions.
    if kernel && unsafe { libc::geteuid() } == 0 {
        assert!(
            folded.lines().any(|l| l.contains("do_syscall_64_[k]")),
            "{name}: no kernel frames\n{folded}"
        );
        let p =
            callstack::profile::Profile::read_trace(std::fs::File::open(data).unwrap()).unwrap();
        assert!(
            p.kernel_symbols.iter().any(|k| k.name == "do_syscall_64"),
            "{name}: the recording holds no kernel symbols: {:?}",
            p.kernel_symbols
        );
    }
    for ((f, want), got) in HOT.iter().zip(&s) {
        assert!(
            (got - want).abs() < within,
            "{name}: {f} has {got:.1}% of the samples, want {want}% +-{within}\n{folded}"
        );
    }
    // Every sample unwinds to the thread's first frame: `_start`, a
    // thread's `clone`, or, for a sample taken before `main`'s program
    // starts (the loader mapping and initializing its libraries), the
    // loader's entry (unnamed: `ld-linux-x86-64.so.2+0x...`), over
    // `_dl_start` or `_dl_init`.
    for line in folded.lines() {
        let in_loader = line.starts_with("ld-linux")
            && (line.contains(";_dl_init;") || line.contains(";_dl_start;"));
        // (A sample at `_start` itself is a whole chain too.)
        assert!(
            line.starts_with("_start;")
                || line.starts_with("_start ")
                || line.starts_with("clone3;")
                || line.starts_with("clone;")
                || in_loader,
            "{name}: a stack that does not reach _start or clone: {line}"
        );
    }
}

/// `--preload`: the in-process sampler preloaded into the command (what
/// `record` falls back to when perf events are refused): the shares, user
/// frames only, every stack down to the thread's first frame. Its CPU-time
/// timers fire at the kernel's tick (250 Hz here, whatever `-F` asks), so a
/// few seconds give a few hundred samples: within 10 points, not 5 (seen:
/// 67-80 / 14-21 / 6-14 over runs of 2 x 2 s).
#[test]
fn preloaded_sampler() {
    let dir = scratch_dir("record-preload");
    let exe = Gcc::new(&["prof_hot.c"])
        .flags("-O2 -fomit-frame-pointer -pthread")
        .build(&dir.join("prof_hot"));
    let data = dir.join("preload.data");
    run(Command::new(&release_artifacts().cli)
        .args(["record", "-q", "--preload", "-F", "999", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&exe)
        .args(["2.0", "2"]));
    check_shares_of("preload", &data, false, 10.0);
}

#[test]
fn cfi_without_frame_pointers() {
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed here");
        return;
    }
    let dir = scratch_dir("record-cfi");
    let exe = Gcc::new(&["prof_hot.c"])
        .flags("-O2 -fomit-frame-pointer -pthread")
        .build(&dir.join("prof_hot"));
    let data = record(&dir, &exe, "cfi");
    check_shares("cfi", &data);
    check_outputs(&dir, &data);
}

#[test]
fn frame_pointers_without_cfi() {
    if !perf_allowed() {
        return;
    }
    let dir = scratch_dir("record-fp");
    let exe = Gcc::new(&["prof_hot.c"])
        .flags("-O2 -fno-omit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables -pthread")
        .build(&dir.join("prof_hot_fp"));
    let data = record(&dir, &exe, "fp");
    check_shares("fp", &data);
}

/// The pprof file through the real `go tool pprof`, and the SVG.
fn check_outputs(dir: &Path, data: &Path) {
    let pb = dir.join("profile.pb.gz");
    let svg = dir.join("flame.svg");
    let ours = run(Command::new(&release_artifacts().cli)
        .args(["report", "--top", "5", "--pprof"])
        .arg(&pb)
        .arg("--svg")
        .arg(&svg)
        .arg(data));

    // The SVG is well-formed XML and names the hot functions.
    let text = std::fs::read_to_string(&svg).unwrap();
    let mut reader = quick_xml::Reader::from_str(&text);
    let mut depth = 0i32;
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Start(_)) => depth += 1,
            Ok(quick_xml::events::Event::End(_)) => depth -= 1,
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(_) => {}
            Err(e) => panic!("flame.svg is not XML: {e}"),
        }
    }
    assert_eq!(depth, 0, "unbalanced SVG");
    for (f, _) in HOT {
        assert!(text.contains(f), "the SVG does not name {f}");
    }

    // go tool pprof reads it; its cumulative shares of the hot functions
    // match, and its top flat function is ours.
    if Command::new("go").arg("version").output().is_err() {
        panic!("`go` (Debian golang-go) is missing: run scripts/install-test-deps.sh");
    }
    let go = |args: &[&str]| {
        run(Command::new("go")
            .args(["tool", "pprof"])
            .args(args)
            .arg(&pb)
            .env("HOME", dir)
            .env("PPROF_TMPDIR", dir))
    };
    let cum = go(&["-top", "-cum", "-nodecount=40"]);
    for (f, want) in HOT {
        let line = cum
            .lines()
            .find(|l| l.split_whitespace().last() == Some(f))
            .unwrap_or_else(|| panic!("go tool pprof does not list {f}:\n{cum}"));
        // flat flat% sum% cum cum% name
        let cols: Vec<&str> = line.split_whitespace().collect();
        let pct: f64 = cols[4].trim_end_matches('%').parse().unwrap();
        assert!((pct - want).abs() < 5.0, "go tool pprof: {f} {pct}%\n{cum}");
    }
    // go's top flat functions (several when they tie: the order of equal
    // rows is not ours to predict) include ours.
    let flat = go(&["-top", "-nodecount=5"]);
    let rows: Vec<(String, String)> = flat
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            Some((cols.first()?.to_string(), cols.last()?.to_string()))
        })
        .collect();
    let top_flat = rows
        .first()
        .map(|r| r.0.clone())
        .unwrap_or_else(|| panic!("no rows in go tool pprof -top:\n{flat}"));
    let our_first = ours
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("self"))
        .nth(1)
        .and_then(|l| l.split_whitespace().last())
        .unwrap()
        .to_string();
    assert!(
        rows.iter()
            .any(|(f, name)| *f == top_flat && *name == our_first),
        "ours:\n{ours}\ngo:\n{flat}"
    );
}

/// Neither frame pointers nor CFI in the program's own code: the unwinder's
/// instruction analysis finds its frames.
#[test]
fn neither_frame_pointers_nor_cfi() {
    if !perf_allowed() {
        return;
    }
    let dir = scratch_dir("record-none");
    let exe = Gcc::new(&["prof_hot.c"])
        .flags(
            "-O2 -fomit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables -pthread",
        )
        .build(&dir.join("prof_hot_none"));
    let data = record(&dir, &exe, "none");
    check_shares("none", &data);
}

/// `-p PID`: a process already running, for a set duration.
#[test]
fn running_process() {
    if !perf_allowed() {
        return;
    }
    let dir = scratch_dir("record-pid");
    let exe = Gcc::new(&["prof_hot.c"])
        .flags("-O2 -fomit-frame-pointer -pthread")
        .build(&dir.join("prof_hot"));
    let mut child = Command::new(&exe).args(["5", "1"]).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let data = dir.join("pid.data");
    let r = Command::new(&release_artifacts().cli)
        .args(["record", "-q", "-d", "1", "-o"])
        .arg(&data)
        .arg("-p")
        .arg(child.id().to_string())
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    check_shares("pid", &data);
}

/// Builds tests/fixtures/rust/prof_hot.rs with rustc and `flags`.
fn rustc(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let src = testsupport::workspace_root().join("tests/fixtures/rust/prof_hot.rs");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    run(Command::new(rustc)
        .args(["-O", "-g", "--edition", "2021"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(src));
    out
}

#[test]
fn rust_without_frame_pointers() {
    if !perf_allowed() {
        return;
    }
    let dir = scratch_dir("record-rs");
    let exe = rustc(&dir, "prof_hot_rs", &["-C", "force-frame-pointers=no"]);
    let data = record(&dir, &exe, "rs");
    check_shares("rust", &data);
}

#[test]
fn rust_with_frame_pointers() {
    if !perf_allowed() {
        return;
    }
    let dir = scratch_dir("record-rs-fp");
    let exe = rustc(&dir, "prof_hot_rs_fp", &["-C", "force-frame-pointers=yes"]);
    let data = record(&dir, &exe, "rsfp");
    check_shares("rust-fp", &data);
}

/// Bad input: errors that name what is wrong, never a panic.
#[test]
fn bad_input() {
    let dir = scratch_dir("record-bad");
    let cli = &release_artifacts().cli;
    let fail = |args: &[&str], want: &str| {
        let o = Command::new(cli)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    };
    fail(&["report", "missing.data"], "missing.data");
    std::fs::write(dir.join("garbage.data"), b"not a profile at all").unwrap();
    fail(&["report", "garbage.data"], "not a callstack trace file");
    // A plain trace is a profile counting stacks, with one sample type.
    let mut w = callstack::tracefile::TraceWriter::new(Vec::new()).unwrap();
    w.write_stack(&[0x1234], true).unwrap();
    std::fs::write(dir.join("plain.data"), w.finish().unwrap()).unwrap();
    fail(
        &["report", "plain.data", "--sample-type", "cpu"],
        "no sample type \"cpu\" (the profile has: samples)",
    );
    if perf_allowed() {
        fail(
            &["record", "-q", "-o", "x.data", "--", "/nonexistent/program"],
            "/nonexistent/program",
        );
    }
}

/// A C++ function name reduced to what gdb's frame names and ours share:
/// no template arguments, parameters, return type or `[clone .isra.0]`
/// (gdb names frames from DWARF, `std::vector<int, ...>::push_back`; we
/// give the demangled symbol, `void std::vector<int, ...>::push_back(int
/// const&)`).
///
/// A name still mangled is demangled by `c++filt` first: cpp_demangle 0.5.1
/// fails on some (`std::swap<int>`'s enable_if return type).
fn bare_name(name: &str) -> String {
    let demangled;
    let name = if name.starts_with("_Z") {
        let o = Command::new("c++filt")
            .arg(name)
            .output()
            .expect("run c++filt");
        demangled = String::from_utf8_lossy(&o.stdout).trim().to_string();
        demangled.as_str()
    } else {
        name
    };
    let name = name.split(" [clone").next().unwrap_or(name);
    let mut out = String::new();
    let mut depth = 0i32;
    for c in name.chars() {
        match c {
            '<' | '(' => depth += 1,
            '>' | ')' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    let mut out = out.trim_end();
    while let Some(rest) = ["const", "volatile", "&&", "&"]
        .iter()
        .find_map(|q| out.strip_suffix(q))
    {
        out = rest.trim_end();
    }
    out.rsplit(' ').next().unwrap_or("").to_string()
}

/// `chain` with runs of the same function folded into one (a recursion's
/// depth).
fn fold_recursion(chain: &[String]) -> Vec<String> {
    let mut out = chain.to_vec();
    out.dedup();
    out
}

/// `record` on an ordinary C++ program (tests/fixtures/c/prof_cpp.cpp,
/// `g++ -O2 -g -fomit-frame-pointer`: std::sort and std::map code, an 8 KiB
/// frame, a recursion, inlined helpers), checked against gdb at the same
/// pcs: for a few of the recorded leaf pcs in the program's code (one or
/// per leaf function, each with a single recorded chain, the 8 most
/// sampled), gdb stops there (twice) and its chain of function names down to `main`,
/// inlined frames included, must be the recorded one. Every sample whose
/// leaf is in the program's code must unwind to `main` or `_start`.
#[test]
fn cpp_samples_match_gdb() {
    use callstack::profile::{Names, Profile};
    use std::collections::BTreeMap;
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed here");
        return;
    }
    let dir = scratch_dir("record-cpp");
    let exe = dir.join("prof_cpp");
    let o = Command::new("g++")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(testsupport::c_fixtures().join("prof_cpp.cpp"))
        .output()
        .expect("run g++");
    assert!(
        o.status.success(),
        "g++: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let data = dir.join("cpp.data");
    // A fixed copy: every sample must unwind whole, and with the adaptive
    // one (8 KiB at the start) the first samples under `big_frame` (an 8
    // KiB frame) are cut until it grows.
    run(Command::new(&release_artifacts().cli)
        .args(["record", "-q", "-F", "999", "--stack-size", "16384", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&exe)
        .arg("1.0"));
    let p = Profile::read_trace(std::fs::File::open(&data).unwrap()).unwrap();
    let names = Names::symbolize(&p, None, &[]);
    let exe_canon = exe.canonicalize().unwrap();
    let m = p
        .modules
        .iter()
        .find(|m| m.path == exe_canon || m.path == exe)
        .unwrap_or_else(|| panic!("no module for {exe:?} in {:?}", p.modules));

    // Leaf pc (link-time) -> recorded chains (innermost first, down to
    // main) -> samples.
    let mut by_pc: BTreeMap<u64, BTreeMap<Vec<String>, i64>> = BTreeMap::new();
    let mut bad = Vec::new();
    for s in &p.stacks {
        let leaf = s.frames[0] as u64;
        if !(m.start <= leaf && leaf < m.end) {
            continue;
        }
        let mut chain: Vec<String> = Vec::new();
        for (i, &a) in s.frames.iter().enumerate() {
            let exact = i == 0 && s.first_is_exact;
            for f in names.get(a, exact).unwrap_or(&[]) {
                chain.push(bare_name(&f.function));
            }
            if chain.last().is_some_and(|n| n == "main") {
                break;
            }
        }
        match chain.last().map(String::as_str) {
            Some("main") => {}
            Some("_start") => continue,
            _ => bad.push(chain.clone()),
        }
        *by_pc
            .entry(leaf - m.bias)
            .or_default()
            .entry(chain)
            .or_default() += s.values[0];
    }
    assert!(
        bad.is_empty(),
        "{} stacks in the program's code do not reach main: {bad:#?}",
        bad.len()
    );

    // Per leaf function, its most sampled pc that has one chain; the 8
    // leaf functions most sampled (gdb's stops are slow).
    let mut picks: BTreeMap<String, Vec<(i64, u64)>> = BTreeMap::new();
    for (&pc, chains) in &by_pc {
        if chains.len() != 1 {
            continue;
        }
        let (chain, &n) = chains.iter().next().unwrap();
        // Not a PLT stub (no function there, for us or gdb).
        if !chain[0].contains("+0x") {
            picks.entry(chain[0].clone()).or_default().push((n, pc));
        }
    }
    let mut best: Vec<(i64, u64, &str)> = picks
        .iter_mut()
        .map(|(f, v)| {
            v.sort_unstable_by(|a, b| b.cmp(a));
            (v[0].0, v[0].1, f.as_str())
        })
        .collect();
    best.sort_unstable_by(|a, b| b.cmp(a));
    best.truncate(8);
    eprintln!("leaf pcs checked (samples, pc, function): {best:x?}");
    assert!(
        best.len() >= 6,
        "too few leaf functions sampled with one chain: {best:?}"
    );
    let pcs: Vec<u64> = best.iter().map(|b| b.1).collect();

    let pcs_arg: Vec<String> = pcs.iter().map(|pc| format!("{pc:x}")).collect();
    let out = testsupport::gdb_batch("gdb")
        .env("RECORD_PCS", pcs_arg.join(","))
        .arg("-x")
        .arg(testsupport::workspace_root().join("tests/fixtures/gdb/record_pcs.py"))
        .env("RECORD_HITS", "2")
        .arg("--args")
        .arg(&exe)
        .arg("30")
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut checked = 0;
    for line in text.lines() {
        let mut f = line.split('\t');
        match f.next() {
            Some("HIT") => {}
            Some("MISSED") => panic!("gdb never stopped at {line}\n{text}"),
            _ => continue,
        }
        let pc = u64::from_str_radix(f.next().unwrap().trim_start_matches("0x"), 16).unwrap();
        let gdb: Vec<String> = f.map(bare_name).collect();
        let ours = by_pc[&pc].keys().next().unwrap();
        // In a recursion gdb may stop at another depth than the samples':
        // the chains must then be equal but for the depth.
        if fold_recursion(ours) != *ours {
            assert_eq!(
                fold_recursion(ours),
                fold_recursion(&gdb),
                "at {pc:#x}: recorded chain (left) is not gdb's (right), recursions folded"
            );
        } else {
            assert_eq!(
                ours, &gdb,
                "at {pc:#x}: recorded chain (left) is not gdb's (right)"
            );
        }
        checked += 1;
    }
    assert_eq!(
        checked,
        2 * pcs.len(),
        "gdb stopped {checked} times, want {}\n{text}\n{}",
        2 * pcs.len(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// tests/fixtures/c/record_end.c, built once per test.
fn record_end(dir: &Path) -> PathBuf {
    Gcc::new(&["record_end.c"])
        .flags("-O2 -fomit-frame-pointer")
        .build(&dir.join("record_end"))
}

/// The folded stacks of a recording.
fn folded(data: &Path) -> String {
    run(Command::new(&release_artifacts().cli)
        .args(["report", "--top", "0", "--folded", "-"])
        .arg(data))
}

/// Checks that `data` holds the fixture's spinning: samples in
/// `spin_before_end` called from `main`.
fn check_spin(what: &str, data: &Path) {
    let f = folded(data);
    let spin: u64 = f
        .lines()
        .filter(|l| l.contains(";main;spin_before_end"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert!(spin > 0, "{what}: no samples in main;spin_before_end\n{f}");
}

/// `record -- COMMAND` ends with the command's status (its exit code, or
/// 128 + the signal that ended it) whatever way it ends, the recording
/// holds what was sampled up to its end (`_exit`, `abort`, SIGKILL,
/// SIGSEGV: nothing is written by the program itself), the program's
/// standard output is byte for byte what it writes alone, and record's
/// own lines (to stderr) have no `\r` when stderr is not a terminal.
#[test]
fn exit_status_and_end_of_run() {
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed here");
        return;
    }
    let dir = scratch_dir("record-end");
    let exe = record_end(&dir);
    let bare = Command::new(&exe)
        .args(["exit", "0", "0"])
        .output()
        .unwrap();
    assert!(bare.status.success());
    for (args, want) in [
        (&["exit", "0"][..], 0),
        (&["exit", "7"], 7),
        (&["_exit", "5"], 5),
        (&["abort"], 128 + libc::SIGABRT),
        (&["kill"], 128 + libc::SIGKILL),
        (&["segv"], 128 + libc::SIGSEGV),
    ] {
        let data = dir.join(format!("{}.data", args.join("-")));
        let o = Command::new(&release_artifacts().cli)
            .args(["record", "-F", "999", "-o"])
            .arg(&data)
            .arg("--")
            .arg(&exe)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(want), "{args:?}: {err}");
        assert_eq!(
            o.stdout, bare.stdout,
            "{args:?}: the program's stdout differs from its bare run"
        );
        assert!(
            !err.contains('\r'),
            "{args:?}: a progress line on a pipe: {err:?}"
        );
        assert!(err.contains("wrote"), "{args:?}: {err}");
        check_spin(&format!("{args:?}"), &data);
    }
}

/// A command that cannot be started: a clear error, the shell's exit code
/// (127 not found, 126 not executable), and no output file, with perf
/// events and with `--preload`.
#[test]
fn command_not_started() {
    let dir = scratch_dir("record-nocmd");
    let not_exec = dir.join("not-executable");
    std::fs::write(&not_exec, "data\n").unwrap();
    for preload in [false, true] {
        if !preload && !perf_allowed() {
            continue;
        }
        for (prog, want) in [
            (dir.join("no-such-program"), 127),
            (PathBuf::from("no-such-program-in-path-xyz"), 127),
            (not_exec.clone(), 126),
        ] {
            let data = dir.join("nothing.data");
            let mut cmd = Command::new(&release_artifacts().cli);
            cmd.args(["record", "-q", "-o"]).arg(&data);
            if preload {
                cmd.arg("--preload");
            }
            let o = cmd.arg("--").arg(&prog).output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(
                o.status.code(),
                Some(want),
                "{prog:?} (preload {preload}): {err}"
            );
            assert!(
                err.contains(&*prog.to_string_lossy()) && err.contains("cannot start"),
                "{prog:?}: {err}"
            );
            assert!(!err.contains("panicked"), "{err}");
            assert!(
                !data.exists(),
                "{prog:?} (preload {preload}): an output file was left"
            );
        }
    }
}

/// Starts `record -o DATA -- record_end MODE -1 READY` (spinning until a
/// signal), waits for the program to be spinning, sends `sig` to record's
/// pid, and returns record's exit code; the program is killed if it still
/// runs then.
fn record_signalled(
    dir: &Path,
    exe: &Path,
    mode: &str,
    sig: i32,
    data: &Path,
    preload: bool,
) -> Option<i32> {
    let ready = dir.join(format!("{mode}-{sig}-{preload}.ready"));
    let _ = std::fs::remove_file(&ready);
    let mut rec = Command::new(&release_artifacts().cli)
        .args(["record", "-q"])
        .args(if preload { &["--preload"][..] } else { &[] })
        .arg("-o")
        .arg(data)
        .arg("--")
        .arg(exe)
        .arg(mode)
        .arg("-1")
        .arg(&ready)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The program creates READY once it has spun for a while.
    let start = std::time::Instant::now();
    while !ready.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "{mode}: the program never started spinning"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: kill on our child's pid.
    unsafe { libc::kill(rec.id() as i32, sig) };
    let code = rec.wait().unwrap().code();
    // A program record left running (it did not pass the signal on)
    // spins forever: end it.
    let pid: i32 = std::fs::read_to_string(&ready)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill on the program's pid; it is not reaped by anyone while
    // it runs (an orphan's zombie goes to init at once), so at worst the
    // signal finds no process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    code
}

/// SIGTERM and SIGINT sent to record's pid (by `kill`, not a terminal)
/// are passed on to the command, as `perf record` does: a program that
/// handles them exits its own way, one that does not dies by them; record
/// exits with that status and the recording up to then is written.
#[test]
fn signals_are_passed_on() {
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed here");
        return;
    }
    let dir = scratch_dir("record-signal");
    let exe = record_end(&dir);
    for (mode, sig, want) in [
        ("handle", libc::SIGTERM, 40 + libc::SIGTERM),
        ("handle", libc::SIGINT, 40 + libc::SIGINT),
        ("wait", libc::SIGTERM, 128 + libc::SIGTERM),
        ("wait", libc::SIGINT, 128 + libc::SIGINT),
    ] {
        let data = dir.join(format!("{mode}-{sig}.data"));
        let code = record_signalled(&dir, &exe, mode, sig, &data, false);
        assert_eq!(code, Some(want), "{mode} {sig}");
        check_spin(&format!("{mode} {sig}"), &data);
    }
}

/// The `File:` line of `go tool pprof -top` for a recording: the name of
/// the pprof's first (main) mapping.
fn pprof_file_line(dir: &Path, data: &Path) -> String {
    let pb = dir.join(format!(
        "{}.pb.gz",
        data.file_stem().unwrap().to_string_lossy()
    ));
    run(Command::new(&release_artifacts().cli)
        .args(["report", "--top", "0", "--pprof"])
        .arg(&pb)
        .arg(data));
    let top = run(Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=1"])
        .arg(&pb)
        .env("HOME", dir)
        .env("PPROF_TMPDIR", dir));
    top.lines()
        .find(|l| l.starts_with("File: "))
        .unwrap_or_else(|| panic!("no File: line\n{top}"))
        .to_string()
}

/// A profile's main mapping (pprof's first, `File:` in `go tool pprof`) is
/// the recorded program, not `[kernel.kallsyms]` (kernel frames are
/// recorded as root) nor a library: python3 (its interpreter loop), a C
/// program, and a C program exec'd by a shell (the program is the last
/// one the process exec'd).
#[test]
fn pprof_main_mapping_is_the_program() {
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed here");
        return;
    }
    let dir = scratch_dir("record-mainmap");
    let c = record_end(&dir);
    let python = std::fs::canonicalize("/usr/bin/python3").expect("/usr/bin/python3");
    let cases: Vec<(&str, Vec<std::ffi::OsString>, String)> = vec![
        (
            "python",
            vec![
                "/usr/bin/python3".into(),
                "-c".into(),
                "x = 0\nfor i in range(2000000): x += i".into(),
            ],
            python.file_name().unwrap().to_string_lossy().into_owned(),
        ),
        (
            "c",
            vec![c.clone().into(), "exit".into(), "0".into()],
            "record_end".into(),
        ),
        (
            "shell-exec",
            vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("exec {} exit 0", c.display()).into(),
            ],
            "record_end".into(),
        ),
    ];
    for (name, argv, want) in cases {
        let data = dir.join(format!("{name}.data"));
        run(Command::new(&release_artifacts().cli)
            .args(["record", "-q", "-o"])
            .arg(&data)
            .arg("--")
            .args(&argv)
            .stdout(std::process::Stdio::null()));
        let line = pprof_file_line(&dir, &data);
        assert_eq!(line, format!("File: {want}"), "{name}");
    }
}

/// The first user frame after a sample's kernel frames is the interrupted
/// pc (the kernel is entered by a fault, an interrupt or a system call,
/// never by a call), looked up as it is: page faults taken at
/// `fault_target`'s first instruction (tests/fixtures/c/fault_entry.c) are
/// in `fault_target`, not in `fault_prev`, whose last byte is the byte
/// before (what a return address's lookup at pc - 1 would name). In the
/// folded stacks and in the pprof read back by `go tool pprof`.
#[test]
fn exact_user_pc_after_kernel_frames() {
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed here");
        return;
    }
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let dir = scratch_dir("record-fault-entry");
    let exe = Gcc::new(&["fault_entry.c"])
        .flags("-O2")
        .build(&dir.join("fault_entry"));
    let data = dir.join("fault.data");
    run(Command::new(&release_artifacts().cli)
        .args(["record", "-q", "-F", "999", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&exe)
        .arg("1"));
    let f = folded(&data);
    assert!(
        !f.contains("fault_prev"),
        "fault_target's first instruction named as fault_prev:\n{f}"
    );
    // As root the kernel's frames are recorded: faults at the entry.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let at_entry: u64 = f
            .lines()
            .filter(|l| l.contains(";main;fault_target;") && l.contains("_[k]"))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum();
        assert!(at_entry > 0, "no kernel frames under fault_target:\n{f}");
    }
    let pb = dir.join("fault.pb.gz");
    run(Command::new(&release_artifacts().cli)
        .args(["report", "--top", "0", "--pprof"])
        .arg(&pb)
        .arg(&data));
    let top = run(Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=1000"])
        .arg(&pb)
        .env("HOME", &dir)
        .env("PPROF_TMPDIR", &dir));
    assert!(top.contains("fault_target"), "{top}");
    assert!(!top.contains("fault_prev"), "{top}");
    // `callstack symbolize` of the recording too (its `I` records).
    let sym = run(Command::new(&release_artifacts().cli)
        .arg("symbolize")
        .arg(&data));
    assert!(sym.contains(" in fault_target"), "{sym}");
    assert!(!sym.contains("fault_prev"), "{sym}");
}

/// `--preload` (the in-process sampler): the command's exit status too;
/// a program ending in `_exit` (the sampler replaces it) or by a signal
/// it leaves to the default action (`abort`, SIGSEGV; SIGTERM and SIGINT
/// sent to record and passed on) still writes its profile; one killed by
/// SIGKILL leaves no empty file, and record says so.
#[test]
fn preload_exit_status_and_end_of_run() {
    let dir = scratch_dir("record-preload-end");
    let exe = record_end(&dir);
    for (args, want, written) in [
        (&["exit", "3", "1.0"][..], 3, true),
        (&["_exit", "5", "1.0"], 5, true),
        (&["abort", "1.0"], 128 + libc::SIGABRT, true),
        (&["segv", "1.0"], 128 + libc::SIGSEGV, true),
        (&["kill", "0.2"], 128 + libc::SIGKILL, false),
    ] {
        let data = dir.join(format!("{}.data", args.join("-")));
        let o = Command::new(&release_artifacts().cli)
            .args(["record", "--preload", "-o"])
            .arg(&data)
            .arg("--")
            .arg(&exe)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(want), "{args:?}: {err}");
        assert!(o.stdout.starts_with(b"record_end: out\r\n"), "{args:?}");
        if written {
            check_spin(&format!("preload {args:?}"), &data);
        } else {
            assert!(!data.exists(), "{args:?}: a file was left: {err}");
            assert!(err.contains("wrote no profile"), "{args:?}: {err}");
        }
    }
    for (mode, sig, want) in [
        ("wait", libc::SIGTERM, 128 + libc::SIGTERM),
        ("wait", libc::SIGINT, 128 + libc::SIGINT),
        ("handle", libc::SIGTERM, 40 + libc::SIGTERM),
    ] {
        let data = dir.join(format!("{mode}-{sig}.data"));
        let code = record_signalled(&dir, &exe, mode, sig, &data, true);
        assert_eq!(code, Some(want), "preload {mode} {sig}");
        check_spin(&format!("preload {mode} {sig}"), &data);
    }
}

/// On a terminal (util-linux `script` gives the command one), the
/// progress line is shown, rewritten with `\r`; `-q` hides it. (Not on a
/// terminal it is not shown: `exit_status_and_end_of_run`.)
#[test]
fn progress_line_on_a_terminal() {
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed here");
        return;
    }
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no `script` (util-linux) to give record a terminal");
        return;
    }
    let dir = scratch_dir("record-tty");
    let exe = record_end(&dir);
    for quiet in [false, true] {
        let data = dir.join(format!("tty-{quiet}.data"));
        let line = format!(
            "{} record {} -o {} -- {} exit 0 0.8",
            release_artifacts().cli.display(),
            if quiet { "-q" } else { "" },
            data.display(),
            exe.display()
        );
        let o = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            out.contains("\rcallstack record: "),
            !quiet,
            "quiet {quiet}: {out:?}"
        );
        check_spin("tty", &data);
    }
}

/// `record --rotate SECS -o DIR`: one gzip'd pprof per period, named by
/// its start time, in order and back to back; `go tool pprof` reads each
/// and, merging them all, gives the 70/20/10 split within 5 points. With
/// `--no-symbolize` the profiles hold no names, only addresses and the
/// mappings' paths and build-ids, for a server to symbolize.
#[test]
fn rotating_pprof_profiles() {
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed here");
        return;
    }
    let dir = scratch_dir("record-rotate");
    let exe = Gcc::new(&["prof_hot.c"])
        .flags("-O2 -fomit-frame-pointer")
        .build(&dir.join("prof_hot"));
    let pprof = |args: &[&str], files: &[PathBuf]| -> String {
        run(Command::new("go")
            .args(["tool", "pprof"])
            .args(args)
            .args(files))
    };
    for symbolize in [true, false] {
        let out = dir.join(if symbolize { "named" } else { "bare" });
        let mut cmd = Command::new(&release_artifacts().cli);
        cmd.args(["record", "-q", "-F", "999", "--rotate", "0.5", "-o"])
            .arg(&out);
        if !symbolize {
            cmd.arg("--no-symbolize");
        }
        run(cmd.arg("--").arg(&exe).args(["2.0", "1"]));
        let mut files: Vec<PathBuf> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        // 2 s of CPU: at least 4 periods of 0.5 s, more on a busy machine.
        assert!(files.len() >= 4, "{names:?}");
        for n in &names {
            // YYYYMMDDTHHMMSS.mmmZ.pb.gz
            let b = n.as_bytes();
            assert!(
                n.len() == 26 && b[8] == b'T' && &n[15..16] == "." && n.ends_with("Z.pb.gz"),
                "{n}"
            );
        }
        // Back to back: each starts where the last ended (its start plus
        // its duration), and each but the last lasts at least the period.
        // How much longer depends on the machine's load: the recorder
        // looks at the clock between its passes over the rings.
        let mut last: Option<(f64, f64)> = None;
        for (i, f) in files.iter().enumerate() {
            let raw = pprof(&["-raw"], std::slice::from_ref(f));
            let name = f.file_name().unwrap().to_string_lossy();
            let secs = |s: &str| -> f64 {
                let h: f64 = s[9..11].parse().unwrap();
                let m: f64 = s[11..13].parse().unwrap();
                let x: f64 = s[13..19].parse().unwrap();
                h * 3600.0 + m * 60.0 + x
            };
            let start = secs(&name);
            // `-top`'s header gives the duration with its unit ("-raw"
            // cuts it to four characters): "Duration: 549.51ms, Total...".
            let top = pprof(&["-top"], std::slice::from_ref(f));
            let duration: f64 = top
                .lines()
                .find_map(|l| l.strip_prefix("Duration: "))
                .and_then(|d| d.split(',').next())
                .and_then(|d| {
                    let (num, scale) = if let Some(v) = d.strip_suffix("ms") {
                        (v, 1e-3)
                    } else if let Some(v) = d.strip_suffix("µs").or(d.strip_suffix("us")) {
                        (v, 1e-6)
                    } else {
                        (d.strip_suffix('s')?, 1.0)
                    };
                    num.parse::<f64>().ok().map(|v| v * scale)
                })
                .unwrap_or_else(|| panic!("{name}: no duration\n{top}"));
            if i + 1 < files.len() {
                assert!(duration >= 0.45, "{name}: lasts {duration} s\n{raw}");
            }
            if let Some((l, d)) = last {
                assert!(
                    (start - (l + d)).abs() < 0.02,
                    "{name}: starts at {start:.3}, the last at {l:.3} lasting {d} s"
                );
            }
            last = Some((start, duration));
            let id =
                String::from_utf8(run(Command::new("readelf").args(["-n"]).arg(&exe)).into_bytes())
                    .unwrap()
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
                    .unwrap();
            // Parca's server would take it (its checks of ids and
            // indices, stricter than go tool pprof's).
            let parsed = testsupport::pprof::parca_check(&std::fs::read(f).unwrap())
                .unwrap_or_else(|e| panic!("{name}: Parca would refuse it: {e}"));
            // Named or not; a short period (the program's last
            // milliseconds, or a loaded machine's) may miss hot_seventy.
            let samples = raw.lines().filter(|l| l.contains("thread_id:[")).count();
            if samples == 0 {
                continue;
            }
            assert!(raw.contains(&id), "{name}: the program's build-id\n{raw}");
            assert!(
                parsed
                    .mappings
                    .iter()
                    .any(|m| m.build_id == id && m.file.ends_with("prof_hot")),
                "{name}: {:?}",
                parsed.mappings
            );
            if !symbolize || samples >= 50 {
                assert_eq!(raw.contains("hot_seventy"), symbolize, "{name}\n{raw}");
            }
            assert_eq!(raw.contains("prof_hot.c"), symbolize, "{name}\n{raw}");
        }
        if symbolize {
            // All periods merged: the split by function.
            let top = pprof(&["-top", "-cum", "-nodecount=60"], &files);
            // Inclusive shares (the samples land in the inlined `burn`).
            let flat = |f: &str| -> f64 {
                top.lines()
                    .find(|l| l.split_whitespace().last() == Some(f))
                    .and_then(|l| l.split_whitespace().nth(4))
                    .and_then(|p| p.trim_end_matches('%').parse().ok())
                    .unwrap_or_else(|| panic!("{f} in\n{top}"))
            };
            let total: f64 = HOT.iter().map(|(f, _)| flat(f)).sum();
            for (f, want) in HOT {
                let got = flat(f) * 100.0 / total;
                assert!(
                    (got - want).abs() < 5.0,
                    "{f}: {got:.1}% for {want}%\n{top}"
                );
            }
        }
    }
}

/// `record --off-cpu` on a program that sleeps 70% of its time in
/// `nanosleep` under `sleep_seventy` and blocks 30% in `read` on a pipe
/// under `read_thirty` (tests/fixtures/c/offcpu.c): the `off_cpu` sample
/// type gives those shares within 5 points, with the blocking stacks down
/// to `main`, and the second thread's blocking under `writer`.
#[test]
fn off_cpu_time_by_blocking_stack() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .unwrap_or(3);
    if !root && paranoid > 1 {
        eprintln!("skipped: --off-cpu needs root or perf_event_paranoid <= 1");
        return;
    }
    let dir = scratch_dir("record-offcpu");
    let exe = offcpu_exe(&dir);
    let data = dir.join("off.data");
    run(Command::new(&release_artifacts().cli)
        .args(["record", "-q", "--off-cpu", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&exe)
        .arg("2.0"));
    check_off_cpu_shares(&data);
}

/// `record -a --off-cpu` (the whole host: a whole CPU's context-switch
/// records, of every task, are not a task's) on the program of
/// [`off_cpu_time_by_blocking_stack`], started apart: the same shares
/// within 5 points, stacks and totals for its 2 s; narrowed by
/// `--pid-filter` (the switches of its threads only are sampled) and by
/// `--comm` (every task's switches, kept by name).
#[test]
fn off_cpu_whole_host() {
    if !whole_host_allowed() {
        eprintln!("skipped: -a needs root or perf_event_paranoid <= 0");
        return;
    }
    let dir = scratch_dir("record-offcpu-all");
    let exe = offcpu_exe(&dir);
    let cli = &release_artifacts().cli;
    let mut c = Command::new(&exe).arg("20.0").spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let pid = c.id().to_string();
    for filter in [["--pid-filter", pid.as_str()], ["--comm", "offcpu"]] {
        let data = dir.join("off.data");
        let o = Command::new(cli)
            .args(["record", "-q", "-a", "--off-cpu", "-d", "2"])
            .args(filter)
            .arg("-o")
            .arg(&data)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        check_off_cpu_shares(&data);
    }
    let _ = c.kill();
    c.wait().unwrap();
}

/// tests/fixtures/c/offcpu.c built in `dir`.
fn offcpu_exe(dir: &Path) -> PathBuf {
    Gcc::new(&["offcpu.c"])
        .flags("-O2 -pthread")
        .build(&dir.join("offcpu"))
}

/// The `off_cpu` shares of a recording of tests/fixtures/c/offcpu.c for
/// 2 s: 70/30 within 5 points, the main thread blocked nearly all of it.
fn check_off_cpu_shares(data: &Path) {
    let folded = run(Command::new(&release_artifacts().cli)
        .arg("report")
        .arg(data)
        .args(["--top", "0", "--sample-type", "off_cpu", "--folded", "-"]));
    let mut by = std::collections::HashMap::<&str, u64>::new();
    for line in folded.lines() {
        let (path, v) = line.rsplit_once(' ').unwrap();
        let v: u64 = v.parse().unwrap();
        let frames: Vec<&str> = path.split(';').collect();
        for f in ["sleep_seventy", "read_thirty", "writer"] {
            if frames.contains(&f) {
                *by.entry(f).or_default() += v;
                if f != "writer" {
                    assert!(frames.contains(&"main"), "{path}");
                }
            }
        }
    }
    let got = |f: &str| by.get(f).copied().unwrap_or(0);
    let (s, r) = (got("sleep_seventy") as f64, got("read_thirty") as f64);
    let share = s * 100.0 / (s + r);
    assert!(
        (share - 70.0).abs() < 5.0,
        "sleep_seventy {share:.1}%\n{folded}"
    );
    // The main thread is blocked nearly all of its 2 s.
    assert!(s + r > 1.7e9, "{s} + {r} ns\n{folded}");
    assert!(got("writer") > 1_000_000_000, "{folded}");
}

/// `record -a` (every process of the host): two programs started apart
/// from the recorder, a C one (70/20/10 by construction) and python3 in a
/// busy loop, both appear with their chains down to `main` (python3: its
/// interpreter loop); `--pid-filter` keeps theirs only, and the C
/// program's split holds within 5 points; `--comm` narrows by name.
#[test]
fn whole_host() {
    if !whole_host_allowed() {
        eprintln!("skipped: -a needs root or perf_event_paranoid <= 0");
        return;
    }
    let dir = scratch_dir("record-all");
    let exe = Gcc::new(&["prof_hot.c"])
        .flags("-O2 -fno-omit-frame-pointer")
        .build(&dir.join("prof_hot"));
    // Built before the programs start.
    let cli = &release_artifacts().cli;
    // Long enough for three recordings on a loaded machine; killed after.
    let mut c = Command::new(&exe).args(["20.0", "1"]).spawn().unwrap();
    let mut py = python_spinning(20.0);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let filtered = dir.join("filtered.data");
    run(Command::new(cli)
        .args([
            "record",
            "-q",
            "-a",
            "-F",
            "999",
            "-d",
            "1.5",
            "--pid-filter",
        ])
        .arg(format!("{},{}", c.id(), py.id()))
        .arg("-o")
        .arg(&filtered));
    let by_comm = dir.join("comm.data");
    run(Command::new(cli)
        .args([
            "record", "-q", "-a", "-F", "999", "-d", "1", "--comm", "prof_hot", "-o",
        ])
        .arg(&by_comm));
    let everything = dir.join("all.data");
    run(Command::new(cli)
        .args(["record", "-q", "-a", "-F", "999", "-d", "1", "-o"])
        .arg(&everything));
    let _ = c.kill();
    let _ = py.kill();
    c.wait().unwrap();
    py.wait().unwrap();
    let folded = |data: &Path| {
        run(Command::new(cli)
            .arg("report")
            .arg(data)
            .args(["--top", "0", "--folded", "-"]))
    };
    let f = folded(&filtered);
    let (hot, py_samples) = chains_to_main(&f);
    let total: u64 = hot.iter().sum();
    assert!(total > 0 && py_samples > 0, "{f}");
    // Each process's vDSO is named (one per process, at its own address).
    assert!(!f.contains("[vdso]+"), "{f}");
    for ((name, want), n) in HOT.iter().zip(hot) {
        let got = n as f64 * 100.0 / total as f64;
        assert!(
            (got - want).abs() < 5.0,
            "{name}: {got:.1}% for {want}%\n{f}"
        );
    }
    // By name: the C program only.
    let f = folded(&by_comm);
    assert!(f.contains("hot_seventy"), "{f}");
    assert!(!f.contains("_PyEval_EvalFrameDefault"), "{f}");
    // Everything: both, among whatever else runs.
    let f = folded(&everything);
    assert!(
        f.contains("hot_seventy")
            && (f.contains("_PyEval_EvalFrameDefault") || f.contains(";spin_here")),
        "{f}"
    );
    // The recorder's Python sampler thread too, whose stack is shallow
    // (the main thread's frames, from `main` to the unwinder's, do not all
    // fit in the 8 KiB copied per sample). The recorder maps the libraries
    // it names, shared, a few MiB from their loaded images: once taken for
    // a part of libc's image, which moved libc's start, so that this
    // thread's chains stopped in libc.
    let (mut ours, mut whole) = (0u64, 0u64);
    for line in f.lines() {
        let (path, v) = line.rsplit_once(' ').unwrap();
        let frames: Vec<&str> = path.split(';').collect();
        if frames
            .iter()
            .any(|f| f.starts_with("callstack::python::record::run"))
        {
            let v = v.parse::<u64>().unwrap();
            ours += v;
            if frames
                .iter()
                .any(|f| ["start_thread", "clone3", "clone"].contains(f))
            {
                whole += v;
            }
        }
    }
    assert!(
        whole * 10 >= ours * 8,
        "{whole} of the Python sampler thread's {ours} reach its start\n{f}"
    );
}

/// python3 spinning in `spin_here` for `secs` seconds, once its imports
/// are done (it says so on its stdout, read here): its startup's deep
/// import stacks are not what the whole-host tests sample.
fn python_spinning(secs: f64) -> std::process::Child {
    use std::io::BufRead;
    let mut py = Command::new("python3")
        .args([
            "-c",
            &format!(
                "import time, sys\nt=time.time()\ndef spin_here():\n    x=0\n    while time.time()-t<{secs}: x+=1\nprint('ready', flush=True)\nspin_here()"
            ),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(py.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    py
}

/// Whether `record -a` may run here (root, or `perf_event_paranoid` <= 0).
fn whole_host_allowed() -> bool {
    testsupport::whole_host_allowed()
}

/// A C program (70/20/10, no frame pointers: its CFI is needed) and
/// python3 spinning, started apart from the recorder for `secs` seconds.
fn two_busy_processes(dir: &Path, secs: f64) -> (std::process::Child, std::process::Child) {
    let exe = Gcc::new(&["prof_hot.c"])
        .flags("-O2 -fomit-frame-pointer")
        .build(&dir.join("prof_hot"));
    let c = Command::new(&exe)
        .args([&secs.to_string(), "1"])
        .spawn()
        .unwrap();
    let py = python_spinning(secs);
    std::thread::sleep(std::time::Duration::from_millis(300));
    (c, py)
}

/// The C program's samples by hot function, and python3's (known by the
/// evaluation loop's frame, or by the Python function that replaced it),
/// from folded stacks; every chain reaches `main` (python3:
/// `Py_BytesMain`).
fn chains_to_main(f: &str) -> ([u64; 3], u64) {
    let mut hot = [0u64; 3];
    let mut py = 0;
    for line in f.lines() {
        let (path, v) = line.rsplit_once(' ').unwrap();
        let v: u64 = v.parse().unwrap();
        let frames: Vec<&str> = path.split(';').collect();
        if let Some(i) = HOT.iter().position(|(h, _)| frames.contains(h)) {
            assert!(frames.contains(&"main"), "{path}");
            hot[i] += v;
        } else if frames
            .iter()
            .any(|f| f.contains("_PyEval_EvalFrameDefault") || *f == "spin_here")
        {
            assert!(
                frames
                    .iter()
                    .any(|f| f.contains("Py_BytesMain") || *f == "main"),
                "{path}"
            );
            py += v;
        }
    }
    (hot, py)
}

/// `record -a --memory-budget` far below what two processes need (10 kB):
/// the least recently used modules' tables and the module maps are
/// dropped over and over, and rebuilt when a sample needs them, so every
/// chain still reaches `main` and the 70/20/10 split holds; stderr says
/// what was evicted, and so do the comments of its pprof (`go tool pprof
/// -comments`). With `--rotate`, each period's symbolizer files are
/// closed too, the profiles still named, and their comments name the
/// modules dropped.
#[test]
fn memory_budget_evicts_and_chains_resolve() {
    if !whole_host_allowed() {
        eprintln!("skipped: -a needs root or perf_event_paranoid <= 0");
        return;
    }
    let dir = scratch_dir("record-budget");
    let cli = &release_artifacts().cli;
    let (mut c, mut py) = two_busy_processes(&dir, 6.0);
    let pids = format!("{},{}", c.id(), py.id());
    let data = dir.join("budget.data");
    let o = Command::new(cli)
        .args([
            "record",
            "-a",
            "-F",
            "999",
            "-d",
            "1.5",
            "--memory-budget",
            "0.01",
            "--pid-filter",
        ])
        .arg(&pids)
        .arg("-o")
        .arg(&data)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{stderr}");
    let rotated = dir.join("rotated");
    let o2 = Command::new(cli)
        .args([
            "record",
            "-a",
            "-F",
            "999",
            "-d",
            "1.6",
            "--rotate",
            "0.5",
            "--memory-budget",
            "0.01",
        ])
        .arg("--pid-filter")
        .arg(&pids)
        .arg("-o")
        .arg(&rotated)
        .output()
        .unwrap();
    let stderr2 = String::from_utf8_lossy(&o2.stderr).into_owned();
    let _ = c.kill();
    let _ = py.kill();
    c.wait().unwrap();
    py.wait().unwrap();
    assert!(o2.status.success(), "{stderr2}");

    // What was dropped, said once at the end.
    for s in [&stderr, &stderr2] {
        let line = s
            .lines()
            .find(|l| l.starts_with("callstack record: evicted "))
            .unwrap_or_else(|| panic!("no eviction line:\n{s}"));
        assert!(line.contains(" to stay under the budget: "), "{line}");
        // The modules of either process (those of the last sample before
        // each check are kept: which process that is depends on the
        // order the CPUs' rings are read in).
        assert!(
            ["prof_hot", "libc", "python"]
                .iter()
                .any(|m| line.contains(m)),
            "{line}"
        );
    }
    let f = run(Command::new(cli)
        .arg("report")
        .arg(&data)
        .args(["--top", "0", "--folded", "-"]));
    let (hot, py_samples) = chains_to_main(&f);
    let total: u64 = hot.iter().sum();
    assert!(total > 0 && py_samples > 0, "{f}");
    for ((name, want), n) in HOT.iter().zip(hot) {
        let got = n as f64 * 100.0 / total as f64;
        assert!(
            (got - want).abs() < 5.0,
            "{name}: {got:.1}% for {want}%\n{f}"
        );
    }

    if Command::new("go").arg("version").output().is_err() {
        eprintln!("go not found: the rotated profiles are not read back");
        return;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&rotated)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    // Parca's server would take each (a whole host's: mappings of many
    // processes, pid and comm labels).
    for f in &files {
        testsupport::pprof::parca_check(&std::fs::read(f).unwrap())
            .unwrap_or_else(|e| panic!("{f:?}: Parca would refuse it: {e}"));
    }
    let pprof = |args: &[&str], files: &[PathBuf]| -> String {
        run(Command::new("go")
            .args(["tool", "pprof"])
            .args(args)
            .args(files)
            .env("HOME", &dir)
            .env("PPROF_TMPDIR", &dir))
    };
    // The one-file recording keeps them too (its trace's `C` records).
    let pb = dir.join("budget.pb.gz");
    run(Command::new(cli)
        .args(["report", "--top", "0", "--pprof"])
        .arg(&pb)
        .arg(&data));
    let comments = pprof(&["-comments"], std::slice::from_ref(&pb));
    assert!(
        comments.contains("callstack: evicted to stay under the memory budget: "),
        "{comments}"
    );
    let mut with_comment = 0;
    for f in &files {
        let comments = pprof(&["-comments"], std::slice::from_ref(f));
        if comments.contains("callstack: evicted to stay under the memory budget: ") {
            with_comment += 1;
        }
    }
    assert!(with_comment > 0, "no profile names what was evicted");
    let top = pprof(&["-top", "-cum", "-nodecount=80"], &files);
    for (h, _) in HOT {
        assert!(top.contains(h), "{h}\n{top}");
    }
    assert!(top.contains("main"), "{top}");
}

/// `record -a`'s samples carry their process: `pid` (number) and `comm`
/// labels in the pprof, which `go tool pprof -tags` lists and
/// `-tagfocus` splits by (the C program's functions under its own pid and
/// name only, python3's under its own).
#[test]
fn whole_host_pid_labels() {
    if !whole_host_allowed() {
        eprintln!("skipped: -a needs root or perf_event_paranoid <= 0");
        return;
    }
    if Command::new("go").arg("version").output().is_err() {
        eprintln!("skipped: go not found (go tool pprof reads the labels)");
        return;
    }
    let dir = scratch_dir("record-labels");
    let cli = &release_artifacts().cli;
    let (mut c, mut py) = two_busy_processes(&dir, 4.0);
    let (cpid, pypid) = (c.id(), py.id());
    let data = dir.join("labels.data");
    run(Command::new(cli)
        .args(["record", "-q", "-a", "-F", "999", "-d", "1", "--pid-filter"])
        .arg(format!("{cpid},{pypid}"))
        .arg("-o")
        .arg(&data));
    let _ = c.kill();
    let _ = py.kill();
    c.wait().unwrap();
    py.wait().unwrap();
    let pb = dir.join("labels.pb.gz");
    run(Command::new(cli)
        .args(["report", "--top", "0", "--pprof"])
        .arg(&pb)
        .arg(&data));
    let pprof = |args: &[&str]| -> String {
        run(Command::new("go")
            .args(["tool", "pprof"])
            .args(args)
            .arg(&pb)
            .env("HOME", &dir)
            .env("PPROF_TMPDIR", &dir))
    };
    let tags = pprof(&["-tags"]);
    // The `comm:` and `pid:` sections: exactly our two processes.
    let section = |name: &str| -> Vec<String> {
        let mut out = Vec::new();
        let mut inside = false;
        for l in tags.lines() {
            let t = l.trim();
            if t.starts_with(&format!("{name}: Total")) {
                inside = true;
            } else if inside && t.is_empty() {
                break;
            } else if inside {
                out.push(t.rsplit(": ").next().unwrap().to_string());
            }
        }
        out.sort();
        out
    };
    let mut want_pids = vec![cpid.to_string(), pypid.to_string()];
    want_pids.sort();
    assert_eq!(section("pid"), want_pids, "{tags}");
    let comms = section("comm");
    assert_eq!(comms.len(), 2, "{tags}");
    assert!(comms.contains(&"prof_hot".to_string()), "{tags}");
    assert!(comms.iter().any(|c| c.starts_with("python3")), "{tags}");
    // Focused on one process: its functions only.
    let c_top = pprof(&["-top", "-nodecount=50", "-tagfocus=comm=prof_hot"]);
    assert!(c_top.contains("hot_seventy"), "{c_top}");
    assert!(!c_top.contains("_PyEval_EvalFrameDefault"), "{c_top}");
    assert!(!c_top.contains("spin_here"), "{c_top}");
    // The python process's: its Python function (the Python sampler's
    // frames), or the evaluation loop where a sample took no Python stack
    // (every sample may take one: then the loop's frame is gone).
    let py_top = pprof(&["-top", "-nodecount=50", &format!("-tagfocus=pid={pypid}")]);
    assert!(!py_top.contains("hot_seventy"), "{py_top}");
    assert!(
        py_top.contains("spin_here") || py_top.contains("_PyEval_EvalFrameDefault"),
        "{py_top}"
    );
}

/// The user stack copy starts small (8 KiB: what sampling costs the
/// program is mostly the kernel's copy) and grows when samples are cut at
/// its end: a program whose hot loop runs 200 frames deep with 112-byte
/// locals each (tests/fixtures/c/deep_stack.c, ~28 KiB of stack, on two
/// threads, the second started before the copy grows) gets its whole
/// chains, 200 `descend` frames down from `main` or the thread's start, and
/// stderr says the copy grew; with `--stack-size 8192` the copy stays (the
/// chains are cut); a shallow program's copy stays by default, and with
/// `--stack-size-min 1024` shrinks to what its chains need (they stay
/// whole).
#[test]
fn stack_copy_grows_for_deep_stacks() {
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed here");
        return;
    }
    let dir = scratch_dir("record-deep");
    let deep = Gcc::new(&["deep_stack.c"])
        .flags("-O2 -fomit-frame-pointer -pthread")
        .build(&dir.join("deep_stack"));
    let cli = &release_artifacts().cli;
    let rec = |name: &str, extra: &[&str], exe: &Path, args: &[&str]| -> (String, String) {
        let data = dir.join(format!("{name}.data"));
        let o = Command::new(cli)
            .args(["record", "-F", "999"])
            .args(extra)
            .arg("-o")
            .arg(&data)
            .arg("--")
            .arg(exe)
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{stderr}");
        (folded(&data), stderr)
    };
    // (samples whose chain is whole, samples cut) of the deep loop.
    let whole_and_cut = |f: &str| -> (u64, u64) {
        let (mut whole, mut cut) = (0, 0);
        for line in f.lines() {
            let (path, v) = line.rsplit_once(' ').unwrap();
            let v: u64 = v.parse().unwrap();
            let frames: Vec<&str> = path.split(';').collect();
            if !frames.contains(&"spin_deep") {
                continue;
            }
            let from_root = frames.contains(&"main") || frames.contains(&"worker");
            if from_root {
                let n = frames.iter().filter(|f| **f == "descend").count();
                assert_eq!(n, 200, "{path}");
                let i = frames.iter().position(|f| *f == "descend").unwrap();
                assert!(["main", "worker"].contains(&frames[i - 1]), "{path}");
                whole += v;
            } else {
                cut += v;
            }
        }
        (whole, cut)
    };
    let (f, stderr) = rec("adaptive", &[], &deep, &["3.0", "2"]);
    assert!(
        stderr.contains("user stack copy grew from 8192 to 16384 bytes"),
        "{stderr}"
    );
    assert!(stderr.contains("to 32768 bytes"), "{stderr}");
    let (whole, cut) = whole_and_cut(&f);
    // The copy grows within about a second of a 3 s run (of CPU per
    // thread): most samples are whole.
    assert!(whole > 2 * cut, "{whole} whole, {cut} cut\n{stderr}");

    let (f, stderr) = rec("fixed", &["--stack-size", "8192"], &deep, &["1.0", "1"]);
    assert!(!stderr.contains("grew"), "{stderr}");
    let (whole, cut) = whole_and_cut(&f);
    assert!(whole == 0 && cut > 0, "{whole} whole, {cut} cut");

    let shallow = Gcc::new(&["prof_hot.c"])
        .flags("-O2 -fomit-frame-pointer")
        .build(&dir.join("prof_hot"));
    // By default the copy of a shallow program neither grows nor shrinks.
    let (f, stderr) = rec("shallow", &[], &shallow, &["1.0", "1"]);
    assert!(!stderr.contains("grew"), "{stderr}");
    assert!(!stderr.contains("shrank"), "{stderr}");
    assert!(f.contains("hot_seventy"), "{f}");
    // Allowed to, it shrinks to twice what its chains read (about 1 KiB
    // from a thread's start: libc's frames there hold a jump buffer), and
    // the chains stay whole.
    let (f, stderr) = rec(
        "shrinking",
        &["--stack-size-min", "1024"],
        &shallow,
        &["2.5", "2"],
    );
    assert!(!stderr.contains("grew"), "{stderr}");
    let shrank = stderr
        .lines()
        .find_map(|l| l.split("user stack copy shrank from 8192 to ").nth(1))
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or_else(|| panic!("no shrink: {stderr}"));
    assert!((1024..=4096).contains(&shrank), "{stderr}");
    let (mut whole, mut all) = (0u64, 0u64);
    for line in f.lines() {
        let (path, v) = line.rsplit_once(' ').unwrap();
        let v: u64 = v.parse().unwrap();
        let frames: Vec<&str> = path.split(';').collect();
        if frames
            .iter()
            .any(|f| ["hot_seventy", "warm_twenty", "cool_ten"].contains(f))
        {
            all += v;
            if frames.contains(&"work")
                && (frames.contains(&"_start") || frames.contains(&"start_thread"))
            {
                whole += v;
            }
        }
    }
    assert!(whole * 100 >= all * 99, "{whole} of {all} whole\n{f}");
}

/// Two processes whose programs load at the same addresses (one source
/// built twice without PIE, its busy function named `spin_alpha` in one
/// and `spin_gamma` in the other), recorded together as a command's
/// children: each process's samples are named from its own program, about
/// half each, every chain down to `main`; and each file is one module
/// record however many processes mapped it (libc once, not once per
/// process).
#[test]
fn processes_at_the_same_addresses() {
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed");
        return;
    }
    let dir = scratch_dir("record-twins");
    let (a, g) = twins(&dir);
    let data = dir.join("twins.data");
    run(Command::new(&release_artifacts().cli)
        .args(["record", "-q", "-F", "999", "-o"])
        .arg(&data)
        .args(["--", "sh", "-c"])
        .arg(format!("{} 1.0 & {} 1.0; wait", a.display(), g.display())));
    let f = folded(&data);
    let (mut alpha, mut gamma) = (0u64, 0u64);
    for line in f.lines() {
        let (path, v) = line.rsplit_once(' ').unwrap();
        let v: u64 = v.parse().unwrap();
        let frames: Vec<&str> = path.split(';').collect();
        let n = frames
            .iter()
            .filter(|f| ["spin_alpha", "spin_gamma"].contains(f))
            .count();
        assert!(n <= 1, "two programs' functions in one stack: {path}");
        if frames.contains(&"spin_alpha") {
            alpha += v;
        } else if frames.contains(&"spin_gamma") {
            gamma += v;
        } else {
            continue;
        }
        assert!(frames.contains(&"main"), "{path}");
    }
    let total = (alpha + gamma) as f64;
    assert!(total > 0.0, "{f}");
    for (name, n) in [("spin_alpha", alpha), ("spin_gamma", gamma)] {
        let share = 100.0 * n as f64 / total;
        assert!(
            (30.0..70.0).contains(&share),
            "{name}: {share:.1}% of the two programs' samples, want about half\n{f}"
        );
    }
    let p = callstack::profile::Profile::read_trace(std::fs::File::open(&data).unwrap()).unwrap();
    let libc: Vec<_> = p
        .modules
        .iter()
        .filter(|m| m.path.to_string_lossy().contains("libc.so"))
        .collect();
    let listed: Vec<String> = p
        .modules
        .iter()
        .map(|m| {
            format!(
                "{} {:#x}-{:#x} bias {:#x}",
                m.path.display(),
                m.start,
                m.end,
                m.bias
            )
        })
        .collect();
    assert_eq!(libc.len(), 1, "{listed:#?}");
    for m in &p.modules {
        let overlapping: Vec<_> = p
            .modules
            .iter()
            .filter(|o| !std::ptr::eq(*o, m) && o.start < m.end && m.start < o.end)
            .collect();
        assert!(overlapping.is_empty(), "{m:?} overlaps {overlapping:?}");
    }
}

/// tests/fixtures/c/prof_twin.c built twice without PIE in `dir`: busy in
/// `spin_alpha`, and in `spin_gamma` (other code, so another build-id), at
/// the same addresses.
fn twins(dir: &Path) -> (PathBuf, PathBuf) {
    let build = |name: &str, step: u32| {
        Gcc::new(&["prof_twin.c"])
            .flags(&format!(
                "-O2 -fno-pie -no-pie -fno-omit-frame-pointer -DSPIN={name} -DSTEP={step}"
            ))
            .build(&dir.join(name))
    };
    (build("spin_alpha", 1), build("spin_gamma", 3))
}

/// `record --rotate --no-symbolize` writes addresses and mappings only,
/// for a server to name; here google/pprof's own command names them
/// through binutils from the programs' files, as a profile server does
/// from the same files fetched by build-id. Three programs at once: the
/// 70/20/10 one (PIE, no frame pointers) and the two builds without PIE
/// at the same addresses (one of them moved to a range of its own): each
/// named right, the split within 5 points. This needs each mapping's file
/// offset to be the file's, not the link-time address (0x400000 without
/// PIE).
#[test]
fn unnamed_pprof_is_named_by_a_server() {
    if !perf_allowed() {
        eprintln!("skipped: perf events not allowed here");
        return;
    }
    let Some(pprof) = testsupport::pprof_with_binutils() else {
        return;
    };
    let dir = scratch_dir("record-unnamed");
    let hot = Gcc::new(&["prof_hot.c"])
        .flags("-O2 -fomit-frame-pointer")
        .build(&dir.join("prof_hot"));
    let (a, g) = twins(&dir);
    let out = dir.join("bare");
    run(Command::new(&release_artifacts().cli)
        .args([
            "record",
            "-q",
            "-F",
            "999",
            "--rotate",
            "5",
            "--no-symbolize",
            "-o",
        ])
        .arg(&out)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "{} 1.5 & {} 1.5 & {} 1.5 1; wait",
            a.display(),
            g.display(),
            hot.display()
        )));
    let files: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let top = run(Command::new(&pprof)
        .args(["-symbolize=local", "-top", "-cum", "-nodecount=200"])
        .args(&files));
    let cum = |f: &str| -> f64 {
        top.lines()
            .filter(|l| l.split_whitespace().count() == 6)
            .find(|l| l.split_whitespace().last() == Some(f))
            .and_then(|l| l.split_whitespace().nth(4))
            .and_then(|p| p.trim_end_matches('%').parse().ok())
            .unwrap_or_else(|| panic!("{f} not named in\n{top}"))
    };
    assert!(cum("spin_alpha") > 5.0 && cum("spin_gamma") > 5.0, "{top}");
    let total: f64 = HOT.iter().map(|(f, _)| cum(f)).sum();
    for (f, want) in HOT {
        let got = cum(f) * 100.0 / total;
        assert!(
            (got - want).abs() < 5.0,
            "{f}: {got:.1}% for {want}%\n{top}"
        );
    }
}
