//! `callstack memtrack`: C and C++ fixtures with known allocation sites and
//! leaks, run under the preload library; the recording is read back and
//! every count asserted exactly, by function name.

use callstack::alloc::HeapSnapshot;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use testsupport::{release_artifacts, scratch_dir, Gcc};

/// Per-function sums of the sites whose innermost named frame is that
/// function: (allocations, bytes, frees, freed bytes).
fn by_function(snap: &HeapSnapshot, names: &[&str]) -> HashMap<String, (u64, u64, u64, u64)> {
    let mut sym = snap.symbolizer();
    let mut out: HashMap<String, (u64, u64, u64, u64)> = HashMap::new();
    for s in &snap.sites {
        let frames = snap.site_frames(&mut sym, s);
        if let Some(f) = frames.iter().find(|f| names.contains(&f.function.as_str())) {
            let e = out.entry(f.function.clone()).or_default();
            e.0 += s.allocs;
            e.1 += s.alloc_bytes;
            e.2 += s.frees;
            e.3 += s.free_bytes;
        }
    }
    out
}

fn memtrack(exe: &Path, capture: &str, out: &Path) -> (String, HeapSnapshot) {
    memtrack_with(exe, &["--capture", capture], out)
}

fn memtrack_with(exe: &Path, opts: &[&str], out: &Path) -> (String, HeapSnapshot) {
    let a = release_artifacts();
    let o = Command::new(&a.cli)
        .arg("memtrack")
        .args(opts)
        .arg("-o")
        .arg(out)
        .arg("--")
        .arg(exe)
        .env("CALLSTACK_PRELOAD_LIB", &a.preload_lib)
        .output()
        .expect("run callstack memtrack");
    // The program's output, then memtrack's summary (on stderr).
    let stdout = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success(),
        "memtrack failed: {}\n{stdout}",
        o.status
    );
    let snap = HeapSnapshot::read_from(std::fs::File::open(out).unwrap()).unwrap();
    (stdout, snap)
}

fn fixture_counts(stdout: &str) -> (u64, u64, u64) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("fixture:"))
        .expect("fixture line");
    let num = |k: &str| -> u64 {
        let s = &line[line.find(k).unwrap() + k.len()..];
        s.split_whitespace().next().unwrap().parse().unwrap()
    };
    (num("allocs="), num("bytes="), num("frees="))
}

const SITES: [&str; 6] = [
    "leak_a",
    "temp_b",
    "realloc_chain",
    "calloc_c",
    "aligned_d",
    "thread_leak",
];

fn check_sites(capture: &str) {
    let dir = scratch_dir(&format!("memtrack-sites-{capture}"));
    let exe = Gcc::new(&["memtrack_sites.c"])
        .flags("-O0 -pthread")
        .build(&dir.join("sites"));
    let (stdout, snap) = memtrack(&exe, capture, &dir.join("out.heap"));
    let f = by_function(&snap, &SITES);
    // (allocations, bytes, frees, freed bytes), as the fixture's comments say.
    assert_eq!(f["leak_a"], (3, 3000, 0, 0), "{stdout}");
    assert_eq!(f["temp_b"], (100, 6400, 100, 6400));
    assert_eq!(f["realloc_chain"], (9, 8176, 8, 8176 - 4096));
    assert_eq!(f["calloc_c"], (1, 500, 0, 0));
    assert_eq!(f["aligned_d"], (4, 4480, 2, 4128));
    assert_eq!(f["thread_leak"], (1000, 48000, 960, 46080));
    // The fixture's own counts equal the recording's, site by site summed.
    let (allocs, bytes, frees) = fixture_counts(&stdout);
    let sum = f
        .values()
        .fold((0, 0, 0), |a, v| (a.0 + v.0, a.1 + v.1, a.2 + v.2));
    assert_eq!(sum, (allocs, bytes, frees));
    // The block from __libc_malloc (past the hooks) was freed safely.
    assert!(snap.counters.unknown_frees >= 1);
    assert_eq!(snap.counters.live_overflow, 0);
    // The summary names the leaks.
    let leaks = &stdout[stdout.find("leaks:").expect("leak report")..];
    for (name, bytes) in [
        ("leak_a", 3000),
        ("realloc_chain", 4096),
        ("thread_leak", 1920),
    ] {
        let at = leaks
            .find(&format!("{name} at "))
            .unwrap_or_else(|| panic!("{name} in\n{leaks}"));
        let head = leaks[..at].rfind("bytes live").unwrap();
        let line_start = leaks[..head].rfind('\n').unwrap() + 1;
        assert!(
            leaks[line_start..].starts_with(&format!("  {bytes} bytes live")),
            "{name}: {}",
            &leaks[line_start..at]
        );
    }
}

