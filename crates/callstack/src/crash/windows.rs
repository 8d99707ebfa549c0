//! Crash reports on Windows x64: the same two parts as on Linux (see the
//! [module docs](super)), from an unhandled-exception filter and a handler
//! thread.
//!
//! ## Which exceptions are reported
//! Only those that nothing handles: [`install`] sets an unhandled-exception
//! filter (`SetUnhandledExceptionFilter`), which Windows (and wine) calls
//! after every frame-based handler of the thread declined the exception,
//! just before the process dies. A vectored handler would see every
//! *first-chance* exception, also those the program then catches itself
//! (SEH `__except`, C++ `catch`, Rust's `catch_unwind`, which unwinds with
//! `RaiseException`): reporting there would report crashes that do not
//! happen. So the access violation, illegal or privileged instruction,
//! division by zero or uncaught C++ exception that reaches the filter is
//! the crash, and a vectored handler (added first) takes one code only:
//! `EXCEPTION_STACK_OVERFLOW`. Its dispatch runs on the few pages left
//! below the guard page, and the search for a frame handler and the
//! filter's call need more than that: under wine 8 the filter is never
//! reached, the thread faults again inside the dispatcher and dies (a
//! program of one thread exits with status 1; ours would hang, its handler
//! thread alive). So a stack overflow is reported at first chance, and
//! after its report the process ends with `EXCEPTION_STACK_OVERFLOW`, the
//! status Windows gives it. The cost: a program that catches its own stack
//! overflow (`__except` then `_resetstkoflw`) is reported and ended; the
//! vectored handlers after ours (Rust's, which prints "has overflowed its
//! stack") do not run.
//!
//! Known limits: code that later replaces the filter (another crash
//! reporter) takes the reports over; a mingw program that handles faults
//! with the C runtime's `signal(SIGSEGV)` (which the C runtime's own
//! filter, the one ours chains to, calls) gets a report before its
//! handler runs; an exception raised with a debugger attached
//! goes to the debugger; `__fastfail` (Rust's `abort`, the UCRT's
//! `abort` with its default behaviour) ends the process without any
//! filter, as on Windows. `abort()` of the C runtime (msvcrt's, which mingw
//! links) raises `SIGABRT` first: [`install`] catches it with the C
//! runtime's `signal`, reports from a `CONTEXT` of the aborting thread
//! (`RtlCaptureContext`, exception code `STATUS_FATAL_APP_EXIT`
//! 0x40000015), then lets `abort` go on (exit status 3).
//!
//! ## A thread with its own stack
//! A stack overflow leaves the crashed thread a few pages at most, and
//! memory allocation, the loader or a second fault may be unsafe there. So
//! [`install`] starts a **handler thread** (with a stack of its own) that
//! waits on an event. The filter, on the crashed thread, only takes the
//! crash lock, stores the `EXCEPTION_POINTERS` and the thread's stack
//! bounds (from its TEB) in static storage, wakes the handler thread and
//! waits for it (at most the helper's timeout plus 5 s). The handler thread:
//! 1. unwinds the crashed thread's `CONTEXT` with the `.pdata` unwinder of
//!    [`crate::capture_from_context`], reading only inside that thread's
//!    stack;
//! 2. writes the raw part (exception in words, process, thread, time, each
//!    frame's address, module path and offset: the module's RVA) into a
//!    static buffer with no allocation, to the standard error handle and
//!    the report file (`WriteFile`);
//! 3. starts the helper (below) and feeds it the raw part and the crash
//!    context on a pipe.
//!
//! Then the filter returns to the filter that was installed before (the C
//! runtime's, in a mingw program), or says `EXCEPTION_CONTINUE_SEARCH`:
//! the process ends as it would have without us, with the exception code
//! as its exit status.
//!
//! ## The symbolized part and the minidump: a helper process
//! As on Linux, and for the same reason: the crashed process's heap may be
//! locked (a crash inside `HeapAlloc`) or corrupt. The helper is, in order,
//! [`super::Options::helper`] or `CALLSTACK_CRASH_HELPER` (run as `HELPER
//! crash-report`), else the crashed program itself re-run with its command
//! line and `CALLSTACK_CRASH_SYMBOLIZE=1`, which turns [`install`] (and the
//! C `callstack_install_crash_handler`) into the symbolizer. The helper
//! writes the minidump first (`crash/windows_dump.rs`: it opens the
//! crashed process and reads it from outside, the design of Crashpad's
//! handler), then the symbolized report to standard error (inherited) and
//! the report file. The command line and the environment block are built
//! at install time; at crash time the handler thread calls `CreatePipe`,
//! `CreateProcessW`, `WriteFile`, `WaitForSingleObject`. The risk that
//! remains: `CreateProcessW` itself allocates in the process heap inside
//! kernel32, so a crash that left the heap's lock held stops the helper
//! from starting; the crashed thread's wait is bounded, and the raw part is
//! already out. (Symbolizing on the handler thread would meet the same lock
//! in every allocation, and a corrupt heap too.)

