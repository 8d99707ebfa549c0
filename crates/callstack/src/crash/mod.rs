//! Crash reports: a raw trace that always appears, then a symbolized one.
//!
//! [`install`] sets handlers for SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT
//! and SIGTRAP. On a crash the report comes in two parts:
//!
//! 1. **The raw part**, written by the signal handler itself with
//!    async-signal-safe calls only and no allocation: the signal and its
//!    code in words (`SIGSEGV: address not mapped, fault address 0x0`), the
//!    thread id and name, and every frame unwound from the signal context
//!    with [`crate::capture_from_context`] (DWARF CFI, falling back to
//!    frame pointers), each as address, module path, offset in the module
//!    and build-id. It goes to standard error and, if asked, to a report
//!    file.
//! 2. **The symbolized part** (function, file:line:column, inlined frames),
//!    made by *another process*: symbolizing inside the crashed process can
//!    deadlock (the crash may be inside `malloc`, holding its lock) or fault
//!    again (the heap may be corrupt). The handler starts a helper with
//!    `clone(CLONE_VM | CLONE_VFORK)` on a stack of its own (not glibc's
//!    `fork()`, whose atfork handlers take malloc's locks, and no copy of
//!    the crashed process's page tables) and `execve`, writes the raw report to its
//!    standard input, and waits for it with a timeout (default 5 s), with
//!    `SIGCHLD` at its default action meanwhile so that a program's handler
//!    that reaps every child cannot take the helper's exit status. The
//!    raw report holds everything the helper needs (module paths, offsets,
//!    build-ids); the helper resolves it offline with
//!    [`crate::symbolize::Symbolizer::from_modules`] (DWARF, split debug
//!    info found by build-id, symbol tables). If this step fails or times
//!    out nothing is lost: the raw part is already written.
//!
//! Then the process dies the way it would have without us: the previous
//! handler of the signal is called if there was one; otherwise the default
//! action is restored and the signal happens again (a fault re-executes the
//! faulting instruction on return; a signal sent by `abort`/`raise`/`kill`
//! is sent again with `tgkill`), so the exit status and the core dump are
//! unchanged.
//!
//! ```no_run
//! callstack::crash::install(callstack::crash::Options {
//!     report_path: Some("/tmp/crash.txt".into()),
//!     ..Default::default()
//! })
//! .expect("crash handler");
//! ```
//!
//! ## Minidumps
//! With [`Options::minidump_dir`] (or `CALLSTACK_CRASH_MINIDUMP_DIR`; C:
//! `callstack_install_crash_handler_with_minidumps`), the helper first writes
//! a minidump of the crashed process into that directory (created if
//! missing), then prints the symbolized report, whose header gains a line
//! `minidump: PATH (N threads, M modules, B bytes, T ms after the fault)`
//! (or `minidump: not written: WHY`). The file is named
//! `<exe>-<pid>-<unix-seconds>.dmp` (the executable's file name, the
//! crashed pid, the time of the crash): unique per crash on a machine. It
//! is the standard format (see [`crate::minidump`]) with every thread's
//! registers and stack, the modules with their build-ids, and the exception
//! (signal, code, fault address, crashing thread).
//!
//! How, and why so (the design of Crashpad's handler started at crash
//! time, reading the process the way Breakpad's Linux writer does): the
//! handler does nothing more in the crashed process than for the report.
//! After the raw part it sends the helper, on its standard input only (not
//! on stderr or the report file), the crash context: the crashed pid, the
//! crashing thread, `si_signo`/`si_code`/`si_addr`, and every general
//! register of the signal's `ucontext` (x86-64 and AArch64, as the words of
//! the kernel's `user_regs_struct`), formatted into static storage. It
//! calls `prctl(PR_SET_PTRACER, helper)` so that the helper, its child,
//! may trace it under Yama's `ptrace_scope=1` (without Yama the call fails
//! with `EINVAL`, harmlessly), makes the process dumpable for that time if
//! it was not (`PR_SET_DUMPABLE`: `ptrace` refuses an undumpable process to
//! anyone without CAP_SYS_PTRACE; as Breakpad does), and waits as for a
//! report. The helper is a
//! fresh process (`execve`d: its own heap, no lock inherited), which
//! attaches to every thread of the crashed process with `ptrace`, copies
//! registers and stacks, reads the modules from `/proc` and their files,
//! writes the file and detaches ([`crate::minidump::write_live_process`]);
//! for the crashing thread it uses the registers from the context (`ptrace`
//! sees that thread inside the handler). So the dump depends on nothing of
//! the crashed process but its memory: a crash inside `malloc` with the
//! arena lock held, or on a thread whose stack is exhausted (the handler
//! runs on its alternate stack, then on the report stack; the helper needs
//! neither), still produces one. Writing in the crashed process itself
//! (Breakpad's in-process mode, sentry-native's) would have to stop its
//! other threads and read them without the heap from a signal handler; a
//! monitor registered at start-up (Crashpad's daemon) costs a process per
//! program for its whole life. The helper's timeout (default 5 s) covers
//! the dump and the report together: a dump of a few threads takes a few
//! milliseconds (BENCHMARKS.md, "crash minidump"). The dump is written
//! before the symbolized report, so that a slow symbolization cannot starve
//! it. The crash context adds no system call to the handler (`prctl` was
//! already used to read the thread's name).
//!
//! ## Which helper symbolizes
//! In order: the program named by [`Options::helper`] or the
//! `CALLSTACK_CRASH_HELPER` environment variable (`none` turns the step
//! off); else the `callstack` binary next to the executable or on `PATH`
//! (run as `callstack crash-report`); else **the crashed program itself**,
//! re-executed from `/proc/self/exe` with its arguments and
//! `CALLSTACK_CRASH_SYMBOLIZE=1` in its environment, which makes
//! [`install`] (and the C `callstack_install_crash_handler`) run the
//! symbolizer and exit instead of returning. So any program linked with
//! callstack symbolizes its own crashes with no extra binary, provided it
//! calls `install` early in `main`, before anything with side effects. A
//! helper that fails is followed by the next one while time remains.
//!
//! The helper protocol, for a helper of your own: it is run as
//! `HELPER crash-report` with the raw report on standard input (followed,
//! on the pipe only, by the crash context block that [`parse_context`]
//! reads),
//! `CALLSTACK_CRASH_SYMBOLIZE=1` and (when a report file is set)
//! `CALLSTACK_CRASH_REPORT=PATH` in its environment; it writes the
//! symbolized report to standard error and appends it to that file.
//! [`run_helper`] does the work (the minidump, then [`symbolize_report`]);
//! a saved report file can be
//! symbolized later with `callstack crash-report FILE`.
//!
//! ## Signal-safety rules of the handler
//! - No allocation, no lock, no `core::fmt`: the report is formatted into a
//!   static buffer by a small byte writer, and that buffer belongs to the
//!   thread that won the crash lock (an atomic holding its thread id).
//! - The report runs on a 256 KiB stack of its own (mapped at install
//!   time, guard page below, used only by the holder of the crash lock),
//!   whatever stack the signal was delivered on, so a thread's small
//!   alternate stack (Rust's standard library gives each thread one of a
//!   few KiB) only has to hold the signal frame.
//! - Only system calls: `write`, `open`, `read`, `close`, `prctl`,
//!   `getpid`, `gettid`, `pipe2`, `clone`, `fcntl`, `poll`,
//!   `sigprocmask`/`sigpending`/`sigtimedwait` (SIGPIPE from a helper that
//!   died early), `waitpid`, `nanosleep`, `kill`, `tgkill`, `sigaction`, and
//!   `clock_gettime` (vDSO); `dup2` and `execve` in the cloned child. No
//!   `mmap`, `brk` or `futex`: a test straces a crash inside `malloc` to
//!   check it.
//! - The module list is a copy in static storage, taken at install time
//!   (`dl_iterate_phdr` then, never in the handler); addresses outside it
//!   (code `dlopen`ed later) are found by reading `/proc/self/maps` with
//!   `open`/`read` and the ELF header already mapped in memory. Call
//!   [`refresh_modules`] after `dlopen` to have them in the snapshot.
//! - The unwinder reads only inside the interrupted thread's stack, so a
//!   corrupt stack ends the walk instead of faulting again.
//! - A crash on another thread while one is being reported waits for the
//!   first (which normally ends the process); a crash *inside* the report of
//!   the same thread skips the report and dies with the default action.
//!
//! ## The per-thread alternate stack rule
//! A stack overflow faults on the guard page with no stack left to run a
//! handler on, so the handler runs on an alternate signal stack, and an
//! alternate stack is per thread. [`install`] gives one to the calling
//! thread; **every other thread that should report its own stack overflow
//! must call [`install_thread`]** (C: `callstack_crash_thread_init()`) once,
//! early. Without it, every other crash of that thread is still reported
//! (the handler runs on the thread's own stack); only an overflow is not.
//! A thread that already has an alternate stack of at least 32 KiB keeps
//! it; Rust's standard library gives its threads a smaller one, which is
//! replaced. Our stacks are 64 KiB plus a guard page, freed at thread exit.
//! They are not set up lazily on a thread's first capture: the capture
//! path makes no system call.
//!
//! ## Chaining
//! The handler that was installed before [`install`] (if any) is called
//! after the report with the same arguments (`SA_SIGINFO` or plain), on
//! our alternate stack and with our signal mask. `SIG_IGN` stays ignored
//! for signals sent by a process; a synchronous fault cannot be ignored
//! (the kernel would force the default action), so it gets the default.
//! A previous handler that returns without fixing the cause makes the
//! instruction fault again: the same fault (thread, signal, pc) is reported
//! once, then only passed on.
//! In a Rust program the standard library's SIGSEGV handler (which prints
//! "has overflowed its stack" and aborts) is such a previous handler: a
//! Rust stack overflow is reported, then ends with SIGABRT as it would
//! have.
//!
//! ## Panics
//! With [`Options::panic_hook`], a panic prints the same two-part report,
//! captured and symbolized in the panicking thread (a panic is not a
//! signal: this is safe), before the previous hook runs.
//!
//! ## Windows (x86-64)
//! [`install`] and the C entries have the same names, options and report
//! format; what differs (`crash/windows.rs` has the whole design):
//! - **Which exceptions.** Those nothing handles: an unhandled-exception
//!   filter (`SetUnhandledExceptionFilter`) reports them, so the
//!   exceptions a program handles itself (SEH `__except`, C++ `catch`,
//!   `catch_unwind`, its own vectored handler) are never reported, as a
//!   vectored handler, which sees every first-chance exception, would.
//!   One exception is taken at first chance by a vectored handler:
//!   `EXCEPTION_STACK_OVERFLOW`, whose dispatch has too little stack left
//!   to reach the filter (under wine 8 it never does); after its report
//!   the process ends with that code. `abort()` is the C runtime's
//!   `SIGABRT` (`signal`), reported from `RtlCaptureContext`, then the C
//!   runtime exits (status 3). [`Options::signals`] is not used there;
//!   [`Options::panic_hook`] is as on Linux.
//! - **A handler thread** started by [`install`], waiting on an event,
//!   does the report: the crashed thread only hands it its
//!   `EXCEPTION_POINTERS` and its stack's bounds, and waits. So the report
//!   has a whole stack to run on after a stack overflow, and no
//!   per-thread set-up (`install_thread`, Linux's) is needed.
//! - **The raw part**: `exception: EXCEPTION_ACCESS_VIOLATION: read of
//!   address 0x0 (code 0xc0000005, at 0x...)` (or `signal: SIGABRT: ...`),
//!   process, thread, time, then the frames as on Linux, each module's
//!   offset its RVA (no build-id: the minidump carries each module's
//!   CodeView record).
//! - **The helper** is started with `CreateProcessW` (its command line and
//!   environment built at install): `CALLSTACK_CRASH_HELPER`, else the
//!   program re-run with its command line. It writes the minidump first
//!   (the native Windows layout, `minidump::windows`, the crashed
//!   process read from outside with `ReadProcessMemory`, its threads
//!   suspended for `GetThreadContext`), then the symbolized part. The one
//!   allocation left in the crashed process is `CreateProcessW`'s own,
//!   inside kernel32: a crash that left the heap's lock held keeps the
//!   helper from starting (the wait is bounded; the raw part is out).
//! - Then the filter that was there before ours runs (the C runtime's in
//!   a mingw program), and the process ends with the exception's code.

