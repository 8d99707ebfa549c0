//! Crash-time minidumps: C programs (`tests/fixtures/c/crash_minidump.c`,
//! -O2 with and without frame pointers, four or five threads, three of them
//! blocked in known functions) and the Rust crash fixture really crash with
//! the handler installed and a minidump directory set. Each crash must leave
//! a dump that
//! - the `minidump` crate parses: every thread (by id), the exception stream
//!   (crashing thread, signal, code, fault address), the crashing thread's
//!   context at the fault (its pc is the raw report's `#0 pc`);
//! - `minidump-stackwalk --json --use-local-debuginfo` unwinds, for every
//!   thread, into gdb's frames at the same crash of the same program (gdb
//!   runs it and stops at the signal), function names through `main` or the
//!   thread's start;
//! - `callstack minidump` (our reader) unwinds into exactly gdb's frames
//!   too.
//!
//! Crashes inside `malloc` with the arena lock held, and on a thread whose
//! stack is exhausted, are among them: the dump is written by the helper
//! process, which uses neither the crashed heap nor its stack.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use testsupport::crash::*;
use testsupport::{scratch_dir, Gcc};

fn build(flags: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(f, _)| f == flags) {
        return p.clone();
    }
    let dir = scratch_dir("crash-md");
    let tag: String = flags
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let exe = Gcc::new(&["crash_minidump.c"])
        .flags(flags)
        .flags("-g -pthread")
        .link_callstack()
        .build(&dir.join(format!("crash_minidump{tag}")));
    built.push((flags.to_string(), exe.clone()));
    exe
}

const FLAG_SETS: [&str; 2] = ["-O2 -fno-omit-frame-pointer", "-O2 -fomit-frame-pointer"];

/// One crash and its dump.
struct Run {
    crash: Crash,
    dump: PathBuf,
    /// The threads the fixture printed (main, reader, locker, sleeper).
    tids: Vec<u32>,
}