#[test]
fn c_sites_exact_capture() {
    check_sites("exact");
}

#[test]
fn c_sites_fast_capture() {
    check_sites("fast");
}

/// heaptrack, run on the same fixture, counts as many allocations by each
/// of its functions as the recording holds, except the one `memalign`,
/// which heaptrack 1.4 does not intercept.
#[test]
fn counts_equal_heaptracks() {
    let dir = scratch_dir("memtrack-heaptrack");
    let exe = Gcc::new(&["memtrack_sites.c"])
        .flags("-O0 -pthread")
        .build(&dir.join("sites"));
    let (_, snap) = memtrack(&exe, "exact", &dir.join("out.heap"));
    let ours = by_function(&snap, &SITES);
    let data = dir.join("ht");
    let o = Command::new("heaptrack")
        .arg("-o")
        .arg(&data)
        .arg(&exe)
        .output()
        .expect("run heaptrack (Debian package heaptrack)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let zst = PathBuf::from(format!("{}.zst", data.display()));
    // Every allocating call site, innermost function on the next line.
    let p = Command::new("heaptrack_print")
        .args(["-a", "1", "-n", "1000", "-p", "0", "-t", "0", "-l", "0"])
        .arg(&zst)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&p.stdout);
    let mut theirs: HashMap<&str, u64> = HashMap::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if let Some(n) = l
            .strip_suffix(" from")
            .and_then(|l| l.split_once(" calls to allocation functions "))
        {
            let func = lines.next().unwrap_or("");
            *theirs.entry(func).or_default() += n.0.parse::<u64>().unwrap();
        }
    }
    for f in SITES {
        let expected = ours[f].0 - if f == "aligned_d" { 1 } else { 0 };
        assert_eq!(theirs.get(f).copied(), Some(expected), "{f}\n{text}");
    }
}

#[test]
fn cpp_new_delete() {
    let dir = scratch_dir("memtrack-cpp");
    let exe = dir.join("cpp");
    let o = Command::new("g++")
        .args(["-g", "-O0", "-o"])
        .arg(&exe)
        .arg(testsupport::c_fixtures().join("memtrack_cpp.cpp"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (stdout, snap) = memtrack(&exe, "exact", &dir.join("out.heap"));
    let f = by_function(&snap, &["cpp_leak()", "cpp_temp()", "cpp_vector()"]);
    assert_eq!(f["cpp_leak()"], (3, 180, 0, 0), "{stdout}");
    assert_eq!(f["cpp_temp()"], (10, 400, 10, 400));
    assert_eq!(f["cpp_vector()"], (2, 576, 2, 576));
}

#[test]
fn fork_child_writes_its_own_file() {
    let dir = scratch_dir("memtrack-fork");
    let exe = Gcc::new(&["memtrack_fork.c"])
        .flags("-O0")
        .build(&dir.join("fork"));
    let out = dir.join("out.heap");
    let (stdout, parent) = memtrack(&exe, "exact", &out);
    let pid: u32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("child "))
        .expect("child pid")
        .parse()
        .unwrap();
    let child_file = PathBuf::from(format!("{}.{pid}", out.display()));
    let child = HeapSnapshot::read_from(std::fs::File::open(&child_file).unwrap()).unwrap();
    let names = ["parent_leak", "child_leak"];
    let p = by_function(&parent, &names);
    let c = by_function(&child, &names);
    assert_eq!(p.get("parent_leak"), Some(&(1, 321, 0, 0)));
    assert_eq!(p.get("child_leak"), None);
    // The child inherits the parent's blocks and adds its own.
    assert_eq!(c.get("parent_leak"), Some(&(1, 321, 0, 0)));
    assert_eq!(c.get("child_leak"), Some(&(1, 123, 0, 0)));
    // The exec'd child wrote its own recording too.
    let prefix = format!("{}.", out.file_name().unwrap().to_str().unwrap());
    let others: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_str().unwrap();
            n.starts_with(&prefix) && p != &child_file
        })
        .collect();
    assert_eq!(others.len(), 1, "{others:?}");
    let ex = HeapSnapshot::read_from(std::fs::File::open(&others[0]).unwrap()).unwrap();
    let e = by_function(&ex, &["parent_leak", "child_leak", "exec_leak"]);
    assert_eq!(e.get("exec_leak"), Some(&(1, 77, 0, 0)));
    assert_eq!(e.get("parent_leak"), None); // a new image: nothing inherited
}

