//! `callstack memtrack` as a tool that wraps a command (as `time`, perf
//! and heaptrack do): the program's exit status, standard streams and
//! signals are its own; a program that ends without `exit` (`_exit`,
//! abort, a fatal signal, SIGKILL) still gets its recording; programs the
//! tracker cannot enter (static, set-user-ID) run untracked with a reason;
//! a driver's children (gcc: cc1, as, ld) are listed.

use callstack::alloc::HeapSnapshot;
use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use testsupport::{release_artifacts, scratch_dir, Gcc};

fn memtrack_cmd(out: &Path) -> Command {
    let a = release_artifacts();
    let mut c = Command::new(&a.cli);
    c.args(["memtrack", "-o"])
        .arg(out)
        .env("CALLSTACK_PRELOAD_LIB", &a.preload_lib);
    c
}

fn fixture(dir: &Path) -> PathBuf {
    Gcc::new(&["memtrack_end.c"])
        .flags("-O0")
        .build(&dir.join("end"))
}

/// (allocations, bytes, frees, freed bytes) of the sites whose stack
/// names `f`.
fn site(snap: &HeapSnapshot, f: &str) -> (u64, u64, u64, u64) {
    let mut sym = snap.symbolizer();
    let mut t = (0, 0, 0, 0);
    for s in &snap.sites {
        if snap
            .site_frames(&mut sym, s)
            .iter()
            .any(|x| x.function == f)
        {
            t = (
                t.0 + s.allocs,
                t.1 + s.alloc_bytes,
                t.2 + s.frees,
                t.3 + s.free_bytes,
            );
        }
    }
    t
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The files of `dir` other than the fixture's binary.
fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "end")
        .collect();
    v.sort();
    v
}

/// Every way of ending: memtrack exits with the program's status (128 +
/// the signal's number for a death by signal), the program's stderr line
/// passes, and the recording holds every block, whatever the ending.
#[test]
fn status_and_recording_whatever_the_ending() {
    let dir = scratch_dir("memtrack-endings");
    let exe = fixture(&dir);
    let cases: [(&[&str], i32); 7] = [
        (&["exit", "7"], 7),
        (&["exit", "0"], 0),
        (&["_exit", "3"], 3),
        (&["abort"], 128 + libc::SIGABRT),
        (&["segv", "0"], 128 + libc::SIGSEGV),
        (&["term"], 128 + libc::SIGTERM),
        (&["kill"], 128 + libc::SIGKILL),
    ];
    for (args, code) in cases {
        let sub = dir.join(args[0]);
        std::fs::create_dir_all(&sub).unwrap();
        let out = sub.join("out.heap");
        let o = memtrack_cmd(&out)
            .arg("--")
            .arg(&exe)
            .args(args)
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}\n{err}");
        assert!(err.contains("fixture stderr line\n"), "{args:?}\n{err}");
        assert!(o.stdout.is_empty(), "{args:?}: {}", text(&o.stdout));
        let snap = HeapSnapshot::read_from(std::fs::File::open(&out).unwrap())
            .unwrap_or_else(|e| panic!("{args:?}: {e}\n{err}"));
        assert_eq!(site(&snap, "end_leak"), (3, 3000, 0, 0), "{args:?}\n{err}");
        assert_eq!(site(&snap, "end_temp"), (10, 640, 10, 640), "{args:?}");
        assert!(
            err.contains("leaks: 3000 bytes in 3 blocks"),
            "{args:?}\n{err}"
        );
        // Nothing else is left behind: no empty file, no tables.
        assert_eq!(files(&sub), ["out.heap"], "{args:?}");
    }
}

