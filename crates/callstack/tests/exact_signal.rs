//! Exact capture from signal handlers: no allocation (a counting global
//! allocator), a SIGPROF storm on busy threads, and a capture that goes
//! through the signal frame into the interrupted code.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use callstack::{Frame, Method};

#[global_allocator]
static A: testsupport::alloc::Counting = testsupport::alloc::Counting;

fn allocs() -> u64 {
    testsupport::alloc::thread_allocs()
}

const EMPTY: Frame = Frame {
    pc: 0,
    sp: 0,
    fp: 0,
    method: Method::Cfi,
};

// ------------------------------------------------------------ no allocation

static H_ALLOCS: AtomicU64 = AtomicU64::new(u64::MAX);
static H_FRAMES_CTX: AtomicUsize = AtomicUsize::new(0);
static H_FRAMES_EXACT: AtomicUsize = AtomicUsize::new(0);
static H_SIGNAL_METHOD: AtomicBool = AtomicBool::new(false);
/// Whether the exact captures' frames (with and without frame details)
/// from the interrupted pc on (the one the signal frame gives) are the
/// context capture's.
static H_SAME_BELOW: AtomicBool = AtomicBool::new(false);

extern "C" fn count_handler(_: libc::c_int, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let before = allocs();
    let mut out = [0usize; 128];
    // SAFETY: the kernel passes a valid ucontext_t.
    let n = callstack::capture_from_context(unsafe { &*(uc as *const libc::ucontext_t) }, &mut out);
    let mut frames = [EMPTY; 128];
    let (m, _) = callstack::capture_exact_with_info(0, &mut frames);
    // The pcs-only capture (its fast path) too.
    let mut pcs = [0usize; 128];
    let p = callstack::capture_exact(0, &mut pcs);
    let after = allocs();
    H_ALLOCS.store(after - before, Ordering::SeqCst);
    H_FRAMES_CTX.store(n, Ordering::SeqCst);
    H_FRAMES_EXACT.store(m, Ordering::SeqCst);
    let signal = frames[..m]
        .iter()
        .position(|f| f.method == Method::SignalFrame);
    H_SIGNAL_METHOD.store(signal.is_some(), Ordering::SeqCst);
    let same = signal.is_some_and(|k| {
        let below = &frames[k..m];
        below.len() == n
            && below
                .iter()
                .zip(&out[..n])
                .all(|(f, &pc)| f.pc as usize == pc)
            && p == m
            && pcs[k..p] == out[..n]
    });
    H_SAME_BELOW.store(same, Ordering::SeqCst);
}

fn install(
    sig: libc::c_int,
    h: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
) {
    // SAFETY: a plain sigaction with SA_SIGINFO and a handler of that type.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = h as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

#[inline(never)]
fn raise_and_check(what: &str) {
    H_ALLOCS.store(u64::MAX, Ordering::SeqCst);
    // SAFETY: raising a signal whose handler is installed.
    unsafe { libc::raise(libc::SIGUSR1) };
    assert_eq!(
        H_ALLOCS.load(Ordering::SeqCst),
        0,
        "{what}: the handler's captures allocated"
    );
    let ctx = H_FRAMES_CTX.load(Ordering::SeqCst);
    let exact = H_FRAMES_EXACT.load(Ordering::SeqCst);
    // The context capture reaches this test's frames; the exact one also
    // has the handler and the trampoline above them.
    assert!(ctx >= 5, "{what}: {ctx} frames from the context");
    assert!(
        exact >= ctx + 2,
        "{what}: {exact} exact frames, {ctx} from the context"
    );
    assert!(
        H_SIGNAL_METHOD.load(Ordering::SeqCst),
        "{what}: no signal frame crossed"
    );
    assert!(
        H_SAME_BELOW.load(Ordering::SeqCst),
        "{what}: below the signal frame, the exact capture is not the context's"
    );
}

#[test]
fn captures_allocate_nothing_cold_or_warm_in_a_signal_handler() {
    // Everything below runs on one thread, so the thread-local count sees
    // only this thread's allocations.
    install(libc::SIGUSR1, count_handler);
    // Cold: no prepare() yet, so modules come from _dl_find_object and CFI
    // is evaluated directly. The very first capture is inside the handler.
    raise_and_check("cold, in handler");
    let mut out = [0usize; 128];
    let before = allocs();
    let n = callstack::capture_exact(0, &mut out);
    assert_eq!(allocs(), before, "cold capture_exact allocated");
    assert!(n >= 3);
    // Warm: tables compiled and published.
    let stats = callstack::prepare();
    assert!(stats.modules >= 3, "{stats:?}");
    raise_and_check("warm, in handler");
    let before = allocs();
    for _ in 0..10 {
        callstack::capture_exact(0, &mut out);
    }
    assert_eq!(allocs(), before, "warm capture_exact allocated");
}
