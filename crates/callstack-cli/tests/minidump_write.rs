//! The minidumps `callstack pstack --minidump` and `callstack core
//! --minidump` write, read back stream by stream with rust-minidump's
//! parser (the `minidump` crate) and checked against /proc, `readelf` and
//! gdb; then unwound by rust-minidump's `minidump-stackwalk`, whose frames
//! must be gdb's (on a gcore of the same process, or the same core).

use minidump::{
    Minidump, MinidumpException, MinidumpMiscInfo, MinidumpModuleList, MinidumpSystemInfo,
    MinidumpThreadList, MinidumpThreadNames, MmapMinidump, Module,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use testsupport::{gcore, release_artifacts, scratch_dir, Gcc};

/// Breakpad's Linux stream types.
const LINUX_CPU_INFO: u32 = 0x4767_0003;
const LINUX_PROC_STATUS: u32 = 0x4767_0004;
const LINUX_LSB_RELEASE: u32 = 0x4767_0005;
const LINUX_CMD_LINE: u32 = 0x4767_0006;
const LINUX_ENVIRON: u32 = 0x4767_0007;
const LINUX_AUXV: u32 = 0x4767_0008;
const LINUX_MAPS: u32 = 0x4767_0009;

/// Functions of the fixtures themselves: gdb's frames in them must all be
/// found, with the same names.
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
    "park_here",
    "park_a",
    "park_b",
    "crash_inner",
    "crash_outer",
    "crash_worker",
];