/// A statically linked program cannot load the preload library, and the
/// loader ignores `LD_PRELOAD` for a set-user-ID one: each runs with its
/// own status and output, a message says why nothing was recorded, and no
/// file is left.
#[test]
fn static_and_setuid_programs_run_untracked() {
    let dir = scratch_dir("memtrack-untracked");
    let stat = Gcc::new(&["memtrack_end.c"])
        .flags("-O0 -static")
        .build(&dir.join("static"));
    let out = dir.join("s.heap");
    let o = memtrack_cmd(&out)
        .arg("--")
        .arg(&stat)
        .args(["exit", "5"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(err.contains("fixture stderr line"), "{err}");
    assert!(err.contains("statically linked"), "{err}");
    assert!(!out.exists());

    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("not root: the set-user-ID case needs a file owned by another user");
        return;
    }
    let suid = dir.join("suid");
    std::fs::copy(fixture(&dir), &suid).unwrap();
    std::os::unix::fs::chown(&suid, Some(65534), Some(65534)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let out = dir.join("u.heap");
    let o = memtrack_cmd(&out)
        .arg("--")
        .arg(&suid)
        .args(["_exit", "6"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(6), "{err}");
    assert!(err.contains("fixture stderr line"), "{err}");
    assert!(err.contains("set-user-ID"), "{err}");
    assert!(!out.exists());
}

/// The program's standard output is its own, byte for byte (xz's
/// compressed stream, a binary writer), standard input reaches it, the
/// summary goes to stderr (or `--summary FILE`) with no carriage return
/// on a pipe.
#[test]
fn streams_are_the_programs() {
    let dir = scratch_dir("memtrack-streams");
    let exe = fixture(&dir);
    let out = dir.join("out.heap");

    let direct = Command::new(&exe).arg("binary").output().unwrap();
    let o = memtrack_cmd(&out)
        .arg("--")
        .arg(&exe)
        .arg("binary")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(o.stdout.len(), 65536);
    assert!(o.stdout == direct.stdout, "binary output differs");
    let err = text(&o.stderr);
    // (stdio's buffer of stdout is live at exit too)
    assert!(
        err.contains("leaks: ") && err.contains("end_leak at "),
        "{err}"
    );
    assert!(!err.contains('\r'), "{err:?}");

    // xz -c f > f.xz, with and without memtrack.
    let input = dir.join("input");
    let mut data = Vec::new();
    for i in 0..200_000u32 {
        data.extend_from_slice(format!("{} ", i.wrapping_mul(2654435761) % 1000).as_bytes());
    }
    std::fs::write(&input, &data).unwrap();
    let plain = Command::new("xz").arg("-c").arg(&input).output().unwrap();
    assert!(plain.status.success());
    let summary = dir.join("summary.txt");
    let o = memtrack_cmd(&out)
        .arg("--summary")
        .arg(&summary)
        .args(["--", "xz", "-c"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(o.stdout == plain.stdout, "xz output differs under memtrack");
    let s = std::fs::read_to_string(&summary).unwrap();
    assert!(s.contains("heap: "), "{s}");
    assert!(!text(&o.stderr).contains("heap: "), "{}", text(&o.stderr));

    // Standard input passes through.
    let mut child = memtrack_cmd(&out)
        .arg("--")
        .arg(&exe)
        .arg("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let sent = data.clone();
    let w = std::thread::spawn(move || stdin.write_all(&sent).unwrap());
    let o = child.wait_with_output().unwrap();
    w.join().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(o.stdout == data, "stdin did not pass through");
}

/// A signal sent to memtrack's pid reaches the program; memtrack exits as
/// the program did (128 + SIGTERM) and the recording is complete.
#[test]
fn signal_to_memtrack_reaches_the_program() {
    let dir = scratch_dir("memtrack-signal");
    let exe = fixture(&dir);
    let out = dir.join("out.heap");
    let mut child = memtrack_cmd(&out)
        .arg("--")
        .arg(&exe)
        .arg("wait")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    // SAFETY: kill of the process we started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(128 + libc::SIGTERM), "{err}");
    let snap = HeapSnapshot::read_from(std::fs::File::open(&out).unwrap()).unwrap();
    assert_eq!(site(&snap, "end_leak"), (3, 3000, 0, 0), "{err}");
}

/// `calloc` whose size overflows returns NULL with errno ENOMEM, as glibc's.
#[test]
fn calloc_overflow_sets_enomem() {
    let dir = scratch_dir("memtrack-calloc");
    let src = dir.join("calloc.c");
    std::fs::write(
        &src,
        "#include <errno.h>\n#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n\
         int main(void) { volatile size_t n = SIZE_MAX / 2; errno = 0;\n\
         void *p = calloc(n, 4); printf(\"%d %d\\n\", p == NULL, errno); return 0; }\n",
    )
    .unwrap();
    let exe = Gcc::new(&[src.to_str().unwrap()])
        .flags("-O0")
        .build(&dir.join("c"));
    let o = memtrack_cmd(&dir.join("out.heap"))
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), format!("1 {}\n", libc::ENOMEM));
}

/// Blocks of size 0 still live at exit are no leak: the leak list counts
/// the 8-byte block of `end_zero`, not its five empty ones.
#[test]
fn zero_size_blocks_are_not_leaks() {
    let dir = scratch_dir("memtrack-zero");
    let exe = fixture(&dir);
    let out = dir.join("out.heap");
    let o = memtrack_cmd(&out)
        .arg("--")
        .arg(&exe)
        .arg("zero")
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    let leaks = &err[err.find("leaks:").expect("leak list")..];
    assert!(
        leaks.starts_with("leaks: 3008 bytes in 4 blocks from 2 sites"),
        "{leaks}"
    );
    assert!(leaks.contains("  8 bytes live in 1 blocks"), "{leaks}");
}

/// `memtrack -- gcc`: the summary is the driver's; every process is listed
/// (command, pid, totals) with its recording `FILE.PID`, which `callstack
/// report` reads; an overall peak is given.
#[test]
fn gcc_driver_and_its_children() {
    let dir = scratch_dir("memtrack-gcc");
    let src = dir.join("hello.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(void) { puts(\"hi\"); return 0; }\n",
    )
    .unwrap();
    let out = dir.join("out.heap");
    let o = memtrack_cmd(&out)
        .args(["--", "gcc", "-O2", "-o"])
        .arg(dir.join("hello"))
        .arg(&src)
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(o.stdout.is_empty());
    let list = &err[err.find("processes recorded:").expect("process list")..];
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    for l in list.lines().skip(1) {
        // "  PID COMMAND: N allocations, B bytes, peak P bytes, leaked L bytes -> FILE"
        let Some((head, file)) = l.trim().split_once(" -> ") else {
            continue;
        };
        let mut w = head.split_whitespace();
        let _pid: u32 = w.next().unwrap().parse().unwrap();
        let cmd = w.next().unwrap().trim_end_matches(':');
        let name = Path::new(cmd)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        seen.insert(name, PathBuf::from(file));
    }
    for name in ["gcc", "cc1", "as", "collect2", "ld"] {
        let file = seen
            .get(name)
            .unwrap_or_else(|| panic!("{name} not listed in\n{list}"));
        let r = Command::new(&release_artifacts().cli)
            .arg("report")
            .arg(file)
            .args(["--top", "3"])
            .output()
            .unwrap();
        assert!(r.status.success(), "{name}: {}", text(&r.stderr));
        assert!(text(&r.stdout).contains("inuse_space"), "{name}");
    }
    assert_eq!(seen["gcc"], out);
    assert!(list.contains("overall peak heap: "), "{list}");
    // The driver's summary comes first; the children's are not printed.
    assert_eq!(err.matches("top sites by live bytes").count(), 1, "{err}");
}

/// Children of the program that end without `exit` (SIGKILL, `_exit`)
/// keep their recordings too, each in `FILE.PID`, listed with the
/// program's own; memtrack exits with the program's status.
#[test]
fn children_that_die_keep_their_recordings() {
    let dir = scratch_dir("memtrack-children");
    let exe = fixture(&dir);
    let out = dir.join("out.heap");
    assert_eq!(exe, dir.join("end"));
    let script = "./end kill; ./end _exit 4; ./end segv 0; exit 9";
    let o = memtrack_cmd(&out)
        .current_dir(&dir)
        .args(["--", "/bin/sh", "-c", script])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(9), "{err}");
    let list = &err[err.find("processes recorded: 4\n").expect("4 processes")..];
    let mut children = 0;
    for l in list.lines().skip(1) {
        let Some((head, file)) = l.trim().split_once(" -> ") else {
            continue;
        };
        // "PID ./end ARGS: ..." (not the shell's line, which names them too)
        if head.split_whitespace().nth(1) != Some("./end") {
            continue;
        }
        children += 1;
        assert!(
            head.contains(": 13 allocations, 3640 bytes, peak 3064 bytes, leaked 3000 bytes"),
            "{head}"
        );
        let snap = HeapSnapshot::read_from(std::fs::File::open(file).unwrap()).unwrap();
        assert_eq!(site(&snap, "end_leak"), (3, 3000, 0, 0), "{file}");
        assert_eq!(site(&snap, "end_temp"), (10, 640, 10, 640), "{file}");
    }
    assert_eq!(children, 3, "{list}");
}

/// The tables file of a process stays as sparse as its records at exit:
/// on tmpfs a read of a hole of a shared mapping allocates it, so the
/// snapshot at exit reads only the file's data extents (a full scan of
/// the site table filled 22 MB per process).
#[test]
fn tables_stay_sparse_on_tmpfs() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm");
        return;
    }
    let dir = scratch_dir("memtrack-sparse");
    let exe = fixture(&dir);
    let tables = shm.join(format!("callstack-memtrack-test-{}", std::process::id()));
    std::fs::create_dir_all(&tables).unwrap();
    let o = Command::new(&exe)
        .arg("exit")
        .env("LD_PRELOAD", &release_artifacts().preload_lib)
        .env("CALLSTACK_MEMTRACK_OUT", dir.join("out.heap"))
        .env("CALLSTACK_MEMTRACK_DIR", &tables)
        .output()
        .unwrap();
    assert!(o.status.success());
    let mut files = Vec::new();
    for e in std::fs::read_dir(&tables).unwrap() {
        let e = e.unwrap();
        use std::os::unix::fs::MetadataExt;
        files.push((e.file_name(), e.metadata().unwrap().blocks() * 512));
    }
    std::fs::remove_dir_all(&tables).unwrap();
    let t: Vec<_> = files
        .iter()
        .filter(|(n, _)| n.to_string_lossy().ends_with(".tables"))
        .collect();
    assert_eq!(t.len(), 1, "{files:?}");
    assert!(t[0].1 < 2 << 20, "{} bytes allocated", t[0].1);
}

/// A forked child that frees blocks of its parent and ends in `_exit`:
/// its recording (read back from its tables file) holds the parent's
/// blocks as they were at the fork, less the ones it freed, plus its own;
/// the parent's recording is untouched by the child. A child that execs
/// at once is a new image with nothing inherited.
#[test]
fn forked_child_frees_its_parents_blocks() {
    let dir = scratch_dir("memtrack-fork-free");
    let exe = Gcc::new(&["memtrack_fork_free.c"])
        .flags("-O0")
        .build(&dir.join("end"));
    let out = dir.join("out.heap");
    let o = memtrack_cmd(&out)
        .current_dir(&dir)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let list = &err[err.find("processes recorded: 3\n").expect("3 processes")..];
    let mut seen = (0, 0);
    for l in list.lines().skip(1) {
        let Some((head, file)) = l.trim().split_once(" -> ") else {
            continue;
        };
        let snap = HeapSnapshot::read_from(std::fs::File::open(file).unwrap()).unwrap();
        // "PID COMMAND: counts"
        let command = head.split_once(": ").map(|x| x.0).unwrap_or(head);
        if command.ends_with(" true") {
            seen.1 += 1;
            assert_eq!(site(&snap, "from_a"), (0, 0, 0, 0), "{head}");
            continue;
        }
        let a = (100, (16..116).sum::<u64>(), 0, 0);
        assert_eq!(site(&snap, "from_a"), a, "{head}");
        if file == out.to_str().unwrap() {
            // The parent.
            assert_eq!(site(&snap, "from_b"), (100, 10000, 0, 0), "{head}");
            assert_eq!(site(&snap, "from_c"), (100, 100000, 100, 100000));
            assert_eq!(site(&snap, "in_child"), (0, 0, 0, 0));
        } else {
            seen.0 += 1;
            assert_eq!(site(&snap, "from_b"), (100, 10000, 100, 10000), "{head}");
            assert_eq!(site(&snap, "from_c"), (100, 100000, 0, 0));
            assert_eq!(site(&snap, "in_child"), (50, 400, 0, 0));
        }
    }
    assert_eq!(seen, (1, 1), "{list}");
}

/// The parent allocates and frees at once after a fork: its child's
/// tables are a copy of the parent's at the fork (the parent waits for
/// the copy), whatever the parent does next.
#[test]
fn forked_child_copies_the_tables_of_the_fork() {
    let dir = scratch_dir("memtrack-fork-race");
    let exe = Gcc::new(&["memtrack_fork_race.c"])
        .flags("-O0")
        .build(&dir.join("end"));
    let out = dir.join("out.heap");
    for _ in 0..3 {
        let o = memtrack_cmd(&out)
            .current_dir(&dir)
            .arg("--")
            .arg(&exe)
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{err}");
        let list = &err[err.find("processes recorded: 2\n").expect("2 processes")..];
        let mut children = 0;
        for l in list.lines().skip(1) {
            let Some((head, file)) = l.trim().split_once(" -> ") else {
                continue;
            };
            let snap = HeapSnapshot::read_from(std::fs::File::open(file).unwrap()).unwrap();
            if file == out.to_str().unwrap() {
                assert_eq!(site(&snap, "before_fork"), (10000, 640000, 5000, 320000));
                assert_eq!(site(&snap, "after_fork"), (10000, 640000, 0, 0));
            } else {
                children += 1;
                assert_eq!(site(&snap, "before_fork"), (10000, 640000, 0, 0), "{head}");
                assert_eq!(site(&snap, "after_fork"), (0, 0, 0, 0), "{head}");
            }
        }
        assert_eq!(children, 1, "{list}");
        for f in std::fs::read_dir(&dir).unwrap() {
            let p = f.unwrap().path();
            if p != exe {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
}
