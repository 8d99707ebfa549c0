//! The symbolized part of a report: parses raw reports (the text the
//! handler wrote) and resolves every frame to functions, files and lines.
//! This runs in the helper process (or in the panic hook), never in a
//! crashed process.

use super::resolve::Resolver;
use super::{BEGIN_RAW, END_RAW};
use std::fmt::Write as _;
use std::path::PathBuf;

/// One frame line of a raw report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawFrame {
    /// Index in the report.
    pub index: usize,
    /// Whether the address is a return address (`ra`) rather than the
    /// interrupted pc (`pc`).
    pub is_return_address: bool,
    /// The runtime address.
    pub address: u64,
    /// Module path, offset in it (address minus load bias) and build-id,
    /// when the handler found the module.
    pub module: Option<(PathBuf, u64, Option<Vec<u8>>)>,
}

/// A parsed raw report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawReport {
    /// Header lines (`signal: ...`, `panic: ...`, `thread: ...`).
    pub header: Vec<String>,
    /// `time:` of the event, CLOCK_MONOTONIC nanoseconds.
    pub time_ns: Option<u64>,
    /// The frames, innermost first.
    pub frames: Vec<RawFrame>,
}

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

fn parse_bytes(hex: &str) -> Option<Vec<u8>> {
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Parses `#N pc|ra 0xADDR in PATH +0xOFF (build-id HEX)` (or `in ??`).
pub fn parse_frame_line(line: &str) -> Option<RawFrame> {
    let rest = line.trim_start().strip_prefix('#')?;
    let (index, rest) = rest.split_once(' ')?;
    let (kind, rest) = rest.split_once(' ')?;
    let (addr, rest) = rest.split_once(' ')?;
    let module = rest.strip_prefix("in ")?;
    let module = if module == "??" {
        None
    } else {
        let (module, build_id) = match module.rfind(" (build-id ") {
            Some(i) => (
                &module[..i],
                module[i + 11..].strip_suffix(')').and_then(parse_bytes),
            ),
            None => (module, None),
        };
        let i = module.rfind(" +0x")?;
        Some((
            PathBuf::from(&module[..i]),
            parse_hex(&module[i + 2..])?,
            build_id,
        ))
    };
    Some(RawFrame {
        index: index.parse().ok()?,
        is_return_address: match kind {
            "ra" => true,
            "pc" => false,
            _ => return None,
        },
        address: parse_hex(addr)?,
        module,
    })
}

/// Finds every raw report in `text` (a report file may hold several).
pub fn parse_raw_reports(text: &str) -> Vec<RawReport> {
    let mut out = Vec::new();
    let mut cur: Option<RawReport> = None;
    for line in text.lines() {
        if line == BEGIN_RAW.trim_end() {
            cur = Some(RawReport::default());
            continue;
        }
        let Some(r) = cur.as_mut() else { continue };
        if line == END_RAW.trim_end() {
            out.extend(cur.take());
        } else if let Some(t) = line.strip_prefix("time: ") {
            r.time_ns = t.split(' ').next().and_then(|t| t.parse().ok());
        } else if let Some(f) = parse_frame_line(line) {
            r.frames.push(f);
        } else if !line.starts_with("frames:") && !line.starts_with("  ") {
            r.header.push(line.to_string());
        }
    }
    out
}

/// Options of [`symbolize_report_with`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Style {
    /// Say how long after the event the symbolized report was finished.
    pub(crate) elapsed: bool,
    /// Drop leading frames of the panic machinery.
    pub(crate) trim_panic_frames: bool,
}

/// Symbolizes every raw report found in `raw` (the text a crash handler
/// wrote, to stderr or to its report file): function, file:line:column and
/// inlined frames for each frame.
pub fn symbolize_report(raw: &str) -> String {
    symbolize_report_with(raw, Style::default())
}

fn is_panic_machinery(name: &str) -> bool {
    name.starts_with("std::panicking")
        || name.starts_with("core::panicking")
        || name.starts_with("std::sys::backtrace")
        || name.starts_with("std::rt::begin_panic")
        || name.starts_with("callstack::")
        || name.contains("rust_begin_unwind")
        || (name.starts_with("<alloc::boxed::Box<") && name.contains("PanicHookInfo"))
}