use core::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::cell::UnsafeCell;
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::path::PathBuf;

use super::env::{BEGIN_RAW, END_RAW};
use super::fmt::Buf;
use super::Options;
use crate::sys::windows::api as w;
use crate::sys::windows::api::{EXCEPTION_POINTERS, HANDLE};

/// Room for one raw report.
const REPORT_BYTES: usize = 64 * 1024;
/// Frames unwound at most.
const MAX_FRAMES: usize = 256;
/// `EXCEPTION_STACK_OVERFLOW`.
const STACK_OVERFLOW: u32 = 0xc000_00fd;
/// `STATUS_FATAL_APP_EXIT`: the code an `abort()` report carries.
const FATAL_APP_EXIT: u32 = 0x4000_0015;

/// A static that one thread at a time owns (the holder of [`CRASHING`]).
struct SyncCell<T>(UnsafeCell<T>);
// SAFETY: every access goes through the crash lock (see its uses).
unsafe impl<T> Sync for SyncCell<T> {}

/// What [`install`] prepared; published once per install, never freed.
struct Config {
    /// UTF-16, NUL-terminated; empty for none.
    report_path: Vec<u16>,
    /// Run the helper at all.
    run_helper: bool,
    /// Ask it for the symbolized part.
    symbolize: bool,
    /// UTF-8; empty for none.
    minidump_dir: Vec<u8>,
    /// The helper's command line (UTF-16, NUL-terminated, writable as
    /// `CreateProcessW` wants it).
    command: SyncCell<Vec<u16>>,
    /// Its environment block (UTF-16).
    environment: Vec<u16>,
    timeout_ms: u32,
    /// Events: the crashed thread's request, the handler's answer.
    request: usize,
    done: usize,
    /// An inheritable duplicate of the standard error handle.
    stderr: usize,
    /// The handler thread's id.
    handler_tid: u32,
}

static CONFIG: AtomicPtr<Config> = AtomicPtr::new(core::ptr::null_mut());
/// The thread being reported (0: none).
static CRASHING: AtomicU32 = AtomicU32::new(0);
/// The filter that was there before ours (0: none).
static PREVIOUS: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
/// The C runtime's `SIGABRT` handler before ours.
static PREVIOUS_ABORT: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// The crash handed to the handler thread.
#[derive(Clone, Copy)]
struct Crash {
    pointers: *const EXCEPTION_POINTERS,
    tid: u32,
    stack: (usize, usize),
}

/// Owned by the holder of [`CRASHING`].
struct Scratch {
    crash: Crash,
    report: [u8; REPORT_BYTES],
    context: [u8; 1024],
    frames: [usize; MAX_FRAMES],
}

static SCRATCH: SyncCell<Scratch> = SyncCell(UnsafeCell::new(Scratch {
    crash: Crash {
        pointers: core::ptr::null(),
        tid: 0,
        stack: (0, 0),
    },
    report: [0; REPORT_BYTES],
    context: [0; 1024],
    frames: [0; MAX_FRAMES],
}));

/// Nanoseconds of the system's performance counter (one clock for every
/// process of the machine: the helper says how long after the fault it
/// finished).
pub(crate) fn monotonic_ns() -> u64 {
    let (mut c, mut f) = (0i64, 0i64);
    // SAFETY: two valid out-parameters.
    unsafe {
        w::QueryPerformanceCounter(&mut c);
        w::QueryPerformanceFrequency(&mut f);
    }
    if f <= 0 {
        return 0;
    }
    (c as u128 * 1_000_000_000 / f as u128) as u64
}

