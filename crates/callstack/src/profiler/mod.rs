//! An in-process sampling profiler: every thread sampled on its own CPU
//! time, each sample an exact stack ([`crate::capture_from_context`]).
//!
//! [`Profiler::start`] gives each thread a POSIX timer on the thread's CPU
//! clock (`timer_create` with `SIGEV_THREAD_ID`, so the signal goes to the
//! thread that used the time). A background thread finds the threads
//! created later (it reads `/proc/self/task` every few milliseconds: no
//! `pthread_create` wrapper), gives each its timer, and drains the
//! samples. The `SIGPROF` handler captures the interrupted stack into a
//! ring that belongs to its thread, allocated beforehand: no allocation, no
//! lock, no system call. A sample takes two words plus one per frame of
//! the ring (64 KiB, more above 819 Hz: a third of a second of samples or
//! more), so shallow stacks fit many; a full ring counts the sample as
//! lost. The kernel
//! checks CPU timers at its scheduler tick (4 ms at `HZ=250`), so above
//! that rate one signal may stand for several periods: each sample's
//! `cpu/nanoseconds` value is the period times the timer's expirations
//! (1 + its overrun count), while `samples/count` counts signals.
//! [`Profiler::stop`] returns a [`Profile`]: the distinct stacks by thread,
//! each with `samples/count` and `cpu/nanoseconds`.
//!
//! ```
//! let profiler = callstack::profiler::Profiler::start(1000).unwrap();
//! let t = std::time::Instant::now();
//! let mut x = 0u64;
//! while t.elapsed() < std::time::Duration::from_millis(50) {
//!     x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
//! }
//! let profile = profiler.stop();
//! assert!(profile.total(0) > 0); // samples
//! ```
//!
//! One profiler runs at a time in a process. The `SIGPROF` handler stays
//! installed after `stop` (a signal already on its way must not meet the
//! default action, which ends the process); it passes signals that are
//! not its own to the handler installed before it.

use crate::profile::Profile;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Frames kept per sample (deeper stacks are cut at the outer end).
pub const MAX_DEPTH: usize = 128;
/// Words of a thread's ring at the least (64 KiB): a sample takes two
/// words plus one per frame, so about 370 samples of 20 frames. Rates
/// above 819 Hz get more (ten words per hertz, up to 512 KiB): a ring
/// holds a third of a second of samples or more, for a collector kept from
/// its CPU on a loaded machine.
const RING_WORDS_MIN: usize = 8192;
const RING_WORDS_MAX: usize = 65536;
/// A ring's first word of a record that says "the rest of the ring up to
/// its end is unused; the next record is at its start".
const WRAP: usize = usize::MAX;
/// How often the background thread drains the rings and looks for new
/// threads.
const POLL: Duration = Duration::from_millis(10);

/// Why the profiler could not start.
#[derive(Debug)]
pub enum ProfilerError {
    /// Another profiler is running in this process.
    AlreadyRunning,
    /// The rate is 0 or above 100 kHz.
    BadRate(u32),
    /// A system call failed (which, and the error).
    Sys(&'static str, std::io::Error),
}

impl std::fmt::Display for ProfilerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProfilerError::AlreadyRunning => write!(f, "a profiler is already running"),
            ProfilerError::BadRate(hz) => {
                write!(f, "sampling rate {hz} Hz out of range (1..=100000)")
            }
            ProfilerError::Sys(what, e) => write!(f, "{what}: {e}"),
        }
    }
}

impl std::error::Error for ProfilerError {}

/// One thread's ring of words: written by the `SIGPROF` handler on that
/// thread (the only producer: the signal is blocked while its handler
/// runs), read by the background thread. A sample is a record of `2 +
/// len` words: `len`, the timer periods it stands for, then its `len`
/// frames; a record never wraps around the ring's end (a [`WRAP`] word
/// fills the end instead), so that the capture writes its frames in place.
struct Slot {
    tid: u32,
    ring: Box<[std::cell::UnsafeCell<usize>]>,
    /// Words written (the producer's count).
    head: AtomicUsize,
    /// Words read (the consumer's count).
    tail: AtomicUsize,
    /// Samples dropped because the ring was full.
    lost: AtomicU64,
}

// SAFETY: words are written only by the producer while it owns them
// (between `head` and `tail + ring.len()`), read only by the consumer
// after the producer published them with a release store of `head`.
unsafe impl Sync for Slot {}

impl Slot {
    /// The ring's words from `at` (modulo its length) to its end.
    fn words(&self, at: usize) -> *mut usize {
        let cap = self.ring.len();
        std::cell::UnsafeCell::raw_get(self.ring[at % cap..].as_ptr())
    }
}

