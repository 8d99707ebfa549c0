//! `Trace::symbolize`: the two-line common case, and a trace from a signal
//! context whose first address is the interrupted pc (looked up exactly,
//! not as a return address).
#![cfg(all(target_os = "linux", feature = "symbolize"))]

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

#[inline(never)]
fn leaf() -> callstack::Trace<64> {
    black_box(callstack::Trace::capture_exact(0))
}

#[inline(never)]
fn mid() -> callstack::Trace<64> {
    let t = leaf();
    black_box(t)
}

fn function_names(t: &callstack::symbolize::SymbolizedTrace) -> Vec<String> {
    t.frames
        .iter()
        .map(|(_, s)| {
            s.frames
                .last()
                .and_then(|f| f.function.as_deref())
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[test]
fn a_captured_trace_prints_its_names() {
    let t = mid();
    assert!(!t.first_is_exact());
    let s = t.symbolize();
    let names = function_names(&s);
    assert_eq!(names[0], "trace_symbolize::leaf", "{s}");
    assert_eq!(names[1], "trace_symbolize::mid", "{s}");
    let text = s.to_string();
    assert!(text.starts_with("#0   0x"), "{text}");
    // Frame 0's last level is the function itself (before it, the inlined
    // capture functions of a debug build).
    let frame0: Vec<&str> = text.lines().filter(|l| l.starts_with("#0 ")).collect();
    assert!(
        frame0
            .last()
            .unwrap()
            .contains(" in trace_symbolize::leaf at "),
        "{text}"
    );
}

static FROM_SIGNAL: Mutex<Option<callstack::Trace<64>>> = Mutex::new(None);
static IN_SPIN: AtomicBool = AtomicBool::new(false);

extern "C" fn on_usr1(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes the interrupted context.
    let uc = unsafe { &*(ctx as *const libc::ucontext_t) };
    let t = callstack::Trace::<64>::capture_from_context(uc);
    // The test thread waits on this lock only after the signal was handled.
    if let Ok(mut g) = FROM_SIGNAL.try_lock() {
        *g = Some(t);
    }
}

/// A loop that is interrupted mid-instruction: frame 0 is inside it.
#[inline(never)]
fn spin_until_signaled(tid: libc::pid_t) {
    IN_SPIN.store(true, Ordering::SeqCst);
    // SAFETY: sends SIGUSR1 to this very thread.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGUSR1) };
    black_box(());
}

#[test]
fn a_trace_from_a_signal_context_names_the_interrupted_function() {
    // SAFETY: installs a handler that only captures.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigaction(libc::SIGUSR1, &sa, core::ptr::null_mut());
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    spin_until_signaled(tid);
    let t = FROM_SIGNAL.lock().unwrap().take().expect("the handler ran");
    assert!(t.first_is_exact());
    let s = t.symbolize();
    let names = function_names(&s);
    // The signal was taken at the syscall's return inside the libc wrapper
    // (frame 0, an exact pc), called from spin_until_signaled.
    let at = names
        .iter()
        .position(|n| n == "trace_symbolize::spin_until_signaled")
        .unwrap_or_else(|| panic!("{s}"));
    assert!(at <= 2, "{s}");
    assert!(s.frames[0].1.module.is_some(), "{s}");
}
