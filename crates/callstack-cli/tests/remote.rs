//! `callstack core` and `callstack pstack` against gdb, on the
//! `remote_threads.c` fixture: several threads blocked in known chains.
//!
//! Every thread's chain of function names must equal gdb's
//! `thread apply all bt` for that thread (matched by tid), frame by frame.

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use testsupport::{gcore, release_artifacts, scratch_dir, Gcc};

/// Functions of the fixture itself.
const OWN: &[&str] = &[
    "block_here",
    "descend",
    "chain_a",
    "chain_b",
    "worker_main",
    "main_wait",
    "main",
    "wait_stdin",
    "waker",
    "sig_handler",
    "sig_victim",
    "sig_main",
];

/// Whether the CFI unwinder is in `remote::step`. Until it is, frames are
/// found by frame pointer only: builds must keep frame pointers, and a
/// chain is compared with gdb's down to the first frame below the
/// fixture's own code (glibc, built without frame pointers, ends the walk).
const CFI_UNWINDER: bool = true;

struct Fixture {
    child: Child,
    pid: u32,
    out: BufReader<ChildStdout>,
    threads: usize,
}

impl Fixture {
    /// The C fixture: `threads` workers, main, the waker and the signal thread.
    fn start(exe: &Path, threads: usize, depth: usize) -> Fixture {
        Self::start_with(exe, threads, depth, 3)
    }

    /// `extra`: threads besides the workers.
    fn start_with(exe: &Path, threads: usize, depth: usize, extra: usize) -> Fixture {
        let mut child = Command::new(exe)
            .args([threads.to_string(), depth.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start fixture");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let pid: u32 = line
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("fixture said {line:?}"));
        assert_eq!(pid, child.id());
        wait_all_blocked(pid, threads + extra);
        Fixture {
            child,
            pid,
            out,
            threads,
        }
    }

    /// Wakes every thread and checks the process finishes its work and exits 0.
    fn finish(mut self) {
        self.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut rest = String::new();
        self.out.read_to_string(&mut rest).unwrap();
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "fixture exited with {status}; output {rest}"
        );
        for i in 0..self.threads {
            assert!(
                rest.contains(&format!("done {i}\n")),
                "thread {i} did not finish: {rest}"
            );
        }
        assert!(rest.contains("all done"), "{rest}");
    }
}