/// The remote_threads fixture, every thread blocked in its known chain.
struct Fixture {
    child: Child,
    pid: u32,
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
        wait_all_blocked(pid, threads + 3);
        Fixture { child, pid }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(mut i) = self.child.stdin.take() {
            let _ = i.write_all(b"go\n");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until every thread of `pid` sits in futex or read.
fn wait_all_blocked(pid: u32, count: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let blocked = tids(pid)
            .iter()
            .filter(|t| {
                let sc = std::fs::read_to_string(format!("/proc/{pid}/task/{t}/syscall"))
                    .unwrap_or_default();
                matches!(sc.split_whitespace().next(), Some("202") | Some("0"))
            })
            .count();
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

fn tids(pid: u32) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// Runs `callstack` and returns its stderr; panics unless it succeeded.
fn callstack(args: &[&str]) -> String {
    let o = Command::new(&release_artifacts().cli)
        .args(args)
        .output()
        .expect("run callstack");
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "callstack {args:?} failed: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// One frame of gdb's `thread apply all bt`: its pc (`None` for a signal
/// frame) and function name.
#[derive(Clone, Debug)]
struct GdbFrame {
    pc: Option<u64>,
    name: String,
}

/// gdb's frames of every thread of a core, by tid, with the pc of every
/// frame printed.
fn gdb_frames(exe: &Path, core: &Path) -> BTreeMap<u32, Vec<GdbFrame>> {
    let o = testsupport::gdb_batch("gdb")
        .args([
            "-ex",
            "set print frame-info location-and-address",
            "-ex",
            "thread apply all bt",
        ])
        .arg(exe)
        .arg(core)
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut out: BTreeMap<u32, Vec<GdbFrame>> = BTreeMap::new();
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
        let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit()).trim();
        let frame = if rest.starts_with("<signal handler called>") {
            GdbFrame {
                pc: None,
                name: "<signal handler called>".into(),
            }
        } else {
            let (pc, rest) = match rest.strip_prefix("0x") {
                Some(r) => {
                    let (hex, r) = r.split_once(" in ").unwrap_or((r, ""));
                    (u64::from_str_radix(hex.trim(), 16).ok(), r)
                }
                None => (None, rest),
            };
            let name = rest.split([' ', '(']).next().unwrap_or("").to_string();
            GdbFrame { pc, name }
        };
        out.get_mut(&t).unwrap().push(frame);
    }
    assert!(!out.is_empty(), "gdb printed no threads:\n{text}");
    out
}

/// One frame of `minidump-stackwalk --json`: the pc (the return address
/// for a caller: rust-minidump prints it minus one) and the name.
#[derive(Clone, Debug)]
struct WalkFrame {
    pc: u64,
    name: String,
    module: String,
}

fn stackwalk_json(dump: &Path) -> Value {
    let text = testsupport::stackwalk_json_text(dump, None);
    serde_json::from_slice(&text).expect("minidump-stackwalk's JSON")
}

fn walk_frames(v: &Value) -> BTreeMap<u32, Vec<WalkFrame>> {
    let mut out = BTreeMap::new();
    for t in v["threads"].as_array().expect("threads") {
        let tid = t["thread_id"].as_u64().unwrap() as u32;
        let frames = t["frames"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let off = f["offset"].as_str().unwrap().trim_start_matches("0x");
                let pc = u64::from_str_radix(off, 16).unwrap() + (i > 0) as u64;
                WalkFrame {
                    pc,
                    name: f["function"].as_str().unwrap_or("??").to_string(),
                    module: f["module"].as_str().unwrap_or("").to_string(),
                }
            })
            .collect();
        out.insert(tid, frames);
    }
    out
}

/// A name with the leading underscores rust-minidump's ELF reader drops,
/// and a `.cold` part's suffix, taken off.
fn base_name(n: &str) -> &str {
    let n = n.trim_start_matches('_');
    n.strip_suffix(".cold").unwrap_or(n)
}

/// `minidump-stackwalk`'s frames of one thread against gdb's: every one of
/// its pcs is one of gdb's, in gdb's order (gdb adds inline frames and
/// tail-call frames from DWARF, which share or lack a return address);
/// every gdb frame in the fixture's own code is found, with its name; and
/// both end at the same outermost frame (the thread's start, or `main`). A walk that reaches a signal frame is compared up to it:
/// `minidump-stackwalk` does not unwind through Linux signal frames.
fn check_thread(tag: &str, tid: u32, gdb: &[GdbFrame], walk: &[WalkFrame], exe_name: &str) {
    // gdb stops at main (`backtrace past-main` is off): so does the walk.
    let walk = match gdb.last() {
        Some(f) if f.name == "main" => {
            let end = walk
                .iter()
                .position(|w| w.name == "main")
                .unwrap_or_else(|| panic!("{tag}: thread {tid}: no main in {walk:?}"));
            &walk[..=end]
        }
        _ => walk,
    };
    let cut = gdb.iter().position(|f| f.pc.is_none());
    let gdb_part = &gdb[..cut.unwrap_or(gdb.len())];
    let mut matched = vec![false; gdb_part.len()];
    let mut g = 0;
    for (i, w) in walk.iter().enumerate() {
        match gdb_part[g..].iter().position(|f| f.pc == Some(w.pc)) {
            Some(k) => {
                g += k;
                matched[g] = true;
                if w.module == exe_name || OWN.contains(&base_name(&w.name)) {
                    assert_eq!(
                        base_name(&w.name),
                        base_name(&gdb_part[g].name),
                        "{tag}: thread {tid} frame {i}: walk {walk:?}\ngdb {gdb:?}"
                    );
                }
                g += 1;
            }
            // Past the signal frame: the walk ends at its trampoline.
            None if cut.is_some() && g == gdb_part.len() => break,
            None => panic!(
                "{tag}: thread {tid}: frame {i} ({w:?}) is not gdb's\nwalk {walk:?}\ngdb {gdb:?}"
            ),
        }
    }
    for (f, m) in gdb_part.iter().zip(&matched) {
        if OWN.contains(&f.name.as_str()) {
            assert!(
                m,
                "{tag}: thread {tid}: gdb's {} missing\nwalk {walk:?}\ngdb {gdb:?}",
                f.name
            );
        }
    }
    if cut.is_none() {
        assert_eq!(
            walk.last().map(|w| w.pc),
            gdb.last().and_then(|f| f.pc),
            "{tag}: thread {tid}: not through to the start\nwalk {walk:?}\ngdb {gdb:?}"
        );
    }
}

/// The build-id `readelf -n` gives for `file`, in hex.
fn readelf_build_id(file: &Path) -> String {
    let o = Command::new("readelf")
        .arg("-n")
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Build ID: ")
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no build-id in {}", file.display()))
}

/// The file mapped as libc in `pid`.
fn libc_of(maps: &str) -> PathBuf {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .map(PathBuf::from)
        .expect("libc in the maps")
}

/// The checks common to every dump: modules with their build-ids, the
/// Linux streams, the system info.
fn check_common(dump: &MmapMinidump, exe: &Path, libc: &Path) {
    let sys: MinidumpSystemInfo = dump.get_stream().expect("system info");
    assert_eq!(sys.os, minidump::system_info::Os::Linux);
    let want_cpu = if cfg!(target_arch = "aarch64") {
        minidump::system_info::Cpu::Arm64
    } else {
        minidump::system_info::Cpu::X86_64
    };
    assert_eq!(sys.cpu, want_cpu);
    let modules: MinidumpModuleList = dump.get_stream().expect("module list");
    for file in [exe, libc] {
        let m = modules
            .iter()
            .find(|m| Path::new(&*m.code_file()) == file)
            .unwrap_or_else(|| {
                panic!(
                    "{} not in the module list: {:?}",
                    file.display(),
                    modules.iter().map(|m| m.code_file()).collect::<Vec<_>>()
                )
            });
        let code_id = m.code_identifier().expect("a code id").to_string();
        assert_eq!(code_id, readelf_build_id(file), "{}", file.display());
        // The debug id: the build-id's first 16 bytes as a GUID.
        let id = readelf_build_id(file);
        let debug = m
            .debug_identifier()
            .expect("a debug id")
            .breakpad()
            .to_string();
        let guid = format!(
            "{}{}{}{}",
            swap(&id[0..8]),
            swap(&id[8..12]),
            swap(&id[12..16]),
            &id[16..32]
        )
        .to_uppercase();
        assert_eq!(debug, format!("{guid}0"), "{}", file.display());
    }
    assert!(
        modules.iter().any(|m| m.code_file() == "linux-gate.so"),
        "no vDSO module"
    );
    for (kind, what) in [
        (LINUX_MAPS, "maps"),
        (LINUX_AUXV, "auxv"),
        (LINUX_CMD_LINE, "cmdline"),
    ] {
        let s = dump
            .get_raw_stream(kind)
            .unwrap_or_else(|_| panic!("no {what} stream"));
        assert!(!s.is_empty(), "empty {what} stream");
    }
    let maps = String::from_utf8_lossy(dump.get_raw_stream(LINUX_MAPS).unwrap()).into_owned();
    assert!(maps.contains(&*exe.to_string_lossy()), "{maps}");
    let cmdline = dump.get_raw_stream(LINUX_CMD_LINE).unwrap();
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap();
    assert_eq!(
        Path::new(&*String::from_utf8_lossy(argv0)).file_name(),
        exe.file_name(),
        "cmdline {:?}",
        String::from_utf8_lossy(cmdline)
    );
    assert!(
        dump.get_raw_stream(LINUX_ENVIRON).is_err(),
        "environ written unasked"
    );
}

/// "78563412" from "12345678": a GUID field as the debug id prints it.
fn swap(hex: &str) -> String {
    (0..hex.len() / 2)
        .rev()
        .map(|i| &hex[2 * i..2 * i + 2])
        .collect()
}

/// Every thread's registers as gdb reads them in a core: (pc, sp) by tid.
fn gdb_pc_sp(exe: &Path, core: &Path) -> BTreeMap<u32, (u64, u64)> {
    let o = testsupport::gdb_batch("gdb")
        .args([
            "-ex",
            "thread apply all printf \"regs %#lx %#lx\\n\", $pc, $sp",
        ])
        .arg(exe)
        .arg(core)
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut out = BTreeMap::new();
    let mut tid = None;
    for l in text.lines() {
        if l.starts_with("Thread ") {
            tid = l
                .split_once("(LWP ")
                .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<u32>().ok());
        } else if let (Some(t), Some(r)) = (tid, l.strip_prefix("regs ")) {
            let w: Vec<&str> = r.split_whitespace().collect();
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            out.insert(t, (hex(w[0]), hex(w[1])));
        }
    }
    assert!(!out.is_empty(), "gdb gave no registers: {text}");
    out
}

