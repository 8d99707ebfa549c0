//! `capture_fast` from SIGPROF handlers: 4 busy threads (allocating,
//! formatting, sleeping, calling libc) are interrupted at a high rate for
//! about 3 seconds, by `setitimer(ITIMER_PROF)` and by a thread sending
//! SIGPROF with `pthread_kill` every few microseconds; each handler captures
//! into a static per-thread buffer. No deadlock (a watchdog fails the test),
//! no crash, and every capture at least finds the handler's own frame.
use std::cell::{Cell, UnsafeCell};
use std::hint::black_box;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const SLOTS: usize = WORKERS;
const DEPTH: usize = 128;

/// One capture buffer per thread, written only by SIGPROF handlers on that
/// thread (which do not nest: SIGPROF is blocked while its handler runs).
struct Buffers([UnsafeCell<[usize; DEPTH]>; SLOTS]);
// SAFETY: slot `i` is written only on thread `i` (see above), and read only
// after every worker has been joined and the timer stopped.
unsafe impl Sync for Buffers {}
static BUFFERS: Buffers = Buffers([const { UnsafeCell::new([0; DEPTH]) }; SLOTS]);
static LAST_LEN: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

static SAMPLES: AtomicUsize = AtomicUsize::new(0);
static EMPTY: AtomicUsize = AtomicUsize::new(0);
static FRAMES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // The worker's slot; other threads (the test harness's) have none.
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

extern "C" fn on_sigprof(_sig: libc::c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    let slot = SLOT.with(|s| s.get());
    if slot >= SLOTS {
        return;
    }
    // SAFETY: see `Buffers`: only this thread's handler writes this slot.
    let buf = unsafe { &mut *BUFFERS.0[slot].get() };
    let n = callstack::capture_fast(0, buf);
    LAST_LEN[slot].store(n, Ordering::Relaxed);
    SAMPLES.fetch_add(1, Ordering::Relaxed);
    FRAMES.fetch_add(n, Ordering::Relaxed);
    if n == 0 {
        EMPTY.fetch_add(1, Ordering::Relaxed);
    }
}

fn install_handler() {
    // SAFETY: a zeroed sigaction with our handler; SA_RESTART keeps the
    // workers' system calls going; the handler is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigprof as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGPROF, &sa, std::ptr::null_mut()), 0);
    }
}

/// Blocks or unblocks SIGPROF on the calling thread (threads it spawns
/// inherit the mask).
fn block_sigprof(block: bool) {
    // SAFETY: a sigset with SIGPROF, applied to this thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPROF);
        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        assert_eq!(libc::pthread_sigmask(how, &set, std::ptr::null_mut()), 0);
    }
}

fn set_prof_timer(interval_us: i64) {
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: interval_us as libc::suseconds_t,
    };
    let it = libc::itimerval {
        it_interval: tv,
        it_value: tv,
    };
    // SAFETY: plain system call with a valid itimerval.
    let r = unsafe { libc::setitimer(libc::ITIMER_PROF, &it, std::ptr::null_mut()) };
    assert_eq!(r, 0);
}

#[inline(never)]
fn allocating(i: usize) -> usize {
    let mut v: Vec<Box<[u8]>> = Vec::new();
    for k in 0..64 {
        v.push(vec![k as u8; 16 + (i + k) % 2000].into_boxed_slice());
    }
    let s: String = v.iter().map(|b| b.len().to_string()).collect();
    black_box(s.len())
}

#[inline(never)]
fn formatting(i: usize) -> usize {
    let s = format!(
        "{i} {:?} {:.3} {:>20} {:#x}",
        (i, "x"),
        i as f64 / 7.0,
        "pad",
        i
    );
    black_box(s.len())
}

#[inline(never)]
fn sleeping(i: usize) -> usize {
    std::thread::sleep(Duration::from_micros(100 + (i % 5) as u64 * 50));
    black_box(i)
}

#[inline(never)]
fn calling_libc(i: usize) -> usize {
    // SAFETY: plain libc calls with valid arguments.
    unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        let p = libc::malloc(64 + i % 4096);
        libc::memset(p, 1, 64);
        libc::free(p);
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
        if fd >= 0 {
            libc::write(fd, c"x".as_ptr().cast(), 1);
            libc::close(fd);
        }
        black_box(libc::getpid() as usize + ts.tv_nsec as usize)
    }
}

#[test]
fn sigprof_handlers_capture_without_deadlock_or_crash() {
    install_handler();
    // Only the workers take SIGPROF: this thread and the helper threads it
    // spawns inherit a blocked mask; each worker unblocks it.
    block_sigprof(true);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(WORKERS + 1));
    let work: [fn(usize) -> usize; WORKERS] = [allocating, formatting, sleeping, calling_libc];
    let workers: Vec<_> = work
        .into_iter()
        .enumerate()
        .map(|(slot, f)| {
            let stop = stop.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                SLOT.with(|s| s.set(slot));
                block_sigprof(false);
                start.wait();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    black_box(f(i));
                    i += 1;
                }
                i
            })
        })
        .collect();
    let threads: Vec<libc::pthread_t> = workers.iter().map(|h| h.as_pthread_t()).collect();

    // A thread sending SIGPROF to every worker in turn, as fast as it can
    // with a short pause, on top of the profiling timer.
    let kicker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0usize;
            while !stop.load(Ordering::Relaxed) {
                for &t in &threads {
                    // SAFETY: the workers are alive until `stop` is set and
                    // they are joined, which happens after this thread ends.
                    unsafe { libc::pthread_kill(t, libc::SIGPROF) };
                    sent += 1;
                }
                std::thread::sleep(Duration::from_micros(20));
            }
            sent
        })
    };

    set_prof_timer(100); // as fast as the kernel delivers (about its tick)
    start.wait();
    let t0 = Instant::now();

    // The watchdog: everything must finish well within 30 s.
    let (tx, rx) = mpsc::channel();
    let stopper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(3));
            stop.store(true, Ordering::Relaxed);
            let sent = kicker.join().unwrap();
            let iters: Vec<usize> = workers.into_iter().map(|h| h.join().unwrap()).collect();
            tx.send((sent, iters)).unwrap();
        })
    };
    let (sent, iters) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("deadlock: workers or kicker did not finish within 30 s");
    stopper.join().unwrap();
    set_prof_timer(0);
    let elapsed = t0.elapsed();

    let samples = SAMPLES.load(Ordering::Relaxed);
    let frames = FRAMES.load(Ordering::Relaxed);
    eprintln!(
        "{samples} SIGPROF captures ({sent} sent by pthread_kill) in {elapsed:?}, \
         {frames} frames, worker iterations {iters:?}"
    );
    assert!(iters.iter().all(|&i| i > 0), "a worker made no progress");
    // Thousands on an idle machine; a loaded one still delivers hundreds.
    assert!(samples > 200, "too few signals handled: {samples}");
    assert_eq!(EMPTY.load(Ordering::Relaxed), 0, "a capture found no frame");
    // Every worker was sampled and its last capture starts in the handler.
    for (slot, last_len) in LAST_LEN.iter().enumerate() {
        let n = last_len.load(Ordering::Relaxed);
        assert!(n >= 1, "worker {slot} never sampled");
        // SAFETY: the workers are joined and the timer is stopped.
        let first = unsafe { (*BUFFERS.0[slot].get())[0] };
        let handler = on_sigprof as *const () as usize;
        assert!(
            first > handler && first < handler + 4096,
            "worker {slot}: first frame {first:#x} is not in the handler ({handler:#x})"
        );
    }
}