/// Waits until every thread of `pid` sits in its blocking system call
/// (futex for the chains, read for the waker), so that the chains are the
/// known ones when we look.
fn wait_all_blocked(pid: u32, count: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut blocked = 0;
        for e in std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
        {
            let sc = std::fs::read_to_string(e.path().join("syscall")).unwrap_or_default();
            let nr = sc.split_whitespace().next().unwrap_or("");
            // x86-64: 202 futex, 0 read.
            if nr == "202" || nr == "0" {
                blocked += 1;
            }
        }
        if blocked == count {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fixture threads never all blocked"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// gdb's `thread apply all bt`: tid -> function names.
fn gdb_threads(args: &[&str]) -> BTreeMap<u32, Vec<String>> {
    let o = testsupport::gdb_batch("gdb")
        .args(["-ex", "thread apply all bt"])
        .args(args)
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = BTreeMap::new();
    let mut tid = None;
    for line in text.lines() {
        if line.starts_with("Thread ") {
            tid = line
                .split_once("(LWP ")
                .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<u32>().ok());
            if let Some(t) = tid {
                out.insert(t, Vec::new());
            }
        } else if line.starts_with('#') {
            if let Some(t) = tid {
                out.get_mut(&t)
                    .unwrap()
                    .extend(testsupport::parse_gdb_bt(line));
            }
        }
    }
    assert!(
        !out.is_empty(),
        "gdb printed no threads:\n{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A thread's name, function names and methods.
type ThreadChain = (Option<String>, Vec<String>, Vec<String>);

struct Ours {
    /// tid -> its chain
    threads: BTreeMap<u32, ThreadChain>,
    stderr: String,
}

fn callstack(args: &[&str]) -> (std::process::Output, String, String) {
    let o = Command::new(&release_artifacts().cli)
        .args(args)
        .output()
        .expect("run callstack");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "callstack panicked: {stderr}");
    (o, stdout, stderr)
}

fn callstack_json(args: &[&str]) -> Ours {
    let (o, stdout, stderr) = callstack(args);
    assert!(o.status.success(), "callstack {args:?} failed: {stderr}");
    let v: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {stdout}"));
    let mut threads = BTreeMap::new();
    for t in v["threads"].as_array().expect("threads array") {
        let tid = t["tid"].as_u64().unwrap() as u32;
        let name = t["name"].as_str().map(String::from);
        let mut funcs = Vec::new();
        let mut methods = Vec::new();
        for f in t["frames"].as_array().unwrap() {
            for key in [
                "pc", "function", "file", "line", "inlined", "module", "method",
            ] {
                assert!(f.get(key).is_some(), "frame without {key}: {f}");
            }
            assert!(f["pc"].as_str().unwrap().starts_with("0x"));
            funcs.push(f["function"].as_str().unwrap_or("??").to_string());
            methods.push(f["method"].as_str().unwrap().to_string());
        }
        threads.insert(tid, (name, funcs, methods));
    }
    Ours { threads, stderr }
}

/// The part of gdb's chain we must equal.
fn expected(gdb: &[String]) -> Vec<String> {
    if CFI_UNWINDER {
        return gdb.to_vec();
    }
    let last_own = gdb.iter().rposition(|f| OWN.contains(&f.as_str()));
    match last_own {
        Some(i) => gdb[..(i + 2).min(gdb.len())].to_vec(),
        None => gdb.to_vec(),
    }
}

fn compare(what: &str, ours: &Ours, gdb: &BTreeMap<u32, Vec<String>>, nthreads: usize) {
    assert_eq!(
        gdb.len(),
        nthreads + 3,
        "{what}: gdb saw {} threads",
        gdb.len()
    );
    for (tid, chain) in gdb {
        // gdb names the signal trampoline's frame `<signal handler called>`.
        let chain: &Vec<String> = &chain
            .iter()
            .map(|f| {
                if f == "<signal" {
                    "__restore_rt".to_string()
                } else {
                    f.clone()
                }
            })
            .collect();
        let (_, got, methods) = ours
            .threads
            .get(tid)
            .unwrap_or_else(|| panic!("{what}: thread {tid} missing from our output"));
        let want = expected(chain);
        assert_eq!(
            got, &want,
            "{what}: thread {tid}: ours {got:?} (methods {methods:?}) vs gdb {chain:?}\nstderr: {}",
            ours.stderr
        );
        assert_eq!(methods[0], "context");
    }
    assert_eq!(ours.threads.len(), gdb.len(), "{what}: thread count");
}

fn build(tag: &str, flags: &str) -> PathBuf {
    let dir = scratch_dir("remote");
    Gcc::new(&["remote_threads.c"])
        .flags(flags)
        .flags("-pthread")
        .build(&dir.join(format!("remote_threads_{tag}")))
}

fn modes() -> Vec<(&'static str, &'static str)> {
    let mut m = vec![
        ("O0fp", "-O0 -fno-omit-frame-pointer"),
        ("O2fp", "-O2 -fno-omit-frame-pointer"),
    ];
    if CFI_UNWINDER {
        m.push(("O2nofp", "-O2 -fomit-frame-pointer"));
        m.push(("O0", "-O0"));
        m.push((
            "O2_debug_frame_only",
            "-O2 -fomit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables",
        ));
    } else {
        // Frame pointers alone miss the caller of a leaf function built
        // without a frame at -O2 (gdb finds it by CFI): -O0 only for now.
        m.truncate(1);
    }
    m
}

#[test]
fn pstack_matches_gdb_and_target_survives() {
    for (tag, flags) in modes() {
        let exe = build(&format!("{tag}_live"), flags);
        let n = 4;
        let fx = Fixture::start(&exe, n, 3);
        let pid = fx.pid.to_string();
        let ours = callstack_json(&["pstack", "--json", &pid]);
        let gdb = gdb_threads(&["-p", &pid]);
        compare(&format!("pstack {tag}"), &ours, &gdb, n);
        // Thread names come from /proc.
        let names: Vec<_> = ours.threads.values().filter_map(|t| t.0.clone()).collect();
        for i in 0..n {
            assert!(names.contains(&format!("worker-{i}")), "{names:?}");
        }
        assert!(names.contains(&"waker".to_string()));
        assert!(names.contains(&"sig".to_string()));
        // Every thread, the main one included, is named as in
        // /proc/PID/task/TID/comm.
        let comm = |tid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .unwrap()
                .trim_end_matches('\n')
                .to_string()
        };
        for (tid, t) in &ours.threads {
            assert_eq!(t.0.as_deref(), Some(comm(*tid).as_str()), "thread {tid}");
        }
        // Text output too, and a second look does not disturb the target.
        let (o, text, _) = callstack(&["pstack", &pid]);
        assert!(o.status.success());
        assert!(text.contains("in block_here ()"), "{text}");
        assert!(text.contains("\"worker-0\""), "{text}");
        for tid in ours.threads.keys() {
            let head = format!("(LWP {tid} \"{}\"):", comm(*tid));
            assert!(text.contains(&head), "{head} missing:\n{text}");
        }
        fx.finish();
    }
}

#[test]
fn core_matches_gdb() {
    for (tag, flags) in modes() {
        let exe = build(&format!("{tag}_core"), flags);
        let n = 3;
        let fx = Fixture::start(&exe, n, 2);
        let dir = scratch_dir(&format!("remote-core-{tag}"));
        let core = gcore(fx.pid, &dir);
        fx.finish();
        let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
        let ours = callstack_json(&["core", "--json", exe_s, core_s]);
        let gdb = gdb_threads(&[exe_s, core_s]);
        compare(&format!("core {tag}"), &ours, &gdb, n);
        let (o, text, _) = callstack(&["core", exe_s, core_s]);
        assert!(o.status.success());
        assert!(text.contains("in block_here () at"), "{text}");
        let _ = std::fs::remove_file(&core);
    }
}

/// One core shared by the bad-input tests.
fn sample_core(tag: &str) -> (PathBuf, PathBuf) {
    let exe = build(&format!("bad{tag}"), "-O0 -fno-omit-frame-pointer");
    let fx = Fixture::start(&exe, 2, 1);
    let core = gcore(fx.pid, &scratch_dir(&format!("remote-bad-{tag}")));
    fx.finish();
    (exe, core)
}

#[test]
fn truncated_and_corrupt_cores_give_messages_not_panics() {
    let (exe, core) = sample_core("trunc");
    let data = std::fs::read(&core).unwrap();
    let dir = core.parent().unwrap().to_path_buf();
    let exe_s = exe.to_str().unwrap();
    let cut = dir.join("cut.core");
    for len in [
        0,
        10,
        63,
        64,
        200,
        1000,
        5000,
        data.len() / 2,
        data.len() - 4096,
    ] {
        std::fs::write(&cut, &data[..len]).unwrap();
        let (o, stdout, stderr) = callstack(&["core", exe_s, cut.to_str().unwrap()]);
        assert!(!stderr.is_empty(), "no message for a core cut at {len}");
        if o.status.success() {
            // Whatever survived is printed, with a word about what did not.
            assert!(stdout.contains("Thread 1"), "cut at {len}: {stdout}");
            assert!(stderr.contains("truncated"), "cut at {len}: {stderr}");
        } else {
            assert!(
                stderr.contains("truncated") || stderr.contains("not an ELF core file"),
                "cut at {len}: {stderr}"
            );
        }
    }
    // Not a core at all.
    let (o, _, stderr) = callstack(&["core", exe_s, exe_s]);
    assert!(!o.status.success());
    assert!(stderr.contains("not a core file"), "{stderr}");

    // Byte flips in the headers and notes, through the library (no process per case).
    let head = &data[..data.len().min(64 * 1024)];
    let mut seed = 0x9e3779b97f4a7c15u64;
    for _ in 0..300 {
        let mut d = head.to_vec();
        for _ in 0..4 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let i = (seed as usize) % d.len().min(8192);
            d[i] = (seed >> 32) as u8;
        }
        let lookup = callstack::remote::Lookup::default();
        if let Ok(c) = callstack::remote::corefile::CoreFile::from_vec(d, Some(&exe), &lookup) {
            let mut mem = c.memory();
            for t in &c.snapshot().threads {
                let _ = callstack::remote::unwind_thread(c.snapshot(), &mut mem, t, 64);
            }
        }
    }
}

