//! The symbolizing helper process: chosen and prepared at install time,
//! started from the signal handler with `clone` and `execve`, fed the raw
//! report through a pipe, and waited for with a timeout.
//!
//! Why `clone(CLONE_VM | CLONE_VFORK | SIGCHLD)` on a stack of its own and
//! not `fork()`: glibc's `fork()` runs the `pthread_atfork` handlers and
//! takes malloc's arena locks, so it deadlocks if the crash happened inside
//! malloc; and any fork copies the page tables of the crashed process (4 ms
//! for 256 MiB resident, growing with the heap). The child shares the
//! memory until its `execve` (as `posix_spawn`'s does) and calls only
//! `sigaction`, `dup2`, `open`, `sigprocmask` and `execve` (all plain system
//! calls) before the new program replaces it.
//!
//! While a helper runs, `SIGCHLD` is set to its default action (no handler,
//! no automatic reaping) and put back after: a program whose `SIGCHLD`
//! handler reaps every child (`waitpid(-1, ...)`), or that ignores
//! `SIGCHLD` (the kernel then reaps children itself), would otherwise reap
//! the helper before we do and take its exit status away. A program's
//! handler gets one `SIGCHLD` after, for its own children that ended
//! meanwhile. A thread of the
//! program that sits in `waitpid(-1, ...)` can still reap it: the report
//! then says the status is unknown.

use super::sys::{self, SyncCell};
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::env::{HELPER_ENV, HELPER_SUBCOMMAND, REPORT_ENV, SYMBOLIZE_ENV};

/// One program to try, ready for `execve`.
pub(crate) struct Candidate {
    path: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    _strings: Vec<CString>,
    /// For the report: which helper this is.
    pub(crate) label: CString,
}

/// Everything the handler needs to run a helper, built at install time.
pub(crate) struct Plan {
    pub(crate) candidates: Vec<Candidate>,
    pub(crate) timeout_ns: u64,
}

// SAFETY: the raw pointers point into the CStrings owned by the same
// Candidate, which is never mutated after construction.
unsafe impl Send for Plan {}
// SAFETY: as above: read-only after construction.
unsafe impl Sync for Plan {}

fn cstring(b: &[u8]) -> CString {
    CString::new(b.iter().copied().filter(|&c| c != 0).collect::<Vec<u8>>()).unwrap()
}

impl Candidate {
    fn new(label: &str, path: &Path, args: &[OsString], report: Option<&Path>) -> Candidate {
        let path_c = cstring(path.as_os_str().as_bytes());
        let mut strings = Vec::new();
        strings.push(path_c.clone());
        for a in args {
            strings.push(cstring(a.as_bytes()));
        }
        let nargs = strings.len();
        for (k, v) in std::env::vars_os() {
            let k = k.as_bytes();
            if k == SYMBOLIZE_ENV.as_bytes() || k == REPORT_ENV.as_bytes() {
                continue;
            }
            let mut kv = k.to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            strings.push(cstring(&kv));
        }
        strings.push(cstring(format!("{SYMBOLIZE_ENV}=1").as_bytes()));
        if let Some(r) = report {
            let mut kv = format!("{REPORT_ENV}=").into_bytes();
            kv.extend_from_slice(r.as_os_str().as_bytes());
            strings.push(cstring(&kv));
        }
        let mut argv: Vec<_> = strings[..nargs].iter().map(|s| s.as_ptr()).collect();
        argv.push(core::ptr::null());
        let mut envp: Vec<_> = strings[nargs..].iter().map(|s| s.as_ptr()).collect();
        envp.push(core::ptr::null());
        Candidate {
            path: path_c,
            argv,
            envp,
            _strings: strings,
            label: cstring(format!("{label} {}", path.display()).as_bytes()),
        }
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Finds the `callstack` binary next to the executable or on `PATH`.
fn find_callstack_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let next_to = exe.parent().map(|d| d.join("callstack"));
    if let Some(p) = next_to.filter(|p| is_executable(p) && *p != exe) {
        return Some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("callstack"))
        .find(|p| is_executable(p))
}

/// Builds the list of helpers to try, best first: the one the user named
/// (option, then `CALLSTACK_CRASH_HELPER`), else the `callstack` binary,
/// then this very program re-executed in symbolizer mode.
pub(crate) fn plan(helper: Option<&Path>, timeout_ns: u64, report: Option<&Path>) -> Plan {
    let sub = [OsString::from(HELPER_SUBCOMMAND)];
    let mut candidates = Vec::new();
    // `none` (symbolizing off) names no program: with a minidump to write
    // the search below still finds one.
    let env_helper = std::env::var_os(HELPER_ENV)
        .filter(|v| v != "none")
        .map(PathBuf::from);
    if let Some(h) = helper.map(Path::to_path_buf).or(env_helper) {
        candidates.push(Candidate::new("user helper", &h, &sub, report));
        return Plan {
            candidates,
            timeout_ns,
        };
    }
    if let Some(cli) = find_callstack_binary() {
        candidates.push(Candidate::new("callstack", &cli, &sub, report));
    }
    // Ourselves, with the same arguments, so that the program reaches
    // `install()` the way it did, and switches to symbolizer mode there.
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    candidates.push(Candidate::new(
        "self",
        Path::new("/proc/self/exe"),
        &args,
        report,
    ));
    Plan {
        candidates,
        timeout_ns,
    }
}

/// How a helper run ended.
pub(crate) enum Outcome {
    /// Exited with this status (0 is success).
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
    /// Did not finish in time and was killed.
    TimedOut,
    /// Could not be started.
    SpawnFailed(i32),
    /// Ended, but something else in the program reaped it: status unknown.
    ReapedElsewhere,
}

/// `SIGCHLD` at its default action for as long as this lives (see the
/// module docs); the previous action is restored on drop.
struct DefaultSigchld {
    old: libc::sigaction,
}

impl DefaultSigchld {
    fn set() -> DefaultSigchld {
        // SAFETY: sigaction with valid structures (zeroed is a valid
        // `sigaction`); SIG_DFL with no flags and an empty mask.
        unsafe {
            let mut dfl: libc::sigaction = core::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut dfl.sa_mask);
            let mut old: libc::sigaction = core::mem::zeroed();
            libc::sigaction(libc::SIGCHLD, &dfl, &mut old);
            DefaultSigchld { old }
        }
    }
}

