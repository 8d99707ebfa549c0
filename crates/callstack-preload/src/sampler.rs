//! The in-process sampler `callstack record` falls back to where perf
//! events are refused (`perf_event_paranoid`, containers, kernels without
//! perf): preloaded into the command, it runs [`callstack::profiler`] from
//! the program's start to its exit and writes the profile as a callstack
//! trace file (the format `callstack record` writes).
//!
//! Inert unless `CALLSTACK_RECORD_OUT` is set; `CALLSTACK_RECORD_HZ` sets the
//! rate (default 999). The first process to start writes the file itself;
//! a program it execs (which starts a sampler of its own) writes
//! `FILE.PID`. A forked child that does not exec is not sampled (the
//! profiler's thread does not survive `fork`).
//!
//! The profile is written at exit (`atexit`), at `_exit`/`_Exit`
//! (replaced here: the profile is written, then the process ends as they
//! would end it), and at a signal that would end the process (SIGINT,
//! SIGTERM, SIGHUP, SIGQUIT, SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL)
//! while the program has left it to its default action: the handler
//! (installed at start for those signals still at their default) hands the
//! writing to a thread of the sampler's, waits for it (at most
//! [`FATAL_WAIT_MS`]: a writer stuck on a lock the dying thread holds must
//! not keep the process alive), then lets the signal end the process as it
//! would have. SIGKILL leaves no profile (the file stays empty, and
//! `callstack record` removes it): perf events, which record from outside,
//! keep that too.

use callstack::profiler::Profiler;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Mutex;

/// The signals whose default action ends the process that the sampler
/// writes the profile at.
const FATAL: [libc::c_int; 9] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGABRT,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
];
/// How long a fatal signal's handler waits for the profile to be written.
pub const FATAL_WAIT_MS: libc::c_int = 10_000;
/// The pipe a fatal signal's handler asks the writer thread through (write
/// end), and the one it is told "written" through (read end); -1 before.
static ASK_FD: AtomicI32 = AtomicI32::new(-1);
static DONE_FD: AtomicI32 = AtomicI32::new(-1);
/// Whether a fatal signal has asked for the profile already.
static ASKED: AtomicBool = AtomicBool::new(false);

static RUNNING: Mutex<Option<(Profiler, std::fs::File)>> = Mutex::new(None);
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    let Some(out) = std::env::var_os("CALLSTACK_RECORD_OUT") else {
        return;
    };
    let hz = std::env::var("CALLSTACK_RECORD_HZ")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(999);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // The command itself creates FILE; a program it execs finds it taken.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&out)
        .or_else(|_| {
            let mut p = out.clone();
            p.push(format!(".{pid}"));
            std::fs::File::create(p)
        });
    let file = match file {
        Ok(f) => f,
        Err(e) => {
            eprintln!("callstack record: {}: {e}", out.to_string_lossy());
            return;
        }
    };
    // The sampler's threads (the profiler's collector, the writer) never
    // take a fatal signal: created with those blocked, they keep them
    // blocked. One sent to the process is then taken by a thread of the
    // program's; taken by the writer, it would wait for itself, by the
    // collector, for a stop that joins it (seen on a loaded machine: a
    // program thread preempted with a SIGPROF pending does not take a
    // signal sent to its process).
    let mask = block_fatal();
    match Profiler::start(hz) {
        Ok(p) => {
            *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some((p, file));
            OWNER_PID.store(pid, Ordering::Relaxed);
            // SAFETY: registers a plain extern "C" function.
            unsafe { libc::atexit(finish) };
            catch_fatal_signals();
        }
        Err(e) => eprintln!("callstack record: cannot start the in-process sampler: {e}"),
    }
    // SAFETY: restores this thread's mask as it was.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut()) };
}

/// Blocks the signals of [`FATAL`] in this thread; the mask before.
fn block_fatal() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, set up by sigemptyset and sigaddset;
    // pthread_sigmask writes the old mask into ours.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FATAL {
            libc::sigaddset(&mut set, sig);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