#[cfg(target_os = "linux")]
mod altstack;
mod context;
#[cfg(all(feature = "remote", target_os = "linux"))]
mod dump;
mod env;
mod fmt;
#[cfg(target_os = "linux")]
mod handler;
#[cfg(target_os = "linux")]
mod helper;
mod panic;
#[cfg(feature = "symbolize")]
mod report;
#[cfg(feature = "symbolize")]
mod resolve;
#[cfg(target_os = "linux")]
mod signals;
#[cfg(target_os = "linux")]
mod snapshot;
/// The parsers [`crate::fuzzing`] hands to the fuzz targets.
#[cfg(target_os = "linux")]
pub(crate) mod fuzzing {
    pub(crate) use super::snapshot::{build_id_in_notes, maps_line_fields};
}
#[cfg(target_os = "linux")]
mod sys;
#[cfg(windows)]
mod windows;
#[cfg(all(windows, feature = "symbolize"))]
mod windows_dump;

#[cfg(feature = "symbolize")]
pub(crate) use env::{BEGIN_RAW, END_RAW};
#[cfg(all(target_os = "linux", feature = "symbolize"))]
pub(crate) use sys::monotonic_ns;
#[cfg(all(windows, feature = "symbolize"))]
pub(crate) use windows::monotonic_ns;

