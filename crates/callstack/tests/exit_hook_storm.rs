//! Exit hooks under a SIGPROF storm: worker threads install hooks at
//! varying depths and return through the trampoline in a loop while a
//! profiling timer interrupts them anywhere (inside `install`, the hooked
//! functions, the trampoline's first instructions, the dispatcher, the
//! hooks). Every capture from the signal context must end with the chain of
//! the worker's own callers, as captured before any hook: no hooked frame
//! may hide or invent a caller, and nothing may crash or hang.
#![cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_os = "linux"
))]

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const MAX: usize = 128;
const WORKERS: usize = 2;

/// Per worker: the callers of its loop function (the suffix every capture
/// must end with), written before the storm starts.
struct Worker {
    base: [AtomicUsize; MAX],
    base_len: AtomicUsize,
    checked: AtomicU64,
    bad: AtomicU64,
    first_bad: [AtomicUsize; MAX],
    first_bad_len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicUsize = AtomicUsize::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const WORKER: Worker = Worker {
    base: [ZERO; MAX],
    base_len: AtomicUsize::new(0),
    checked: AtomicU64::new(0),
    bad: AtomicU64::new(0),
    first_bad: [ZERO; MAX],
    first_bad_len: AtomicUsize::new(0),
};
static WORKERS_STATE: [Worker; WORKERS] = [WORKER; WORKERS];
static HOOKS_RUN: AtomicU64 = AtomicU64::new(0);
static STOP: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Which worker this thread is (usize::MAX: not a worker).
    static ME: Cell<usize> = const { Cell::new(usize::MAX) };
}

extern "C" fn on_prof(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let me = ME.with(|m| m.get());
    if me == usize::MAX {
        return;
    }
    let w = &WORKERS_STATE[me];
    let blen = w.base_len.load(Ordering::Acquire);
    if blen == 0 {
        return;
    }
    // SAFETY: the kernel passes the interrupted context.
    let uc = unsafe { &*(ctx as *const libc::ucontext_t) };
    let mut out = [0usize; MAX];
    let n = callstack::capture_from_context(uc, &mut out);
    let ok = n > blen && (0..blen).all(|i| out[n - blen + i] == w.base[i].load(Ordering::Relaxed));
    w.checked.fetch_add(1, Ordering::Relaxed);
    if !ok && w.bad.fetch_add(1, Ordering::Relaxed) == 0 {
        for (i, &a) in out[..n].iter().enumerate() {
            w.first_bad[i].store(a, Ordering::Relaxed);
        }
        w.first_bad_len.store(n, Ordering::Release);
    }
}

fn count_hook() {
    HOOKS_RUN.fetch_add(1, Ordering::Relaxed);
}

/// Recurses `depth` times, hooking frames on the way (some twice), then
/// returns through the trampolines.
#[inline(never)]
fn chain(depth: u32, salt: u32) -> u64 {
    if depth == 0 {
        // Hook this frame and, some of the time, a frame further up.
        callstack::exit_hook::install(0, count_hook).unwrap();
        if salt % 3 == 0 {
            let _ = callstack::exit_hook::install(salt % 5, count_hook);
        }
        let mut x = 0u64;
        for i in 0..(salt % 64) {
            x = x.wrapping_mul(31).wrapping_add(i as u64);
        }
        return black_box(x);
    }
    if depth % 2 == 0 {
        callstack::exit_hook::install(0, count_hook).unwrap();
    }
    black_box(chain(depth - 1, salt)) + 1
}

#[inline(never)]
fn worker_loop(me: usize) {
    ME.with(|m| m.set(me));
    let w = &WORKERS_STATE[me];
    // The callers of this function: every capture in the loop ends with them.
    let mut base = [0usize; MAX];
    let n = callstack::capture_exact(0, &mut base);
    for (i, &a) in base[1..n].iter().enumerate() {
        w.base[i].store(a, Ordering::Relaxed);
    }
    w.base_len.store(n - 1, Ordering::Release);
    let mut salt = me as u32 * 7919;
    while !STOP.load(Ordering::Relaxed) {
        salt = salt.wrapping_mul(1_103_515_245).wrapping_add(12345);
        black_box(chain(1 + (salt >> 8) % 12, salt >> 4));
    }
    w.base_len.store(0, Ordering::Release);
}

/// An address of a bad capture, with its function's name where the
/// symbolizer is built in (`pc`: the interrupted pc, else a return address).
fn describe(a: usize, pc: bool) -> String {
    #[cfg(feature = "symbolize")]
    {
        let mut sym = callstack::Symbolizer::new();
        let s = if pc {
            sym.symbolize_pc(a)
        } else {
            sym.symbolize_return(a)
        };
        format!("{a:#x} {}", s.function().unwrap_or("??"))
    }
    #[cfg(not(feature = "symbolize"))]
    {
        let _ = pc;
        format!("{a:#x}")
    }
}

#[test]
fn captures_from_sigprof_stay_true_while_hooks_come_and_go() {
    // SAFETY: installs a handler that only captures into its own stack and
    // atomics; a 100 µs CPU-time profiling timer.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_prof as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigaction(libc::SIGPROF, &sa, core::ptr::null_mut());
        let t = libc::itimerval {
            it_interval: libc::timeval {
                tv_sec: 0,
                tv_usec: 100,
            },
            it_value: libc::timeval {
                tv_sec: 0,
                tv_usec: 100,
            },
        };
        libc::setitimer(libc::ITIMER_PROF, &t, core::ptr::null_mut());
    }
    let threads: Vec<_> = (0..WORKERS)
        .map(|i| std::thread::spawn(move || worker_loop(i)))
        .collect();
    // 1.5 s, and on a loaded machine (the timer counts CPU time, which the
    // workers then get less of) longer, until enough samples are in.
    let start = Instant::now();
    let samples = || {
        WORKERS_STATE
            .iter()
            .map(|w| w.checked.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    while start.elapsed() < Duration::from_millis(1500)
        || (samples() <= 200 && start.elapsed() < Duration::from_secs(30))
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    STOP.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    // SAFETY: stops the timer.
    unsafe {
        let t: libc::itimerval = core::mem::zeroed();
        libc::setitimer(libc::ITIMER_PROF, &t, core::ptr::null_mut());
    }
    let mut checked = 0;
    for (i, w) in WORKERS_STATE.iter().enumerate() {
        checked += w.checked.load(Ordering::Relaxed);
        let bad = w.bad.load(Ordering::Relaxed);
        let n = w.first_bad_len.load(Ordering::Acquire);
        let first: Vec<String> = w.first_bad[..n]
            .iter()
            .enumerate()
            .map(|(k, a)| describe(a.load(Ordering::Relaxed), k == 0))
            .collect();
        assert_eq!(
            bad, 0,
            "worker {i}: {bad} captures lost the worker's callers; first: {first:?}"
        );
    }
    assert!(checked > 100, "only {checked} samples");
    assert!(HOOKS_RUN.load(Ordering::Relaxed) > 1000);
}