/// Starts the writer thread and installs [`on_fatal`] for the signals of
/// [`FATAL`] still at their default action.
fn catch_fatal_signals() {
    let mut ask = [0i32; 2];
    let mut done = [0i32; 2];
    // SAFETY: pipe2 writes two fds into each array.
    let ok = unsafe {
        libc::pipe2(ask.as_mut_ptr(), libc::O_CLOEXEC) == 0
            && libc::pipe2(done.as_mut_ptr(), libc::O_CLOEXEC) == 0
    };
    if !ok {
        return;
    }
    let (ask_r, done_w) = (ask[0], done[1]);
    let writer = std::thread::Builder::new()
        .name("callstack-rec".into())
        .spawn(move || loop {
            let mut b = [0u8; 1];
            // SAFETY: reads into our buffer from our pipe.
            let n = unsafe { libc::read(ask_r, b.as_mut_ptr().cast(), 1) };
            if n == 1 {
                finish();
                // SAFETY: writes one byte from our buffer to our pipe.
                unsafe { libc::write(done_w, b.as_ptr().cast(), 1) };
            } else if n == 0 {
                return;
            }
        });
    if writer.is_err() {
        return;
    }
    ASK_FD.store(ask[1], Ordering::Relaxed);
    DONE_FD.store(done[0], Ordering::Relaxed);
    for sig in FATAL {
        // SAFETY: sigaction with zeroed, then filled, structs; the handler
        // makes only async-signal-safe calls.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_fatal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// A signal that ends the process: in the process that started the
/// sampler, asks the writer thread for the profile and waits for it
/// (bounded), then ends the process by the signal's default action.
/// Async-signal-safe: getpid, write, poll, signal, raise.
extern "C" fn on_fatal(sig: libc::c_int) {
    // SAFETY: only async-signal-safe calls, on our fds and this signal.
    unsafe {
        if libc::getpid() == OWNER_PID.load(Ordering::Relaxed) {
            if !ASKED.swap(true, Ordering::AcqRel) {
                let b = [sig as u8];
                libc::write(ASK_FD.load(Ordering::Relaxed), b.as_ptr().cast(), 1);
            }
            // Every thread that meets a fatal signal waits for the one
            // profile (its byte is never read: each poll sees it).
            let mut pfd = libc::pollfd {
                fd: DONE_FD.load(Ordering::Relaxed),
                events: libc::POLLIN,
                revents: 0,
            };
            libc::poll(&mut pfd, 1, FATAL_WAIT_MS);
        }
        // The default action, once this handler returns (the signal is
        // blocked until then): the process ends by the signal, with its
        // status (and a core, where the signal dumps one).
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// `_exit`, as the program sees it: writes the profile (in the process
/// that started the sampler only: a `vfork` child shares its memory), then
/// ends the process as glibc's `_exit` does.
#[no_mangle]
pub extern "C" fn _exit(status: libc::c_int) -> ! {
    end_now(status)
}

/// `_Exit`: the same as [`_exit`].
#[no_mangle]
pub extern "C" fn _Exit(status: libc::c_int) -> ! {
    end_now(status)
}

fn end_now(status: libc::c_int) -> ! {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    if me == OWNER_PID.load(Ordering::Relaxed) {
        finish();
    }
    loop {
        // SAFETY: exit_group ends every thread of the process; it does not
        // return.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

extern "C" fn finish() {
    let taken = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some((profiler, file)) = taken else {
        return;
    };
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != OWNER_PID.load(Ordering::Relaxed) {
        // A forked child: the profiler's thread is not here to stop.
        std::mem::forget(profiler);
        return;
    }
    let mut profile = profiler.stop();
    // JIT code named while the perf map is surely there.
    profile.name_jit_code();
    if let Err(e) = profile.write_trace(std::io::BufWriter::new(file)) {
        eprintln!("callstack record: writing the profile: {e}");
    }
}