#[test]
fn missing_library_is_an_error() {
    let a = release_artifacts();
    let o = Command::new(&a.cli)
        .args(["memtrack", "--", "true"])
        .env("CALLSTACK_PRELOAD_LIB", "/nonexistent/libx.so")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/nonexistent/libx.so"), "{err}");
}

/// A wrapper that execs the program: the recording is the exec'd image's
/// (the tables of its pid taken over); a shell ending in `_exit` (after
/// `exit 3`) has its status and its recording.
#[test]
fn exec_wrapper_and_exit_without_handlers() {
    let dir = scratch_dir("memtrack-exec");
    let exe = Gcc::new(&["memtrack_fork.c"])
        .flags("-O0")
        .build(&dir.join("fork"));
    let a = release_artifacts();
    let out = dir.join("out.heap");
    let o = Command::new(&a.cli)
        .args(["memtrack", "-o"])
        .arg(&out)
        .args(["--", "/bin/sh", "-c"])
        .arg(format!("exec {} exec", exe.display()))
        .env("CALLSTACK_PRELOAD_LIB", &a.preload_lib)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("exec_leak at "), "{err}");
    assert!(err.contains("processes recorded: 1\n"), "{err}");
    let o = Command::new(&a.cli)
        .args(["memtrack", "-o"])
        .arg(&out)
        .args(["--", "/bin/sh", "-c", "exit 3"])
        .env("CALLSTACK_PRELOAD_LIB", &a.preload_lib)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("ended with exit status 3; recording: "),
        "{err}"
    );
    HeapSnapshot::read_from(std::fs::File::open(&out).unwrap()).unwrap();
}