/// Lets the handler tell whether a profiler is running and keeps `stop`
/// from freeing slots while a handler may still read one.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);
/// The `SIGPROF` action found before ours (a `libc::sigaction`, boxed and
/// leaked once), for signals that are not ours.
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static INSTALLED: Mutex<bool> = Mutex::new(false);

/// The start of a timer signal's `siginfo_t` on Linux (the `_timer` member
/// of its union), which the libc crate does not expose.
#[repr(C)]
struct TimerInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    #[cfg(target_pointer_width = "64")]
    _pad: libc::c_int,
    tid: libc::c_int,
    overrun: libc::c_int,
    value: *mut libc::c_void,
}

extern "C" fn on_sigprof(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: `info` is the kernel's siginfo for this signal; a timer
    // signal's layout is `TimerInfo`'s, and we only read `value` after
    // `code` says it is a timer's.
    let ti = unsafe { &*(info as *const TimerInfo) };
    IN_HANDLER.fetch_add(1, Ordering::SeqCst);
    let ours = ti.code == libc::SI_TIMER && ACTIVE.load(Ordering::SeqCst) && !ti.value.is_null();
    if ours {
        // SAFETY: the timer's value is the `Slot` it was created for;
        // `stop` frees slots only after deleting their timers and seeing no
        // handler running.
        let slot = unsafe { &*(ti.value as *const Slot) };
        let cap = slot.ring.len();
        let mut head = slot.head.load(Ordering::Relaxed);
        let tail = slot.tail.load(Ordering::Acquire);
        // Room for the deepest sample up to the ring's end, else the end
        // is skipped.
        let to_end = cap - head % cap;
        let skip = if to_end < 2 + MAX_DEPTH { to_end } else { 0 };
        if cap - head.wrapping_sub(tail) < skip + 2 + MAX_DEPTH {
            slot.lost.fetch_add(1, Ordering::Relaxed);
        } else if !ctx.is_null() {
            // SAFETY: the words from `head` to `tail + cap` are the
            // producer's (not yet published, already consumed), and the
            // record's `2 + MAX_DEPTH` words lie before the ring's end;
            // `ctx` is the handler's ucontext.
            unsafe {
                if skip != 0 {
                    *slot.words(head) = WRAP;
                    head = head.wrapping_add(skip);
                }
                let w = slot.words(head);
                let frames = std::slice::from_raw_parts_mut(w.add(2), MAX_DEPTH);
                let len = crate::capture_from_context(&*(ctx as *const libc::ucontext_t), frames)
                    .min(MAX_DEPTH);
                *w = len;
                // Ticks that expired while this signal was pending: the
                // kernel checks CPU timers at its scheduler tick (often 4
                // ms), so at 1 kHz most signals stand for several periods.
                *w.add(1) = 1 + ti.overrun.max(0) as usize;
                head = head.wrapping_add(2 + len);
            }
            slot.head.store(head, Ordering::Release);
        }
    }
    IN_HANDLER.fetch_sub(1, Ordering::SeqCst);
    if !ours {
        let prev = PREVIOUS.load(Ordering::Acquire);
        if prev.is_null() {
            return;
        }
        // SAFETY: `prev` is the leaked action found at installation; we
        // call its handler as the kernel would have.
        unsafe {
            let p = &*prev;
            if p.sa_sigaction == libc::SIG_DFL || p.sa_sigaction == libc::SIG_IGN {
                return;
            }
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(p.sa_sigaction);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
                f(sig);
            }
        }
    }
}

fn install_handler() -> Result<(), ProfilerError> {
    let mut done = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return Ok(());
    }
    // SAFETY: plain sigaction calls with zeroed, then filled, structs.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigprof as *const () as usize;
        // Not SA_ONSTACK: Rust's std gives each thread an alternate stack
        // of a few KiB (for its overflow message), too small for a walk.
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGPROF, &sa, &mut old) != 0 {
            return Err(ProfilerError::Sys(
                "sigaction(SIGPROF)",
                std::io::Error::last_os_error(),
            ));
        }
        PREVIOUS.store(Box::into_raw(Box::new(old)), Ordering::Release);
    }
    *done = true;
    Ok(())
}

/// A thread being sampled.
struct Sampled {
    slot: Box<Slot>,
    timer: libc::timer_t,
}

// SAFETY: a timer id is a process-wide handle, usable from any thread.
unsafe impl Send for Sampled {}