/// The per-thread checks: tids, registers, names, stack memory covering sp.
fn check_threads(
    dump: &MmapMinidump,
    want_tids: &[u32],
    regs: &BTreeMap<u32, (u64, u64)>,
    names: &BTreeMap<u32, String>,
) {
    let sys: MinidumpSystemInfo = dump.get_stream().unwrap();
    let misc: Option<MinidumpMiscInfo> = dump.get_stream().ok();
    let threads: MinidumpThreadList = dump.get_stream().expect("thread list");
    let mut got: Vec<u32> = threads.threads.iter().map(|t| t.raw.thread_id).collect();
    got.sort_unstable();
    assert_eq!(got, want_tids);
    let thread_names: MinidumpThreadNames = dump.get_stream().expect("thread names");
    for t in &threads.threads {
        let tid = t.raw.thread_id;
        let ctx = t.context(&sys, misc.as_ref()).expect("a context");
        let (pc, sp) = regs[&tid];
        assert_eq!(ctx.get_instruction_pointer(), pc, "thread {tid} pc");
        assert_eq!(ctx.get_stack_pointer(), sp, "thread {tid} sp");
        let start = t.raw.stack.start_of_memory_range;
        let len = t.raw.stack.memory.data_size as u64;
        assert!(
            start <= sp && sp < start + len,
            "thread {tid}: stack {start:#x}+{len:#x} misses sp {sp:#x}"
        );
        let memory = dump.get_memory().expect("a memory list");
        let stack = t.stack_memory(&memory).expect("stack memory");
        assert_eq!(stack.bytes().len() as u64, len);
        if let Some(n) = names.get(&tid) {
            assert_eq!(thread_names.get_name(tid).as_deref(), Some(n.as_str()));
        }
    }
}

