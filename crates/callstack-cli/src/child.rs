//! Running a wrapped command as `time`, perf and heaptrack do: the program
//! keeps our standard streams and process group (it is in the foreground
//! of a terminal as we were), a signal sent to our pid by another process
//! (`kill PID`) is passed on to it, and our exit status is its own: its
//! exit code, or 128 + the signal's number when a signal ended it.
//!
//! Signals a terminal sends (Ctrl-C, Ctrl-\, a hangup) reach the whole
//! foreground process group, the program included: those are not passed
//! on a second time (their `si_code` is `SI_KERNEL`), and they do not end
//! us before the program.

use std::ffi::OsString;
use std::process::{Command, ExitCode};

/// The signals passed on to the program.
const FORWARDED: [libc::c_int; 9] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGWINCH,
    libc::SIGCONT,
];

/// How the program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it (`core`: it dumped core).
    Signaled(i32, bool),
}

impl Ended {
    /// The status a shell would give: the code, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            Ended::Exited(c) => c,
            Ended::Signaled(s, _) => 128 + s,
        }
    }

    /// Our exit code for it.
    pub fn exit_code(self) -> ExitCode {
        ExitCode::from(self.code().clamp(0, 255) as u8)
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Ended::Exited(c) => write!(f, "exit status {c}"),
            Ended::Signaled(s, core) => {
                // SAFETY: strsignal returns a static or thread-local string.
                let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(s)) };
                write!(f, "signal {s} ({})", name.to_string_lossy())?;
                if core {
                    write!(f, ", core dumped")?;
                }
                Ok(())
            }
        }
    }
}

/// The program could not be started.
#[derive(Debug)]
pub struct SpawnError {
    /// What went wrong, with the program's name.
    pub message: String,
    /// The status to exit with, as `env` and shells do: 127 when the
    /// program is not found, 126 when it cannot be run.
    pub exit_code: u8,
}

/// The program's pid, for the thread that passes signals on (0: none yet).
static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

fn forwarded_set() -> libc::sigset_t {
    // SAFETY: a sigset_t filled by sigemptyset/sigaddset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Spawns `cmd` and waits for it, passing signals sent to us on to it.
/// The command's own stdio settings are kept (inherited by default).
/// Returns its pid and how it ended. Errors: it could not be started, or
/// (status 1) waiting failed.
pub fn run(mut cmd: Command, name: &OsString) -> Result<(u32, Ended), SpawnError> {
    let set = forwarded_set();
    // Block the signals in this thread before the program exists (the
    // thread below inherits the mask and takes them with sigwaitinfo; the
    // program unblocks them before its exec).
    // SAFETY: changing this thread's signal mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    // The program starts with none of them blocked (the mask is inherited
    // through fork and exec).
    // SAFETY: pthread_sigmask is async-signal-safe; `set` is a copy owned
    // by the closure.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let child = cmd.spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            // SAFETY: restoring this thread's mask.
            unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
            return Err(SpawnError {
                message: format!("{}: {e}", std::path::Path::new(name).display()),
                exit_code: if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                },
            });
        }
    };
    let pid = child.id() as i32;
    CHILD.store(pid, std::sync::atomic::Ordering::Release);
    std::thread::spawn(move || loop {
        // SAFETY: a zeroed siginfo_t for sigwaitinfo to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid signal set; the signals are blocked in
        // every thread of this process.
        let s = unsafe { libc::sigwaitinfo(&set, &mut info) };
        if s < 0 {
            continue;
        }
        let pid = CHILD.load(std::sync::atomic::Ordering::Acquire);
        if pid > 0 && info.si_code == libc::SI_KERNEL {
            // From the terminal (or the kernel): the program got its own.
            continue;
        }
        if pid > 0 {
            // SAFETY: a signal to the program we started, not yet reaped
            // (the pid is cleared before the wait that reaps it).
            unsafe { libc::kill(pid, s) };
        } else {
            // The program is gone: the signal is ours, with its default
            // action (the main thread has it unblocked by now).
            // SAFETY: setting a default disposition and signalling us.
            unsafe {
                libc::signal(s, libc::SIG_DFL);
                libc::kill(libc::getpid(), s);
            }
        }
    });
    // Wait until it has ended without reaping it, so that the pid cannot
    // be reused while signals may still be passed on to it.
    loop {
        // SAFETY: waiting for our own child, a zeroed siginfo_t to fill.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            break;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(SpawnError {
                message: format!("wait: {}", std::io::Error::last_os_error()),
                exit_code: 1,
            });
        }
    }
    CHILD.store(0, std::sync::atomic::Ordering::Release);
    let mut status = 0;
    // SAFETY: reaping our own child, which has ended.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(SpawnError {
                message: format!("wait: {}", std::io::Error::last_os_error()),
                exit_code: 1,
            });
        }
    }
    // Signals sent to us from now on are ours, with their usual effect.
    // SAFETY: changing this thread's signal mask.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    // `child` was reaped above: dropping it does not wait again.
    drop(child);
    let ended = if libc::WIFSIGNALED(status) {
        Ended::Signaled(libc::WTERMSIG(status), libc::WCOREDUMP(status))
    } else {
        Ended::Exited(libc::WEXITSTATUS(status))
    };
    Ok((pid as u32, ended))
}
