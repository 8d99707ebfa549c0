//! Function names in `callstack core` and `callstack pstack` equal gdb's,
//! `??` included, for stripped objects: a symbol of `.dynsym` names an
//! address only inside its size (or, without a size, up to the next
//! symbol). On the `names_stripped_*` fixtures (an executable and a library,
//! both stripped, with static functions past an exported one's end and an
//! exported assembly function without a size) and on Debian's stripped
//! `/usr/bin/python3` when it is installed.
//!
//! The oracle is gdb's Python API: every frame of every thread, with its pc,
//! name (`??` when none) and whether it is a tail-call frame (a function
//! that ended with a jump to the next, synthesized from the DWARF call
//! sites: ours are marked `"tail_call": true`). On the `tailcall.c`
//! fixture (one chain of tail calls; two chains of which only the common
//! calls are shown; a jump made by an inlined function, one frame named
//! after it; a jump to a library function through the PLT, the chain
//! going on in glibc; a live process, a core of it and a core of a crash in the
//! tail-called function; DWARF 5 and GNU's DWARF 4 extension), and on
//! python3's threads waiting on a lock (glibc's
//! `do_futex_wait` and `__futex_abstimed_wait_cancelable64` end with
//! tail calls).

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use testsupport::{gcore, release_artifacts, scratch_dir, Gcc};

/// tid -> (pc, name, tail-call frame) of each frame, innermost first.
type Chains = BTreeMap<u32, Vec<(u64, String, bool)>>;

const GDB_FRAMES_PY: &str = r#"
import gdb
for inf in gdb.inferiors():
    for th in sorted(inf.threads(), key=lambda t: t.ptid[1]):
        th.switch()
        f = gdb.newest_frame()
        while f is not None:
            tail = int(f.type() == gdb.TAILCALL_FRAME)
            print("FRAME %d %#x %d %s" % (th.ptid[1], f.pc(), tail, f.name() or "??"))
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
        let tail = it.next() == Some("1");
        let name = it.collect::<Vec<_>>().join(" ");
        out.entry(tid).or_default().push((pc, name, tail));
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
                let pc =
                    u64::from_str_radix(f["pc"].as_str().unwrap().trim_start_matches("0x"), 16)
                        .unwrap();
                let tail = f.get("tail_call") == Some(&Value::Bool(true));
                (pc, f["function"].as_str().unwrap_or("??").to_string(), tail)
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
        let show = |c: &[(u64, String, bool)]| {
            c.iter()
                .map(|(pc, n, tail)| {
                    let t = if *tail { " [tail call]" } else { "" };
                    format!("{pc:#x} {n}{t}")
                })
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
    // Native frames only: gdb shows `_PyEval_EvalFrameDefault` where
    // Python frames would stand (tests/python.rs checks those).
    let live = our_frames(&["pstack", "--no-python", &p]);
    let core = gcore(pid, &dir);
    drop(child);
    let core_gdb = gdb_frames(&dir, &[py.to_str().unwrap(), core.to_str().unwrap()]);
    let ours_core = our_frames(&[
        "core",
        "--no-python",
        py.to_str().unwrap(),
        core.to_str().unwrap(),
    ]);
    // Stripped: some frames have no name.
    assert!(
        core_gdb.values().flatten().any(|f| f.1 == "??"),
        "no ?? frame in gdb's output: is python3 stripped?"
    );
    // Threads in threading.Event().wait(): glibc's semaphore wait ends
    // with tail calls (with libc6-dbg's DWARF, as scripts/install-test-deps.sh
    // installs it).
    let tails: Vec<&str> = core_gdb
        .values()
        .flatten()
        .filter(|f| f.2)
        .map(|f| f.1.as_str())
        .collect();
    assert!(
        tails.contains(&"do_futex_wait"),
        "gdb shows no tail-call frame do_futex_wait ({tails:?}): is libc6-dbg installed?"
    );
    assert_same("pstack python3", &live, &live_gdb);
    assert_same("core python3", &ours_core, &core_gdb);
}

/// The chain of names of the thread whose chain contains `name`.
fn chain_with<'a>(c: &'a Chains, name: &str) -> Vec<(&'a str, bool)> {
    let t = c
        .values()
        .find(|t| t.iter().any(|f| f.1 == name))
        .unwrap_or_else(|| panic!("no thread runs {name}"));
    t.iter().map(|f| (f.1.as_str(), f.2)).collect()
}

