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
//! The profile is written at exit (`atexit`) and at `_exit`/`_Exit`
//! (replaced here: the profile is written, then the process ends as they
//! would end it). A process that dies by a signal writes none (its file
//! stays empty, and `callstack record` removes it): perf events, which
//! record from outside, keep those.

use callstack::profiler::Profiler;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

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
    match Profiler::start(hz) {
        Ok(p) => {
            *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some((p, file));
            OWNER_PID.store(pid, Ordering::Relaxed);
            // SAFETY: registers a plain extern "C" function.
            unsafe { libc::atexit(finish) };
        }
        Err(e) => eprintln!("callstack record: cannot start the in-process sampler: {e}"),
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
    let profile = profiler.stop();
    if let Err(e) = profile.write_trace(std::io::BufWriter::new(file)) {
        eprintln!("callstack record: writing the profile: {e}");
    }
}