#[test]
fn pstack_minidump_holds_every_thread_and_module_and_walks_like_gdb() {
    for (tag, flags) in [
        ("O2", "-O2 -g -pthread -fomit-frame-pointer"),
        ("O2_fp", "-O2 -g -pthread -fno-omit-frame-pointer"),
    ] {
        let dir = scratch_dir(&format!("md-write-pstack-{tag}"));
        let exe = Gcc::new(&["remote_threads.c"])
            .flags(flags)
            .build(&dir.join("remote_threads"));
        let fx = Fixture::start(&exe, 4, 3);
        let pid = fx.pid;
        let out = dir.join("live.dmp");
        let note = callstack(&[
            "pstack",
            "--minidump",
            out.to_str().unwrap(),
            &pid.to_string(),
        ]);
        assert!(
            note.contains(&format!("wrote {}", out.display())) && note.contains("7 threads"),
            "{note}"
        );
        // The process was left running: it still answers, and gdb's view of
        // it (a gcore now: every thread still blocked where it was) is the
        // oracle.
        let core = gcore(pid, &dir);
        let want_tids = tids(pid);
        let names: BTreeMap<u32, String> = want_tids
            .iter()
            .map(|t| {
                let n = std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm")).unwrap();
                (*t, n.trim_end().to_string())
            })
            .collect();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let libc = libc_of(&maps);
        let dump = Minidump::read_path(&out).expect("rust-minidump reads our dump");
        check_threads(&dump, &want_tids, &gdb_pc_sp(&exe, &core), &names);
        check_common(&dump, &exe, &libc);
        for (kind, what) in [
            (LINUX_CPU_INFO, "cpuinfo"),
            (LINUX_PROC_STATUS, "status"),
            (LINUX_LSB_RELEASE, "lsb-release"),
        ] {
            assert!(dump.get_raw_stream(kind).is_ok(), "{tag}: no {what} stream");
        }
        assert!(
            dump.get_stream::<MinidumpException>().is_err(),
            "{tag}: an exception stream in a dump of a running process"
        );
        let misc: MinidumpMiscInfo = dump.get_stream().expect("misc info");
        assert_eq!(misc.raw.process_id(), Some(&pid));

        let walk = walk_frames(&stackwalk_json(&out));
        let gdb = gdb_frames(&exe, &core);
        assert_eq!(
            walk.keys().collect::<Vec<_>>(),
            gdb.keys().collect::<Vec<_>>()
        );
        let exe_name = exe.to_string_lossy();
        for (tid, g) in &gdb {
            check_thread(tag, *tid, g, &walk[tid], &exe_name);
        }

        // With the environment, when asked for.
        let out_env = dir.join("live-env.dmp");
        callstack(&[
            "pstack",
            "--minidump",
            out_env.to_str().unwrap(),
            "--minidump-environ",
            &pid.to_string(),
        ]);
        let dump = Minidump::read_path(&out_env).unwrap();
        let env = dump.get_raw_stream(LINUX_ENVIRON).expect("environ stream");
        let want = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert_eq!(env, &want[..]);
        // The gcore made into a minidump (gcore leaves out the code
        // segments of the files, so the dump's maps are partly rebuilt) and
        // read back by `callstack minidump`: every thread's frames, pcs and
        // names, are `callstack core`'s of the same core, and gdb's names.
        let from_core = dir.join("from-core.dmp");
        callstack(&[
            "core",
            "--minidump",
            from_core.to_str().unwrap(),
            core.to_str().unwrap(),
        ]);
        let read_back = frames_by_tid(&callstack_json(&[
            "minidump",
            "--json",
            from_core.to_str().unwrap(),
        ]));
        let of_core = frames_by_tid(&callstack_json(&["core", "--json", core.to_str().unwrap()]));
        assert_eq!(
            read_back, of_core,
            "{tag}: callstack minidump differs from callstack core"
        );
        for (tid, g) in &gdb {
            let ours: Vec<&str> = read_back[tid].iter().map(|f| f.1.as_str()).collect();
            // gdb names the signal frame `<signal handler called>`; we name
            // the function it is in (glibc's `__restore_rt`).
            let theirs: Vec<&str> = g
                .iter()
                .map(|f| match f.name.as_str() {
                    "<signal handler called>" => "__restore_rt",
                    n => n,
                })
                .collect();
            assert!(
                ours.starts_with(&theirs[..theirs.len().min(ours.len())])
                    && ours.len() + 1 >= theirs.len(),
                "{tag}: thread {tid}: callstack minidump {ours:?}, gdb {theirs:?}"
            );
        }
        drop(fx);
        let _ = std::fs::remove_file(&core);
    }
}

/// What `callstack ARGS` printed on its standard output, as JSON.
fn callstack_json(args: &[&str]) -> Value {
    let o = Command::new(&release_artifacts().cli)
        .args(args)
        .output()
        .expect("run callstack");
    assert!(
        o.status.success(),
        "callstack {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("callstack's JSON")
}

/// Every thread's frames `(pc, function)` of `callstack core/minidump
/// --json`, by tid (`??` for an unnamed frame).
fn frames_by_tid(v: &Value) -> BTreeMap<u32, Vec<(String, String)>> {
    v["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .map(|t| {
            let frames = t["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    (
                        f["pc"].as_str().unwrap_or("").to_string(),
                        f["function"].as_str().unwrap_or("??").to_string(),
                    )
                })
                .collect();
            (t["tid"].as_u64().unwrap() as u32, frames)
        })
        .collect()
}