#[test]
fn mismatched_build_id_and_missing_libraries() {
    let (exe, core) = sample_core("bid");
    let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
    // Another build of the program: a different build-id.
    let other = build("other", "-O0 -fno-omit-frame-pointer -DREMOTE_VARIANT=1");
    let (o, stdout, stderr) = callstack(&["core", other.to_str().unwrap(), core_s]);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("does not match"), "{stderr}");
    assert!(stdout.contains("Thread 1"), "{stdout}");
    assert!(
        !stdout.contains("block_here"),
        "symbols of the wrong file were used: {stdout}"
    );
    assert!(stdout.contains("#0  0x"), "{stdout}");

    // Libraries missing: a sysroot without them. The executable still names its frames.
    let empty = scratch_dir("remote-empty-sysroot");
    let (o, stdout, stderr) =
        callstack(&["core", "--sysroot", empty.to_str().unwrap(), exe_s, core_s]);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("libc.so.6: not found under --sysroot"),
        "{stderr}"
    );
    assert!(stdout.contains("in block_here ()"), "{stdout}");
    assert!(stdout.contains("in worker_main ()"), "{stdout}");
}

#[test]
fn pstack_errors_are_clear() {
    let (o, _, stderr) = callstack(&["pstack", "4000000000"]);
    assert!(!o.status.success());
    assert!(stderr.contains("no process with id 4000000000"), "{stderr}");

    // A zombie: a child that exited and was not reaped.
    let mut z = Command::new("true").spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (o, _, stderr) = callstack(&["pstack", &z.id().to_string()]);
    assert!(!o.status.success());
    assert!(stderr.contains("zombie"), "{stderr}");
    z.wait().unwrap();

    // No permission: an unprivileged user may not trace our fixture.
    let exe = build("perm", "-O0 -fno-omit-frame-pointer");
    let fx = Fixture::start(&exe, 1, 1);
    let setpriv = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&release_artifacts().cli)
        .args(["pstack", &fx.pid.to_string()])
        .output();
    if let Ok(o) = setpriv {
        let stderr = String::from_utf8_lossy(&o.stderr);
        if !stderr.contains("Permission denied") || stderr.contains("callstack") {
            assert!(!o.status.success());
            assert!(
                stderr.contains("not permitted to trace process"),
                "{stderr}"
            );
        }
    }
    fx.finish();
}

/// Hides the core's NT_FILE note (its type becomes 0), as in cores written
/// by qemu-user or by some tools for static executables.
fn without_nt_file(core: &Path) -> PathBuf {
    let mut d = std::fs::read(core).unwrap();
    // n_type = NT_FILE ("FILE" read as a little-endian u32), then the name "CORE\0".
    let pat = [0x45u8, 0x4c, 0x49, 0x46, b'C', b'O', b'R', b'E', 0];
    let i = d
        .windows(pat.len())
        .position(|w| w == pat)
        .expect("the core has an NT_FILE note");
    d[i..i + 4].copy_from_slice(&[0, 0, 0, 0]);
    let out = core.with_extension("nofile");
    std::fs::write(&out, d).unwrap();
    out
}

#[test]
fn core_without_nt_file_uses_the_executable_as_the_map() {
    // A static executable: the whole chain is in the file given on the command line.
    let exe = build("static", "-O2 -static");
    let n = 2;
    let fx = Fixture::start(&exe, n, 2);
    let core = gcore(fx.pid, &scratch_dir("remote-static"));
    fx.finish();
    let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
    let gdb = gdb_threads(&[exe_s, core_s]);
    let hidden = without_nt_file(&core);
    let ours = callstack_json(&["core", "--json", exe_s, hidden.to_str().unwrap()]);
    // Known difference, the Symbolizer's to settle: a static glibc has no
    // DWARF, and where `.symtab` holds two names for one address
    // (`__clone3` GLOBAL HIDDEN, `clone3` WEAK DEFAULT) gdb picks the
    // second. Every frame is still compared, up to that alias.
    assert_eq!(ours.threads.len(), gdb.len());
    for (tid, chain) in &gdb {
        let got = &ours.threads[tid].1;
        assert_eq!(
            got.len(),
            chain.len(),
            "thread {tid}: {got:?} vs gdb {chain:?}"
        );
        for (a, b) in got.iter().zip(chain) {
            let b = if b == "<signal" { "__restore_rt" } else { b };
            assert!(
                a == b || a.trim_start_matches("__") == b,
                "thread {tid}: {got:?} vs gdb {chain:?}"
            );
        }
    }
    let _ = std::fs::remove_file(&hidden);
    let _ = std::fs::remove_file(&core);

    // A PIE: placed by AT_ENTRY; the libraries are unknown, so a chain is
    // right down to its first frame outside the executable.
    let exe = build("pie_nofile", "-O2 -fno-omit-frame-pointer");
    let fx = Fixture::start(&exe, n, 2);
    let core = gcore(fx.pid, &scratch_dir("remote-pie-nofile"));
    fx.finish();
    let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
    let gdb = gdb_threads(&[exe_s, core_s]);
    let hidden = without_nt_file(&core);
    let ours = callstack_json(&["core", "--json", exe_s, hidden.to_str().unwrap()]);
    for (tid, chain) in &gdb {
        let own: Vec<&String> = chain
            .iter()
            .take_while(|f| OWN.contains(&f.as_str()))
            .collect();
        let got = &ours.threads[tid].1;
        assert!(
            got.len() >= own.len(),
            "thread {tid}: {got:?} vs gdb {chain:?}"
        );
        assert_eq!(
            got[..own.len()].iter().collect::<Vec<_>>(),
            own,
            "thread {tid}"
        );
    }
    let _ = std::fs::remove_file(&hidden);
    let _ = std::fs::remove_file(&core);
}

