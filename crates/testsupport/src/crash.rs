//! Helpers of the crash-report tests: run a child that crashes (with a
//! deadline, so a hang fails the test instead of blocking it) and read its
//! two-part report.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a crashing child did.
#[derive(Debug)]
pub struct Crash {
    /// The signal that killed it (`WTERMSIG`), if it died by a signal.
    pub signal: Option<i32>,
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// Its standard error.
    pub stderr: String,
    /// Its standard output.
    pub stdout: String,
    /// Wall time from start to end.
    pub elapsed: Duration,
}

/// Runs `cmd` with piped output, killing it after `deadline`. Panics if it
/// had to be killed (a hang).
pub fn run_crashing(mut cmd: Command, deadline: Duration) -> Crash {
    use std::os::unix::process::ExitStatusExt;
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the crash fixture");
    let mut err_pipe = child.stderr.take().unwrap();
    let mut out_pipe = child.stdout.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err_pipe.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out_pipe.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not end within {deadline:?} (hang)");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = start.elapsed();
    // The helper process may keep stderr open a moment longer than its
    // parent; the readers end when every writer is gone.
    Crash {
        signal: status.signal(),
        code: status.code(),
        stderr: err_reader.join().unwrap(),
        stdout: out_reader.join().unwrap(),
        elapsed,
    }
}

/// The text between `begin` and `end` lines (both excluded), first match.
pub fn section<'a>(text: &'a str, begin: &str, end_prefix: &str) -> Option<&'a str> {
    let b = text.find(begin)? + begin.len();
    let rest = &text[b..];
    let e = rest.find(end_prefix)?;
    Some(&rest[..e])
}

/// The raw part of the first report in `text`.
pub fn raw_part(text: &str) -> Option<&str> {
    section(
        text,
        "*** callstack: crash report (raw) ***\n",
        "*** end of raw report ***",
    )
}

/// The symbolized part of the first report in `text`.
pub fn symbolized_part(text: &str) -> Option<&str> {
    section(
        text,
        "*** callstack: crash report (symbolized) ***\n",
        "*** end of symbolized report",
    )
}

/// One frame line of a symbolized report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymLine {
    /// The frame index.
    pub index: usize,
    /// The function name (`??` if unknown).
    pub function: String,
    /// Whether the line is an inlined frame.
    pub inlined: bool,
    /// `file:line[:column]`, if given.
    pub location: Option<String>,
}

/// Parses the frame lines `  #N 0xADDR in FUNCTION [(inlined)] [at FILE:LINE:COL | (...)]`.
pub fn symbolized_frames(part: &str) -> Vec<SymLine> {
    let mut out = Vec::new();
    for l in part.lines() {
        let Some(rest) = l.trim_start().strip_prefix('#') else {
            continue;
        };
        let Some((idx, rest)) = rest.split_once(' ') else {
            continue;
        };
        let Some((_, rest)) = rest.split_once(" in ") else {
            continue;
        };
        let (head, location) = match rest.rsplit_once(" at ") {
            Some((h, loc)) => (h, Some(loc.to_string())),
            None => (rest.split(" (").next().unwrap_or(rest), None),
        };
        let inlined = head.ends_with(" (inlined)");
        let function = head.trim_end_matches(" (inlined)").to_string();
        out.push(SymLine {
            index: idx.parse().unwrap_or(usize::MAX),
            function,
            inlined,
            location,
        });
    }
    out
}

/// Milliseconds from the fault to the end of the symbolized report, as the
/// helper printed them.
pub fn fault_to_symbolized_ms(text: &str) -> Option<f64> {
    let i = text.find("*** end of symbolized report (")? + "*** end of symbolized report (".len();
    text[i..].split(' ').next()?.parse().ok()
}

/// The name of a signal number, for messages.
pub fn signal_label(sig: Option<i32>) -> String {
    match sig {
        Some(6) => "SIGABRT".into(),
        Some(11) => "SIGSEGV".into(),
        Some(8) => "SIGFPE".into(),
        Some(4) => "SIGILL".into(),
        Some(5) => "SIGTRAP".into(),
        Some(7) => "SIGBUS".into(),
        Some(s) => format!("signal {s}"),
        None => "no signal".into(),
    }
}