/// Runs `exe arg` (which crashes) in `dir` with core dumps on and returns
/// the core it left (`kernel.core_pattern` must write `core` or `core.PID`
/// into the working directory, as the other core tests need).
fn crash_for_core(exe: &Path, arg: &str, dir: &Path) -> PathBuf {
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
        .arg(format!("ulimit -c unlimited; exec {} {arg}", exe.display()))
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

#[test]
fn core_minidump_of_a_crash_names_the_signal_and_walks_like_gdb() {
    for (tag, flags) in [
        ("O2", "-O2 -g -pthread -fomit-frame-pointer"),
        ("O2_fp", "-O2 -g -pthread -fno-omit-frame-pointer"),
    ] {
        let dir = scratch_dir(&format!("md-write-core-{tag}"));
        let exe = Gcc::new(&["minidump_crash.c"])
            .flags(flags)
            .build(&dir.join("minidump_crash"));
        for (how, signal, code, reason) in [
            ("segv", 11u32, 1u32, "SIGSEGV / SEGV_MAPERR"),
            ("abort", 6, (-6i32) as u32, "SIGABRT / SI_TKILL"),
        ] {
            let tag = format!("{tag} {how}");
            let core = crash_for_core(&exe, how, &dir);
            let out = dir.join(format!("{how}.dmp"));
            let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
            let note = callstack(&["core", "--minidump", out.to_str().unwrap(), exe_s, core_s]);
            assert!(note.contains("5 threads"), "{tag}: {note}");

            let regs = gdb_pc_sp(&exe, &core);
            let want_tids: Vec<u32> = regs.keys().copied().collect();
            // The thread that crashed: gdb's current thread.
            let gdb_text = String::from_utf8_lossy(
                &testsupport::gdb_batch("gdb")
                    .args([exe_s, core_s])
                    .output()
                    .unwrap()
                    .stdout,
            )
            .into_owned();
            let crashed: u32 = gdb_text
                .split_once("[Current thread is 1 ")
                .and_then(|(_, r)| r.split_once("(LWP "))
                .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no current thread: {gdb_text}"));

            let dump = Minidump::read_path(&out).expect("rust-minidump reads our dump");
            check_threads(&dump, &want_tids, &regs, &BTreeMap::new());
            // The libc the core mapped.
            let maps =
                String::from_utf8_lossy(dump.get_raw_stream(LINUX_MAPS).unwrap()).into_owned();
            check_common(&dump, &exe, &libc_of(&maps));
            let ex: MinidumpException = dump.get_stream().expect("exception stream");
            assert_eq!(ex.raw.thread_id, crashed, "{tag}");
            assert_eq!(ex.raw.exception_record.exception_code, signal, "{tag}");
            assert_eq!(ex.raw.exception_record.exception_flags, code, "{tag}");
            if how == "segv" {
                assert_eq!(ex.raw.exception_record.exception_address, 0x10, "{tag}");
            }
            let sys: MinidumpSystemInfo = dump.get_stream().unwrap();
            let ctx = ex.context(&sys, None).expect("exception context");
            assert_eq!(ctx.get_instruction_pointer(), regs[&crashed].0, "{tag}");

            let json = stackwalk_json(&out);
            assert_eq!(json["crash_info"]["type"], reason, "{tag}");
            if how == "segv" {
                assert_eq!(json["crash_info"]["address"], "0x0000000000000010", "{tag}");
            }
            let crashing = json["crash_info"]["crashing_thread"].as_u64().unwrap() as usize;
            assert_eq!(json["threads"][crashing]["thread_id"], crashed, "{tag}");
            let walk = walk_frames(&json);
            let gdb = gdb_frames(&exe, &core);
            let exe_name = exe.to_string_lossy();
            for (tid, g) in &gdb {
                check_thread(&tag, *tid, g, &walk[tid], &exe_name);
            }
            // The crashing thread goes through the fixture's chain.
            let names: Vec<&str> = walk[&crashed].iter().map(|f| base_name(&f.name)).collect();
            let at = names
                .iter()
                .position(|n| *n == "crash_inner")
                .unwrap_or_else(|| panic!("{tag}: no crash_inner in {names:?}"));
            assert_eq!(
                names[at..at + 3],
                ["crash_inner", "crash_outer", "crash_worker"],
                "{tag}"
            );
            // The environment, read from the core's main stack when asked for.
            let out_env = dir.join(format!("{how}-env.dmp"));
            callstack(&[
                "core",
                "--minidump",
                out_env.to_str().unwrap(),
                "--minidump-environ",
                exe_s,
                core_s,
            ]);
            let dump = Minidump::read_path(&out_env).unwrap();
            let env = dump.get_raw_stream(LINUX_ENVIRON).expect("environ stream");
            let path = format!("PATH={}", std::env::var("PATH").unwrap());
            assert!(
                env.split(|b| *b == 0).any(|v| v == path.as_bytes()),
                "{tag}: {}",
                String::from_utf8_lossy(env)
            );
            let _ = std::fs::remove_file(&core);
        }
    }
}

/// A file that cannot be written is an error naming it, and the target
/// is left running.
#[test]
fn minidump_to_an_unwritable_path_is_an_error_and_the_target_runs_on() {
    let mut child = Command::new("sh")
        .args(["-c", "read x"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let pid = child.id().to_string();
    let o = Command::new(&release_artifacts().cli)
        .args(["pstack", "--minidump", "/nonexistent-dir/x.dmp", &pid])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success());
    assert!(stderr.contains("/nonexistent-dir/x.dmp"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let state = state
        .rsplit_once(')')
        .unwrap()
        .1
        .trim_start()
        .chars()
        .next();
    assert_eq!(state, Some('S'), "the target is not running on");
    let _ = child.kill();
    let _ = child.wait();
}

/// An AArch64 core (qemu-user's, of a static -O2 program): the dump's
/// `CONTEXT_ARM64` holds each thread's pc, sp and lr as gdb-multiarch reads
/// them from the core, its stack covers sp, and the exception names the
/// thread that faulted. (`minidump-stackwalk` reads the dump and starts
/// every walk right, but its CFI walk skips the caller of a leaf function
/// on AArch64, so its frames are not compared with gdb's here.)
#[test]
fn core_minidump_of_an_aarch64_crash_holds_arm64_contexts() {
    let have = |c: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    for tool in ["aarch64-linux-gnu-gcc", "qemu-aarch64", "gdb-multiarch"] {
        assert!(
            have(tool),
            "{tool} missing: run scripts/install-test-deps.sh"
        );
    }
    let dir = scratch_dir("md-write-a64");
    let exe = dir.join("minidump_crash_a64");
    let o = Command::new("aarch64-linux-gnu-gcc")
        .args([
            "-O2",
            "-g",
            "-static",
            "-pthread",
            "-fasynchronous-unwind-tables",
        ])
        .arg(testsupport::c_fixtures().join("minidump_crash.c"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).unwrap();
    let _ = Command::new("sh")
        .current_dir(&run)
        .arg("-c")
        .arg(format!(
            "ulimit -c unlimited; exec qemu-aarch64 {} segv",
            exe.display()
        ))
        .output()
        .unwrap();
    // qemu leaves a host core of itself too: not ours.
    let _ = std::fs::remove_file(run.join("core"));
    let core = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "core"))
        .expect("qemu wrote no guest core");
    let out = dir.join("a64.dmp");
    let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
    let note = callstack(&["core", "--minidump", out.to_str().unwrap(), exe_s, core_s]);
    assert!(note.contains("5 threads"), "{note}");

    let g = Command::new("timeout")
        .args(["60", "gdb-multiarch", "-batch", "-nx", "-ex"])
        .arg("thread apply all printf \"regs %#lx %#lx %#lx\\n\", $pc, $sp, $x30")
        .args([exe_s, core_s])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&g.stdout).into_owned();
    let mut want: BTreeMap<u32, [u64; 3]> = BTreeMap::new();
    let mut tid = None;
    for l in text.lines() {
        if l.starts_with("Thread ") {
            tid = l
                .split_once("(LWP ")
                .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<u32>().ok());
        } else if let (Some(t), Some(r)) = (tid, l.strip_prefix("regs ")) {
            let w: Vec<u64> = r
                .split_whitespace()
                .map(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap())
                .collect();
            want.insert(t, [w[0], w[1], w[2]]);
        }
    }
    assert_eq!(want.len(), 5, "gdb-multiarch: {text}");

    let dump = Minidump::read_path(&out).expect("rust-minidump reads the dump");
    let sys: MinidumpSystemInfo = dump.get_stream().unwrap();
    assert_eq!(sys.cpu, minidump::system_info::Cpu::Arm64);
    let threads: MinidumpThreadList = dump.get_stream().unwrap();
    let memory = dump.get_memory().expect("a memory list");
    let mut seen = Vec::new();
    for t in &threads.threads {
        let tid = t.raw.thread_id;
        let ctx = t.context(&sys, None).expect("an arm64 context");
        let minidump::MinidumpRawContext::Arm64(raw) = &ctx.raw else {
            panic!("thread {tid}: not CONTEXT_ARM64: {:?}", ctx.raw)
        };
        let [pc, sp, lr] = want[&tid];
        assert_eq!(
            (raw.pc, raw.sp, raw.iregs[30]),
            (pc, sp, lr),
            "thread {tid}"
        );
        let stack = t.stack_memory(&memory).expect("stack memory");
        let start = t.raw.stack.start_of_memory_range;
        assert!(start <= sp && sp < start + stack.bytes().len() as u64);
        seen.push(tid);
    }
    seen.sort_unstable();
    assert_eq!(seen, want.keys().copied().collect::<Vec<_>>());
    let ex: MinidumpException = dump.get_stream().expect("exception");
    assert_eq!(ex.raw.exception_record.exception_code, 11);
    let crash_pc = ex
        .context(&sys, None)
        .expect("exception context")
        .get_instruction_pointer();
    assert_eq!(crash_pc, want[&ex.raw.thread_id][0]);
    let modules: MinidumpModuleList = dump.get_stream().unwrap();
    let m = modules
        .iter()
        .find(|m| m.code_file() == exe_s)
        .expect("the executable in the module list");
    assert_eq!(
        m.code_identifier().unwrap().to_string(),
        readelf_build_id(&exe)
    );
    let json = stackwalk_json(&out);
    assert_eq!(json["system_info"]["cpu_arch"], "arm64");
    assert_eq!(
        json["crash_info"]["type"].as_str().map(|s| &s[..7]),
        Some("SIGSEGV")
    );
    let _ = std::fs::remove_dir_all(&run);
}

/// The crash handler's path: `write_live_process` with a [`Crash`] whose
/// registers stand in for what ptrace reads of the crashing thread. Here
/// thread B is given thread A's registers: B's context in the dump is A's,
/// B's stack is taken from A's stack pointer, the exception stream names B
/// with the signal, and the memory around the pc (the fixture's code) is in
/// the dump, byte for byte.
#[test]
fn write_live_process_takes_the_crash_registers_and_keeps_memory_around_the_pc() {
    use callstack::minidump::{write_live_process, Crash, WriteOptions};
    use callstack::remote::{process::LiveProcess, Lookup};
    let dir = scratch_dir("md-write-crash-regs");
    let exe = Gcc::new(&["remote_threads.c"])
        .flags("-O2 -g -pthread")
        .build(&dir.join("remote_threads"));
    let fx = Fixture::start(&exe, 2, 2);
    let live = LiveProcess::capture(fx.pid, &Lookup::default()).unwrap();
    let threads = live.snapshot().threads.clone();
    let (a, b) = (&threads[1], &threads[2]);
    let regs = a.registers;
    let (pc, sp) = (regs.pc().unwrap(), regs.sp().unwrap());
    drop(live);
    let out = dir.join("crash.dmp");
    let opts = WriteOptions {
        crash: Some(Crash {
            tid: b.tid,
            signal: 11,
            code: 1,
            address: 0x10,
            registers: Some(regs),
        }),
        ..WriteOptions::default()
    };
    let stats = write_live_process(fx.pid, &out, &opts, &Lookup::default()).unwrap();
    assert_eq!(stats.threads, 5);
    assert_eq!(stats.bytes, std::fs::metadata(&out).unwrap().len());

    let dump = Minidump::read_path(&out).unwrap();
    let sys: MinidumpSystemInfo = dump.get_stream().unwrap();
    let list: MinidumpThreadList = dump.get_stream().unwrap();
    let t = list
        .threads
        .iter()
        .find(|t| t.raw.thread_id == b.tid)
        .unwrap();
    let ctx = t.context(&sys, None).unwrap();
    assert_eq!(
        (ctx.get_instruction_pointer(), ctx.get_stack_pointer()),
        (pc, sp)
    );
    assert_eq!(t.raw.stack.start_of_memory_range, sp - 128);
    let ex: MinidumpException = dump.get_stream().unwrap();
    assert_eq!(ex.raw.thread_id, b.tid);
    assert_eq!(ex.raw.exception_record.exception_code, 11);
    assert_eq!(ex.raw.exception_record.exception_flags, 1);
    assert_eq!(ex.raw.exception_record.exception_address, 0x10);
    assert_eq!(
        ex.context(&sys, None).unwrap().get_instruction_pointer(),
        pc
    );
    let memory = dump.get_memory().unwrap();
    let m = memory.memory_at_address(pc).expect("memory around the pc");
    let base = m.base_address();
    let bytes = m.bytes();
    assert!(base <= pc - 64 && pc + 64 <= base + bytes.len() as u64);
    let mut want = vec![0u8; bytes.len()];
    {
        use std::os::unix::fs::FileExt;
        std::fs::File::open(format!("/proc/{}/mem", fx.pid))
            .unwrap()
            .read_exact_at(&mut want, base)
            .unwrap();
    }
    assert_eq!(bytes, &want[..]);
    drop(fx);
}

/// A truncated core gives a dump of what it holds, or an error: never a
/// panic, and any dump written is one rust-minidump reads.
#[test]
fn core_minidump_of_a_truncated_core_is_a_dump_or_an_error() {
    let dir = scratch_dir("md-write-truncated");
    let exe = Gcc::new(&["minidump_crash.c"])
        .flags("-O2 -g -pthread")
        .build(&dir.join("minidump_crash"));
    let core = crash_for_core(&exe, "segv", &dir);
    let data = std::fs::read(&core).unwrap();
    let _ = std::fs::remove_file(&core);
    for cut in [64, 4096, data.len() / 3, data.len() / 2, data.len() - 1] {
        let part = dir.join(format!("part-{cut}"));
        std::fs::write(&part, &data[..cut]).unwrap();
        let out = dir.join(format!("part-{cut}.dmp"));
        let o = Command::new(&release_artifacts().cli)
            .args(["core", "--minidump"])
            .arg(&out)
            .arg(&exe)
            .arg(&part)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!stderr.contains("panicked"), "cut {cut}: {stderr}");
        assert!(o.status.code().is_some(), "cut {cut}: killed: {stderr}");
        if o.status.success() {
            Minidump::read_path(&out).unwrap_or_else(|e| panic!("cut {cut}: unreadable dump: {e}"));
        } else {
            assert!(stderr.contains("callstack:"), "cut {cut}: {stderr}");
        }
        let _ = std::fs::remove_file(&part);
    }
}