#[test]
fn separate_debug_file_from_debug_dir() {
    // Debug info split off into DIR/.build-id/xx/rest.debug, the executable stripped.
    let dir = scratch_dir("remote-debugdir");
    let exe = build("split", "-O2 -fno-omit-frame-pointer");
    let dbg = dir.join("split.debug");
    let run = |args: &[&str]| {
        let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let (exe_s, dbg_s) = (exe.to_str().unwrap(), dbg.to_str().unwrap());
    run(&["objcopy", "--only-keep-debug", exe_s, dbg_s]);
    run(&["strip", "--strip-all", exe_s]);
    let notes = run(&["readelf", "-n", exe_s]);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("build-id")
        .trim()
        .to_string();
    let debug_dir = dir.join("debug");
    let place = debug_dir.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&place).unwrap();
    std::fs::copy(&dbg, place.join(format!("{}.debug", &id[2..]))).unwrap();

    let fx = Fixture::start(&exe, 1, 1);
    let core = gcore(fx.pid, &dir);
    fx.finish();
    let core_s = core.to_str().unwrap();
    let (_, without, _) = callstack(&["core", exe_s, core_s]);
    assert!(
        !without.contains("block_here"),
        "stripped, yet named: {without}"
    );
    let (o, with, stderr) = callstack(&[
        "core",
        "--debug-dir",
        debug_dir.to_str().unwrap(),
        exe_s,
        core_s,
    ]);
    assert!(o.status.success(), "{stderr}");
    assert!(with.contains("in block_here () at "), "{with}");
    assert!(with.contains("remote_threads.c:"), "{with}");
    let _ = std::fs::remove_file(&core);
}

/// gdb's `thread apply all bt` with whole names (Rust names hold spaces
/// inside their generic arguments): tid -> names.
fn gdb_threads_full(args: &[&str]) -> BTreeMap<u32, Vec<String>> {
    let o = testsupport::gdb_batch("gdb")
        .args(["-ex", "thread apply all bt"])
        .args(args)
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut tid = None;
    for line in text.lines() {
        if line.starts_with("Thread ") {
            tid = line
                .split_once("(LWP ")
                .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<u32>().ok());
            if let Some(t) = tid {
                out.insert(t, Vec::new());
            }
            continue;
        }
        let (Some(t), Some(rest)) = (tid, line.strip_prefix('#')) else {
            continue;
        };
        let rest = rest
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .trim_start();
        let rest = match rest.split_once(" in ") {
            Some((a, r)) if a.starts_with("0x") => r,
            _ => rest,
        };
        // The name ends at " (" outside any <...>.
        let (mut depth, mut end) = (0i32, rest.len());
        let b = rest.as_bytes();
        for i in 0..b.len() {
            match b[i] {
                b'<' => depth += 1,
                b'>' => depth -= 1,
                b' ' if depth == 0 && b.get(i + 1) == Some(&b'(') => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        out.get_mut(&t).unwrap().push(rest[..end].to_string());
    }
    out
}

/// The last path segment of a function name, without generic arguments,
/// closures spelled alike: gdb names Rust functions from DWARF
/// (`{closure#1}`, `{impl#23}::call_once<..>`), demanglers from symbols
/// (`{{closure}}`, `<X as Trait>::call_once`, `call_once{{vtable.shim}}`).
fn last_segment(name: &str) -> String {
    let mut depth = 0i32;
    let mut segs = vec![String::new()];
    let b: Vec<char> = name.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ':' if depth == 0 && b.get(i + 1) == Some(&':') => {
                segs.push(String::new());
                i += 2;
                continue;
            }
            _ if depth == 0 => segs.last_mut().unwrap().push(c),
            _ => {}
        }
        i += 1;
    }
    // A turbofish (`do_call::<T>`) leaves an empty last segment.
    segs.retain(|s| !s.is_empty());
    let last = segs.pop().unwrap_or_default();
    let last = last.trim_end_matches("{{vtable.shim}}").to_string();
    if last.starts_with("{closure") {
        "{{closure}}".into()
    } else {
        last
    }
}

