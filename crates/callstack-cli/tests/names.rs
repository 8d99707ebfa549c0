//! Function names in `callstack core` and `callstack pstack` equal gdb's,
//! `??` included, for stripped objects: a symbol of `.dynsym` names an
//! address only inside its size (or, without a size, up to the next
//! symbol). On the `names_stripped_*` fixtures (an executable and a library,
//! both stripped, with static functions past an exported one's end and an
//! exported assembly function without a size) and on Debian's stripped
//! `/usr/bin/python3` when it is installed.
//!
//! The oracle is gdb's Python API: every frame of every thread, with its pc,
//! name (`??` when none) and type. gdb's tail-call frames (synthesized from
//! DWARF call-site information, with no return address on the stack) are
//! not frames of ours and are left out of the comparison.

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use testsupport::{release_artifacts, scratch_dir, Gcc};

/// tid -> (pc, name) of each frame, innermost first.
type Chains = BTreeMap<u32, Vec<(u64, String)>>;

const GDB_FRAMES_PY: &str = r#"
import gdb
for inf in gdb.inferiors():
    for th in sorted(inf.threads(), key=lambda t: t.ptid[1]):
        th.switch()
        f = gdb.newest_frame()
        while f is not None:
            if f.type() != gdb.TAILCALL_FRAME:
                print("FRAME %d %#x %s" % (th.ptid[1], f.pc(), f.name() or "??"))
            f = f.older()
"#;

/// gdb's frames (`target`: the executable and core, or `-p PID`).
fn gdb_frames(dir: &Path, target: &[&str]) -> Chains {
    let script = dir.join("frames.py");
    std::fs::write(&script, GDB_FRAMES_PY).unwrap();
    let o = testsupport::gdb_batch("gdb")
        .arg("-x")
        .arg(&script)
        .args(target)
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = Chains::new();
    for l in text.lines() {
        let mut it = l.split(' ');
        if it.next() != Some("FRAME") {
            continue;
        }
        let tid: u32 = it.next().unwrap().parse().unwrap();
        let pc = u64::from_str_radix(it.next().unwrap().trim_start_matches("0x"), 16).unwrap();
        let name = it.collect::<Vec<_>>().join(" ");
        out.entry(tid).or_default().push((pc, name));
    }
    assert!(
        !out.is_empty(),
        "gdb printed no frames:\n{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Our frames, from `callstack ARGS --json`.
fn our_frames(args: &[&str]) -> Chains {
    let o = Command::new(&release_artifacts().cli)
        .args(args)
        .arg("--json")
        .output()
        .expect("run callstack");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "callstack {args:?}: {stderr}");
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let mut out = Chains::new();
    for t in v["threads"].as_array().unwrap() {
        let tid = t["tid"].as_u64().unwrap() as u32;
        let frames = t["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let pc = u64::from_str_radix(f["pc"].as_str().unwrap().trim_start_matches("0x"), 16)
                    .unwrap();
                (pc, f["function"].as_str().unwrap_or("??").to_string())
            })
            .collect();
        out.insert(tid, frames);
    }
    out
}

fn assert_same(what: &str, ours: &Chains, gdb: &Chains) {
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        gdb.keys().collect::<Vec<_>>(),
        "{what}: threads"
    );
    for (tid, want) in gdb {
        let got = &ours[tid];
        let show = |c: &[(u64, String)]| {
            c.iter()
                .map(|(pc, n)| format!("{pc:#x} {n}"))
                .collect::<Vec<_>>()
                .join("\n  ")
        };
        assert!(
            got == want,
            "{what}: thread {tid}\nours:\n  {}\ngdb:\n  {}",
            show(got),
            show(want)
        );
    }
}

