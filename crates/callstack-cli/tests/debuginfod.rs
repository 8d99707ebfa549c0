//! debuginfod: a stripped program whose debug file (and, for a core whose
//! files are gone, whose executable) only a local debuginfod server has.
//! The server is elfutils' `debuginfod`, started by each test on a free
//! port of 127.0.0.1 over a folder of files, and stopped at its end; only
//! 127.0.0.1 is contacted. Where the machine allows it (`unshare -n`),
//! each test runs again inside a network namespace of its own with only
//! the loopback up, so that the server listens there and nowhere else.
//! Every run of the CLI has its debuginfod environment set here, whatever
//! the machine's.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};
use testsupport::{gcore, release_artifacts, scratch_dir, Gcc};

/// Set in the copy of a test that runs inside its network namespace.
const IN_NETNS: &str = "CALLSTACK_TEST_IN_NETNS";

/// Runs the test `name` again in a new network namespace (loopback only)
/// and checks it passed; `false` when that cannot be done here (no
/// `unshare`, not allowed), and then the caller runs the test itself.
fn rerun_in_netns(name: &str) -> bool {
    if std::env::var_os(IN_NETNS).is_some() {
        return false;
    }
    let probe = Command::new("unshare")
        .args(["-n", "ip", "link", "set", "lo", "up"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return false;
    }
    // Built out here, where cargo may reach what it needs.
    release_artifacts();
    let me = std::env::current_exe().unwrap();
    let o = Command::new("unshare")
        .args(["-n", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
        .arg(&me)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(IN_NETNS, "1")
        .output()
        .expect("run unshare");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && out.contains("1 passed"),
        "{name} in its network namespace:\n{out}\n{err}"
    );
    true
}

/// elfutils' debuginfod serving `dir`, on a free port of this machine.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// Starts the server over `dir` and waits until it has indexed
    /// `debuginfo` debug files and `executables` executables.
    fn start(dir: &Path, db: &Path, debuginfo: u64, executables: u64) -> Server {
        let _ = std::fs::remove_file(db);
        // A port the kernel says is free now; the server takes it at once.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("debuginfod")
            .args(["-p", &port.to_string(), "-F", "-d"])
            .arg(db)
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run debuginfod (scripts/install-test-deps.sh installs it)");
        let s = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(m) = s.metrics() {
                if metric(&m, "found_debuginfo_total{source=\"files\"}") >= debuginfo
                    && metric(&m, "found_executable_total{source=\"files\"}") >= executables
                {
                    return s;
                }
            }
            assert!(
                Instant::now() < deadline,
                "debuginfod never indexed {dir:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's `/metrics` page.
    fn metrics(&self) -> Option<String> {
        let mut c = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(
            c,
            "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        c.read_to_string(&mut text).ok()?;
        text.contains(" 200 ").then_some(text)
    }

    /// The requests for files by build-id the server has answered.
    fn file_requests(&self) -> u64 {
        let m = self.metrics().expect("metrics");
        metric(&m, "http_requests_total{type=\"debuginfo\"}")
            + metric(&m, "http_requests_total{type=\"executable\"}")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the metric line `name` (0 when absent).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

/// The debuginfod environment of a run: `urls` (`None`: unset), the cache.
#[derive(Clone)]
struct Env {
    urls: Option<String>,
    cache: PathBuf,
}

/// Runs the CLI with exactly the debuginfod environment `env`.
fn callstack(args: &[&str], env: &Env) -> (String, String) {
    let mut cmd = Command::new(&release_artifacts().cli);
    cmd.args(args)
        .env_remove("DEBUGINFOD_URLS")
        .env_remove("DEBUGINFOD_PROGRESS")
        .env_remove("DEBUGINFOD_TIMEOUT")
        .env("DEBUGINFOD_CACHE_PATH", &env.cache);
    if let Some(u) = &env.urls {
        cmd.env("DEBUGINFOD_URLS", u);
    }
    let o = cmd.output().expect("run callstack");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "callstack panicked: {stderr}");
    assert!(o.status.success(), "callstack {args:?}: {stderr}");
    (stdout, stderr)
}

fn run(args: &[&str]) -> String {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The threads fixture, started and blocked at known places.
struct Fixture {
    child: Child,
    pid: u32,
    out: BufReader<ChildStdout>,
}

impl Fixture {
    fn start(exe: &Path) -> Fixture {
        let mut child = Command::new(exe)
            .args(["1", "2"])
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
        // Every thread (1 worker, main, the waker, the signal thread) in
        // its blocking call: futex or read.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let blocked = std::fs::read_dir(format!("/proc/{pid}/task"))
                .unwrap()
                .flatten()
                .filter(|e| {
                    let sc = std::fs::read_to_string(e.path().join("syscall")).unwrap_or_default();
                    matches!(sc.split_whitespace().next(), Some("202" | "0"))
                })
                .count();
            if blocked == 4 {
                break;
            }
            assert!(Instant::now() < deadline, "fixture threads never blocked");
            std::thread::sleep(Duration::from_millis(5));
        }
        Fixture { child, pid, out }
    }

    fn finish(mut self) {
        self.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut rest = String::new();
        let _ = self.out.read_to_string(&mut rest);
        assert!(self.child.wait().unwrap().success(), "{rest}");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fixture built with debug info, then split: `<dir>/prog` stripped
/// of every symbol, its debug file in `<dir>/srv/` (with a stripped copy
/// of the program, for `/executable`) and, as installed locally, under
/// `<dir>/local/.build-id/`. Returns the program, the local debug dir,
/// the server's folder, and the addresses of the fixture's own functions.
struct Split {
    exe: PathBuf,
    local: PathBuf,
    srv: PathBuf,
    addrs: Vec<String>,
    /// The build-id, in hex.
    id: String,
}

/// A trace file (`callstack symbolize`'s input) of one stack through
/// `sp.addrs` in the program, recorded as loaded at `path`.
fn trace_file(sp: &Split, path: &str, out: &Path) {
    use callstack::tracefile::{ModuleRecord, TraceWriter};
    let id: Vec<u8> = (0..sp.id.len() / 2)
        .map(|i| u8::from_str_radix(&sp.id[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let bias = 0x5555_0000_0000u64;
    let mut w = TraceWriter::new(Vec::new()).unwrap();
    w.write_module(&ModuleRecord {
        path: path.into(),
        build_id: Some(id),
        start: bias,
        end: bias + 0x10_0000,
        bias,
    })
    .unwrap();
    let frames: Vec<usize> = sp
        .addrs
        .iter()
        .map(|a| (u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap() + bias) as usize)
        .collect();
    w.write_stack(&frames, true).unwrap();
    std::fs::write(out, w.finish().unwrap()).unwrap();
}

fn split(tag: &str) -> (PathBuf, Split) {
    let dir = scratch_dir(&format!("debuginfod-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("prog");
    Gcc::new(&["remote_threads.c"])
        .flags("-O2 -pthread")
        .build(&exe);
    let addrs: Vec<String> = run(&["nm", "--defined-only", s(&exe)])
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (a, t) = (it.next()?, it.next()?);
            matches!(t, "T" | "t").then(|| {
                let a = u64::from_str_radix(a, 16).unwrap();
                // Inside the function, where a line is known.
                format!("{:#x}", a + 4)
            })
        })
        .collect();
    assert!(addrs.len() >= 4, "{addrs:?}");
    let srv = dir.join("srv");
    std::fs::create_dir_all(&srv).unwrap();
    let dbg = srv.join("prog.debug");
    run(&["objcopy", "--only-keep-debug", s(&exe), s(&dbg)]);
    run(&["strip", "--strip-all", s(&exe)]);
    std::fs::copy(&exe, srv.join("prog")).unwrap();
    let notes = run(&["readelf", "-n", s(&exe)]);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("build-id")
        .trim()
        .to_string();
    let local = dir.join("local");
    let place = local.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&place).unwrap();
    std::fs::copy(&dbg, place.join(format!("{}.debug", &id[2..]))).unwrap();
    (
        dir,
        Split {
            exe,
            local,
            srv,
            addrs,
            id,
        },
    )
}

/// `pstack`, `core`, `addr2line` and `symbolize` give with the local
/// debuginfod what they give with the debug file installed; a second run
/// is served from the cache (the server counts no request), which gdb
/// reads too; with the server down, the output is that without
/// debuginfod, with one warning line.
#[test]
fn stripped_program_named_through_a_local_server() {
    if rerun_in_netns("stripped_program_named_through_a_local_server") {
        return;
    }
    let (dir, sp) = split("main");
    let server = Server::start(&sp.srv, &dir.join("db.sqlite"), 1, 1);
    let none = Env {
        urls: None,
        cache: dir.join("cache-unused"),
    };
    let cache = dir.join("cache");
    let _ = std::fs::remove_dir_all(&cache);
    let served = Env {
        urls: Some(server.url()),
        cache: cache.clone(),
    };
    let local = s(&sp.local);
    let exe = s(&sp.exe);

    let fx = Fixture::start(&sp.exe);
    let core = gcore(fx.pid, &dir);
    let pid = fx.pid.to_string();
    let core_s = s(&core);
    let a2l = |extra: &[&str], env: &Env| {
        let mut args = vec!["addr2line", "-f", "-e", exe];
        args.extend(extra);
        args.extend(sp.addrs.iter().map(String::as_str));
        callstack(&args, env).0
    };

    // The truth: the debug file installed locally.
    let want_pstack = callstack(&["pstack", "--debug-dir", local, &pid], &none).0;
    let want_core = callstack(&["core", "--debug-dir", local, exe, core_s], &none).0;
    let want_a2l = a2l(&["--debug-dir", local], &none);
    assert!(want_pstack.contains("remote_threads.c:"), "{want_pstack}");
    assert!(want_a2l.contains("remote_threads.c:"), "{want_a2l}");
    // Without it, no lines.
    let bare_pstack = callstack(&["pstack", &pid], &none).0;
    let bare_core = callstack(&["core", exe, core_s], &none).0;
    let bare_a2l = a2l(&[], &none);
    assert!(!bare_pstack.contains("remote_threads.c:"), "{bare_pstack}");
    assert!(!bare_a2l.contains("remote_threads.c:"), "{bare_a2l}");
    // A trace of the program, whose file is not at the recorded path:
    // found by build-id in the local debug dir; through the server, the
    // object (`/executable`) and its debug file.
    let gone = dir.join("gone.trace");
    trace_file(&sp, "/gone/from/this/machine/prog", &gone);
    let want_sym = callstack(&["symbolize", "--debug-dir", local, s(&gone)], &none).0;
    assert!(want_sym.contains("remote_threads.c:"), "{want_sym}");
    let bare_sym = callstack(&["symbolize", s(&gone)], &none).0;
    assert!(!bare_sym.contains("remote_threads.c:"), "{bare_sym}");

    // Through the server, then again from the cache.
    for round in 0..2 {
        let before = server.file_requests();
        let (got, err) = callstack(&["pstack", &pid], &served);
        assert_eq!(got, want_pstack, "pstack, round {round}: {err}");
        let (got, err) = callstack(&["core", exe, core_s], &served);
        assert_eq!(got, want_core, "core, round {round}: {err}");
        assert_eq!(a2l(&[], &served), want_a2l, "addr2line, round {round}");
        let (got, err) = callstack(&["symbolize", s(&gone)], &served);
        assert_eq!(got, want_sym, "symbolize, round {round}: {err}");
        let asked = server.file_requests() - before;
        if round == 0 {
            assert!(asked >= 1, "nothing asked of the server");
        } else {
            assert_eq!(asked, 0, "the second round was not served by the cache");
        }
    }
    let hex_dir = std::fs::read_dir(&cache).unwrap().flatten().find(|e| {
        e.path()
            .join("debuginfo")
            .metadata()
            .is_ok_and(|m| m.len() > 0)
    });
    assert!(hex_dir.is_some(), "no <cache>/<build-id>/debuginfo");

    // `--no-debuginfod` and an empty DEBUGINFOD_URLS turn it off.
    let before_off = server.file_requests();
    let fresh = Env {
        urls: Some(server.url()),
        cache: dir.join("cache-off"),
    };
    assert_eq!(
        callstack(&["core", "--no-debuginfod", exe, core_s], &fresh).0,
        bare_core
    );
    let empty = Env {
        urls: Some(String::new()),
        cache: dir.join("cache-off"),
    };
    assert_eq!(callstack(&["core", exe, core_s], &empty).0, bare_core);
    assert_eq!(server.file_requests(), before_off, "asked while turned off");
    assert!(
        !dir.join("cache-off").exists(),
        "a disabled client wrote a cache"
    );

    // The server down: as without debuginfod, and one warning line.
    let url = server.url();
    drop(server);
    let down = Env {
        urls: Some(url.clone()),
        cache: dir.join("cache-down"),
    };
    for (args, want) in [
        (vec!["pstack", pid.as_str()], &bare_pstack),
        (vec!["core", exe, core_s], &bare_core),
    ] {
        let (got, err) = callstack(&args, &down);
        assert_eq!(&got, want, "{args:?} with the server down: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.contains("debuginfod")).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(
            lines[0].contains(&url) && lines[0].contains("refused"),
            "{err}"
        );
    }
    // gdb reads what we cached: the same layout, one cache (the server
    // is down, so nothing else could give it the lines).
    let o = Command::new("gdb")
        .args(["-nx", "-batch", "-iex", "set debuginfod enabled on"])
        .args(["-ex", "info line block_here"])
        .arg(exe)
        .env("DEBUGINFOD_URLS", &url)
        .env("DEBUGINFOD_CACHE_PATH", &cache)
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("Line ") && text.contains("remote_threads.c"),
        "gdb did not find our cache's debug file: {text}"
    );
    let mut args = vec!["addr2line", "-f", "-e", exe];
    args.extend(sp.addrs.iter().map(String::as_str));
    let (got, err) = callstack(&args, &down);
    assert_eq!(got, bare_a2l);
    assert_eq!(
        err.lines().filter(|l| l.contains("debuginfod")).count(),
        1,
        "{err}"
    );
    fx.finish();
}

/// The frames of each thread of `callstack core --json`: (function,
/// file, line) from the outermost module's point of view.
fn json_frames(text: &str) -> Vec<Vec<(String, String, u64)>> {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    v["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    (
                        f["function"].as_str().unwrap_or("??").to_string(),
                        f["file"].as_str().unwrap_or("").to_string(),
                        f["line"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .collect()
}

/// A core whose program is gone from the machine: the executable and its
/// debug file come from the server (`/buildid/<id>/executable`), and the
/// frames are those of the program present with its debug file.
#[test]
fn core_of_a_program_whose_file_is_gone() {
    if rerun_in_netns("core_of_a_program_whose_file_is_gone") {
        return;
    }
    let (dir, sp) = split("gone");
    let server = Server::start(&sp.srv, &dir.join("db.sqlite"), 1, 1);
    let gone_dir = dir.join("gone");
    std::fs::create_dir_all(&gone_dir).unwrap();
    let gone = gone_dir.join("prog");
    std::fs::copy(&sp.exe, &gone).unwrap();
    let fx = Fixture::start(&gone);
    let core = gcore(fx.pid, &dir);
    fx.finish();
    let none = Env {
        urls: None,
        cache: dir.join("cache-unused"),
    };
    let want = callstack(
        &["core", "--json", "--debug-dir", s(&sp.local), s(&core)],
        &none,
    )
    .0;
    std::fs::remove_file(&gone).unwrap();
    let (without, err) = callstack(&["core", "--json", s(&core)], &none);
    assert!(err.contains("not found"), "{err}");
    let served = Env {
        urls: Some(server.url()),
        cache: dir.join("cache"),
    };
    let _ = std::fs::remove_dir_all(&served.cache);
    let (got, err) = callstack(&["core", "--json", s(&core)], &served);
    assert!(!err.contains("not found"), "{err}");
    let want = json_frames(&want);
    assert!(
        want.iter()
            .flatten()
            .any(|f| f.1.ends_with("remote_threads.c")),
        "{want:?}"
    );
    assert_eq!(json_frames(&got), want, "{err}");
    assert_ne!(json_frames(&without), want);
}