#[test]
fn rust_program_core_and_live_match_gdb() {
    let dir = scratch_dir("remote-rust");
    let exe = dir.join("remote_threads_rs");
    let src = testsupport::workspace_root().join("tests/fixtures/rust/remote_threads.rs");
    let o = Command::new("rustc")
        .args(["-g", "-C", "opt-level=2", "--edition", "2021"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run rustc");
    assert!(
        o.status.success(),
        "rustc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let n = 3;
    let fx = Fixture::start_with(&exe, n, 2, 2);
    let pid = fx.pid.to_string();
    let live = callstack_json(&["pstack", "--json", &pid]);
    let gdb_live = gdb_threads_full(&["-p", &pid]);
    let core = gcore(fx.pid, &dir);
    fx.finish();
    let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
    let from_core = callstack_json(&["core", "--json", exe_s, core_s]);
    let gdb_core = gdb_threads_full(&[exe_s, core_s]);
    for (what, ours, gdb) in [
        ("pstack", &live, &gdb_live),
        ("core", &from_core, &gdb_core),
    ] {
        assert_eq!(gdb.len(), n + 2, "{what}: gdb threads");
        assert_eq!(ours.threads.len(), gdb.len(), "{what}: thread count");
        for (tid, chain) in gdb {
            let got = &ours.threads[tid].1;
            let a: Vec<String> = got.iter().map(|s| last_segment(s)).collect();
            let b: Vec<String> = chain.iter().map(|s| last_segment(s)).collect();
            assert_eq!(a, b, "{what}: thread {tid}");
            // Our own functions by their full path.
            for (x, y) in got.iter().zip(chain) {
                if y.starts_with("remote_threads::") && !y.contains('{') {
                    assert_eq!(x, y, "{what}: thread {tid}");
                }
            }
        }
    }
    let _ = std::fs::remove_file(&core);
}

#[test]
fn core_of_code_without_cfi_or_frame_pointer_uses_instruction_analysis() {
    // Built with .debug_frame only (gdb's truth), then the same file with
    // .debug_frame removed (same code, same build-id): no CFI and no frame
    // pointer in the fixture's functions, so callstack must read the code.
    let dir = scratch_dir("remote-nocfi");
    let exe = build(
        "nocfi_truth",
        "-O2 -fomit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables",
    );
    let bare = dir.join("remote_threads_nocfi");
    let o = Command::new("objcopy")
        .args(["--remove-section", ".debug_frame"])
        .arg(&exe)
        .arg(&bare)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let n = 2;
    let fx = Fixture::start(&exe, n, 2);
    let core = gcore(fx.pid, &dir);
    fx.finish();
    let core_s = core.to_str().unwrap();
    let gdb = gdb_threads(&[exe.to_str().unwrap(), core_s]);
    let mut ours = callstack_json(&["core", "--json", bare.to_str().unwrap(), core_s]);
    // Known limit of instruction analysis (issue 7's fallback): a frame
    // without CFI that returns into the signal trampoline (`sig_handler`)
    // is not followed, because the trampoline's address does not follow a
    // call instruction. That thread is checked down to the handler only.
    let mut gdb = gdb;
    for (tid, chain) in gdb.iter_mut() {
        if chain.iter().any(|f| f == "sig_handler") {
            let keep = chain.iter().position(|f| f == "sig_handler").unwrap() + 1;
            chain.truncate(keep);
            let t = ours.threads.get_mut(tid).unwrap();
            t.1.truncate(keep);
            t.2.truncate(keep);
        }
    }
    compare("core, no CFI, no frame pointer", &ours, &gdb, n);
    let methods: Vec<&String> = ours.threads.values().flat_map(|t| &t.2).collect();
    assert!(
        methods.iter().any(|m| *m == "insn" || *m == "scan"),
        "no frame was found by instruction analysis: {methods:?}"
    );
    let _ = std::fs::remove_file(&core);
}

#[test]
fn cross_architecture_cores_match_gdb_multiarch() {
    // (name, gcc, qemu, flags for unwind tables)
    let arches = [
        (
            "aarch64",
            "aarch64-linux-gnu-gcc",
            "qemu-aarch64",
            "-fasynchronous-unwind-tables",
        ),
        (
            "arm",
            "arm-linux-gnueabihf-gcc",
            "qemu-arm",
            "-funwind-tables",
        ),
        (
            "mips",
            "mipsel-linux-gnu-gcc",
            "qemu-mipsel",
            "-fasynchronous-unwind-tables",
        ),
    ];
    let have = |c: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    for (name, gcc, qemu, tables) in arches {
        if !(have(gcc) && have(qemu) && have("gdb-multiarch")) {
            eprintln!("skipping {name}: {gcc}, {qemu} or gdb-multiarch missing (scripts/install-test-deps.sh installs them)");
            continue;
        }
        let dir = scratch_dir(&format!("remote-cross-{name}"));
        let exe = dir.join(format!("insn_cross_{name}"));
        let o = Command::new(gcc)
            .args(["-g", "-O2", "-static", tables])
            .arg(testsupport::c_fixtures().join("insn_cross.c"))
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // qemu-user writes a core (no NT_FILE) when the program aborts.
        let run = dir.join("run");
        let _ = std::fs::remove_dir_all(&run);
        std::fs::create_dir_all(&run).unwrap();
        Command::new("sh")
            .current_dir(&run)
            .arg("-c")
            .arg(format!(
                "ulimit -c unlimited; exec {qemu} {}",
                exe.display()
            ))
            .output()
            .unwrap();
        let core = std::fs::read_dir(&run)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "core"))
            .unwrap_or_else(|| panic!("{name}: qemu wrote no core"));
        let gdb = testsupport::gdb_core_pcs(&["gdb-multiarch"], &exe, &core);
        assert!(
            gdb.len() >= 8,
            "{name}: gdb-multiarch's chain is short: {gdb:x?}"
        );
        let (o, stdout, stderr) = callstack(&[
            "core",
            "--json",
            exe.to_str().unwrap(),
            core.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{name}: {stderr}");
        let v: Value = serde_json::from_str(&stdout).unwrap();
        let frames = v["threads"][0]["frames"].as_array().unwrap().clone();
        let pcs: Vec<u64> = frames
            .iter()
            .filter(|f| !f["inlined"].as_bool().unwrap())
            .map(|f| {
                u64::from_str_radix(f["pc"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
            })
            .collect();
        // gdb lists an inlined frame with its caller's pc: compare real frames.
        let mut gdb_real = gdb.clone();
        gdb_real.dedup();
        let mut ours = pcs.clone();
        ours.dedup();
        assert_eq!(ours, gdb_real, "{name}: pcs differ\n ours {frames:#?}");
        let names: Vec<&str> = frames
            .iter()
            .filter_map(|f| f["function"].as_str())
            .collect();
        for f in ["crash", "d", "c", "b", "a"] {
            assert!(names.contains(&f), "{name}: {f} missing from {names:?}");
        }
    }
}

#[test]
fn progress_on_a_terminal_only() {
    let exe = build("progress", "-O0 -fno-omit-frame-pointer");
    let fx = Fixture::start(&exe, 40, 1);
    let pid = fx.pid.to_string();
    // Not a terminal: nothing on stderr.
    let (o, _, stderr) = callstack(&["pstack", &pid]);
    assert!(o.status.success());
    assert!(stderr.is_empty(), "{stderr}");
    // A terminal (script(1) gives one): a progress line for 43 threads.
    let cli = release_artifacts().cli.display().to_string();
    if let Ok(o) = Command::new("script")
        .args([
            "-qec",
            &format!("{cli} pstack {pid} >/dev/null"),
            "/dev/null",
        ])
        .output()
    {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("callstack: thread 43/43"), "{out}");
    }
    fx.finish();
}

#[test]
fn frames_in_the_vdso() {
    // The vDSO has no file: its image comes from the core (or the process),
    // for names and CFI. Take cores until one catches the thread inside it.
    let dir = scratch_dir("remote-vdso");
    let exe = Gcc::new(&["remote_vdso.c"])
        .flags("-O2")
        .build(&dir.join("remote_vdso"));
    let mut child = Command::new(&exe).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = child.id();
    let exe_s = exe.to_str().unwrap();
    let mut checked = false;
    for _ in 0..30 {
        let core = gcore(pid, &dir);
        let core_s = core.to_str().unwrap();
        let ours = callstack_json(&["core", "--json", exe_s, core_s]);
        let frames = &ours.threads[&pid];
        let in_vdso = {
            let (o, stdout, _) = callstack(&["core", exe_s, core_s]);
            o.status.success()
                && stdout
                    .lines()
                    .skip_while(|l| !l.starts_with("Thread "))
                    .nth(1)
                    .is_some_and(|l| l.contains("from [vdso]"))
        };
        if in_vdso {
            let gdb = gdb_threads(&[exe_s, core_s]);
            assert_eq!(&frames.1, &gdb[&pid], "methods {:?}", frames.2);
            assert!(frames.1.len() >= 4, "{:?}", frames.1);
            checked = true;
        }
        let _ = std::fs::remove_file(&core);
        if checked {
            break;
        }
    }
    // Live: a vDSO frame, when caught, is named from the process's image.
    for _ in 0..30 {
        let (o, stdout, _) = callstack(&["pstack", &pid.to_string()]);
        assert!(o.status.success());
        if stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("from [vdso]"))
        {
            assert!(stdout.contains("in spin ()"), "{stdout}");
            assert!(stdout.contains("in main ()"), "{stdout}");
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        checked,
        "no core caught the thread inside the vDSO in 30 tries"
    );
}

/// The JSON document `callstack ARGS` prints.
fn callstack_value(args: &[&str]) -> Value {
    let (o, stdout, stderr) = callstack(args);
    assert!(o.status.success(), "callstack {args:?} failed: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {stdout}"))
}

#[test]
fn core_alone_finds_the_executable() {
    // With NT_FILE: the mapping at AT_PHDR names the executable.
    let exe = build("noexe", "-O2 -fomit-frame-pointer");
    let n = 2;
    let fx = Fixture::start(&exe, n, 2);
    let core = gcore(fx.pid, &scratch_dir("remote-noexe"));
    fx.finish();
    let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
    let gdb = gdb_threads(&[exe_s, core_s]);
    let ours = callstack_json(&["core", "--json", core_s]);
    compare("core alone", &ours, &gdb, n);
    let v = callstack_value(&["core", "--json", core_s]);
    assert_eq!(v["executable"]["source"], "nt_file", "{}", v["executable"]);
    assert_eq!(v["executable"]["file"], exe_s, "{}", v["executable"]);
    assert!(
        v["signal"].is_null(),
        "a gcore has no signal: {}",
        v["signal"]
    );
    // Both argument forms print the same.
    let (_, alone, _) = callstack(&["core", core_s]);
    let (_, both, _) = callstack(&["core", exe_s, core_s]);
    assert_eq!(alone, both);
    assert!(alone.contains("in block_here () at"), "{alone}");
    let _ = std::fs::remove_file(&core);

    // Without NT_FILE: the path at AT_EXECFN, checked against the program
    // headers at AT_PHDR, gives the same output as the executable given.
    let exe = build("noexe_static", "-O2 -static");
    let fx = Fixture::start(&exe, n, 2);
    let core = gcore(fx.pid, &scratch_dir("remote-noexe-static"));
    fx.finish();
    let hidden = without_nt_file(&core);
    let (exe_s, hidden_s) = (exe.to_str().unwrap(), hidden.to_str().unwrap());
    let v = callstack_value(&["core", "--json", hidden_s]);
    assert_eq!(
        v["executable"]["source"], "at_execfn",
        "{}",
        v["executable"]
    );
    assert_eq!(v["executable"]["file"], exe_s, "{}", v["executable"]);
    let given = callstack_value(&["core", "--json", exe_s, hidden_s]);
    assert_eq!(v["threads"], given["threads"]);
    let ours = callstack_json(&["core", "--json", hidden_s]);
    assert!(
        ours.threads.values().any(|t| t
            .1
            .starts_with(&["block_here".to_string(), "descend".to_string()])),
        "{:?}",
        ours.threads
    );
    // An executable that is not the one that ran is refused, not used.
    let other = build("noexe_other", "-O0 -static");
    let moved = hidden.with_file_name("moved_core");
    std::fs::rename(&hidden, &moved).unwrap();
    std::fs::copy(&other, &exe).unwrap();
    let (o, _, stderr) = callstack(&["core", moved.to_str().unwrap()]);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("was not found or does not match the core"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(&moved);
    let _ = std::fs::remove_file(&core);
}

/// Runs `exe` (which crashes) in `dir` with core dumps on, and returns the
/// core it left there (`core` or `core.PID`, as `kernel.core_pattern`
/// names it). Cores left by earlier runs are removed first.
fn crash_for_core(exe: &Path, dir: &Path) -> PathBuf {
    let is_core = |p: &Path| {
        let n = p.file_name().unwrap().to_string_lossy();
        n == "core" || n.starts_with("core.")
    };
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if is_core(&e.path()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -c unlimited; exec {}", exe.display()))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!st.success(), "{} did not crash", exe.display());
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| is_core(p))
        .unwrap_or_else(|| {
            panic!(
                "no core dumped in {} (kernel.core_pattern is {:?})",
                dir.display(),
                std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default()
            )
        })
}

/// A crash at pc 0, by a call through a null function pointer: the caller
/// is found where the call left its return address (gdb does the same),
/// with and without frame pointers.
#[test]
fn core_of_a_call_through_a_null_pointer_matches_gdb() {
    for (tag, flags) in [
        ("O2", "-O2 -g"),
        ("O2_fp", "-O2 -g -fno-omit-frame-pointer"),
        ("O0", "-O0 -g"),
    ] {
        let dir = scratch_dir(&format!("remote-call-null-{tag}"));
        let exe = Gcc::new(&["call_null.c"])
            .flags(flags)
            .build(&dir.join("call_null"));
        let core = crash_for_core(&exe, &dir);
        let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
        let ours = callstack_json(&["core", "--json", exe_s, core_s]);
        let gdb = gdb_threads(&[exe_s, core_s]);
        let want = ["??", "call_null", "above_call_null", "main"];
        for (tid, chain) in &gdb {
            assert_eq!(&chain[..4], want, "{tag}: gdb's chain");
            let (_, got, methods) = &ours.threads[tid];
            assert_eq!(
                &got[..4],
                want,
                "{tag}: ours {got:?} ({methods:?}) vs gdb {chain:?}"
            );
        }
        let _ = std::fs::remove_file(&core);
    }
}

#[test]
fn core_of_a_crash_names_the_signal_and_the_thread() {
    let dir = scratch_dir("remote-crash");
    let exe = Gcc::new(&["core_crash.c"])
        .flags("-O0 -g -pthread")
        .build(&dir.join("core_crash"));
    let core = crash_for_core(&exe, &dir);
    let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
    // gdb's word on the signal and the thread that got it.
    let o = testsupport::gdb_batch("gdb")
        .args([exe_s, core_s])
        .output()
        .unwrap();
    let gdb_text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        gdb_text.contains("Program terminated with signal SIGSEGV, Segmentation fault."),
        "{gdb_text}"
    );
    let current: u32 = gdb_text
        .split_once("[Current thread is 1 ")
        .and_then(|(_, r)| r.split_once("(LWP "))
        .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no current thread in gdb's output: {gdb_text}"));
    let gdb = gdb_threads(&[exe_s, core_s]);
    for args in [
        vec!["core", "--json", core_s],
        vec!["core", "--json", exe_s, core_s],
    ] {
        let v = callstack_value(&args);
        let sig = &v["signal"];
        assert_eq!(sig["number"], 11, "{sig}");
        assert_eq!(sig["name"], "SIGSEGV", "{sig}");
        assert_eq!(sig["description"], "Segmentation fault", "{sig}");
        assert_eq!(sig["address"], "0x10", "{sig}");
        assert_eq!(sig["code"], 1, "SEGV_MAPERR: {sig}");
        assert_eq!(sig["tid"], current, "{sig}");
        assert_eq!(sig["thread"], 1, "{sig}");
        assert_eq!(v["threads"][0]["tid"], current);
        assert_eq!(v["command_line"], exe_s);
        let ours = callstack_json(&args);
        let chain = &ours.threads[&current].1;
        assert_eq!(chain, &gdb[&current]);
        assert_eq!(chain[..3], ["crash_inner", "crash_outer", "crash_worker"]);
    }
    let (o, text, _) = callstack(&["core", core_s]);
    assert!(o.status.success());
    assert!(
        text.contains(
            "Program terminated with signal SIGSEGV, Segmentation fault (fault address 0x10)."
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "The signal was received by thread 1 (LWP {current})."
        )),
        "{text}"
    );
    let _ = std::fs::remove_file(&core);
}

/// Where a Rust backtrace ends, as gdb 13 ends it: at the user's
/// `crate::main` (marked `DW_AT_main_subprogram`) unless the crate also has
/// a namespace of that name (a closure in `main`: gdb then prints down to
/// `_start`), and at the C `main` when the program has no debug info; at
/// -O0 and -O2. `--past-main` always prints down to `_start`.
#[test]
fn rust_backtrace_ends_at_main_as_gdb() {
    let dir = scratch_dir("remote-rust-main");
    let src = testsupport::workspace_root().join("tests/fixtures/rust/main_end.rs");
    // (tag, opt-level, extra rustc flags, strip debug info, last function)
    let cases = [
        ("plain0", "0", None, false, "main_end::main"),
        ("plain2", "2", None, false, "main_end::main"),
        ("shadowed0", "0", Some("shadowed"), false, "_start"),
        ("shadowed2", "2", Some("shadowed"), false, "_start"),
        ("nodebug2", "2", None, true, "main"),
    ];
    for (tag, opt, cfg, strip, last) in cases {
        let exe = dir.join(format!("main_end_{tag}"));
        let mut c = Command::new("rustc");
        c.args(["-g", "-C", &format!("opt-level={opt}"), "--edition", "2021"]);
        if let Some(cfg) = cfg {
            c.args(["--cfg", cfg]);
        }
        let o = c.arg(&src).arg("-o").arg(&exe).output().expect("run rustc");
        assert!(
            o.status.success(),
            "rustc: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        if strip {
            let o = Command::new("strip").arg("-g").arg(&exe).output().unwrap();
            assert!(o.status.success());
        }
        let fx = Fixture::start_with(&exe, 0, 0, 1);
        let pid = fx.pid.to_string();
        let ours = callstack_json(&["pstack", "--json", &pid]);
        let past = callstack_json(&["pstack", "--json", "--past-main", &pid]);
        let gdb = gdb_threads_full(&["-p", &pid]);
        fx.finish();
        assert_eq!(gdb.len(), 1, "{tag}: gdb threads");
        let (tid, chain) = gdb.iter().next().unwrap();
        let got = &ours.threads[tid].1;
        assert_eq!(
            got.last().map(String::as_str),
            Some(last),
            "{tag}: ours {got:?}"
        );
        let a: Vec<String> = got.iter().map(|s| last_segment(s)).collect();
        // Without debug info gdb names Rust functions from their symbols,
        // hash included (`main_end::work::h0123456789abcdef`).
        let unhashed = |s: &str| -> String {
            match s.rsplit_once("::h") {
                Some((f, h)) if h.len() == 16 && h.bytes().all(|c| c.is_ascii_hexdigit()) => {
                    f.to_string()
                }
                _ => s.to_string(),
            }
        };
        let b: Vec<String> = chain.iter().map(|s| last_segment(&unhashed(s))).collect();
        assert_eq!(a, b, "{tag}: ours vs gdb");
        let beyond = &past.threads[tid].1;
        assert_eq!(
            beyond.last().map(String::as_str),
            Some("_start"),
            "{tag} --past-main: {beyond:?}"
        );
        assert!(beyond.len() >= got.len(), "{tag}");
    }
}

/// A handler built with frame pointers and no CFI whose last call never
/// returns (`ns_die`, which calls `abort`), reached through a PLT stub: the
/// return addresses follow calls that prologue analysis of their target
/// cannot check, and the frame records at `rbp` are the truth. The chain
/// must go through `<signal handler called>` into the interrupted code, as
/// gdb's does (issue 24: the scan's guess after a call that does not return
/// had won over a valid frame record, and the walk went astray in ld.so's
/// stale frames).
#[test]
fn core_of_a_noreturn_call_in_a_frame_pointer_handler_matches_gdb() {
    let flags =
        "-O2 -g0 -fno-omit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables";
    let dir = scratch_dir("remote-noreturn-sig");
    let lib = Gcc::new(&["noreturn_sig_lib.c"])
        .flags(flags)
        .flags("-fPIC -shared")
        .build(&dir.join("libnoreturn_sig.so"));
    // The library by path (it has no soname).
    let exe = Gcc::new(&["noreturn_sig_main.c", lib.to_str().unwrap()])
        .flags(flags)
        .build(&dir.join("noreturn_sig"));
    for (arg, handler) in [
        ("lib", &["ns_die", "ns_lib_handler"][..]),
        ("exe", &["ns_die", "ns_fatal", "exe_handler"][..]),
    ] {
        let wrapper = dir.join(format!("run_{arg}.sh"));
        std::fs::write(
            &wrapper,
            format!("#!/bin/sh\nexec {} {arg}\n", exe.display()),
        )
        .unwrap();
        let mut perm = std::fs::metadata(&wrapper).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
        std::fs::set_permissions(&wrapper, perm).unwrap();
        let core = crash_for_core(&wrapper, &dir);
        let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
        let ours = callstack_json(&["core", "--json", exe_s, core_s]);
        let gdb = gdb_threads(&[exe_s, core_s]);
        assert_eq!(gdb.len(), 1, "{arg}: one thread");
        for (tid, chain) in &gdb {
            let chain: Vec<String> = chain
                .iter()
                .map(|f| {
                    if f == "<signal" {
                        "__restore_rt".into()
                    } else {
                        f.clone()
                    }
                })
                .collect();
            // gdb's own chain is the one the fixture says.
            let at = chain
                .iter()
                .position(|f| f == "ns_die")
                .unwrap_or_else(|| panic!("{arg}: gdb {chain:?}"));
            let mut want: Vec<&str> = handler.to_vec();
            want.extend(["__restore_rt"]);
            assert_eq!(
                &chain[at..at + want.len()],
                &want[..],
                "{arg}: gdb {chain:?}"
            );
            assert_eq!(
                &chain[chain.len() - 3..],
                ["victim", "outer", "main"],
                "{arg}: gdb {chain:?}"
            );
            let (_, got, methods) = &ours.threads[tid];
            assert_eq!(got, &chain, "{arg}: ours ({methods:?}) vs gdb");
        }
        let _ = std::fs::remove_file(&core);
    }
}