/// The chains `tailcall.c` is built to give, with the tail-call frames gdb
/// synthesizes (so that a comparison cannot pass on chains without them).
fn assert_tailcall_chains(what: &str, c: &Chains, crashed: bool) {
    let single = chain_with(c, "single_a");
    let at = single.iter().position(|f| f.0 == "leaf").unwrap();
    assert_eq!(
        &single[at..at + 5],
        &[
            ("leaf", false),
            ("single_mid", true),
            ("single_b", true),
            ("single_a", false),
            ("single_thread", false)
        ],
        "{what}: one chain of tail calls"
    );
    assert_eq!(
        at == 0,
        crashed,
        "{what}: leaf is frame 0 only in the crash"
    );
    // Two chains (through fork_left or fork_right): only what both share.
    let fork = chain_with(c, "fork_a");
    let at = fork.iter().position(|f| f.0 == "leaf").unwrap();
    assert_eq!(
        &fork[at..at + 5],
        &[
            ("leaf", false),
            ("fork_join", true),
            ("fork_b", true),
            ("fork_a", false),
            ("fork_thread", false)
        ],
        "{what}: two chains of tail calls"
    );
    // A jump made by an inlined function: one frame, named after it.
    let inline = chain_with(c, "inline_top");
    let at = inline.iter().position(|f| f.0 == "leaf").unwrap();
    assert_eq!(
        &inline[at..at + 4],
        &[
            ("leaf", false),
            ("inline_helper", true),
            ("inline_top", false),
            ("inline_thread", false)
        ],
        "{what}: a tail call from an inlined function"
    );
    // Into libc through the PLT: pthread_join ends with a jump too.
    let join = chain_with(c, "joiner_a");
    let at = join.iter().position(|f| f.0 == "joiner_b").unwrap();
    assert!(at > 0 && join[at - 1].1, "{what}: {join:?}");
    assert_eq!(
        &join[at..at + 3],
        &[
            ("joiner_b", true),
            ("joiner_a", false),
            ("joiner_thread", false)
        ],
        "{what}: a tail call to a library function"
    );
    // main calls leaf itself.
    let main = chain_with(c, "main");
    assert!(main.iter().all(|f| !f.1), "{what}: {main:?}");
}

/// Spawns `exe ARGS` with piped stdin and waits for its `ready` line.
fn spawn_ready(exe: &Path, args: &[&str], dir: &Path) -> (Killed, std::process::ChildStdin) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -c unlimited; exec {} {}",
            exe.display(),
            args.join(" ")
        ))
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let stdin = child.stdin.take().unwrap();
    (Killed(child), stdin)
}

#[test]
fn tail_call_frames_like_gdb() {
    let dir = scratch_dir("names-tailcall");
    for (dwarf, flags) in [("dwarf5", "-gdwarf-5"), ("dwarf4", "-gdwarf-4")] {
        let exe = Gcc::new(&["tailcall.c"])
            .flags("-O2 -pthread")
            .flags(flags)
            .build(&dir.join(format!("tailcall-{dwarf}")));
        let e = exe.to_str().unwrap();
        // A live process, its threads blocked in read.
        let (child, stdin) = spawn_ready(&exe, &[], &dir);
        let pid = child.0.id();
        // read (0), and futex (202) for the joiner.
        wait_blocked(pid, &["0", "202"], 5);
        let p = pid.to_string();
        let live_gdb = gdb_frames(&dir, &["-p", &p]);
        let live = our_frames(&["pstack", &p]);
        assert_tailcall_chains(&format!("gdb -p, {dwarf}"), &live_gdb, false);
        assert_same(&format!("pstack, {dwarf}"), &live, &live_gdb);
        if dwarf == "dwarf4" {
            drop(stdin);
            continue;
        }
        let core = gcore(pid, &dir);
        drop(stdin);
        drop(child);
        let core_gdb = gdb_frames(&dir, &[e, core.to_str().unwrap()]);
        assert_tailcall_chains("gdb core", &core_gdb, false);
        assert_same(
            "core",
            &our_frames(&["core", e, core.to_str().unwrap()]),
            &core_gdb,
        );

        // A crash in the tail-called function (frame 0 at an exact pc).
        let crash_dir = dir.join("crash");
        std::fs::create_dir_all(&crash_dir).unwrap();
        let (mut child, stdin) = spawn_ready(&exe, &["crash"], &crash_dir);
        let st = child.0.wait().unwrap();
        drop(stdin);
        assert!(!st.success());
        let core = std::fs::read_dir(&crash_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("core"))
            .unwrap_or_else(|| {
                panic!(
                    "no core dumped in {} (kernel.core_pattern is {:?})",
                    crash_dir.display(),
                    std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default()
                )
            });
        let c = core.to_str().unwrap();
        let crash_gdb = gdb_frames(&dir, &[e, c]);
        assert_tailcall_chains("gdb crash core", &crash_gdb, true);
        assert_same("crash core", &our_frames(&["core", e, c]), &crash_gdb);
        // The text output prints them as gdb's `bt` does: ordinary frames.
        let o = Command::new(&release_artifacts().cli)
            .args(["core", e, c])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        let pc = crash_gdb
            .values()
            .flatten()
            .find(|f| f.1 == "single_mid")
            .unwrap()
            .0;
        // The line of single_mid's tail call (gdb's line for the frame).
        let src = std::fs::read_to_string(testsupport::c_fixtures().join("tailcall.c")).unwrap();
        let line = 1 + src
            .lines()
            .position(|l| l.trim() == "return leaf(x, fd);")
            .unwrap();
        let want = format!("#1  {pc:#018x} in single_mid () at ");
        let end = format!("tailcall.c:{line}");
        assert!(
            text.lines()
                .any(|l| l.starts_with(&want) && l.ends_with(&end)),
            "no line `{want}...{end}`:\n{text}"
        );
    }
}