fn wide(s: &std::ffi::OsStr) -> Vec<u16> {
    s.encode_wide().collect()
}

/// Quotes one argument of a command line as `CommandLineToArgvW` reads it.
fn quote(arg: &[u16], out: &mut Vec<u16>) {
    let q = u16::from(b'"');
    let bs = u16::from(b'\\');
    out.push(q);
    let mut slashes = 0;
    for &c in arg {
        if c == bs {
            slashes += 1;
        } else {
            if c == q {
                out.extend(std::iter::repeat_n(bs, slashes + 1));
            }
            slashes = 0;
        }
        out.push(c);
    }
    out.extend(std::iter::repeat_n(bs, slashes));
    out.push(q);
}

/// See [`super::install`].
pub(crate) fn install(options: Options, symbolize: bool, minidump_dir: Vec<u8>) -> io::Result<()> {
    use super::env::{HELPER_ENV, HELPER_SUBCOMMAND, REPORT_ENV, SYMBOLIZE_ENV, TIMEOUT_ENV};
    let timeout = std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(std::time::Duration::from_millis)
        .unwrap_or(options.timeout);
    let timeout_ms = timeout.as_millis().min(u32::MAX as u128 / 2) as u32;
    let helper: Option<PathBuf> = options.helper.clone().or_else(|| {
        std::env::var_os(HELPER_ENV)
            .filter(|v| !v.is_empty() && v != "none")
            .map(PathBuf::from)
    });
    let mut command = Vec::new();
    match &helper {
        Some(h) => {
            quote(&wide(h.as_os_str()), &mut command);
            command.push(u16::from(b' '));
            command.extend(HELPER_SUBCOMMAND.encode_utf16());
        }
        None => {
            // SAFETY: the process's command line, NUL-terminated, lives as
            // long as the process.
            unsafe {
                let p = w::GetCommandLineW();
                let mut n = 0;
                while !p.is_null() && *p.add(n) != 0 {
                    n += 1;
                }
                if n > 0 {
                    command.extend_from_slice(core::slice::from_raw_parts(p, n));
                }
            }
        }
    }
    command.push(0);
    let mut environment = Vec::new();
    for (k, v) in std::env::vars_os() {
        if k == SYMBOLIZE_ENV || k == REPORT_ENV {
            continue;
        }
        environment.extend(wide(&k));
        environment.push(u16::from(b'='));
        environment.extend(wide(&v));
        environment.push(0);
    }
    environment.extend(format!("{SYMBOLIZE_ENV}=1").encode_utf16());
    environment.push(0);
    if let Some(p) = &options.report_path {
        environment.extend(format!("{REPORT_ENV}=").encode_utf16());
        environment.extend(wide(p.as_os_str()));
        environment.push(0);
    }
    environment.push(0);
    let report_path = options
        .report_path
        .as_ref()
        .map(|p| {
            let mut v = wide(p.as_os_str());
            v.retain(|&c| c != 0);
            v.push(0);
            v
        })
        .unwrap_or_default();
    let run_helper = symbolize || !minidump_dir.is_empty();
    let previous = CONFIG.load(Ordering::Acquire);
    // SAFETY: published configs are never freed.
    let (request, done, stderr) = match unsafe { previous.as_ref() } {
        // The handler thread waits on the first install's events: kept.
        Some(p) => (p.request as HANDLE, p.done as HANDLE, p.stderr as HANDLE),
        None => events()?,
    };
    let handler_tid = if previous.is_null() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("callstack crash handler".into())
            .stack_size(1 << 20)
            .spawn(move || {
                // SAFETY: a plain call.
                let _ = tx.send(unsafe { w::GetCurrentThreadId() });
                handler_thread()
            })?;
        rx.recv()
            .map_err(|_| io::Error::other("the crash handler thread did not start"))?
    } else {
        // SAFETY: published configs are never freed.
        unsafe { (*previous).handler_tid }
    };
    let cfg = Box::new(Config {
        report_path,
        run_helper,
        symbolize,
        minidump_dir,
        command: SyncCell(UnsafeCell::new(command)),
        environment,
        timeout_ms,
        request: request as usize,
        done: done as usize,
        stderr: stderr as usize,
        handler_tid,
    });
    CONFIG.store(Box::leak(cfg), Ordering::Release);
    if previous.is_null() {
        // SAFETY: installs our filter and our SIGABRT handler (plain
        // functions living as long as the program), keeping what was there.
        unsafe {
            w::AddVectoredExceptionHandler(1, vectored);
            let old = w::SetUnhandledExceptionFilter(Some(filter));
            PREVIOUS.store(old.map_or(0, |f| f as usize), Ordering::Release);
            let ours: extern "C" fn(i32) = on_abort;
            let old = w::signal(w::SIGABRT, ours as usize);
            if old != usize::MAX {
                PREVIOUS_ABORT.store(old, Ordering::Release);
            }
        }
    }
    Ok(())
}