/// A thread that overflowed its stack (-O2, no frame pointers): the
/// crashing thread's stack is kept whole (its stack pointer is in the guard
/// page, the stack starts just above it), and `minidump-stackwalk` walks
/// every one of gdb's 2000-odd frames, through the thread's start.
#[test]
fn core_minidump_of_a_stack_overflow_keeps_the_whole_stack() {
    let dir = scratch_dir("md-write-overflow");
    let exe = Gcc::new(&["minidump_crash.c"])
        .flags("-O2 -g -pthread -fomit-frame-pointer")
        .build(&dir.join("minidump_crash"));
    let core = crash_for_core(&exe, "overflow", &dir);
    let out = dir.join("overflow.dmp");
    let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
    callstack(&["core", "--minidump", out.to_str().unwrap(), exe_s, core_s]);
    let regs = gdb_pc_sp(&exe, &core);
    let dump = Minidump::read_path(&out).unwrap();
    let ex: MinidumpException = dump.get_stream().unwrap();
    assert_eq!(ex.raw.exception_record.exception_code, 11);
    let crashed = ex.raw.thread_id;
    let list: MinidumpThreadList = dump.get_stream().unwrap();
    let t = list
        .threads
        .iter()
        .find(|t| t.raw.thread_id == crashed)
        .unwrap();
    let sp = regs[&crashed].1;
    let start = t.raw.stack.start_of_memory_range;
    let len = t.raw.stack.memory.data_size as u64;
    assert!(
        start <= sp + 4096 && start + 128 >= sp,
        "stack {start:#x} vs sp {sp:#x}"
    );
    assert!(len > 4 << 20, "only {len} bytes of the overflowed stack");

    let walk = walk_frames(&stackwalk_json(&out));
    let gdb = gdb_frames(&exe, &core);
    assert!(
        gdb[&crashed].len() > 1000,
        "gdb: {} frames",
        gdb[&crashed].len()
    );
    let exe_name = exe.to_string_lossy();
    for (tid, g) in &gdb {
        check_thread("overflow", *tid, g, &walk[tid], &exe_name);
    }
    assert_eq!(walk[&crashed].len(), gdb[&crashed].len());
    let _ = std::fs::remove_file(&core);
}