pub(crate) fn symbolize_report_with(raw: &str, style: Style) -> String {
    let mut out = String::new();
    for r in parse_raw_reports(raw) {
        let mut res = Resolver::for_frames(&r.frames);
        // JIT code (in no module) is named from the process's jitdump files
        // and perf map, read once the first such frame comes, if there.
        let pid = r
            .header
            .iter()
            .find_map(|h| h.strip_prefix("process: ")?.trim().parse::<u32>().ok());
        let mut jit: Option<crate::symbolize::jit::JitSources> = None;
        out.push_str("*** callstack: crash report (symbolized) ***\n");
        for h in &r.header {
            if !h.starts_with("time:") && !h.starts_with("process:") {
                let _ = writeln!(out, "{h}");
            }
        }
        let mut lines: Vec<(usize, String)> = Vec::new();
        for f in &r.frames {
            let mut text = Vec::new();
            let Some((path, offset, _)) = &f.module else {
                // Its jitdump files (from its maps: the report is made
                // while the process is still there) and its perf map.
                let jit = jit.get_or_insert_with(|| {
                    pid.map(|pid| {
                        crate::symbolize::jit::JitSources::for_live_process(pid, &mut |_| {})
                    })
                    .unwrap_or_default()
                });
                // A return address is looked up at the call, one byte back.
                let lookup = if f.is_return_address {
                    f.address.wrapping_sub(1)
                } else {
                    f.address
                };
                let line = match jit.lookup(lookup) {
                    Some(j) => match (j.file, j.line) {
                        (Some(file), Some(line)) => format!(
                            "  #{} {:#018x} in {} at {file}:{line} (JIT)",
                            f.index, f.address, j.name
                        ),
                        _ => format!(
                            "  #{} {:#018x} in {} (JIT, perf map)",
                            f.index, f.address, j.name
                        ),
                    },
                    None => format!("  #{} {:#018x} in ??", f.index, f.address),
                };
                lines.push((f.index, line));
                continue;
            };
            let res = res.resolve(f);
            let base = path
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            for sf in &res.frames {
                let mut s = format!(
                    "  #{} {:#018x} in {}",
                    f.index,
                    f.address,
                    sf.function.as_deref().unwrap_or("??")
                );
                if sf.inlined {
                    s.push_str(" (inlined)");
                }
                match (&sf.file, sf.line) {
                    (Some(file), Some(line)) => {
                        let _ = write!(s, " at {file}:{line}");
                        if let Some(c) = sf.column {
                            let _ = write!(s, ":{c}");
                        }
                    }
                    _ => {
                        let _ = write!(s, " ({base} +{offset:#x})");
                    }
                }
                text.push((sf.function.clone(), s));
            }
            if res.frames.is_empty() {
                let why = if res.unreadable {
                    ", file unreadable"
                } else {
                    ""
                };
                text.push((
                    None,
                    format!(
                        "  #{} {:#018x} in ?? ({base} +{offset:#x}{why})",
                        f.index, f.address
                    ),
                ));
            }
            if res.build_id_mismatch {
                if let Some(last) = text.last_mut() {
                    last.1
                        .push_str(" [build-id differs from the file on disk: names may be wrong]");
                }
            }
            for (_, s) in text {
                lines.push((f.index, s));
            }
        }
        if style.trim_panic_frames {
            // Drop the leading frames of the panic machinery (our hook, the
            // std hook dispatch, `panic_fmt`): the report starts at the
            // function that panicked.
            let mut cut = 0;
            for (i, (_, s)) in lines.iter().enumerate() {
                let name = s.split_once(" in ").map(|(_, n)| n).unwrap_or("");
                if is_panic_machinery(name) {
                    cut = i + 1;
                } else if !name.starts_with("??") {
                    break;
                }
            }
            lines.drain(..cut);
        }
        for (_, s) in &lines {
            out.push_str(s);
            out.push('\n');
        }
        match (style.elapsed, r.time_ns) {
            (true, Some(t)) => {
                let now = super::monotonic_ns();
                let _ = writeln!(
                    out,
                    "*** end of symbolized report ({:.1} ms after the fault) ***",
                    now.saturating_sub(t) as f64 / 1e6
                );
            }
            _ => out.push_str("*** end of symbolized report ***\n"),
        }
    }
    out
}