/// The two events of a crash's hand-over and an inheritable duplicate of
/// the standard error handle (null if there is none), kept for the
/// process's life.
fn events() -> io::Result<(HANDLE, HANDLE, HANDLE)> {
    // SAFETY: plain Win32 calls with valid arguments.
    unsafe {
        let request = w::CreateEventW(core::ptr::null_mut(), 0, 0, core::ptr::null());
        let done = w::CreateEventW(core::ptr::null_mut(), 0, 0, core::ptr::null());
        if request.is_null() || done.is_null() {
            return Err(io::Error::last_os_error());
        }
        let mut dup: HANDLE = core::ptr::null_mut();
        let me = w::GetCurrentProcess();
        let err = w::GetStdHandle(w::STD_ERROR_HANDLE);
        if err.is_null()
            || err == w::INVALID_HANDLE_VALUE
            || w::DuplicateHandle(me, err, me, &mut dup, 0, 1, w::DUPLICATE_SAME_ACCESS) == 0
        {
            dup = core::ptr::null_mut();
        }
        Ok((request, done, dup))
    }
}

/// The unhandled-exception filter: hands the crash to the handler thread,
/// then to the filter that was there before.
unsafe extern "system" fn filter(ep: *mut EXCEPTION_POINTERS) -> i32 {
    report_here(ep);
    let prev = PREVIOUS.load(Ordering::Acquire);
    let verdict = if prev != 0 {
        // SAFETY: `PREVIOUS` holds only what `SetUnhandledExceptionFilter`
        // returned: a filter function.
        let f: w::TopLevelFilter =
            unsafe { core::mem::transmute::<usize, w::TopLevelFilter>(prev) };
        // SAFETY: the arguments Windows gave us.
        unsafe { f(ep) }
    } else {
        0 // EXCEPTION_CONTINUE_SEARCH
    };
    // SAFETY: a plain call.
    let tid = unsafe { w::GetCurrentThreadId() };
    let _ = CRASHING.compare_exchange(tid, 0, Ordering::AcqRel, Ordering::Acquire);
    verdict
}

/// The vectored handler: a stack overflow only (see "Which exceptions are
/// reported" in the module docs), reported at first chance, then the
/// process ends with `EXCEPTION_STACK_OVERFLOW`.
unsafe extern "system" fn vectored(ep: *mut EXCEPTION_POINTERS) -> i32 {
    // SAFETY: Windows passes a valid EXCEPTION_POINTERS.
    let code = unsafe { (*(*ep).ExceptionRecord).ExceptionCode };
    if code != STACK_OVERFLOW {
        return 0; // EXCEPTION_CONTINUE_SEARCH
    }
    report_here(ep);
    // SAFETY: ends this process, as an unhandled stack overflow does.
    unsafe { w::TerminateProcess(w::GetCurrentProcess(), STACK_OVERFLOW) };
    0
}