/// The background thread's state.
struct Collector {
    period_ns: i64,
    /// Words of each thread's ring.
    ring_words: usize,
    /// Threads armed at the last scan, named again at the next.
    name_again: Vec<u32>,
    threads: HashMap<u32, Sampled>,
    profile: Profile,
    own_tid: u32,
    /// The thread building the unwind tables at the start (not sampled).
    prep_tid: u32,
    lost: u64,
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

impl Collector {
    /// Gives every thread of the process without one a timer; stops
    /// sampling the threads that are gone.
    fn scan(&mut self) {
        // A thread is often found before it names itself (Rust's threads
        // and `pthread_setname_np` name themselves once running; under
        // qemu-user the gap is long): its name is read again at the next
        // scan.
        for tid in std::mem::take(&mut self.name_again) {
            self.name(tid);
        }
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        let mut live = Vec::new();
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            live.push(tid);
            if tid == self.own_tid || tid == self.prep_tid || self.threads.contains_key(&tid) {
                continue;
            }
            if let Some(s) = self.arm(tid) {
                self.threads.insert(tid, s);
                self.name(tid);
                self.name_again.push(tid);
            }
        }
        let gone: Vec<u32> = self
            .threads
            .keys()
            .copied()
            .filter(|t| !live.contains(t))
            .collect();
        for tid in gone {
            if let Some(s) = self.threads.remove(&tid) {
                self.retire(s);
            }
        }
    }

    /// Names thread `tid` in the profile by its `comm` now (kept as it was
    /// when the thread is gone).
    fn name(&mut self, tid: u32) {
        if let Ok(name) = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")) {
            self.profile
                .threads
                .insert(tid, name.trim_end().to_string());
        }
    }

    /// A timer on `tid`'s CPU clock that signals `tid`.
    fn arm(&mut self, tid: u32) -> Option<Sampled> {
        let ring = (0..self.ring_words)
            .map(|_| std::cell::UnsafeCell::new(0))
            .collect();
        let slot = Box::new(Slot {
            tid,
            ring,
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            lost: AtomicU64::new(0),
        });
        // The thread's CPU clock, as glibc's pthread_getcpuclockid makes it:
        // (~tid << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED.
        let clock = ((!(tid as libc::clockid_t)) << 3) | 6;
        // SAFETY: zeroed sigevent filled as timer_create(2) documents for
        // SIGEV_THREAD_ID; the slot outlives the timer (see `retire`).
        unsafe {
            let mut ev: libc::sigevent = std::mem::zeroed();
            ev.sigev_notify = libc::SIGEV_THREAD_ID;
            ev.sigev_signo = libc::SIGPROF;
            ev.sigev_notify_thread_id = tid as libc::c_int;
            ev.sigev_value = libc::sigval {
                sival_ptr: &*slot as *const Slot as *mut libc::c_void,
            };
            let mut timer: libc::timer_t = std::mem::zeroed();
            if libc::timer_create(clock, &mut ev, &mut timer) != 0 {
                return None; // the thread exited meanwhile
            }
            let ts = libc::timespec {
                tv_sec: self.period_ns / 1_000_000_000,
                tv_nsec: self.period_ns % 1_000_000_000,
            };
            let spec = libc::itimerspec {
                it_interval: ts,
                it_value: ts,
            };
            if libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) != 0 {
                libc::timer_delete(timer);
                return None;
            }
            Some(Sampled { slot, timer })
        }
    }

    /// Moves the samples of a thread's ring into the profile.
    fn drain(profile: &mut Profile, slot: &Slot, period_ns: i64) {
        let cap = slot.ring.len();
        let head = slot.head.load(Ordering::Acquire);
        let mut tail = slot.tail.load(Ordering::Relaxed);
        while tail != head {
            // SAFETY: the words between tail and head are published and
            // not written until `tail` moves past them; a record lies
            // whole before the ring's end.
            unsafe {
                let w = slot.words(tail);
                if *w == WRAP {
                    tail = tail.wrapping_add(cap - tail % cap);
                    continue;
                }
                let n = (*w).min(MAX_DEPTH);
                let cpu = period_ns.saturating_mul(*w.add(1) as i64);
                let frames = std::slice::from_raw_parts(w.add(2), n);
                profile.add(frames, true, Some(slot.tid), &[1, cpu]);
                tail = tail.wrapping_add(2 + n);
            }
            slot.tail.store(tail, Ordering::Release);
        }
    }

    fn drain_all(&mut self) {
        for s in self.threads.values() {
            Self::drain(&mut self.profile, &s.slot, self.period_ns);
        }
    }

    /// Deletes a thread's timer, drains and frees its ring.
    fn retire(&mut self, s: Sampled) {
        // SAFETY: the timer is ours. Deleting it also removes its signal if
        // still pending. The thread is gone (or profiling has stopped and no
        // handler is running), so nothing reads the slot any more.
        unsafe {
            libc::timer_delete(s.timer);
        }
        Self::drain(&mut self.profile, &s.slot, self.period_ns);
        self.lost += s.slot.lost.load(Ordering::Relaxed);
    }
}