/// The helper mode of a crashed process's helper: reads the raw report
/// and the crash context on standard input; writes the minidump first if
/// the context names a directory (see [`super::Options::minidump_dir`]);
/// then writes the symbolized report (with a `minidump: PATH` line) to
/// standard error and appends it to the file named by
/// `CALLSTACK_CRASH_REPORT` (if set). Returns the process exit status (0
/// when something was symbolized or a dump written).
pub fn run_helper() -> i32 {
    use std::io::{Read, Write};
    let mut raw = String::new();
    let mut bytes = Vec::new();
    if std::io::stdin().read_to_end(&mut bytes).is_err() {
        return 1;
    }
    raw.push_str(&String::from_utf8_lossy(&bytes));
    let context = super::context::parse_context(&raw);
    let event_ns = parse_raw_reports(&raw).last().and_then(|r| r.time_ns);
    let mut dumped = false;
    let dump_line = context.as_ref().and_then(|c| {
        let dir = c.minidump_dir.as_ref()?;
        let line = minidump_line(c, dir, event_ns);
        dumped = !line.starts_with("minidump: not written");
        Some(line)
    });
    let symbolize = context.as_ref().is_none_or(|c| c.symbolize);
    let mut text = if symbolize {
        symbolize_report_with(
            &raw,
            Style {
                elapsed: true,
                trim_panic_frames: false,
            },
        )
    } else {
        String::new()
    };
    match (&dump_line, text.is_empty()) {
        (Some(line), false) => text = with_header_line(&text, line),
        (Some(line), true) => text = format!("*** callstack: {line} ***\n"),
        (None, _) => {}
    }
    if text.is_empty() {
        eprintln!("callstack crash-report: no raw report on standard input");
        return 2;
    }
    let _ = std::io::stderr().write_all(text.as_bytes());
    if let Some(path) = std::env::var_os(super::env::REPORT_ENV) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(text.as_bytes());
        }
    }
    if symbolize || dumped {
        0
    } else {
        1
    }
}

/// Writes the minidump and says how it went, as the report's line:
/// `minidump: PATH (N threads, M modules, B bytes, T ms after the fault)`
/// or `minidump: not written: WHY`.
#[cfg(any(all(feature = "remote", target_os = "linux"), windows))]
fn minidump_line(
    c: &super::context::CrashContext,
    dir: &std::path::Path,
    event: Option<u64>,
) -> String {
    // The writer of Windows' streams and contexts there, of Linux's elsewhere.
    #[cfg(not(windows))]
    use super::dump::write;
    #[cfg(windows)]
    use super::windows_dump::write;
    match write(c, dir) {
        Ok((path, st)) => {
            let mut s = format!(
                "minidump: {} ({} threads, {} modules, {} bytes",
                path.display(),
                st.threads,
                st.modules,
                st.bytes
            );
            if let Some(t) = event {
                let now = super::monotonic_ns();
                let _ = write!(
                    s,
                    ", {:.1} ms after the fault",
                    now.saturating_sub(t) as f64 / 1e6
                );
            }
            s.push(')');
            s
        }
        Err(e) => format!("minidump: not written: {e}"),
    }
}

#[cfg(not(any(all(feature = "remote", target_os = "linux"), windows)))]
fn minidump_line(_: &super::context::CrashContext, _: &std::path::Path, _: Option<u64>) -> String {
    "minidump: not written: callstack was built without the `remote` feature".to_string()
}