impl Run {
    fn crash_tid(&self) -> u32 {
        let line = self.crash.raw().lines().find(|l| l.starts_with("thread: "));
        line.and_then(|l| l[8..].split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no thread line:\n{}", self.crash.stderr))
    }
    /// The raw report's `#0 pc`.
    fn fault_pc(&self) -> u64 {
        let line = self.crash.raw().lines().find(|l| l.starts_with("  #0 pc "));
        line.and_then(|l| u64::from_str_radix(l[10..].split(' ').next()?, 16).ok())
            .unwrap_or_else(|| panic!("no #0 pc line:\n{}", self.crash.stderr))
    }
    /// The raw report's fault address (0 when it names none).
    fn fault_address(&self) -> u64 {
        let raw = self.crash.raw();
        raw.find("fault address 0x")
            .and_then(|i| {
                let h = &raw[i + 16..];
                let end = h.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(h.len());
                u64::from_str_radix(&h[..end], 16).ok()
            })
            .unwrap_or(0)
    }
    /// The raw report's `(signal N, code C`.
    fn signal_and_code(&self) -> (i32, i32) {
        let raw = self.crash.raw();
        let i = raw.find("(signal ").expect("signal line");
        let rest = &raw[i + 8..];
        let (sig, rest) = rest.split_once(", code ").unwrap();
        let code = rest.split([' ', ')']).next().unwrap();
        (sig.parse().unwrap(), code.parse().unwrap())
    }
}

/// Runs `exe scenario DIR` (or with `-` and the directory in
/// `CALLSTACK_CRASH_MINIDUMP_DIR` when `by_env`), and finds its dump.
fn run(exe: &Path, scenario: &str, by_env: bool, tag: &str) -> Run {
    let dir = scratch_dir(&format!("crash-md-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = Command::new(exe);
    cmd.arg(scenario).env_remove("CALLSTACK_CRASH_HELPER");
    if by_env {
        cmd.arg("-").env("CALLSTACK_CRASH_MINIDUMP_DIR", &dir);
    } else {
        cmd.arg(&dir).env_remove("CALLSTACK_CRASH_MINIDUMP_DIR");
    }
    let crash = run_crashing(cmd, DEADLINE);
    finish(crash, &dir)
}

fn finish(crash: Crash, dir: &Path) -> Run {
    // The report names the file, in the symbolized part.
    let sym = symbolized_part(&crash.stderr)
        .unwrap_or_else(|| panic!("no symbolized part:\n{}", crash.stderr));
    let line = sym
        .lines()
        .find(|l| l.starts_with("minidump: "))
        .unwrap_or_else(|| panic!("no minidump line:\n{}", crash.stderr));
    let path = line[10..].split(" (").next().unwrap();
    assert!(
        path.starts_with('/'),
        "dump not written: {line}\n{}",
        crash.stderr
    );
    let dump = PathBuf::from(path);
    assert_eq!(dump.parent(), Some(dir), "{line}");
    let name = dump.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with(".dmp"), "{name}");
    assert!(dump.is_file(), "{line}: no such file");
    let files = std::fs::read_dir(dir).unwrap().count();
    assert_eq!(files, 1, "one dump per crash in {}", dir.display());
    let tids = crash
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("fixture: tids "))
        .map(|l| l.split(' ').map(|t| t.parse().unwrap()).collect())
        .unwrap_or_default();
    Run { crash, dump, tids }
}

/// Checks the dump stream by stream with the `minidump` crate; returns the
/// crashing thread's index in the thread list.
fn check_streams(r: &Run, threads: usize) {
    use minidump::*;
    let md = Minidump::read_path(&r.dump).unwrap_or_else(|e| panic!("{}: {e}", r.dump.display()));
    let list: MinidumpThreadList = md.get_stream().expect("thread list");
    let ids: Vec<u32> = list.threads.iter().map(|t| t.raw.thread_id).collect();
    assert_eq!(ids.len(), threads, "threads {ids:?}\n{}", r.crash.stderr);
    let crash_tid = r.crash_tid();
    for t in r.tids.iter().chain([&crash_tid]) {
        assert!(ids.contains(t), "thread {t} not in the dump {ids:?}");
    }
    let sys: MinidumpSystemInfo = md.get_stream().expect("system info");
    let misc: Option<MinidumpMiscInfo> = md.get_stream().ok();
    let exc: MinidumpException = md.get_stream().expect("exception stream");
    assert_eq!(exc.raw.thread_id, crash_tid, "exception thread");
    let (sig, code) = r.signal_and_code();
    let rec = &exc.raw.exception_record;
    assert_eq!(rec.exception_code, sig as u32, "exception code = signal");
    assert_eq!(
        rec.exception_flags, code as u32,
        "exception flags = si_code"
    );
    assert_eq!(rec.exception_address, r.fault_address(), "fault address");
    let pc = r.fault_pc();
    let ctx = exc.context(&sys, misc.as_ref()).expect("exception context");
    assert_eq!(ctx.get_instruction_pointer(), pc, "exception context pc");
    let t = list
        .threads
        .iter()
        .find(|t| t.raw.thread_id == crash_tid)
        .unwrap();
    let ctx = t
        .context(&sys, misc.as_ref())
        .expect("crashing thread context");
    assert_eq!(ctx.get_instruction_pointer(), pc, "crashing thread's pc");
    let modules: MinidumpModuleList = md.get_stream().expect("module list");
    assert!(
        modules
            .iter()
            .any(|m| m.code_file().contains("crash_minidump")
                || m.code_file().contains("crash_fixture")),
        "the executable is in the module list"
    );
}

/// A function name as both tools spell the same symbol: glibc's aliases
/// (`__GI___libc_read`, `__libc_read`, `_libc_read` as minidump-stackwalk
/// prints a name with two leading underscores) and gcc's split parts
/// (`f.cold`) name one function.
fn norm(name: &str) -> String {
    let mut n = name.trim_start_matches('_');
    while let Some(r) = n.strip_prefix("GI_") {
        n = r.trim_start_matches('_');
    }
    let n = n.split(".cold").next().unwrap();
    let n = n.split(".part.").next().unwrap();
    n.to_string()
}

/// `minidump-stackwalk --json --use-local-debuginfo`: each thread's
/// function names (inlined frames first, as gdb lists them), by thread id.
fn stackwalk(dump: &Path) -> BTreeMap<u32, Vec<String>> {
    let text = testsupport::stackwalk_json_text(dump, None);
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let mut out = BTreeMap::new();
    for t in v["threads"].as_array().unwrap() {
        let tid = t["thread_id"].as_u64().unwrap() as u32;
        let mut names = Vec::new();
        for f in t["frames"].as_array().unwrap() {
            if let Some(inl) = f["inlines"].as_array() {
                for i in inl {
                    names.push(i["function"].as_str().unwrap_or("??").to_string());
                }
            }
            names.push(f["function"].as_str().unwrap_or("??").to_string());
        }
        out.insert(tid, names);
    }
    out
}

/// gdb's frames of every thread at the crash: gdb runs the program (no
/// dump, no helper) and stops at the signal, before the handler. Returns
/// (the crashing thread's chain, every thread's chain).
fn gdb_threads(exe: &Path, scenario: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let o = Command::new("gdb")
        .args(testsupport::GDB_BATCH_ARGS)
        .args(["-ex", "run", "-ex", "bt 100", "-ex", "echo @@threads\\n"])
        .args(["-ex", "thread apply all bt 100", "--args"])
        .arg(exe)
        .args([scenario, "-"])
        .env("CALLSTACK_CRASH_HELPER", "none")
        .env_remove("CALLSTACK_CRASH_MINIDUMP_DIR")
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let (first, all) = text.split_once("@@threads").unwrap_or((&text, ""));
    let current = testsupport::parse_gdb_bt(first);
    let mut threads = Vec::new();
    for part in all.split("\nThread ").skip(1) {
        threads.push(testsupport::parse_gdb_bt(part));
    }
    (current, threads)
}

fn is_own(n: &str) -> bool {
    n.starts_with("md_") || n == "main" || n.starts_with("crash_fixture::")
}

/// The first of the program's own functions in a chain: which thread it is.
fn key(chain: &[String]) -> String {
    chain
        .iter()
        .map(|n| norm(n))
        .find(|n| is_own(n))
        .unwrap_or_default()
}

/// Up to `main` included (gdb stops there), normalized.
fn through_main(chain: &[String]) -> Vec<String> {
    let n: Vec<String> = chain.iter().map(|n| norm(n)).collect();
    let end = n
        .iter()
        .position(|f| f == "main")
        .map_or(n.len(), |i| i + 1);
    n[..end].to_vec()
}

/// minidump-stackwalk's chain against gdb's, both through `main`.
///
/// The program's own frames (and the thread's start) must be the same
/// sequence. Elsewhere the two tools name and count frames from different
/// sources, so the rest is compared as far as they can agree:
/// - gdb also shows tail-call frames it rebuilds from DWARF call-site
///   information (glibc's `pthread_join` tail-calls `__pthread_clockjoin_ex`,
///   `__pthread_kill_internal` tail-calls `__pthread_kill_implementation`),
///   which no minidump processor can see, and hides an inlined function
///   whose first instruction is the pc; so for C, ours must be gdb's with
///   only frames outside the program's own code left out;
/// - Rust's generic functions are spelled differently by each (`{closure#0}`
///   or `{{closure}}`, generic arguments or none), so for Rust only the
///   program's own frames are compared.
///
/// `call_null`: the crash is a call through a null pointer at `-O2` with
/// frame pointers; minidump-stackwalk then takes the frame pointer over the
/// return address the call left at sp and skips the calling function (the
/// dump holds that return address: [`check_call_null_stack`] checks it).
fn assert_same_frames(ours: &[String], gdb: &[String], what: &str, rust: bool, call_null: bool) {
    let (mut ours, gdb) = (through_main(ours), through_main(gdb));
    let own = |c: &[String]| -> Vec<String> {
        c.iter()
            .filter(|n| is_own(n) || *n == "start_thread" || *n == "clone3")
            .cloned()
            .collect()
    };
    let mut gdb_own = own(&gdb);
    if call_null && ours.first().is_some_and(|f| f == "??") && gdb.get(1).is_some_and(|f| is_own(f))
    {
        // Put back the frame minidump-stackwalk skips, for the comparison.
        if ours.get(1) != gdb.get(1) {
            ours.insert(1, gdb[1].clone());
        }
    }
    let ours_own = own(&ours);
    if rust {
        gdb_own.retain(|n| n.starts_with("crash_fixture::"));
        let ours_own: Vec<String> = ours_own
            .into_iter()
            .filter(|n| n.starts_with("crash_fixture::"))
            .collect();
        assert!(
            !ours_own.is_empty() && ours_own == gdb_own && ours.last() == gdb.last(),
            "{what}: minidump-stackwalk's frames differ from gdb's\n  stackwalk: {ours:?}\n  gdb:       {gdb:?}"
        );
        return;
    }
    let mut i = 0;
    let mut skipped = Vec::new();
    for g in &gdb {
        if i < ours.len() && ours[i] == *g {
            i += 1;
        } else {
            skipped.push(g.clone());
        }
    }
    let ok = i == ours.len()
        && ours_own == gdb_own
        && !gdb.is_empty()
        && skipped.iter().all(|s| !is_own(s));
    assert!(
        ok,
        "{what}: minidump-stackwalk's frames differ from gdb's\n  stackwalk: {ours:?}\n  gdb:       {gdb:?}"
    );
}

/// A call through a null pointer: the crashing thread's stack in the dump
/// starts with the return address the call left, which is the raw report's
/// `#1` (the caller, as our handler unwound it in the crashed process).
fn check_call_null_stack(r: &Run, caller: &str) {
    use minidump::*;
    let md = Minidump::read_path(&r.dump).unwrap();
    let list: MinidumpThreadList = md.get_stream().unwrap();
    let sys: MinidumpSystemInfo = md.get_stream().unwrap();
    let t = list
        .threads
        .iter()
        .find(|t| t.raw.thread_id == r.crash_tid())
        .unwrap();
    let ctx = t.context(&sys, None).unwrap();
    let sp = ctx.get_stack_pointer();
    let none = UnifiedMemoryList::default();
    let stack = t.stack_memory(&none).expect("crashing thread's stack");
    let word: u64 = stack.get_memory_at_address(sp).expect("the word at sp");
    let raw = r.crash.raw();
    let ra = raw
        .lines()
        .find(|l| l.starts_with("  #1 ra "))
        .and_then(|l| u64::from_str_radix(l[10..].split(' ').next()?, 16).ok())
        .expect("#1 ra line");
    assert_eq!(word, ra, "the return address at sp in the dump\n{raw}");
    // ... which is in the caller (the symbolized #1).
    let sym = symbolized_frames(symbolized_part(&r.crash.stderr).unwrap());
    assert_eq!(
        sym.get(1).map(|f| f.function.as_str()),
        Some(caller),
        "{}",
        r.crash.stderr
    );
}

/// Every thread of the dump unwound by minidump-stackwalk against gdb at
/// the same crash, the threads matched by their own outermost-known
/// function. A recursion's chain is compared over the frames both have.
fn check_against_gdb(r: &Run, exe: &Path, scenario: &str) {
    let sw = stackwalk(&r.dump);
    let (gdb_current, gdb_all) = gdb_threads(exe, scenario);
    let crash_tid = r.crash_tid();
    let what = format!("{} {scenario}", exe.display());
    let ours = &sw[&crash_tid];
    if scenario == "overflow" {
        let n = ours.len().min(gdb_current.len());
        assert!(n >= 50, "{what}: {ours:?} vs {gdb_current:?}");
        assert!(
            ours[..n].iter().all(|f| f == "md_recurse"),
            "{what}: {ours:?}"
        );
        assert!(gdb_current[..n].iter().all(|f| f == "md_recurse"), "{what}");
    } else {
        let call_null = scenario == "call-null";
        if call_null && cfg!(target_arch = "x86_64") {
            check_call_null_stack(r, "md_call_null");
        }
        assert_same_frames(
            ours,
            &gdb_current,
            &format!("{what}: crashing thread"),
            false,
            call_null,
        );
    }
    assert_eq!(
        sw.len(),
        gdb_all.len(),
        "{what}: thread counts, ours {sw:?}"
    );
    let mut by_key: BTreeMap<String, &Vec<String>> = BTreeMap::new();
    for g in &gdb_all {
        by_key.insert(key(g), g);
    }
    for (tid, chain) in &sw {
        if *tid == crash_tid {
            continue;
        }
        let k = key(chain);
        let g = by_key
            .get(&k)
            .unwrap_or_else(|| panic!("{what}: thread {tid} {chain:?}: no gdb thread in {k}"));
        assert_same_frames(
            chain,
            g,
            &format!("{what}: thread {tid} ({k})"),
            false,
            false,
        );
    }
}

/// `callstack minidump DUMP` (our reader) against gdb at the same crash:
/// every thread's function names exactly, through `main` or the thread's
/// start (tail-call and inlined frames included), threads matched as in
/// [`check_against_gdb`].
fn check_callstack_minidump(r: &Run, exe: &Path, scenario: &str) {
    let cli = &testsupport::release_artifacts().cli;
    let o = Command::new(cli)
        .arg("minidump")
        .arg(&r.dump)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "callstack minidump failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let ours: Vec<Vec<String>> = text
        .split("\nThread ")
        .skip(1)
        .map(testsupport::parse_gdb_bt)
        .collect();
    let (gdb_current, gdb_all) = gdb_threads(exe, scenario);
    let what = format!("{} {scenario}: callstack minidump", exe.display());
    assert_eq!(ours.len(), gdb_all.len(), "{what}: threads\n{text}");
    let crash_key = key(&gdb_current);
    let mut by_key: BTreeMap<String, &Vec<String>> = BTreeMap::new();
    for g in &gdb_all {
        by_key.insert(key(g), g);
    }
    for chain in &ours {
        let k = key(chain);
        let g = if k == crash_key {
            &gdb_current
        } else {
            by_key[&k]
        };
        if scenario == "overflow" && k == "md_recurse" {
            let n = chain.len().min(g.len());
            assert!(n >= 50 && chain[..n] == g[..n], "{what}: {chain:?}\n{g:?}");
            continue;
        }
        let end = |c: &[String]| {
            c.iter()
                .position(|f| f == "main")
                .map_or(c.len(), |i| i + 1)
        };
        assert_eq!(
            chain[..end(chain)],
            g[..end(g)],
            "{what}: thread of {k}\n{text}"
        );
    }
}

fn c_case(scenario: &str, threads: usize) {
    for (i, flags) in FLAG_SETS.iter().enumerate() {
        let exe = build(flags);
        let r = run(&exe, scenario, i == 1, &format!("{scenario}-{i}"));
        let line = symbolized_part(&r.crash.stderr)
            .and_then(|s| s.lines().find(|l| l.starts_with("minidump: ")))
            .unwrap_or_default()
            .to_string();
        eprintln!("[crash_minidump {flags} {scenario}] {line}");
        check_streams(&r, threads);
        check_against_gdb(&r, &exe, scenario);
        check_callstack_minidump(&r, &exe, scenario);
    }
}

#[test]
fn crash_minidump_c_null_dereference() {
    c_case("null", 4);
}

#[test]
fn crash_minidump_c_abort() {
    c_case("abort", 4);
}

#[test]
fn crash_minidump_c_call_through_a_null_pointer() {
    c_case("call-null", 4);
}

#[test]
fn crash_minidump_c_stack_overflow() {
    c_case("overflow", 4);
}

#[test]
fn crash_minidump_c_on_a_second_thread() {
    c_case("thread-null", 5);
}

/// The fault is inside glibc's malloc with the arena lock held: the dump
/// is still written (by the helper: its own heap), and unwinds through
/// malloc.
#[test]
fn crash_minidump_c_inside_malloc_with_the_lock_held() {
    c_case("malloc", 4);
}

/// Without a directory (no option, no environment variable) no dump is
/// written and the report has no minidump line.
#[test]
fn crash_minidump_c_none_without_a_directory() {
    let exe = build(FLAG_SETS[0]);
    let mut cmd = Command::new(&exe);
    cmd.args(["null", "-"])
        .env_remove("CALLSTACK_CRASH_HELPER")
        .env_remove("CALLSTACK_CRASH_MINIDUMP_DIR");
    let c = run_crashing(cmd, DEADLINE);
    assert!(symbolized_part(&c.stderr).is_some(), "{}", c.stderr);
    assert!(!c.stderr.contains("minidump: "), "{}", c.stderr);
    assert_eq!(c.signal, Some(libc::SIGSEGV));
}

/// `CALLSTACK_CRASH_HELPER=none` turns symbolizing off, not the dump: the
/// helper still runs, writes the dump and prints only its line.
#[test]
fn crash_minidump_c_dump_without_symbolizing() {
    let exe = build(FLAG_SETS[0]);
    let dir = scratch_dir("crash-md-nosym");
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = Command::new(&exe);
    cmd.args(["null"])
        .arg(&dir)
        .env("CALLSTACK_CRASH_HELPER", "none");
    let c = run_crashing(cmd, DEADLINE);
    assert!(symbolized_part(&c.stderr).is_none(), "{}", c.stderr);
    let line = c
        .stderr
        .lines()
        .find(|l| l.starts_with("*** callstack: minidump: /"))
        .unwrap_or_else(|| panic!("no minidump line:\n{}", c.stderr));
    let path = line["*** callstack: minidump: ".len()..]
        .split(" (")
        .next()
        .unwrap();
    assert!(Path::new(path).is_file(), "{line}");
    assert_eq!(c.signal, Some(libc::SIGSEGV));
}

/// A program that made itself undumpable (`PR_SET_DUMPABLE` 0: ptrace is
/// refused to everyone but root's CAP_SYS_PTRACE) still gets its dump: the
/// handler makes it dumpable while its helper runs.
///
/// Run as an unprivileged user (`nobody`, through `setpriv`) when the tests
/// run as root, whose CAP_SYS_PTRACE would trace an undumpable process
/// anyway.
#[test]
fn crash_minidump_c_undumpable_process() {
    use std::os::unix::fs::PermissionsExt;
    let exe = build(FLAG_SETS[0]);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let setpriv = Path::new("/usr/bin/setpriv");
    if !root || !setpriv.exists() {
        let r = run(&exe, "undumpable", false, "undumpable");
        check_streams(&r, 4);
        return;
    }
    // A directory `nobody` can run the program from and write the dump in.
    let top = std::env::temp_dir().join(format!("callstack-md-undumpable-{}", std::process::id()));
    let dir = top.join("dumps");
    let _ = std::fs::remove_dir_all(&top);
    std::fs::create_dir_all(&dir).unwrap();
    for d in [&top, &dir] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let copy = top.join("crash_minidump");
    std::fs::copy(&exe, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(setpriv);
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(&copy)
        .arg("undumpable")
        .arg(&dir)
        .env_remove("CALLSTACK_CRASH_HELPER");
    let r = finish(run_crashing(cmd, DEADLINE), &dir);
    check_streams(&r, 4);
    assert_eq!(r.crash.signal, Some(libc::SIGSEGV));
    let _ = std::fs::remove_dir_all(&top);
}

/// The `callstack` binary as the helper (`callstack crash-report`) writes
/// the dump too.
#[test]
fn crash_minidump_c_callstack_binary_as_helper() {
    let exe = build(FLAG_SETS[1]);
    let dir = scratch_dir("crash-md-cli");
    let _ = std::fs::remove_dir_all(&dir);
    let cli = &testsupport::release_artifacts().cli;
    let mut cmd = Command::new(&exe);
    cmd.args(["abort"])
        .arg(&dir)
        .env("CALLSTACK_CRASH_HELPER", cli);
    let r = finish(run_crashing(cmd, DEADLINE), &dir);
    assert!(
        r.crash.stderr.contains("symbolizing helper (user helper"),
        "{}",
        r.crash.stderr
    );
    check_streams(&r, 4);
    check_against_gdb(&r, &exe, "abort");
}

fn rust_fixture() -> PathBuf {
    testsupport::release_artifacts().crash_fixture.clone()
}

/// The Rust fixture (`callstack::crash::install` with
/// `CALLSTACK_CRASH_MINIDUMP_DIR`): a null dereference, `abort()` and a
/// call through a null function pointer on the main thread, a null
/// dereference and a stack overflow on a second thread.
#[test]
fn crash_minidump_rust() {
    let exe = rust_fixture();
    for (scenario, threads) in [
        ("null", 1),
        ("abort", 1),
        ("call-null", 1),
        ("thread", 2),
        ("thread-overflow", 2),
    ] {
        let dir = scratch_dir(&format!("crash-md-rust-{scenario}"));
        let _ = std::fs::remove_dir_all(&dir);
        let mut cmd = Command::new(&exe);
        cmd.arg(scenario)
            .env_remove("CALLSTACK_CRASH_HELPER")
            .env("CALLSTACK_CRASH_MINIDUMP_DIR", &dir);
        let r = finish(run_crashing(cmd, DEADLINE), &dir);
        check_streams(&r, threads);
        let sw = stackwalk(&r.dump);
        let ours = &sw[&r.crash_tid()];
        let o = Command::new("gdb")
            .args(testsupport::GDB_BATCH_ARGS)
            .args(["-ex", "run", "-ex", "bt 100", "--args"])
            .arg(&exe)
            .arg(scenario)
            .env("CALLSTACK_CRASH_HELPER", "none")
            .env_remove("CALLSTACK_CRASH_MINIDUMP_DIR")
            .output()
            .expect("run gdb");
        let gdb = testsupport::parse_gdb_bt(&String::from_utf8_lossy(&o.stdout));
        if scenario == "thread-overflow" {
            // The program's own frames (an inlined `black_box` at the pc
            // is shown by minidump-stackwalk, hidden by gdb).
            let own =
                |c: &[String]| -> Vec<String> { c.iter().filter(|n| is_own(n)).cloned().collect() };
            let (o, g) = (own(ours), own(&gdb));
            let n = o.len().min(g.len());
            assert!(n >= 50, "{scenario}: {ours:?} vs {gdb:?}");
            assert_eq!(o[..n], g[..n], "{scenario}");
            assert!(
                g[..n].iter().all(|f| f == "crash_fixture::rust_recurse"),
                "{gdb:?}"
            );
            assert!(
                norm(&ours[0]) == "core::hint::black_box" || ours[0] == g[0],
                "{ours:?}"
            );
        } else {
            let call_null = scenario == "call-null";
            if call_null && cfg!(target_arch = "x86_64") {
                check_call_null_stack(&r, "crash_fixture::rust_call_null");
            }
            assert_same_frames(ours, &gdb, &format!("rust {scenario}"), true, call_null);
        }
    }
}