pub use context::{parse_context, CrashContext};
pub use env::{
    HELPER_ENV, HELPER_SUBCOMMAND, MINIDUMP_DIR_ENV, REPORT_ENV, SYMBOLIZE_ENV, TIMEOUT_ENV,
};
#[cfg(feature = "symbolize")]
pub use report::{parse_raw_reports, run_helper, symbolize_report, RawFrame, RawReport};
#[cfg(target_os = "linux")]
pub use signals::{code_words, signal_name, CRASH_SIGNALS};

use std::io;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// What [`install`] sets up.
#[derive(Clone, Debug)]
pub struct Options {
    /// Also append each report (raw and symbolized) to this file.
    pub report_path: Option<PathBuf>,
    /// Run the symbolizing helper after the raw part (default `true`).
    pub symbolize: bool,
    /// The helper program (default: `CALLSTACK_CRASH_HELPER`, else the
    /// `callstack` binary, else this program re-executed).
    pub helper: Option<PathBuf>,
    /// How long to wait for the helper (default 5 s;
    /// `CALLSTACK_CRASH_TIMEOUT_MS` overrides it).
    pub timeout: Duration,
    /// The signals to catch (default `CRASH_SIGNALS`). Linux only: on
    /// Windows the unhandled-exception filter sees every exception, and
    /// `SIGABRT` is always caught.
    pub signals: Vec<i32>,
    /// Also report panics (default `false`).
    pub panic_hook: bool,
    /// Write a minidump of the crashed process into this directory (see
    /// "Minidumps" in the [module docs](self)); default: the
    /// `CALLSTACK_CRASH_MINIDUMP_DIR` environment variable, else none.
    pub minidump_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            report_path: None,
            symbolize: true,
            helper: None,
            timeout: Duration::from_secs(5),
            #[cfg(target_os = "linux")]
            signals: CRASH_SIGNALS.to_vec(),
            #[cfg(not(target_os = "linux"))]
            signals: Vec::new(),
            panic_hook: false,
            minidump_dir: None,
        }
    }
}