impl Drop for DefaultSigchld {
    fn drop(&mut self) {
        // SAFETY: restores the action read in `set`; then, if it is a
        // handler, sends one SIGCHLD to the process: a SIGCHLD for the
        // program's own children that ended meanwhile was discarded (the
        // default action ignores it), and handlers reap in a loop, so one
        // late signal stands for all of them.
        unsafe {
            libc::sigaction(libc::SIGCHLD, &self.old, core::ptr::null_mut());
            let h = self.old.sa_sigaction;
            if h != libc::SIG_DFL && h != libc::SIG_IGN {
                libc::kill(libc::getpid(), libc::SIGCHLD);
            }
        }
    }
}

/// Runs one helper: clone, exec, feed the `input` parts in order, wait until
/// `deadline_ns` (monotonic). Async-signal-safe: system calls only, no
/// allocation.
///
/// While it runs the helper may trace this process (it reads every thread
/// with `ptrace` to write a minidump): `prctl(PR_SET_PTRACER, helper)`
/// allows a child to attach to its parent under Yama's `ptrace_scope=1`
/// (without Yama the call fails with `EINVAL` and nothing is needed), and
/// is undone once the helper has ended.
pub(crate) fn run(c: &Candidate, input: &[&[u8]], deadline_ns: u64) -> Outcome {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid two-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Outcome::SpawnFailed(sys::errno());
    }
    let (rd, wr) = (fds[0], fds[1]);
    let _sigchld = DefaultSigchld::set();
    let pid = spawn(c, rd);
    sys::close(rd);
    if pid < 0 {
        let e = sys::errno();
        sys::close(wr);
        return Outcome::SpawnFailed(e);
    }
    let pid = pid as i32;
    // Before the helper reads its input to the end, hence before it can
    // attach to us.
    set_ptracer(pid as libc::c_ulong);
    for part in input {
        feed(wr, part, deadline_ns);
    }
    sys::close(wr);
    let out = wait(pid, deadline_ns);
    set_ptracer(0);
    out
}

/// `prctl(PR_SET_PTRACER, pid)` (0: none); errors (no Yama) are ignored.
fn set_ptracer(pid: libc::c_ulong) {
    // SAFETY: a plain system call with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, pid, 0, 0, 0) };
}

/// The stack the child runs on from `clone` to `execve` (it shares the
/// crashed process's memory meanwhile). Used only by the holder of the
/// crash lock, whose thread waits (`CLONE_VFORK`) while the child runs.
#[repr(align(16))]
struct ChildStack([u8; 32 * 1024]);
static CHILD_STACK: SyncCell<ChildStack> = SyncCell::new(ChildStack([0; 32 * 1024]));

struct ChildArgs<'a> {
    c: &'a Candidate,
    rd: i32,
}

extern "C" fn child_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the ChildArgs of `spawn`, alive while the parent
    // waits for the child to exec (CLONE_VFORK).
    let a = unsafe { &*(arg as *const ChildArgs<'_>) };
    child(a.c, a.rd)
}

/// Starts the helper: `clone(CLONE_VM | CLONE_VFORK | SIGCHLD)` on a stack of
/// its own (what `posix_spawn` does, and not glibc's `fork()`, whose atfork
/// handlers take malloc's locks): the child shares the crashed process's
/// memory until its `execve`, so no page table is copied (a plain fork of a
/// process with 256 MiB resident costs 4 ms, and grows with the heap), and
/// this thread waits meanwhile. Every signal is blocked around the call, and
/// the child puts the handled ones back to their default before unblocking
/// them: no handler of the program runs in the child on shared memory.
/// Returns the child's pid, or -1 with errno set.
fn spawn(c: &Candidate, rd: i32) -> i64 {
    let args = ChildArgs { c, rd };
    // SAFETY: the child stack is ours while we hold the crash lock (the
    // only caller); sigset manipulation on local values; `clone` with a
    // function, a stack top 16-byte aligned and an argument that outlives
    // the child's use of it (CLONE_VFORK returns after its execve or exit).
    unsafe {
        let stack = &mut (*CHILD_STACK.get()).0;
        let top = stack.as_mut_ptr().add(stack.len());
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_entry,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&args as *const ChildArgs<'_>).cast_mut().cast(),
        );
        let e = sys::errno();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        sys::set_errno(e);
        pid as i64
    }
}

