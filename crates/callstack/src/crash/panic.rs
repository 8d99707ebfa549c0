//! The panic hook: the same two-part report for a Rust panic, captured and
//! symbolized in the panicking process (a panic is not a signal: locks and
//! allocation are allowed), then the previous hook runs as before.

use super::env::{BEGIN_RAW, END_RAW};
use super::fmt::Buf;
#[cfg(feature = "symbolize")]
use super::report::{symbolize_report_with, Style};
use std::io::Write;
use std::path::PathBuf;

/// Captures the calling thread's stack: the one capture call of panic
/// reports. `out[0]` is inside the caller.
///
/// [`crate::capture_exact`]: right through the standard library's panic
/// machinery, which has no frame pointers.
#[inline(always)]
fn capture_here(out: &mut [usize]) -> usize {
    crate::capture_exact(0, out)
}

/// The thread's lines and the frame lines, as the crash handler writes
/// them.
#[cfg(target_os = "linux")]
fn thread_and_frames(w: &mut Buf<'_>, frames: &[usize]) {
    use super::handler::{write_frames, write_thread};
    write_thread(w, super::sys::gettid());
    let mut maps = super::snapshot::MapsScratch::new();
    write_frames(w, frames, false, &mut maps);
}

/// The thread's lines and the frame lines, as the crash handler writes
/// them.
#[cfg(windows)]
fn thread_and_frames(w: &mut Buf<'_>, frames: &[usize]) {
    // SAFETY: a plain call.
    let tid = unsafe { crate::sys::windows::api::GetCurrentThreadId() };
    super::windows::write_thread(w, tid);
    super::windows::write_frames(w, frames, false);
}

/// Formats the raw part of a panic report.
fn raw_report(info: &std::panic::PanicHookInfo<'_>) -> String {
    let mut frames = [0usize; 128];
    let n = capture_here(&mut frames);
    let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = info.payload().downcast_ref::<String>() {
        s.clone()
    } else {
        "Box<dyn Any>".to_string()
    };
    let loc = info
        .location()
        .map(|l| format!(" at {}:{}:{}", l.file(), l.line(), l.column()))
        .unwrap_or_default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut w = Buf::new(&mut buf);
    w.str(BEGIN_RAW);
    w.str("panic: ")
        .str(&msg.replace('\n', " "))
        .str(&loc)
        .str("\n");
    thread_and_frames(&mut w, &frames[..n]);
    w.str(END_RAW);
    String::from_utf8_lossy(w.as_bytes()).into_owned()
}

/// Installs the panic hook (once per call; the previous hook still runs
/// after ours).
pub(crate) fn install(report_path: Option<PathBuf>) {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let raw = raw_report(info);
        // Without the symbolizer the raw part (addresses, modules, offsets)
        // is the whole report: `callstack crash-report` can finish it.
        #[cfg(feature = "symbolize")]
        let text = {
            let sym = symbolize_report_with(
                &raw,
                Style {
                    elapsed: false,
                    trim_panic_frames: true,
                },
            );
            format!("{raw}{sym}")
        };
        #[cfg(not(feature = "symbolize"))]
        let text = raw;
        let _ = std::io::stderr().write_all(text.as_bytes());
        if let Some(p) = &report_path {
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
            {
                let _ = f.write_all(text.as_bytes());
            }
        }
        prev(info);
    }));
}