#[cfg(target_os = "linux")]
static INSTALL: Mutex<()> = Mutex::new(());

/// Installs the crash handlers (see the [module docs](self)).
///
/// If `CALLSTACK_CRASH_SYMBOLIZE=1` is in the environment, this process is
/// a symbolizing helper: `install` reads a raw report on standard input,
/// prints the symbolized report and **exits the process**.
///
/// Not async-signal-safe; call it early in `main`, from one thread. Calling
/// it again replaces the settings (the handlers that were there before the
/// first call stay the ones chained to).
#[cfg(target_os = "linux")]
pub fn install(options: Options) -> io::Result<()> {
    become_helper_if_asked();
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    snapshot::refresh();
    crate::prepare_thread();
    if !crate::has_dl_find_object() {
        // Without glibc's lock-free `_dl_find_object` (glibc < 2.35) the
        // exact unwinder needs its tables compiled before a signal comes.
        crate::prepare();
    }
    let timeout = std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(options.timeout);
    let helper_off = helper_off(&options);
    let minidump_dir = minidump_dir(&options)?;
    let symbolize = options.symbolize && !helper_off;
    let plan = (symbolize || !minidump_dir.is_empty()).then(|| {
        helper::plan(
            options.helper.as_deref(),
            timeout.as_nanos().min(u64::MAX as u128) as u64,
            options.report_path.as_deref(),
        )
    });
    let report_path = options
        .report_path
        .as_ref()
        .map(|p| {
            let mut v = p.as_os_str().as_encoded_bytes().to_vec();
            v.retain(|&b| b != 0);
            v.push(0);
            v
        })
        .unwrap_or_default();
    let cfg = Box::new(handler::Config {
        report_path,
        plan,
        symbolize,
        minidump_dir,
    });
    // Published once per install and never freed: a handler running on
    // another thread may still read the previous one.
    handler::CONFIG.store(Box::leak(cfg), core::sync::atomic::Ordering::Release);
    altstack::install_thread()?;
    handler::prepare_report_stack()?;
    let ours: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) = handler::on_signal;
    let ours = ours as usize;
    for &sig in &options.signals {
        if !(1..65).contains(&sig) || sig == libc::SIGKILL || sig == libc::SIGSTOP {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot catch signal {sig}"),
            ));
        }
        // SAFETY: sigaction with valid pointers; PREVIOUS is written here,
        // under the install lock, before our handler is installed for `sig`.
        unsafe {
            let mut old: libc::sigaction = core::mem::zeroed();
            if libc::sigaction(sig, core::ptr::null(), &mut old) != 0 {
                return Err(io::Error::last_os_error());
            }
            if old.sa_sigaction != ours {
                (*handler::PREVIOUS.get())[sig as usize] = Some(old);
            }
            let mut act: libc::sigaction = core::mem::zeroed();
            act.sa_sigaction = ours;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(sig, &act, core::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    if options.panic_hook {
        panic::install(options.report_path.clone());
    }
    Ok(())
}

/// In a helper process (`CALLSTACK_CRASH_SYMBOLIZE=1`): runs the helper
/// and exits.
fn become_helper_if_asked() {
    if std::env::var_os(SYMBOLIZE_ENV).is_some_and(|v| v == "1") {
        #[cfg(feature = "symbolize")]
        std::process::exit(report::run_helper());
        #[cfg(not(feature = "symbolize"))]
        {
            eprintln!("callstack: built without the `symbolize` feature: cannot symbolize");
            std::process::exit(3);
        }
    }
}

/// Whether `CALLSTACK_CRASH_HELPER=none` turns the helper off.
fn helper_off(options: &Options) -> bool {
    std::env::var_os(HELPER_ENV).is_some_and(|v| v == "none") && options.helper.is_none()
}

/// The minidump directory of `options` (or of the environment), absolute,
/// as bytes; empty for none.
fn minidump_dir(options: &Options) -> io::Result<Vec<u8>> {
    Ok(
        match options
            .minidump_dir
            .clone()
            .or_else(|| std::env::var_os(MINIDUMP_DIR_ENV).map(PathBuf::from))
            .filter(|d| !d.as_os_str().is_empty())
        {
            Some(d) => {
                let d = std::path::absolute(&d).unwrap_or(d);
                let bytes = d.as_os_str().as_encoded_bytes().to_vec();
                if bytes.iter().any(|&b| b == 0 || b == b'\n') {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "minidump directory: a path with a NUL or newline byte",
                    ));
                }
                bytes
            }
            None => Vec::new(),
        },
    )
}