/// Waits until every thread of `pid` is in one of the system calls `nrs`.
fn wait_blocked(pid: u32, nrs: &[&str], threads: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut blocked = 0;
        let mut all = 0;
        for e in std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
        {
            all += 1;
            let sc = std::fs::read_to_string(e.path().join("syscall")).unwrap_or_default();
            if nrs.contains(&sc.split_whitespace().next().unwrap_or("")) {
                blocked += 1;
            }
        }
        if all == threads && blocked == threads {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "threads of {pid} never all blocked"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
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

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sh(args: &[&str]) {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Builds the stripped fixture: (executable, library).
fn stripped_fixture(dir: &Path) -> (PathBuf, PathBuf) {
    let flags = "-O1 -fno-inline -fno-toplevel-reorder";
    let lib = Gcc::new(&["names_stripped_lib.c"])
        .flags(flags)
        .flags("-fPIC -shared")
        .build(&dir.join("libnames_stripped.so"));
    // The library by path (it has no soname: the executable needs it by
    // that path).
    let exe = Gcc::new(&["names_stripped_main.c", lib.to_str().unwrap()])
        .flags(flags)
        .flags("-rdynamic")
        .build(&dir.join("names_stripped"));
    for f in [&lib, &exe] {
        sh(&["strip", "--strip-all", f.to_str().unwrap()]);
    }
    (exe, lib)
}

#[test]
fn stripped_objects_name_like_gdb() {
    let dir = scratch_dir("names-stripped");
    let (exe, lib) = stripped_fixture(&dir);
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let child = Killed(child);
    wait_blocked(pid, &["0"], 1);

    let p = pid.to_string();
    let live_gdb = gdb_frames(&dir, &["-p", &p]);
    let live = our_frames(&["pstack", &p]);
    let core = gcore(pid, &dir);
    let core_gdb = gdb_frames(&dir, &[exe.to_str().unwrap(), core.to_str().unwrap()]);
    let ours_core = our_frames(&["core", exe.to_str().unwrap(), core.to_str().unwrap()]);
    stdin.write_all(b"x").unwrap();
    drop(child);

    // The chain the fixture is built to give (so that the comparison
    // below cannot pass on a chain without the cases it is about).
    let names: Vec<&str> = core_gdb
        .values()
        .next()
        .unwrap()
        .iter()
        .map(|f| f.1.as_str())
        .collect();
    let from_names_unsized = names.iter().position(|n| *n == "names_unsized").unwrap();
    assert_eq!(
        &names[from_names_unsized - 2..],
        &["??", "??", "names_unsized", "names_api_entry", "??", "main"],
        "gdb's chain"
    );
    assert_same("pstack", &live, &live_gdb);
    assert_same("core", &ours_core, &core_gdb);

    // `callstack addr2line` keeps binutils' names: the nearest preceding
    // symbol of the section, whatever its size.
    let nm = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .unwrap();
    let nm = String::from_utf8_lossy(&nm.stdout);
    let small = nm
        .lines()
        .find(|l| l.ends_with(" names_api_small"))
        .and_then(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
        .expect("names_api_small in .dynsym");
    // An address just past names_api_small's end: binutils names it
    // names_api_small, gdb does not.
    let probe = format!("{:#x}", small + 0x10);
    let ours = Command::new(&release_artifacts().cli)
        .args(["addr2line", "-f", "-e"])
        .arg(&lib)
        .arg(&probe)
        .output()
        .unwrap();
    let binutils = Command::new("addr2line")
        .args(["-f", "-e"])
        .arg(&lib)
        .arg(&probe)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&ours.stdout),
        String::from_utf8_lossy(&binutils.stdout)
    );
    assert!(String::from_utf8_lossy(&ours.stdout).starts_with("names_api_small\n"));
    // ... and says so.
    let help = Command::new(&release_artifacts().cli)
        .args(["addr2line", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("as binutils gives them") && help.contains("past that symbol's size"),
        "{help}"
    );
}

#[test]
fn python3_names_like_gdb() {
    let py = Path::new("/usr/bin/python3");
    if !py.exists() {
        eprintln!("skipped: no /usr/bin/python3");
        return;
    }
    let dir = scratch_dir("names-python");
    let script = dir.join("threads.py");
    std::fs::write(
        &script,
        "import sys, threading, time\n\
         def sleeper():\n    time.sleep(1000)\n\
         def waiter():\n    threading.Event().wait()\n\
         for f in (sleeper, sleeper, waiter, waiter):\n    threading.Thread(target=f, daemon=True).start()\n\
         print('ready', flush=True)\n\
         sys.stdin.read()\n",
    )
    .unwrap();
    let mut child = Command::new(py)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id();
    let child = Killed(child);
    // read (0), futex (202), clock_nanosleep (230).
    wait_blocked(pid, &["0", "202", "230"], 5);

    let p = pid.to_string();
    let live_gdb = gdb_frames(&dir, &["-p", &p]);
    let live = our_frames(&["pstack", &p]);
    let core = gcore(pid, &dir);
    drop(child);
    let core_gdb = gdb_frames(&dir, &[py.to_str().unwrap(), core.to_str().unwrap()]);
    let ours_core = our_frames(&["core", py.to_str().unwrap(), core.to_str().unwrap()]);
    // Stripped: some frames have no name.
    assert!(
        core_gdb.values().flatten().any(|f| f.1 == "??"),
        "no ?? frame in gdb's output: is python3 stripped?"
    );
    assert_same("pstack python3", &live, &live_gdb);
    assert_same("core python3", &ours_core, &core_gdb);
}