/// `text` (symbolized reports) with `line` added to the header of the last
/// report, before its first frame.
fn with_header_line(text: &str, line: &str) -> String {
    let start = text
        .rfind("*** callstack: crash report (symbolized) ***")
        .unwrap_or(0);
    let at = text[start..]
        .find("\n  #")
        .or_else(|| text[start..].find("\n*** end of symbolized report"))
        .map_or(text.len(), |i| start + i + 1);
    let mut out = String::with_capacity(text.len() + line.len() + 1);
    out.push_str(&text[..at]);
    out.push_str(line);
    out.push('\n');
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_frame_lines() {
        let f = parse_frame_line("  #2 ra 0x00005555deadbeef in /a b/exe +0x1234 (build-id 0aff)")
            .unwrap();
        assert_eq!(f.index, 2);
        assert!(f.is_return_address);
        assert_eq!(f.address, 0x5555deadbeef);
        assert_eq!(
            f.module,
            Some((PathBuf::from("/a b/exe"), 0x1234, Some(vec![0x0a, 0xff])))
        );
        let f = parse_frame_line("  #0 pc 0x0000000000000010 in ??").unwrap();
        assert_eq!(f.module, None);
        assert!(!f.is_return_address);
        assert!(parse_frame_line("  #0 xx 0x10 in ??").is_none());
        assert!(parse_frame_line("garbage").is_none());
    }

    #[test]
    fn symbolizes_a_frame_of_this_test() {
        crate::crash::snapshot::refresh();
        let here = symbolizes_a_frame_of_this_test as *const () as usize;
        let mut s = crate::crash::snapshot::MapsScratch::new();
        let found = crate::crash::snapshot::lookup(here, &mut s).unwrap();
        let raw = format!(
            "{BEGIN_RAW}signal: test\nframes: 1\n  #0 pc {:#018x} in {} +{:#x}\n{END_RAW}",
            here,
            String::from_utf8_lossy(found.path),
            found.offset
        );
        let text = symbolize_report(&raw);
        assert!(text.contains("symbolizes_a_frame_of_this_test"), "{text}");
        assert!(text.contains("report.rs:"), "{text}");
    }

    #[test]
    fn frames_in_no_module_are_named_from_the_perf_map() {
        // A pid no process has here (above the kernel's pid_max limit of
        // 2^22), so that no runtime writes its map meanwhile.
        let pid = 4_194_999u32;
        let path = crate::symbolize::perfmap::path_for_pid(pid);
        std::fs::write(&path, "7f0000001000 40 LazyCompile:*handler app.js:7\n").unwrap();
        let raw = format!(
            "{BEGIN_RAW}signal: SIGSEGV: x\nprocess: {pid}\nframes: 3\n  #0 pc 0x00007f0000001000 in ??\n  #1 ra 0x00007f0000001040 in ??\n  #2 ra 0x00007f0000002000 in ??\n{END_RAW}"
        );
        let text = symbolize_report(&raw);
        let _ = std::fs::remove_file(&path);
        assert!(
            text.contains("#0 0x00007f0000001000 in LazyCompile:*handler app.js:7 (JIT, perf map)"),
            "{text}"
        );
        // A return address just past the function is its call's.
        assert!(
            text.contains("#1 0x00007f0000001040 in LazyCompile:*handler"),
            "{text}"
        );
        assert!(text.contains("#2 0x00007f0000002000 in ??"), "{text}");
    }

    #[test]
    fn bad_input_gives_no_report_or_unknown_frames_never_a_panic() {
        let good = format!(
            "{BEGIN_RAW}signal: SIGSEGV: x\nframes: 2\n  #0 pc 0x0000000000001000 in /nonexistent/a +0x1000 (build-id 0aff)\n  #1 ra 0x0000000000002000 in ??\n{END_RAW}"
        );
        // Every truncation, and a few corruptions, of a valid report.
        for cut in 0..good.len() {
            if good.is_char_boundary(cut) {
                let _ = symbolize_report(&good[..cut]);
            }
        }
        for bad in [
            "  #0 pc 0x in ?? ",
            "  #x ra 0x10 in /a +0x",
            "  #1 ra 0xffffffffffffffffff in /a +0x1",
            "  #2 ra 0x10 in /a +0x1 (build-id zz)",
            "  #3 ra 0x10 in  +0x1 (build-id ",
        ] {
            let text = format!("{BEGIN_RAW}{bad}\n{END_RAW}");
            let _ = symbolize_report(&text);
        }
        assert!(symbolize_report("no report here").is_empty());
        let text = symbolize_report(&good);
        assert!(text.contains("#0 0x0000000000001000 in ??"), "{text}");
        assert!(text.contains("#1 0x0000000000002000 in ??"), "{text}");
    }
}