/// In the child: the program's signal handlers back to their defaults,
/// standard input from the pipe, standard output to `/dev/null` (the
/// report goes to standard error), all signals unblocked, then `execve`.
/// Never returns.
fn child(c: &Candidate, rd: i32) -> ! {
    // SAFETY: plain system calls on descriptors this child owns (its own
    // descriptor table: no CLONE_FILES) and on its own handler table (no
    // CLONE_SIGHAND); the argv/envp arrays are NUL-terminated arrays of C
    // strings prepared at install time.
    unsafe {
        let mut dfl: libc::sigaction = core::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..65 {
            let mut cur: libc::sigaction = core::mem::zeroed();
            if libc::sigaction(sig, core::ptr::null(), &mut cur) == 0
                && cur.sa_sigaction != libc::SIG_DFL
                && cur.sa_sigaction != libc::SIG_IGN
            {
                libc::sigaction(sig, &dfl, core::ptr::null_mut());
            }
        }
        libc::dup2(rd, 0);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
        if null >= 0 {
            libc::dup2(null, 1);
        }
        let mut all: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, core::ptr::null_mut());
        libc::execve(c.path.as_ptr(), c.argv.as_ptr(), c.envp.as_ptr());
        libc::_exit(127)
    }
}

fn remaining_ms(deadline_ns: u64) -> i32 {
    let now = sys::monotonic_ns();
    if now >= deadline_ns {
        0
    } else {
        (((deadline_ns - now) / 1_000_000) + 1).min(i32::MAX as u64) as i32
    }
}

/// Writes `input` to the pipe, never blocking past the deadline.
fn feed(wr: i32, mut input: &[u8], deadline_ns: u64) {
    // SAFETY: setting O_NONBLOCK on our own pipe end.
    unsafe {
        let fl = libc::fcntl(wr, libc::F_GETFL);
        libc::fcntl(wr, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    // A helper that dies early must not kill us with SIGPIPE: the write
    // then fails with EPIPE instead.
    let mut old: libc::sigset_t;
    let mut pipe_set: libc::sigset_t;
    // SAFETY: sigset manipulation on local values; blocks SIGPIPE for this
    // thread only, restored below.
    unsafe {
        old = core::mem::zeroed();
        pipe_set = core::mem::zeroed();
        libc::sigemptyset(&mut pipe_set);
        libc::sigaddset(&mut pipe_set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe_set, &mut old);
    }
    while !input.is_empty() {
        // SAFETY: writing from a valid slice.
        let n = unsafe { libc::write(wr, input.as_ptr().cast(), input.len()) };
        if n > 0 {
            input = &input[n as usize..];
            continue;
        }
        let e = sys::errno();
        if n < 0 && e == libc::EINTR {
            continue;
        }
        if n < 0 && e == libc::EAGAIN {
            let ms = remaining_ms(deadline_ns);
            if ms == 0 {
                break;
            }
            let mut p = libc::pollfd {
                fd: wr,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, ms) };
            continue;
        }
        break;
    }
    // SAFETY: drop a SIGPIPE our writes raised (if any) before unblocking,
    // then restore the mask.
    unsafe {
        let mut pending: libc::sigset_t = core::mem::zeroed();
        libc::sigpending(&mut pending);
        if libc::sigismember(&pending, libc::SIGPIPE) == 1 {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&pipe_set, core::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
    }
}

/// Polls `waitpid(WNOHANG)` every millisecond until the child ends or the
/// deadline passes; then kills it with SIGKILL and reaps it.
fn wait(pid: i32, deadline_ns: u64) -> Outcome {
    loop {
        let mut status = 0i32;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            if libc::WIFEXITED(status) {
                return Outcome::Exited(libc::WEXITSTATUS(status));
            }
            if libc::WIFSIGNALED(status) {
                return Outcome::Signaled(libc::WTERMSIG(status));
            }
        } else if r < 0 && sys::errno() != libc::EINTR {
            // ECHILD: another thread of the program reaped it: it ended.
            return Outcome::ReapedElsewhere;
        }
        if sys::monotonic_ns() >= deadline_ns {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Outcome::TimedOut;
        }
        sys::sleep_ns(1_000_000);
    }
}
