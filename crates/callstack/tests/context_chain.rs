//! `capture_from_context` in a signal handler: a thread spinning in Rust
//! code (`spin`, under `level_b` and `level_a`) is interrupted by
//! `pthread_kill`; the handler's capture from the `ucontext_t` starts at
//! the interrupted pc and names the spinning chain exactly. The
//! architecture's `regs_from_ucontext` and its CFI rules are what this
//! checks (run in process on every architecture, under qemu-user for
//! AArch64 and RISC-V 64).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static DONE: AtomicBool = AtomicBool::new(false);
static N: AtomicUsize = AtomicUsize::new(0);
static OUT: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];

extern "C" fn on_usr1(_: libc::c_int, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    if DONE.load(Ordering::SeqCst) {
        return;
    }
    let mut out = [0usize; 64];
    // SAFETY: the kernel passes a valid ucontext_t.
    let n = callstack::capture_from_context(unsafe { &*(uc as *const libc::ucontext_t) }, &mut out);
    for (slot, &pc) in OUT.iter().zip(&out[..n]) {
        slot.store(pc, Ordering::SeqCst);
    }
    N.store(n, Ordering::SeqCst);
    DONE.store(true, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

#[inline(never)]
fn spin() -> usize {
    let mut i = 0usize;
    while !STOP.load(Ordering::Relaxed) {
        i = std::hint::black_box(i.wrapping_add(1));
    }
    i
}

#[inline(never)]
fn level_b() -> usize {
    std::hint::black_box(spin()) + 1
}

#[inline(never)]
fn level_a() -> usize {
    std::hint::black_box(level_b()) + 1
}

/// The function holding `pc` (an exact pc when `exact`, else a return
/// address), without the Rust hash.
fn name(pc: usize, exact: bool) -> String {
    let mut name = format!("{pc:#x}");
    // backtrace looks up the address before the one it is given (a return
    // address's call): an exact pc is given one past itself.
    let at = if exact { pc + 1 } else { pc };
    backtrace::resolve(at as *mut _, |s| {
        if let Some(n) = s.name() {
            name = n.to_string();
        }
    });
    match name.rfind("::h") {
        Some(i) if name.len() - i == 19 => name[..i].to_string(),
        _ => name,
    }
}

#[test]
fn a_context_capture_names_the_interrupted_chain() {
    // SAFETY: a plain sigaction with SA_SIGINFO and a handler of that type.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let spinner = std::thread::spawn(level_a);
    let pt = {
        use std::os::unix::thread::JoinHandleExt;
        spinner.as_pthread_t()
    };
    // Signal until the handler has run in `spin` (an early signal may find
    // the thread still starting).
    while !DONE.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        // SAFETY: the thread is alive until STOP is set, which only the
        // handler does.
        unsafe { libc::pthread_kill(pt, libc::SIGUSR1) };
    }
    spinner.join().unwrap();
    let n = N.load(Ordering::SeqCst);
    let names: Vec<String> = OUT[..n]
        .iter()
        .enumerate()
        .map(|(i, pc)| name(pc.load(Ordering::SeqCst), i == 0))
        .collect();
    // The interrupted pc is in `spin`, or (in a debug build, where they
    // are calls) in the `core` functions it calls in its loop.
    let want = [
        "context_chain::spin",
        "context_chain::level_b",
        "context_chain::level_a",
    ];
    let first = names.iter().take_while(|n| n.starts_with("core::")).count();
    assert!(n > first + want.len(), "{names:?}");
    assert_eq!(&names[first..first + want.len()], &want, "{names:?}");
    assert_eq!(
        names
            .iter()
            .filter(|n| n.contains("context_chain::"))
            .count(),
        want.len(),
        "{names:?}"
    );
}