/// Installs the crash handlers (see the [module docs](self) and, for
/// Windows, the unhandled-exception filter of `crash/windows.rs`).
///
/// If `CALLSTACK_CRASH_SYMBOLIZE=1` is in the environment, this process is
/// a symbolizing helper: `install` reads a raw report on standard input,
/// writes the minidump it asks for and the symbolized report, and **exits
/// the process**.
///
/// Call it early in `main`, from one thread. Calling it again replaces the
/// settings.
#[cfg(windows)]
pub fn install(options: Options) -> io::Result<()> {
    become_helper_if_asked();
    let _guard = WINDOWS_INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let minidump_dir = minidump_dir(&options)?;
    let symbolize = options.symbolize && !helper_off(&options);
    if options.panic_hook {
        panic::install(options.report_path.clone());
    }
    windows::install(options, symbolize, minidump_dir)
}

#[cfg(windows)]
static WINDOWS_INSTALL: Mutex<()> = Mutex::new(());

/// Gives the calling thread an alternate signal stack, so that its stack
/// overflow is reported too (see the per-thread rule in the [module
/// docs](self)). Idempotent. Call it at the start of each thread you
/// create; the thread that called [`install`] needs nothing more.
#[cfg(target_os = "linux")]
pub fn install_thread() -> io::Result<()> {
    altstack::install_thread()
}

/// Takes a new snapshot of the loaded modules for the handler (after
/// `dlopen`; without it, addresses in new modules are still found through
/// `/proc/self/maps`, more slowly).
#[cfg(target_os = "linux")]
pub fn refresh_modules() {
    snapshot::refresh();
}
