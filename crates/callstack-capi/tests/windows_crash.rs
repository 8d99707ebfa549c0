//! Crash reports and minidumps on Windows x86-64: `tests/fixtures/c/
//! win_crash.c`, built by mingw-w64 at -O0, -O2 with frame pointers and -O2
//! without (`-fomit-frame-pointer`), linked to the `libcallstack.a` built
//! for `x86_64-pc-windows-gnu`, run under wine. It installs the crash
//! handler with a minidump directory and crashes at the end of
//!
//!   main -> alpha -> beta -> crash   (a call through a null pointer, an
//!                                     integer division by zero, `ud2`,
//!                                     `abort()`)
//!   main -> alpha -> beta -> recurse -> recurse ...   (a stack overflow)
//!
//! For each crash:
//! - the process's exit status is the exception's code (0xc0000005, ...;
//!   3 for `abort`, as the C runtime exits), read by the fixture's parent
//!   mode with `GetExitCodeProcess` (wine hands Linux only its low byte);
//! - the raw part says the exception in words, and the symbolized part is
//!   exactly the designed chain, each frame's function, file and line, then
//!   the C runtime's start-up (`__tmainCRTStartup`, `mainCRTStartup`) and
//!   the thread's first frames in kernel32 and ntdll;
//! - a minidump was written, and `minidump-stackwalk --use-local-debuginfo`
//!   unwinds its crashing thread to the same chain, function and line for
//!   each frame (it unwinds the PE by its `.pdata` and names it from its
//!   DWARF: it finds the executable by the path in the dump's module list,
//!   the wine path `Z:\...`, which the test makes a relative file name in
//!   the directory it runs minidump-stackwalk in);
//! - the stack overflow is reported from the handler thread: the first 255
//!   frames are `recurse` at its recursive call.
//!
//! And a program that handles its own exceptions (a `RaiseException` and
//! an access violation, taken by its own vectored handler) gets no report
//! and exits 0.
//!
//! Run by `scripts/test-windows.sh` (ignored otherwise).
use std::path::{Path, PathBuf};
use std::process::Command;

use testsupport::{c_fixtures, mingw_build_with_callstack, scratch_dir, windows_stage_path};

/// The three builds.
const BUILDS: &[(&str, &str)] = &[
    ("O0", "-O0"),
    ("O2fp", "-O2 -fno-omit-frame-pointer"),
    ("O2nofp", "-O2 -fomit-frame-pointer"),
];

fn build(tag: &str, flags: &str) -> PathBuf {
    let out = scratch_dir("windows_crash").join(format!("win_crash-{tag}.exe"));
    let mut f: Vec<&str> = flags.split_whitespace().collect();
    // An RSDS debug directory: the minidump's CodeView record.
    f.push("-Wl,--build-id");
    mingw_build_with_callstack("win_crash.c", &f, &out);
    out
}

/// The wine path of a Linux path (wine's `Z:` drive is `/`).
fn wine_path(p: &Path) -> String {
    format!("Z:{}", p.display()).replace('/', "\\")
}

/// The Linux path of a wine `Z:` path.
fn linux_path(p: &str) -> PathBuf {
    PathBuf::from(p.trim_start_matches("Z:").replace('\\', "/"))
}

/// Runs `exe run MODE DIR [REPORT]` under wine: (stdout, stderr).
fn run(exe: &Path, mode: &str, dir: &Path, report: Option<&Path>) -> (String, String) {
    let o = Command::new(windows_stage_path("CALLSTACK_WINE"))
        .arg(exe)
        .args(["run", mode])
        .arg(wine_path(dir))
        .args(report.map(wine_path))
        .env("WINEDEBUG", "-all")
        // No winedbg after the crash (wine's "starting debugger..."): the
        // process ends at once.
        .env("WINEDLLOVERRIDES", "winedbg.exe=d")
        .output()
        .expect("run wine");
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).replace('\r', ""),
        String::from_utf8_lossy(&o.stderr).replace('\r', ""),
    );
    assert!(o.status.success(), "{mode}: {}\n{out}\n{err}", o.status);
    (out, err)
}

fn line_of(after: &str, needle: &str) -> u32 {
    testsupport::line_of(&c_fixtures().join("win_crash.c"), after, needle)
}