/// `SIGABRT` of the C runtime (`abort()`): a report from here, then what
/// was there before (the C runtime then ends the process, status 3).
extern "C" fn on_abort(sig: i32) {
    let mut ctx = w::Context([0; w::CONTEXT_SIZE]);
    // SAFETY: a valid, aligned CONTEXT to fill.
    unsafe { w::RtlCaptureContext(&mut ctx) };
    let (pc, _, _) =
        // SAFETY: an x64 CONTEXT just filled.
        unsafe { crate::sys::windows::x86_64::context_regs(ctx.0.as_ptr()) };
    let mut rec = w::EXCEPTION_RECORD {
        ExceptionCode: FATAL_APP_EXIT,
        ExceptionFlags: 1, // EXCEPTION_NONCONTINUABLE
        ExceptionRecord: core::ptr::null_mut(),
        ExceptionAddress: pc as usize as *mut core::ffi::c_void,
        NumberParameters: 0,
        ExceptionInformation: [0; 15],
    };
    let ep = EXCEPTION_POINTERS {
        ExceptionRecord: &mut rec,
        ContextRecord: ctx.0.as_mut_ptr().cast(),
    };
    report_here(&ep as *const _ as *mut _);
    let prev = PREVIOUS_ABORT.load(Ordering::Acquire);
    // SIG_DFL (0), SIG_IGN (1) and SIG_ERR are no functions to call.
    if prev > 1 && prev != usize::MAX {
        // SAFETY: a handler `signal` returned: a C function of one int.
        let f: extern "C" fn(i32) =
            unsafe { core::mem::transmute::<usize, extern "C" fn(i32)>(prev) };
        f(sig);
    }
}