/// Asserts that the symbolized frames whose function passes `keep`, in
/// order, are exactly `expected`, each with a `file:line` in a file whose
/// name ends with `file_suffix`.
pub fn assert_chain(
    frames: &[SymLine],
    keep: impl Fn(&str) -> bool,
    expected: &[&str],
    file_suffix: &str,
    whole: &str,
) {
    let got: Vec<&SymLine> = frames.iter().filter(|f| keep(&f.function)).collect();
    let names: Vec<&str> = got.iter().map(|f| f.function.as_str()).collect();
    assert_eq!(names, expected, "chain of names differs; report:\n{whole}");
    for f in got {
        let loc = f.location.as_deref().unwrap_or("");
        let file = loc.split(':').next().unwrap_or("");
        assert!(
            file.ends_with(file_suffix)
                && loc
                    .split(':')
                    .nth(1)
                    .is_some_and(|l| l.parse::<u32>().is_ok_and(|n| n > 0)),
            "frame {} ({}) has no {file_suffix}:line: {loc:?}; report:\n{whole}",
            f.index,
            f.function
        );
    }
}

/// The checks every crash scenario makes on a report: the raw part names
/// the signal (`signal_line`), the symbolized part's frames that pass `keep`
/// are exactly `expected` with `file:line`s in `file_suffix` files
/// ([`assert_chain`]), the child died by `signal` (the previous disposition
/// ran), and symbolizing took under 10 s.
pub fn check_report(
    c: &Crash,
    signal: i32,
    signal_line: &str,
    keep: impl Fn(&str) -> bool,
    expected: &[&str],
    file_suffix: &str,
) {
    let raw = raw_part(&c.stderr).unwrap_or_else(|| panic!("no raw part:\n{}", c.stderr));
    assert!(
        raw.contains(signal_line),
        "signal line {signal_line:?} missing:\n{}",
        c.stderr
    );
    let sym =
        symbolized_part(&c.stderr).unwrap_or_else(|| panic!("no symbolized part:\n{}", c.stderr));
    assert_chain(
        &symbolized_frames(sym),
        keep,
        expected,
        file_suffix,
        &c.stderr,
    );
    assert_eq!(
        c.signal,
        Some(signal),
        "died by {}:\n{}",
        signal_label(c.signal),
        c.stderr
    );
    let ms = fault_to_symbolized_ms(&c.stderr).expect("timing line");
    assert!(ms < 10_000.0, "symbolizing took {ms} ms");
}

/// Whether `path` exists and is executable by someone.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// How long a crash fixture may take before it counts as hung.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// One crash fixture and the conventions of its reports, so that each test
/// case is the scenario and what it must show.
pub struct Suite {
    /// Tag of the log line each run prints (`crash_rust`).
    pub label: &'static str,
    /// The fixture executable (built on first use).
    pub exe: fn() -> std::path::PathBuf,
    /// Whether a symbolized function name is one of the fixture's own.
    pub ours: fn(&str) -> bool,
    /// What the fixture's own function names start with (`crash_fixture::`
    /// for Rust, empty for C).
    pub prefix: &'static str,
    /// The outer frames of every scenario that starts from `main`,
    /// outermost last, without `prefix`.
    pub main: &'static [&'static str],
    /// How each frame's `file:line` file name ends.
    pub file_suffix: &'static str,
    /// A text every raw part carries besides the signal line.
    pub raw_mark: &'static str,
}

