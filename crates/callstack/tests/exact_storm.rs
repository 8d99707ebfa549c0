//! Signal storm: 4 busy threads (allocating, formatting, sleeping, calling
//! into libc) interrupted by SIGPROF at kHz rates, each handler calling
//! `capture_from_context_with_info`: no deadlock, no crash, no allocation,
//! and every sample ends at the thread's first frame (`clone3`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use callstack::{Frame, Method, StopReason};

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

// ------------------------------------------------------------ signal storm

const THREADS: usize = 4;
static STORM_SAMPLES: AtomicU64 = AtomicU64::new(0);
static STORM_OUTERMOST: AtomicU64 = AtomicU64::new(0);
static STORM_OTHER: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
static STORM_ALLOCS: AtomicU64 = AtomicU64::new(0);
static LAST_PCS: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
static OTHER_PCS: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];

fn remember(set: &[AtomicUsize; 64], pc: usize) {
    for s in set {
        match s.compare_exchange(0, pc, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(v) if v == pc => return,
            Err(_) => {}
        }
    }
}

extern "C" fn storm_handler(_: libc::c_int, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let before = allocs();
    let mut frames = [EMPTY; 256];
    // SAFETY: the kernel passes a valid ucontext_t.
    let uc = unsafe { &*(uc as *const libc::ucontext_t) };
    let (n, stop) = callstack::capture_from_context_with_info(uc, &mut frames);
    STORM_SAMPLES.fetch_add(1, Ordering::Relaxed);
    match stop {
        StopReason::Outermost => {
            STORM_OUTERMOST.fetch_add(1, Ordering::Relaxed);
            if n > 0 {
                remember(&LAST_PCS, frames[n - 1].pc as usize);
            }
        }
        other => {
            let i = match other {
                StopReason::UnknownModule(_) => 0,
                StopReason::NoRule(_) => 1,
                StopReason::Error(_) => 2,
                StopReason::BufferFull => 3,
                _ => 4,
            };
            STORM_OTHER[i].fetch_add(1, Ordering::Relaxed);
            if n > 0 {
                remember(&OTHER_PCS, frames[n - 1].pc as usize);
            }
        }
    }
    STORM_ALLOCS.fetch_add(allocs() - before, Ordering::Relaxed);
}

fn busy(kind: usize, stop: &AtomicBool) {
    let mut sink = 0usize;
    while !stop.load(Ordering::Relaxed) {
        match kind {
            0 => {
                let v: Vec<u64> = (0..64).collect();
                let b = Box::new(v);
                sink = sink.wrapping_add(b.len());
            }
            1 => {
                let s = format!("{sink} {:?} {:.3}", [1, 2, 3], 2.5f64);
                sink = sink.wrapping_add(s.len());
            }
            2 => std::thread::sleep(std::time::Duration::from_micros(50)),
            _ => {
                // SAFETY: plain libc calls on local buffers.
                unsafe {
                    let mut buf = [0u8; 64];
                    libc::snprintf(
                        buf.as_mut_ptr().cast(),
                        64,
                        c"%d-%s".as_ptr(),
                        42,
                        c"x".as_ptr(),
                    );
                    sink = sink.wrapping_add(libc::strlen(buf.as_ptr().cast()));
                    let mut arr = [5i32, 3, 9, 1, 7];
                    extern "C" fn cmp(
                        a: *const libc::c_void,
                        b: *const libc::c_void,
                    ) -> libc::c_int {
                        // SAFETY: qsort hands pointers into `arr`.
                        unsafe { *(a as *const i32) - *(b as *const i32) }
                    }
                    libc::qsort(arr.as_mut_ptr().cast(), 5, 4, Some(cmp));
                    sink = sink.wrapping_add(libc::getpid() as usize);
                }
            }
        }
    }
    std::hint::black_box(sink);
}

#[test]
fn signal_storm_on_busy_threads() {
    install(libc::SIGPROF, storm_handler);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let (tx, rx) = std::sync::mpsc::channel();
    for kind in 0..THREADS {
        let stop = stop.clone();
        let tx = tx.clone();
        handles.push(std::thread::spawn(move || {
            // SAFETY: pthread_self is always safe.
            tx.send(unsafe { libc::pthread_self() } as usize).unwrap();
            busy(kind, &stop);
        }));
    }
    let tids: Vec<usize> = (0..THREADS).map(|_| rx.recv().unwrap()).collect();
    // About 5 kHz per thread for 3 s; tables are published half-way, while
    // captures run.
    let start = std::time::Instant::now();
    let mut prepared = false;
    while start.elapsed() < std::time::Duration::from_secs(3) {
        for &t in &tids {
            // SAFETY: the threads are alive until `stop` is set and joined.
            unsafe { libc::pthread_kill(t as libc::pthread_t, libc::SIGPROF) };
        }
        if !prepared && start.elapsed() > std::time::Duration::from_millis(1500) {
            callstack::prepare();
            prepared = true;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let samples = STORM_SAMPLES.load(Ordering::Relaxed);
    let outermost = STORM_OUTERMOST.load(Ordering::Relaxed);
    let other: Vec<u64> = STORM_OTHER
        .iter()
        .map(|x| x.load(Ordering::Relaxed))
        .collect();
    let names = |set: &[AtomicUsize; 64]| -> Vec<String> {
        set.iter()
            .map(|x| x.load(Ordering::Relaxed))
            .filter(|&x| x != 0)
            .map(|pc| {
                let mut name = format!("{pc:#x}");
                backtrace::resolve(pc as *mut _, |s| {
                    if let Some(n) = s.name() {
                        name = format!("{n} ({pc:#x})");
                    }
                });
                name
            })
            .collect()
    };
    let last = names(&LAST_PCS);
    let others = names(&OTHER_PCS);
    let rate = samples as f64 / start.elapsed().as_secs_f64() / THREADS as f64;
    eprintln!("{rate:.0} Hz per thread; samples {samples}, outermost {outermost}, other {other:?}\nlast {last:?}\nother stops {others:?}");
    assert!(samples > 1000, "{samples} samples");
    assert_eq!(
        STORM_ALLOCS.load(Ordering::Relaxed),
        0,
        "a handler allocated"
    );
    assert_eq!(outermost, samples, "stops: {other:?}, at {others:?}");
    // Every walk ended at a thread's first frame: clone3 (glibc's thread
    // start). Under qemu-user (scripts/test-aarch64.sh) the guest's libc
    // has no symbol table to name it by.
    let unnamed =
        |n: &String| n.starts_with("0x") && std::env::var_os("CALLSTACK_TEST_QEMU").is_some();
    assert!(
        last.iter().all(|n| n.contains("clone") || unnamed(n)),
        "{last:?}"
    );
}