/// A running in-process profiler; [`Profiler::stop`] ends it and returns
/// the profile. See the [module documentation](self).
pub struct Profiler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Collector>>,
    started: Instant,
}

impl Profiler {
    /// Starts sampling every thread of the process (those created later
    /// too) `hz` times per second of each thread's CPU time.
    ///
    /// Installs the `SIGPROF` handler and starts the background thread,
    /// which arms the timers of the threads alive now before `start`
    /// returns, then calls [`crate::prepare`] (so captures take their rules
    /// from compiled tables). Fails if a profiler is running or `hz` is not in
    /// `1..=100000`.
    pub fn start(hz: u32) -> Result<Profiler, ProfilerError> {
        if hz == 0 || hz > 100_000 {
            return Err(ProfilerError::BadRate(hz));
        }
        install_handler()?;
        if ACTIVE
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Err(ProfilerError::AlreadyRunning);
        }
        let mut profile = Profile::cpu(hz);
        profile.start_time_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("callstack-prof".into())
            .spawn(move || {
                let mut c = Collector {
                    period_ns: profile.period,
                    ring_words: (hz as usize * 10)
                        .clamp(RING_WORDS_MIN, RING_WORDS_MAX)
                        .next_power_of_two(),
                    name_again: Vec::new(),
                    threads: HashMap::new(),
                    profile,
                    own_tid: gettid(),
                    prep_tid: 0,
                    lost: 0,
                };
                // Compiled unwind tables make captures cheaper; until they
                // are ready, captures read `.eh_frame_hdr` directly. Built
                // on a thread of their own: it takes seconds in a debug
                // build under qemu-user, and threads started meanwhile
                // must be found and sampled.
                let (prep_tx, prep_rx) = std::sync::mpsc::channel();
                let prep = std::thread::Builder::new()
                    .name("callstack-prep".into())
                    .spawn(move || {
                        let _ = prep_tx.send(gettid());
                        crate::prepare();
                    });
                match prep {
                    Ok(_) => c.prep_tid = prep_rx.recv().unwrap_or(0),
                    Err(_) => drop(crate::prepare()),
                }
                c.scan();
                let _ = tx.send(());
                while !stop2.load(Ordering::Acquire) {
                    std::thread::park_timeout(POLL);
                    c.drain_all();
                    c.scan();
                }
                c
            })
            .map_err(|e| {
                ACTIVE.store(false, Ordering::SeqCst);
                ProfilerError::Sys("spawning the profiler thread", e)
            })?;
        // Every thread alive now has its timer when `start` returns.
        let _ = rx.recv();
        Ok(Profiler {
            stop,
            thread: Some(thread),
            started: Instant::now(),
        })
    }

    /// Stops sampling and returns the profile: one stack per distinct
    /// (stack, thread), values `samples/count` and `cpu/nanoseconds`, the
    /// thread names, the loaded modules, the duration and the lost count.
    pub fn stop(mut self) -> Profile {
        self.finish()
    }

    fn finish(&mut self) -> Profile {
        let Some(thread) = self.thread.take() else {
            return Profile::cpu(1);
        };
        self.stop.store(true, Ordering::Release);
        thread.thread().unpark();
        let mut c = match thread.join() {
            Ok(c) => c,
            Err(_) => {
                ACTIVE.store(false, Ordering::SeqCst);
                return Profile::cpu(1);
            }
        };
        // No handler touches a slot once ACTIVE is false and none is
        // running; then the timers go.
        ACTIVE.store(false, Ordering::SeqCst);
        while IN_HANDLER.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        for tid in std::mem::take(&mut c.name_again) {
            c.name(tid);
        }
        let all: Vec<Sampled> = c.threads.drain().map(|(_, s)| s).collect();
        for s in all {
            c.retire(s);
        }
        let mut p = c.profile;
        p.lost += c.lost;
        p.duration_ns = self.started.elapsed().as_nanos() as u64;
        p.add_loaded_modules();
        p
    }
}

impl Drop for Profiler {
    /// Stops sampling (the profile is dropped).
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.finish();
        }
    }
}