/// On the crashed thread: takes the crash lock, hands the crash to the
/// handler thread and waits for it.
fn report_here(ep: *mut EXCEPTION_POINTERS) {
    // SAFETY: published configs are never freed.
    let Some(cfg) = (unsafe { CONFIG.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    // SAFETY: plain calls.
    let tid = unsafe { w::GetCurrentThreadId() };
    if tid == cfg.handler_tid {
        // Our own thread crashed while reporting: no second report.
        say(b"*** callstack: exception in the crash handler thread; no report ***\n");
        return;
    }
    loop {
        match CRASHING.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(owner) if owner == tid => {
                say(b"*** callstack: exception while handling a crash on this thread; no second report ***\n");
                return;
            }
            // Another thread is being reported: it usually ends the process.
            // SAFETY: a plain call.
            Err(_) => unsafe { w::Sleep(10) },
        }
    }
    // SAFETY: we hold the crash lock, which owns SCRATCH.crash; the handler
    // thread reads it only between our request and its answer.
    unsafe {
        (*SCRATCH.0.get()).crash = Crash {
            pointers: ep,
            tid,
            stack: crate::sys::windows::teb::stack(),
        };
        w::SetEvent(cfg.request as HANDLE);
        w::WaitForSingleObject(cfg.done as HANDLE, cfg.timeout_ms.saturating_add(5000));
    }
}

/// Writes `bytes` to standard error.
fn say(bytes: &[u8]) {
    // SAFETY: plain calls with a valid buffer.
    unsafe {
        let h = w::GetStdHandle(w::STD_ERROR_HANDLE);
        write_all(h, bytes);
    }
}

/// `WriteFile` until everything is written or it fails.
///
/// # Safety
/// `h` must be a handle open for writing (or invalid: nothing happens).
unsafe fn write_all(h: HANDLE, mut bytes: &[u8]) {
    if h.is_null() || h == w::INVALID_HANDLE_VALUE {
        return;
    }
    while !bytes.is_empty() {
        let mut n = 0u32;
        let len = bytes.len().min(1 << 30) as u32;
        // SAFETY: as promised by the caller; `bytes` is valid for `len`.
        if unsafe { w::WriteFile(h, bytes.as_ptr(), len, &mut n, core::ptr::null_mut()) } == 0
            || n == 0
        {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// The handler thread: waits for a crash, reports it, answers.
fn handler_thread() {
    loop {
        // SAFETY: the events are published with the config before a crash
        // can be handed over; CONFIG is never freed.
        unsafe {
            let Some(cfg) = CONFIG.load(Ordering::Acquire).as_ref() else {
                w::Sleep(10);
                continue;
            };
            if w::WaitForSingleObject(cfg.request as HANDLE, w::INFINITE) != w::WAIT_OBJECT_0 {
                return;
            }
            // The config of the latest install.
            let cfg = &*CONFIG.load(Ordering::Acquire);
            report(cfg, &mut *SCRATCH.0.get());
            w::SetEvent(cfg.done as HANDLE);
        }
    }
}

/// The name and words of an exception code.
pub fn exception_name(code: u32) -> (&'static str, &'static str) {
    match code {
        0xc000_0005 => ("EXCEPTION_ACCESS_VIOLATION", ""),
        0xc000_0006 => ("EXCEPTION_IN_PAGE_ERROR", ""),
        0xc000_001d => ("EXCEPTION_ILLEGAL_INSTRUCTION", "illegal instruction"),
        0xc000_0096 => ("EXCEPTION_PRIV_INSTRUCTION", "privileged instruction"),
        0xc000_0094 => ("EXCEPTION_INT_DIVIDE_BY_ZERO", "integer division by zero"),
        0xc000_0095 => ("EXCEPTION_INT_OVERFLOW", "integer overflow"),
        0xc000_00fd => ("EXCEPTION_STACK_OVERFLOW", "stack overflow"),
        0xc000_008c => ("EXCEPTION_ARRAY_BOUNDS_EXCEEDED", "array bounds exceeded"),
        0xc000_008d => (
            "EXCEPTION_FLT_DENORMAL_OPERAND",
            "floating-point denormal operand",
        ),
        0xc000_008e => (
            "EXCEPTION_FLT_DIVIDE_BY_ZERO",
            "floating-point division by zero",
        ),
        0xc000_008f => (
            "EXCEPTION_FLT_INEXACT_RESULT",
            "floating-point inexact result",
        ),
        0xc000_0090 => (
            "EXCEPTION_FLT_INVALID_OPERATION",
            "floating-point invalid operation",
        ),
        0xc000_0091 => ("EXCEPTION_FLT_OVERFLOW", "floating-point overflow"),
        0xc000_0093 => ("EXCEPTION_FLT_UNDERFLOW", "floating-point underflow"),
        0xc000_0025 => (
            "EXCEPTION_NONCONTINUABLE_EXCEPTION",
            "continued after a noncontinuable exception",
        ),
        0xc000_0409 => (
            "STATUS_STACK_BUFFER_OVERRUN",
            "fail-fast or stack buffer overrun",
        ),
        0x8000_0002 => ("EXCEPTION_DATATYPE_MISALIGNMENT", "misaligned access"),
        0x8000_0003 => ("EXCEPTION_BREAKPOINT", "breakpoint"),
        0x8000_0004 => ("EXCEPTION_SINGLE_STEP", "single step"),
        0xe06d_7363 => ("MSVC C++ exception", "uncaught C++ exception"),
        0x2047_4343 => (
            "GCC exception",
            "uncaught C++ exception or Rust panic (GCC unwinder)",
        ),
        FATAL_APP_EXIT => ("SIGABRT", "abort() called"),
        _ => ("exception", "unknown code"),
    }
}

/// Writes the exception line of the raw report.
fn exception_line(out: &mut Buf<'_>, rec: &w::EXCEPTION_RECORD, sp: u64) {
    let code = rec.ExceptionCode;
    let (name, words) = exception_name(code);
    let word = |i: usize| {
        if (rec.NumberParameters as usize) > i {
            rec.ExceptionInformation[i] as u64
        } else {
            0
        }
    };
    if code == FATAL_APP_EXIT {
        out.str("signal: SIGABRT: abort() called (C runtime signal 22)\n");
        return;
    }
    out.str("exception: ").str(name).str(": ");
    if code == 0xc000_0005 || code == 0xc000_0006 {
        out.str(match word(0) {
            0 => "read of address ",
            1 => "write of address ",
            8 => "execution of address ",
            _ => "access of address ",
        });
        let addr = word(1);
        out.hex(addr, 1);
        if addr.abs_diff(sp) < 64 * 1024 {
            out.str(" (next to the stack pointer: stack overflow)");
        }
    } else {
        out.str(words);
    }
    out.str(" (code ")
        .hex(code as u64, 1)
        .str(", at ")
        .hex(rec.ExceptionAddress as u64, 1)
        .str(")\n");
}

/// Writes `units` (UTF-16) as UTF-8.
fn utf16(out: &mut Buf<'_>, units: &[u16]) {
    for c in char::decode_utf16(units.iter().copied()) {
        let mut b = [0u8; 4];
        out.str(c.unwrap_or('\u{fffd}').encode_utf8(&mut b));
    }
}

/// Writes the `process:`, `thread:` and `time:` lines of a raw report.
pub(crate) fn write_thread(out: &mut Buf<'_>, tid: u32) {
    // SAFETY: a plain call.
    let pid = unsafe { w::GetCurrentProcessId() };
    out.str("process: ").dec(pid as u64).str("\n");
    out.str("thread: ").dec(tid as u64).str("\n");
    out.str("time: ")
        .dec(monotonic_ns())
        .str(" ns (QueryPerformanceCounter)\n");
}

/// Writes the frame lines of a raw report: `  #N pc|ra 0xADDR in PATH
/// +0xRVA` or `in ??`, the module from the loader's list (no lock, no
/// allocation).
pub(crate) fn write_frames(out: &mut Buf<'_>, frames: &[usize], first_is_pc: bool) {
    out.str("frames: ").dec(frames.len() as u64).str("\n");
    for (i, &a) in frames.iter().enumerate() {
        out.str("  #").dec(i as u64);
        out.str(if i == 0 && first_is_pc {
            " pc "
        } else {
            " ra "
        });
        out.hex(a as u64, 16);
        match crate::sys::windows::loader::module_and_name_of(a) {
            Some((base, _, name)) if !name.is_empty() => {
                out.str(" in ");
                utf16(out, name);
                out.str(" +").hex((a - base) as u64, 1);
            }
            _ => {
                out.str(" in ??");
            }
        }
        out.str("\n");
    }
}

/// On the handler thread: the raw part, then the helper.
///
/// # Safety
/// The crash in `s.crash` must be one a crashed thread handed over and is
/// waiting in (its pointers valid, its stack alive).
unsafe fn report(cfg: &Config, s: &mut Scratch) {
    let c = s.crash;
    // SAFETY: as promised by the caller.
    let (rec, ctx) = unsafe {
        (
            &*(*c.pointers).ExceptionRecord,
            (*c.pointers).ContextRecord as *const u8,
        )
    };
    // SAFETY: an x64 CONTEXT.
    let (_, sp, _) = unsafe { crate::sys::windows::x86_64::context_regs(ctx) };
    // SAFETY: the crashed thread's committed stack, alive while it waits.
    let n = unsafe {
        crate::unwind::windows::walk_context_on(ctx, c.stack.0, c.stack.1, &mut s.frames)
    };
    let mut out = Buf::new(&mut s.report);
    out.str(BEGIN_RAW);
    exception_line(&mut out, rec, sp);
    write_thread(&mut out, c.tid);
    // An abort's context is our SIGABRT handler's own: its frame is left
    // out, and the report starts at the return address into the C
    // runtime's `raise` (as a Linux SIGABRT report starts in libc).
    let skip = usize::from(rec.ExceptionCode == FATAL_APP_EXIT && n > 1);
    write_frames(&mut out, &s.frames[skip..n], skip == 0);
    if n == MAX_FRAMES {
        out.str("  ... (more frames not shown)\n");
    }
    out.str(END_RAW);
    if out.truncated() {
        let keep = out.len().saturating_sub(END_RAW.len() + 16);
        out.truncate(keep);
        out.str("\n...\n").str(END_RAW);
    }
    let len = out.len();
    let raw = &s.report[..len];
    say(raw);
    if cfg.report_path.len() > 1 {
        // SAFETY: a NUL-terminated UTF-16 path; the handle is closed here.
        unsafe {
            let h = w::CreateFileW(
                cfg.report_path.as_ptr(),
                w::FILE_APPEND_DATA,
                w::FILE_SHARE_READ | w::FILE_SHARE_WRITE,
                core::ptr::null_mut(),
                w::OPEN_ALWAYS,
                w::FILE_ATTRIBUTE_NORMAL,
                core::ptr::null_mut(),
            );
            if h != w::INVALID_HANDLE_VALUE {
                write_all(h, raw);
                w::CloseHandle(h);
            }
        }
    }
    if !cfg.run_helper {
        return;
    }
    // SAFETY: a plain call.
    let pid = unsafe { w::GetCurrentProcessId() };
    let mut b = Buf::new(&mut s.context);
    b.str("*** callstack: crash context ***\n");
    b.str("pid: ").dec(pid as u64).str("\n");
    b.str("tid: ").dec(c.tid as u64).str("\n");
    b.str("signal: 0 0 ")
        .hex(rec.ExceptionAddress as u64, 1)
        .str("\n");
    b.str("exception: ")
        .hex(rec.ExceptionCode as u64, 1)
        .str(" ")
        // SAFETY: reads the two pointers of the EXCEPTION_POINTERS.
        .hex(unsafe { (*c.pointers).ExceptionRecord } as u64, 1)
        .str(" ")
        .hex(ctx as u64, 1)
        .str("\n");
    b.str("symbolize: ")
        .str(if cfg.symbolize { "1" } else { "0" })
        .str("\n");
    if !cfg.minidump_dir.is_empty() {
        b.str("minidump-dir: ").bytes(&cfg.minidump_dir).str("\n");
    }
    b.str("*** end of crash context ***\n");
    let clen = if b.truncated() { 0 } else { b.len() };
    let start = monotonic_ns();
    // SAFETY: the config's buffers are valid; we are the only user of the
    // command line (the holder of the crash lock's handler).
    let outcome = unsafe { run_helper(cfg, raw, &s.context[..clen]) };
    let mut line = [0u8; 256];
    let mut l = Buf::new(&mut line);
    l.str("*** callstack: symbolizing helper ");
    match outcome {
        Ok(0) => l.str("finished"),
        Ok(u32::MAX) => l.str("timed out and was killed"),
        Ok(st) => l.str("failed with exit status ").dec(st as u64),
        Err(e) => l.str("could not start, error ").dec(e as u64),
    };
    l.str(" after ")
        .dec((monotonic_ns() - start) / 1_000_000)
        .str(" ms ***\n");
    say(l.as_bytes());
}

/// Starts the helper, writes it the raw report and the crash context on
/// its standard input, waits for it (killing it at the timeout). Its exit
/// status (`u32::MAX`: timed out), or the error of `CreateProcessW`.
///
/// # Safety
/// Only the handler thread calls it (it writes the command line).
unsafe fn run_helper(cfg: &Config, raw: &[u8], context: &[u8]) -> Result<u32, u32> {
    // SAFETY: Win32 calls with valid, initialised arguments; every handle
    // opened here is closed here.
    unsafe {
        let mut sa = w::SECURITY_ATTRIBUTES {
            nLength: core::mem::size_of::<w::SECURITY_ATTRIBUTES>() as u32,
            lpSecurityDescriptor: core::ptr::null_mut(),
            bInheritHandle: 1,
        };
        let (mut rd, mut wr): (HANDLE, HANDLE) = (core::ptr::null_mut(), core::ptr::null_mut());
        if w::CreatePipe(&mut rd, &mut wr, &mut sa, 0) == 0 {
            return Err(w::GetLastError());
        }
        w::SetHandleInformation(wr, w::HANDLE_FLAG_INHERIT, 0);
        let mut si: w::STARTUPINFOW = core::mem::zeroed();
        si.cb = core::mem::size_of::<w::STARTUPINFOW>() as u32;
        si.dwFlags = w::STARTF_USESTDHANDLES;
        si.hStdInput = rd;
        si.hStdOutput = cfg.stderr as HANDLE;
        si.hStdError = cfg.stderr as HANDLE;
        let mut pi: w::PROCESS_INFORMATION = core::mem::zeroed();
        let command = &mut *cfg.command.0.get();
        let ok = w::CreateProcessW(
            core::ptr::null(),
            command.as_mut_ptr(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            1,
            w::CREATE_UNICODE_ENVIRONMENT,
            cfg.environment.as_ptr() as *mut core::ffi::c_void,
            core::ptr::null(),
            &mut si,
            &mut pi,
        );
        let err = w::GetLastError();
        w::CloseHandle(rd);
        if ok == 0 {
            w::CloseHandle(wr);
            return Err(err);
        }
        write_all(wr, raw);
        write_all(wr, context);
        w::CloseHandle(wr);
        let status = if w::WaitForSingleObject(pi.hProcess, cfg.timeout_ms) == w::WAIT_OBJECT_0 {
            let mut code = 0u32;
            w::GetExitCodeProcess(pi.hProcess, &mut code);
            code
        } else {
            w::TerminateProcess(pi.hProcess, 1);
            u32::MAX
        };
        w::CloseHandle(pi.hThread);
        w::CloseHandle(pi.hProcess);
        Ok(status)
    }
}