/// A core of an architecture without a minidump context here (32-bit ARM,
/// from qemu-user) is an error that says so, and no dump is left behind.
#[test]
fn core_minidump_of_an_arm_core_is_an_error_naming_the_architecture() {
    let dir = scratch_dir("md-write-arm");
    let exe = dir.join("minidump_crash_arm");
    let o = Command::new("arm-linux-gnueabihf-gcc")
        .args(["-O2", "-g", "-static", "-pthread"])
        .arg(testsupport::c_fixtures().join("minidump_crash.c"))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("arm-linux-gnueabihf-gcc (scripts/install-test-deps.sh installs it)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).unwrap();
    let _ = Command::new("sh")
        .current_dir(&run)
        .arg("-c")
        .arg(format!(
            "ulimit -c unlimited; exec qemu-arm {} segv",
            exe.display()
        ))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(run.join("core"));
    let core = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "core"))
        .expect("qemu wrote no guest core");
    let out = dir.join("arm.dmp");
    let o = Command::new(&release_artifacts().cli)
        .args(["core", "--minidump"])
        .arg(&out)
        .arg(&exe)
        .arg(&core)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("minidumps of Arm targets are not supported"),
        "{stderr}"
    );
    assert!(!out.exists(), "a dump was left behind");
    let _ = std::fs::remove_dir_all(&run);
}
