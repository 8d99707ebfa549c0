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
use testsupport::{release_artifacts, scratch_dir, Gcc};

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
    fn start(exe: &Path, threads: usize, depth: usize) -> Fixture {
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
        wait_all_blocked(pid, threads + 2);
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
    let o = Command::new("gdb")
        .args([
            "-nx",
            "-batch",
            "-ex",
            "set pagination off",
            "-ex",
            "set debuginfod enabled off",
        ])
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

struct Ours {
    /// tid -> (name, function names, methods)
    threads: BTreeMap<u32, (Option<String>, Vec<String>, Vec<String>)>,
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
        nthreads + 2,
        "{what}: gdb saw {} threads",
        gdb.len()
    );
    for (tid, chain) in gdb {
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

fn gcore(pid: u32, dir: &Path) -> PathBuf {
    let prefix = dir.join("core");
    let o = Command::new("gcore")
        .arg("-o")
        .arg(&prefix)
        .arg(pid.to_string())
        .output()
        .expect("run gcore");
    let core = PathBuf::from(format!("{}.{pid}", prefix.display()));
    assert!(
        core.is_file(),
        "gcore failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    core
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
        // Text output too, and a second look does not disturb the target.
        let (o, text, _) = callstack(&["pstack", &pid]);
        assert!(o.status.success());
        assert!(text.contains("in block_here ()"), "{text}");
        assert!(text.contains("\"worker-0\""), "{text}");
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