/// A frame: function, file name, line.
type Frame = (String, String, u32);

/// The frames of the symbolized part: `  #N 0xADDR in FUNC at FILE:LINE:COL`
/// (`??` and frames without a line as `("??", "", 0)`).
fn symbolized(err: &str) -> Vec<Frame> {
    let start = err
        .find("*** callstack: crash report (symbolized) ***")
        .unwrap_or_else(|| panic!("no symbolized part:\n{err}"));
    err[start..]
        .lines()
        .take_while(|l| !l.starts_with("*** end of symbolized report"))
        .filter_map(|l| l.strip_prefix("  #"))
        .map(|l| {
            let rest = l.split_once(" in ").map_or("??", |(_, r)| r);
            match rest.split_once(" at ") {
                Some((f, loc)) => {
                    let mut parts = loc.rsplitn(3, ':');
                    let _col = parts.next();
                    let line = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                    let file = parts.next().unwrap_or("");
                    let file = file.rsplit(['/', '\\']).next().unwrap_or("").to_string();
                    (f.to_string(), file, line)
                }
                None => (
                    rest.split(' ').next().unwrap_or("??").to_string(),
                    String::new(),
                    0,
                ),
            }
        })
        .collect()
}

/// `minidump-stackwalk --json --use-local-debuginfo` on `dump`: the crashing
/// thread's frames, and how each was found.
fn stackwalk(dump: &Path, exe: &Path) -> Vec<(Frame, String)> {
    // The dump names its modules by their wine paths (`Z:\...` for the
    // executable, `C:\windows\system32\...` for wine's DLLs, which are PE
    // files in the prefix): each made a relative file name here, where
    // minidump-stackwalk runs, linked to the file.
    let dir = scratch_dir("windows_crash_walk").join(dump.file_stem().unwrap());
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = PathBuf::from(std::env::var_os("WINEPREFIX").expect("WINEPREFIX"));
    let md = minidump::Minidump::read_path(dump).expect("read the minidump");
    let modules: minidump::MinidumpModuleList = md.get_stream().expect("a module list");
    use minidump::Module as _;
    // The executable's CodeView record (`-Wl,--build-id` writes an RSDS
    // debug directory): its debug id, which symbol servers index.
    let main = modules.main_module().expect("a main module");
    assert!(
        main.code_file()
            .ends_with(&*exe.file_name().unwrap().to_string_lossy())
            && main.debug_identifier().is_some_and(|id| !id.is_nil()),
        "{}: {main:?}",
        dump.display()
    );
    for m in modules.iter() {
        let name = m.code_file();
        let file = match name.get(..3) {
            Some("Z:\\") => linux_path(&name),
            Some(d) if d.eq_ignore_ascii_case("C:\\") => {
                prefix.join("drive_c").join(name[3..].replace('\\', "/"))
            }
            _ => continue,
        };
        let link = dir.join(&*name);
        let _ = std::fs::remove_file(&link);
        if file.exists() {
            std::os::unix::fs::symlink(&file, &link).unwrap();
        }
    }
    let text = testsupport::stackwalk_json_text(dump, Some(&dir));
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    v["crashing_thread"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let file = f["file"]
                .as_str()
                .unwrap_or("")
                .rsplit(['/', '\\'])
                .next()
                .unwrap_or("")
                .to_string();
            (
                (
                    f["function"].as_str().unwrap_or("??").to_string(),
                    file,
                    f["line"].as_u64().unwrap_or(0) as u32,
                ),
                f["trust"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn own(f: &str, line: u32) -> Frame {
    (f.to_string(), "win_crash.c".to_string(), line)
}

/// The designed chain under the crashing function: beta, alpha, main.
fn chain_below(crash_line: u32) -> Vec<Frame> {
    vec![
        own("crash", crash_line),
        own("beta", line_of("NOINLINE void beta(void)", "crash();")),
        own("alpha", line_of("NOINLINE void alpha(void)", "beta();")),
        own("main", line_of("int main(int", "alpha();")),
    ]
}

/// One crash: the exit status, the report, the chain, the minidump.
fn crash(exe: &Path, mode: &str, status: &str, words: &str, crash_line: u32) {
    let dir = scratch_dir("windows_crash_dumps").join(format!(
        "{}-{mode}",
        exe.file_stem().unwrap().to_string_lossy()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    // A report file too, for one of the crashes.
    let report = (mode == "div0").then(|| dir.with_extension("txt"));
    if let Some(r) = &report {
        let _ = std::fs::remove_file(r);
    }
    let (out, err) = run(exe, mode, &dir, report.as_deref());
    let label = format!("{} {mode}", exe.display());
    if let Some(r) = &report {
        // The raw part, then the symbolized one (the helper appends it).
        let text = std::fs::read_to_string(r).unwrap_or_else(|e| panic!("{}: {e}", r.display()));
        let raw = text.find("*** callstack: crash report (raw) ***");
        let sym = text.find("*** callstack: crash report (symbolized) ***");
        assert!(
            matches!((raw, sym), (Some(a), Some(b)) if a < b) && text.contains(words),
            "{label}: report file:\n{text}"
        );
    }
    assert!(
        out.contains(&format!("exit {status}\n")),
        "{label}: {out}\n{err}"
    );
    assert!(
        err.contains("*** callstack: crash report (raw) ***"),
        "{label}:\n{err}"
    );
    assert!(err.contains(words), "{label}: no {words:?} in\n{err}");
    let frames = symbolized(&err);
    let want = chain_below(crash_line);
    // The designed chain, after what stands above the crashing function:
    // nothing but the pc 0 of a call through a null pointer, or the C
    // runtime's abort machinery (msvcrt's raise and abort; our SIGABRT
    // handler's own frame is left out).
    let at = frames
        .iter()
        .position(|f| f.0 == "crash")
        .unwrap_or_else(|| panic!("{label}: no crash frame in {frames:#?}\n{err}"));
    match mode {
        "null" => assert_eq!(at, 1, "{label}: {frames:#?}"),
        "abort" => assert!(
            at == 2 && frames[0].0 == "raise" && frames[1].0 == "abort",
            "{label}: {frames:#?}"
        ),
        _ => assert_eq!(at, 0, "{label}: {frames:#?}"),
    }
    assert_eq!(frames[at..at + 4], want[..], "{label}:\n{err}");
    let rest: Vec<&str> = frames[at + 4..].iter().map(|f| f.0.as_str()).collect();
    assert_eq!(
        rest,
        [
            "__tmainCRTStartup",
            "mainCRTStartup",
            "BaseThreadInitThunk",
            "RtlUserThreadStart"
        ],
        "{label}:\n{err}"
    );

    // The minidump, and minidump-stackwalk's walk of it.
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("minidump: "))
        .unwrap_or_else(|| panic!("{label}: no minidump line:\n{err}"));
    let path = linux_path(line.split(" (").next().unwrap());
    assert!(path.starts_with(&dir), "{label}: {line}");
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let stem = exe.file_stem().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("{stem}-")) && name.ends_with(".dmp"),
        "{label}: {name}"
    );
    let walked = stackwalk(&path, exe);
    // minidump-stackwalk names the noreturn path gcc splits off at -O2
    // (`crash.cold`, where `abort()` is) by its COFF symbol: the function
    // is `crash`.
    let names: Vec<Frame> = walked
        .iter()
        .map(|w| {
            let (f, file, line) = w.0.clone();
            match f.strip_suffix(".cold") {
                Some(f) => (f.to_string(), file, line),
                _ => (f, file, line),
            }
        })
        .collect();
    match names.iter().position(|f| f.0 == "crash") {
        Some(wat) => {
            assert_eq!(names[wat..wat + 4], want[..], "{label}: {walked:#?}");
            // Frame for frame, the report's chain.
            assert_eq!(
                names[wat..wat + 4],
                frames[at..at + 4],
                "{label}: {walked:#?}"
            );
        }
        None => {
            // A call through a null pointer with frame pointers:
            // minidump-stackwalk unwinds pc 0 (in no module, so no CFI) by
            // the frame pointer, which is still `crash`'s: its first
            // caller is `beta`, and `crash` (whose return address is at
            // the stack pointer, where our unwinder takes it) is skipped.
            assert!(mode == "null" && flags_have_fp(exe), "{label}: {walked:#?}");
            assert_eq!(names[0].0, "??", "{label}: {walked:#?}");
            assert_eq!(names[1..4], want[1..], "{label}: {walked:#?}");
        }
    }
}

/// Whether `exe` is one of the builds with frame pointers.
fn flags_have_fp(exe: &Path) -> bool {
    let name = exe.file_stem().unwrap().to_string_lossy();
    !name.ends_with("nofp")
}

fn crashes(tag: &str, flags: &str) {
    let exe = build(tag, flags);
    let cases: &[(&str, &str, &str, u32)] = &[
        (
            "null",
            "0xc0000005",
            "exception: EXCEPTION_ACCESS_VIOLATION: execution of address 0x0 (code 0xc0000005",
            line_of("NOINLINE void crash(void)", "null_fn();"),
        ),
        (
            "div0",
            "0xc0000094",
            "exception: EXCEPTION_INT_DIVIDE_BY_ZERO: integer division by zero (code 0xc0000094",
            line_of("NOINLINE void crash(void)", "one / zero"),
        ),
        (
            "ill",
            "0xc000001d",
            "exception: EXCEPTION_ILLEGAL_INSTRUCTION: illegal instruction (code 0xc000001d",
            line_of("NOINLINE void crash(void)", "ud2"),
        ),
        (
            "abort",
            "0x3",
            "signal: SIGABRT: abort() called",
            line_of("NOINLINE void crash(void)", "abort();"),
        ),
    ];
    std::thread::scope(|s| {
        for &(mode, status, words, line) in cases {
            let exe = &exe;
            s.spawn(move || crash(exe, mode, status, words, line));
        }
        s.spawn(|| overflow(&exe));
        s.spawn(|| handled(&exe));
    });
}

/// A stack overflow: reported from the handler thread, the process ended
/// with `EXCEPTION_STACK_OVERFLOW`, and a minidump.
fn overflow(exe: &Path) {
    let dir = scratch_dir("windows_crash_dumps").join(format!(
        "{}-overflow",
        exe.file_stem().unwrap().to_string_lossy()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let (out, err) = run(exe, "overflow", &dir, None);
    let label = format!("{} overflow", exe.display());
    assert!(out.contains("exit 0xc00000fd\n"), "{label}: {out}\n{err}");
    assert!(
        err.contains("exception: EXCEPTION_STACK_OVERFLOW: stack overflow (code 0xc00000fd"),
        "{label}:\n{err}"
    );
    assert!(err.contains("frames: 256\n"), "{label}:\n{err}");
    let frames = symbolized(&err);
    let call = line_of("NOINLINE int recurse(int n)", "recurse(n + 1)");
    assert_eq!(frames.len(), 256, "{label}:\n{err}");
    assert_eq!(frames[0].0, "recurse", "{label}:\n{err}");
    for f in &frames[1..] {
        assert_eq!(*f, own("recurse", call), "{label}:\n{err}");
    }
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("minidump: "))
        .unwrap_or_else(|| panic!("{label}: no minidump line:\n{err}"));
    let walked = stackwalk(&linux_path(line.split(" (").next().unwrap()), exe);
    assert!(walked.len() > 100, "{label}: {walked:#?}");
    assert_eq!(walked[0].0 .0, "recurse", "{label}: {walked:#?}");
    for w in &walked[1..100] {
        assert_eq!(w.0, own("recurse", call), "{label}: {walked:#?}");
    }
}

/// Exceptions the program handles itself: no report, exit 0.
fn handled(exe: &Path) {
    let dir = scratch_dir("windows_crash_dumps").join("handled");
    let (out, err) = run(exe, "handled", &dir, None);
    assert!(out.contains("exit 0\n"), "{out}\n{err}");
    assert!(!err.contains("callstack"), "{err}");
    assert!(!dir.exists() || std::fs::read_dir(&dir).unwrap().next().is_none());
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn crash_reports_and_minidumps_at_o0() {
    crashes(BUILDS[0].0, BUILDS[0].1);
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn crash_reports_and_minidumps_at_o2_with_frame_pointers() {
    crashes(BUILDS[1].0, BUILDS[1].1);
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn crash_reports_and_minidumps_at_o2_without_frame_pointers() {
    crashes(BUILDS[2].0, BUILDS[2].1);
}