/// A library with thread-local storage dlopen'd by the traced program, and
/// threads allocating through it afterwards: no deadlock or recursion
/// (the preload's own thread-local flag is read after the loader's TLS
/// generation changed), and every block is found at its line.
#[test]
fn dlopen_of_a_tls_library() {
    let dir = scratch_dir("memtrack-dlopen");
    let lib = dir.join("libtlslib.so");
    let o = Command::new("gcc")
        .args(["-g", "-O0", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(testsupport::c_fixtures().join("memtrack_tls_lib.c"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let exe = Gcc::new(&["memtrack_dlopen.c"])
        .flags("-O0 -pthread -ldl")
        .build(&dir.join("dl"));
    let a = release_artifacts();
    let out = dir.join("out.heap");
    let o = Command::new(&a.cli)
        .args(["memtrack", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .arg(&lib)
        .env("CALLSTACK_PRELOAD_LIB", &a.preload_lib)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let snap = HeapSnapshot::read_from(std::fs::File::open(&out).unwrap()).unwrap();
    let mut sym = snap.symbolizer();
    let (mut allocs, mut bytes) = (0, 0);
    for s in &snap.sites {
        let frames = snap.site_frames(&mut sym, s);
        if frames
            .first()
            .is_some_and(|f| f.location.ends_with("memtrack_tls_lib.c:11"))
            && frames.iter().any(|f| f.function == "after_dlopen")
        {
            allocs += s.allocs;
            bytes += s.alloc_bytes;
        }
    }
    assert_eq!((allocs, bytes), (5, 1000));
}

/// `callstack report` reads a heap recording as a heap profile: folded
/// stacks of in-use bytes (the leaks) and of allocation counts, a
/// flamegraph SVG by bytes, a gzip'd pprof with the four heap sample types.
#[test]
fn report_of_a_heap_recording() {
    let dir = scratch_dir("memtrack-report");
    let exe = Gcc::new(&["memtrack_sites.c"])
        .flags("-O0 -pthread")
        .build(&dir.join("sites"));
    let out = dir.join("out.heap");
    memtrack(&exe, "exact", &out);
    let a = release_artifacts();
    let folded = |sample_type: &str| -> HashMap<String, i64> {
        let o = Command::new(&a.cli)
            .arg("report")
            .arg(&out)
            .args(["--top", "0", "--folded", "-", "--sample-type", sample_type])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mut m = HashMap::new();
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            let (stack, v) = l.rsplit_once(' ').unwrap();
            let leaf = stack.rsplit(';').next().unwrap().to_string();
            *m.entry(leaf).or_insert(0) += v.parse::<i64>().unwrap();
        }
        m
    };
    let inuse = folded("inuse_space");
    assert_eq!(inuse["leak_a"], 3000);
    assert_eq!(inuse["realloc_chain"], 4096);
    assert_eq!(inuse["thread_leak"], 1920);
    assert_eq!(inuse.get("temp_b"), None); // all freed
    let objects = folded("alloc_objects");
    assert_eq!(objects["temp_b"], 100);
    assert_eq!(objects["thread_leak"], 1000);

    let (svg, pprof) = (dir.join("heap.svg"), dir.join("heap.pb.gz"));
    let o = Command::new(&a.cli)
        .arg("report")
        .arg(&out)
        .arg("--svg")
        .arg(&svg)
        .arg("--pprof")
        .arg(&pprof)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("inuse_space/bytes total"), "{text}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("leak_a"));
    let raw = Command::new("gzip")
        .arg("-dc")
        .arg(&pprof)
        .output()
        .unwrap();
    assert!(raw.status.success());
    let body = String::from_utf8_lossy(&raw.stdout);
    for s in [
        "alloc_objects",
        "alloc_space",
        "inuse_objects",
        "inuse_space",
        "leak_a",
    ] {
        assert!(body.contains(s), "{s} missing from the pprof string table");
    }
    // Parca's server would take it.
    let parsed = testsupport::pprof::parca_check(&raw.stdout)
        .unwrap_or_else(|e| panic!("Parca would refuse it: {e}"));
    assert_eq!(parsed.sample_types.len(), 4, "{:?}", parsed.sample_types);
    // go tool pprof (Debian golang-go) reads it: flat values by function.
    let flat = |index: &str| -> String {
        let o = Command::new("go")
            .args(["tool", "pprof", "-top", &format!("-sample_index={index}")])
            .arg(&pprof)
            .output()
            .expect("run go tool pprof (Debian package golang-go)");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let has = |text: &str, value: &str, func: &str| {
        text.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.first() == Some(&value) && w.last() == Some(&func)
        })
    };
    let inuse = flat("inuse_space");
    assert!(has(&inuse, "3000B", "leak_a"), "{inuse}");
    assert!(has(&inuse, "1920B", "thread_leak"), "{inuse}");
    let objects = flat("alloc_objects");
    assert!(has(&objects, "1000", "thread_leak"), "{objects}");
}

/// `--sample-bytes N`: every site's estimated allocations, bytes and live
/// bytes equal the fixture's exact truth (and exact tracking's) within
/// five standard deviations of the sampling (each under 10% for the
/// allocated bytes), for small, medium, large and varying sizes and
/// threads; the reports say they hold estimates, and the pprof's period
/// is N.
#[test]
fn sampled_tracking_estimates_every_site() {
    let dir = scratch_dir("memtrack-sampled");
    let exe = Gcc::new(&["memtrack_sampled.c"])
        .flags("-O1 -pthread")
        .build(&dir.join("sampled"));
    let names = [
        "small_objs",
        "medium_objs",
        "big_objs",
        "mixed_sizes",
        "thread_objs",
    ];
    let n: u64 = 16 * 1024;
    let (_, exact) = memtrack(&exe, "exact", &dir.join("exact.heap"));
    let (out, sampled) = memtrack_with(
        &exe,
        &["--sample-bytes", &n.to_string()],
        &dir.join("sampled.heap"),
    );
    assert_eq!(exact.sample_bytes, 0);
    assert_eq!(sampled.sample_bytes, n);
    assert!(
        out.contains(&format!("sampled: about one allocation per {n} bytes")),
        "{out}"
    );
    // Frees of blocks not sampled are no "unknown frees".
    assert!(
        sampled.counters.unknown_frees < 100,
        "{:?}",
        sampled.counters
    );
    let ex = by_function(&exact, &names);
    let sa = by_function(&sampled, &names);
    let live = |snap: &HeapSnapshot, name: &str| -> (u64, u64) {
        let mut sym = snap.symbolizer();
        let mut r = (0, 0);
        for s in &snap.sites {
            if snap
                .site_frames(&mut sym, s)
                .iter()
                .any(|f| f.function == name)
            {
                r.0 += s.live_blocks();
                r.1 += s.live_bytes();
            }
        }
        r
    };
    // How far an estimate of `truth` bytes in blocks of about `size` bytes
    // may be off: five standard deviations of the sampling.
    let tol = |truth: u64, size: u64| -> f64 {
        let p = 1.0 - (-(size as f64) / n as f64).exp();
        let samples = truth as f64 / size as f64 * p;
        5.0 * ((1.0 - p) / samples).sqrt() + 0.002
    };
    for line in out.lines().filter(|l| l.starts_with("fixture: ")) {
        let mut w = line.split_whitespace().skip(1);
        let name = w.next().unwrap();
        let num = |k: &str| -> u64 {
            let v = line
                .split_whitespace()
                .find_map(|t| t.strip_prefix(k))
                .unwrap();
            v.parse().unwrap()
        };
        let (allocs, bytes, live_n, live_b) = (
            num("allocs="),
            num("bytes="),
            num("live="),
            num("live_bytes="),
        );
        // Exact tracking holds the truth.
        assert_eq!((ex[name].0, ex[name].1), (allocs, bytes), "{name} exact");
        assert_eq!(live(&exact, name), (live_n, live_b), "{name} exact live");
        let size = bytes / allocs;
        let (est_n, est_b) = (sa[name].0, sa[name].1);
        let t = tol(bytes, size);
        assert!(t < 0.10, "{name}: the fixture gives too few samples ({t})");
        let rb = est_b as f64 / bytes as f64;
        let rn = est_n as f64 / allocs as f64;
        assert!(
            (rb - 1.0).abs() < t,
            "{name}: bytes {est_b} for {bytes} (ratio {rb}, tolerance {t})"
        );
        assert!(
            (rn - 1.0).abs() < t,
            "{name}: allocations {est_n} for {allocs} (ratio {rn}, tolerance {t})"
        );
        let (est_ln, est_lb) = live(&sampled, name);
        if live_b == 0 {
            assert_eq!((est_ln, est_lb), (0, 0), "{name}: live");
        } else {
            let t = tol(live_b, size);
            let rl = est_lb as f64 / live_b as f64;
            assert!(
                (rl - 1.0).abs() < t,
                "{name}: live bytes {est_lb} for {live_b} (ratio {rl}, tolerance {t})"
            );
        }
    }
    // The heap profile says what it is sampled by.
    let a = release_artifacts();
    let pb = dir.join("sampled.pb.gz");
    let o = Command::new(&a.cli)
        .arg("report")
        .arg(dir.join("sampled.heap"))
        .arg("--pprof")
        .arg(&pb)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&pb)
        .output()
        .expect("run go tool pprof (Debian package golang-go)");
    let raw = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(raw.contains("PeriodType: space bytes"), "{raw}");
    assert!(raw.contains(&format!("Period: {n}")), "{raw}");
    testsupport::pprof::parca_check(&std::fs::read(&pb).unwrap())
        .unwrap_or_else(|e| panic!("Parca would refuse it: {e}"));
}