impl Suite {
    /// Runs the fixture with `args` and `env` (and no helper named unless
    /// `env` names one), with the [`DEADLINE`]; logs the timing.
    pub fn run_exe(&self, exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Crash {
        let mut cmd = crate::target_command(exe);
        cmd.args(args);
        // No `callstack` binary sits next to the fixture: it symbolizes
        // itself (re-executed) unless a test names a helper.
        cmd.env_remove("CALLSTACK_CRASH_HELPER");
        if crate::cross_target().is_some() {
            // Under qemu-user the fixture cannot re-execute itself (the
            // host kernel refuses a guest executable): the host's
            // `callstack` binary symbolizes its report instead, reading the
            // guest's files named in the raw part.
            let cli = &crate::release_artifacts().cli;
            cmd.env("CALLSTACK_CRASH_HELPER", cli);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let c = run_crashing(cmd, DEADLINE);
        eprintln!(
            "[{} {}] died by {}, fault -> symbolized report: {} ms, child wall time {:?}",
            self.label,
            args.join(" "),
            signal_label(c.signal),
            fault_to_symbolized_ms(&c.stderr).map_or("n/a".into(), |m| format!("{m:.1}")),
            c.elapsed
        );
        c
    }

    /// Runs the fixture's `scenario` with `env`.
    pub fn run(&self, scenario: &str, env: &[(&str, &str)]) -> Crash {
        self.run_exe(&(self.exe)(), &[scenario], env)
    }

    /// `own` followed by [`Suite::main`], each with [`Suite::prefix`].
    pub fn from_main(&self, own: &[&str]) -> Vec<String> {
        own.iter()
            .chain(self.main)
            .map(|n| format!("{}{n}", self.prefix))
            .collect()
    }

    /// [`check_report`] with the chain `own` + [`Suite::main`], and the
    /// raw part carries [`Suite::raw_mark`].
    pub fn check(&self, c: &Crash, signal: i32, signal_line: &str, own: &[&str]) {
        let names = self.from_main(own);
        self.check_names(c, signal, signal_line, &names);
    }

    /// [`check_report`] with exactly the chain `names` (prefixed already),
    /// and the raw part carries [`Suite::raw_mark`].
    pub fn check_names(&self, c: &Crash, signal: i32, signal_line: &str, names: &[String]) {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        check_report(c, signal, signal_line, self.ours, &names, self.file_suffix);
        let raw = c.raw();
        assert!(raw.contains(self.raw_mark), "{}", c.stderr);
    }

    /// The symbolized frames of our own functions.
    pub fn own_frames(&self, c: &Crash) -> Vec<SymLine> {
        c.frames()
            .into_iter()
            .filter(|f| (self.ours)(&f.function))
            .collect()
    }

    /// A stack overflow: reported as such on SIGSEGV, at least 100 frames
    /// of ours all in `recurse` (unprefixed), and the child then died by
    /// `died_by`. Returns all the symbolized frames.
    pub fn check_overflow(&self, c: &Crash, recurse: &str, died_by: i32) -> Vec<SymLine> {
        let raw = c.raw();
        // SEGV_MAPERR below the main stack, SEGV_ACCERR on a thread's
        // PROT_NONE guard page.
        assert!(raw.contains("signal: SIGSEGV: "), "{}", c.stderr);
        assert!(
            raw.contains("(next to the stack pointer: stack overflow)"),
            "{}",
            c.stderr
        );
        let own = self.own_frames(c);
        assert!(own.len() >= 100, "{}", c.stderr);
        let recurse = format!("{}{recurse}", self.prefix);
        assert!(own.iter().all(|f| f.function == recurse), "{}", c.stderr);
        assert_eq!(c.signal, Some(died_by), "{}", c.stderr);
        c.frames()
    }

    /// The `prev-handler` scenario: the null dereference is reported (its
    /// chain from `null_deref`, unprefixed), then the fixture's own
    /// handler prints `marker` after the report.
    pub fn check_previous_handler(&self, c: &Crash, null_deref: &str, marker: &str) {
        self.check(
            c,
            libc::SIGSEGV,
            "signal: SIGSEGV: address not mapped, fault address 0x0",
            &[null_deref],
        );
        let report_end = c.stderr.find("*** end of symbolized report").unwrap();
        let own = c.stderr.find(marker).expect("own handler ran");
        assert!(own > report_end, "{}", c.stderr);
    }

    /// A crash inside glibc's `malloc` with its lock held (`own` are our
    /// frames above `main`'s): the fault is in libc, the chain is right,
    /// and glibc's own frames (named through libc6-dbg, which
    /// scripts/install-test-deps.sh installs) come first.
    pub fn check_inside_malloc(&self, c: &Crash, own: &[&str]) {
        let first = c.raw().lines().find(|l| l.starts_with("  #0 pc ")).unwrap();
        assert!(first.contains("/libc.so"), "{}", c.stderr);
        self.check(
            c,
            libc::SIGSEGV,
            "signal: SIGSEGV: address not mapped, fault address 0x20",
            own,
        );
        if crate::cross_target().is_some() {
            // Under qemu-user the helper is the host's `callstack`, which
            // reads the host's /lib/libc.so.6 (another build, refused by
            // build-id), not the guest's: glibc's frames stay unnamed
            // there. The chain above and the fault in libc are checked.
            return;
        }
        let frames = c.frames();
        assert_eq!(frames[0].function, "_int_malloc", "{}", c.stderr);
        assert!(frames[1].function.contains("malloc"), "{}", c.stderr);
    }

    /// The `null` scenario with a helper that cannot be started: the raw
    /// part is out, no symbolized part, the failure is said, and the child
    /// still dies by SIGSEGV. Returns the crash for more checks.
    pub fn check_missing_helper(&self) -> Crash {
        let c = self.run("null", &[("CALLSTACK_CRASH_HELPER", "/nonexistent/helper")]);
        assert!(c.raw().contains("SIGSEGV: address not mapped"));
        assert!(symbolized_part(&c.stderr).is_none());
        assert!(
            c.stderr.contains("failed with exit status 127"),
            "{}",
            c.stderr
        );
        assert_eq!(c.signal, Some(libc::SIGSEGV));
        c
    }

    /// The `null` scenario with a helper that hangs and a 500 ms timeout:
    /// the raw part is out, the helper is killed, and the child dies by
    /// SIGSEGV within 10 s.
    pub fn check_hanging_helper(&self) {
        let dir = crate::scratch_dir(&format!("{}-hang", self.label));
        let helper = dir.join("hang.sh");
        std::fs::write(&helper, "#!/bin/sh\nexec sleep 60\n").unwrap();
        let _ = Command::new("chmod").arg("+x").arg(&helper).status();
        let c = self.run(
            "null",
            &[
                ("CALLSTACK_CRASH_HELPER", helper.to_str().unwrap()),
                ("CALLSTACK_CRASH_TIMEOUT_MS", "500"),
            ],
        );
        assert!(
            raw_part(&c.stderr).is_some_and(|r| r.contains("SIGSEGV")),
            "{}",
            c.stderr
        );
        assert!(
            c.stderr.contains("timed out and was killed"),
            "{}",
            c.stderr
        );
        assert_eq!(c.signal, Some(libc::SIGSEGV));
        assert!(c.elapsed < Duration::from_secs(10), "{:?}", c.elapsed);
    }

    /// The `null` scenario with the `callstack` binary as the helper.
    pub fn check_callstack_binary_as_helper(&self, null_deref: &str) {
        let cli = &crate::release_artifacts().cli;
        let c = self.run("null", &[("CALLSTACK_CRASH_HELPER", cli.to_str().unwrap())]);
        self.check(
            &c,
            libc::SIGSEGV,
            "signal: SIGSEGV: address not mapped, fault address 0x0",
            &[null_deref],
        );
        assert!(
            c.stderr.contains("symbolizing helper (user helper"),
            "{}",
            c.stderr
        );
    }

    /// Checks a report file written by a `null` crash: both parts, the raw
    /// one naming SIGSEGV. Returns the file's text.
    pub fn check_report_file(&self, c: &Crash, file: &Path) -> String {
        assert_eq!(c.signal, Some(libc::SIGSEGV));
        let text = std::fs::read_to_string(file).unwrap();
        assert!(
            raw_part(&text).is_some_and(|r| r.contains("SIGSEGV")),
            "{text}"
        );
        assert!(symbolized_part(&text).is_some(), "{text}");
        text
    }
}

impl Crash {
    /// The raw part of the report on stderr; panics (showing stderr) if
    /// there is none.
    pub fn raw(&self) -> &str {
        raw_part(&self.stderr).unwrap_or_else(|| panic!("no raw part:\n{}", self.stderr))
    }

    /// The symbolized part of the report on stderr; panics (showing
    /// stderr) if there is none.
    pub fn symbolized(&self) -> &str {
        symbolized_part(&self.stderr)
            .unwrap_or_else(|| panic!("no symbolized part:\n{}", self.stderr))
    }

    /// The frames of the symbolized part ([`Crash::symbolized`]).
    pub fn frames(&self) -> Vec<SymLine> {
        symbolized_frames(self.symbolized())
    }
}