/// PLT entries are named `function@plt` in `pstack`/`core`'s naming (gdb's,
/// the library's default), as objdump and gdb name them, on C programs
/// built with and without IBT's second PLT (`.plt.sec`), one entry of
/// `.plt.got` among them, and on system binaries; `addr2line` (binutils')
/// still names none.
#[test]
fn plt_entries_are_named_as_objdump_names_them() {
    use callstack::symbolize::{Address, ModuleInfo, Symbolizer};
    if std::env::consts::ARCH != "x86_64" {
        eprintln!("skipped: the fixtures here are x86-64 system binaries");
        return;
    }
    let dir = testsupport::scratch_dir("names-plt");
    let mut files: Vec<(std::path::PathBuf, &str)> = vec![
        (
            testsupport::Gcc::new(&["prof_twin.c"])
                .flags("-O0 -fcf-protection=none")
                .build(&dir.join("plt_classic")),
            "objdump",
        ),
        (
            testsupport::Gcc::new(&["prof_twin.c"])
                .flags("-O0 -fcf-protection=full")
                .build(&dir.join("plt_ibt")),
            "objdump",
        ),
    ];
    for f in [
        "/usr/bin/gzip",
        "/usr/bin/bash",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
    ] {
        if std::path::Path::new(f).is_file() {
            files.push((f.into(), "objdump"));
        }
    }
    // AArch64's PLT, from the cross compiler the AArch64 stage installs.
    let a64 = dir.join("plt_aarch64");
    let built = std::process::Command::new("aarch64-linux-gnu-gcc")
        .args(["-O0", "-o"])
        .arg(&a64)
        .arg(testsupport::c_fixtures().join("prof_twin.c"))
        .status()
        .is_ok_and(|s| s.success());
    if built {
        files.push((a64, "aarch64-linux-gnu-objdump"));
    } else {
        eprintln!("no aarch64-linux-gnu-gcc: AArch64's PLT not checked");
    }
    for (exe, objdump) in &files {
        let dump = std::process::Command::new(objdump)
            .arg("-d")
            .arg(exe)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&dump.stdout);
        // `0000000000001040 <clock_gettime@plt>:`; not `*ABS*+0x9f550@plt`
        // (an IRELATIVE slot: no symbol to name it after).
        let entries: Vec<(usize, &str)> = text
            .lines()
            .filter_map(|l| {
                let (a, rest) = l.split_once(" <")?;
                let name = rest.strip_suffix(">:")?;
                (name.ends_with("@plt") && !name.starts_with("*ABS*"))
                    .then(|| Some((usize::from_str_radix(a, 16).ok()?, name)))?
            })
            .collect();
        assert!(
            !entries.is_empty(),
            "{}: objdump lists no PLT entry",
            exe.display()
        );
        let info = ModuleInfo {
            path: exe.to_path_buf(),
            build_id: None,
            start: 0,
            end: usize::MAX / 2,
            bias: Some(0),
        };
        let mut gdb_like = Symbolizer::from_modules(vec![info.clone()]);
        let mut binutils_like = Symbolizer::from_modules(vec![info]);
        binutils_like.set_symbol_extent(callstack::symbolize::SymbolExtent::Section);
        for &(addr, name) in &entries {
            for probe in [addr, addr + 6] {
                let got = gdb_like.symbolize(Address::Exact(probe));
                let f = got.frames.last().and_then(|f| f.function.as_deref());
                assert_eq!(f, Some(name), "{} {probe:#x}", exe.display());
                let b = binutils_like.symbolize(Address::Exact(probe));
                assert!(
                    b.frames.iter().all(|f| f.function.is_none()),
                    "{} {probe:#x}: binutils' addr2line names no PLT entry: {b:?}",
                    exe.display()
                );
            }
        }
        eprintln!("{}: {} PLT entries named", exe.display(), entries.len());
    }
}
