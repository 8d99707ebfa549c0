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
