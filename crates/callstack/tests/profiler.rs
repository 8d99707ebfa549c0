//! The in-process profiler on a program whose CPU time is split 70/20/10
//! between three functions by construction: the profile's shares by
//! function name within 5 points, on a thread created after `start`.

#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]

use callstack::profiler::Profiler;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Burns `ns` of this thread's CPU time.
#[inline(always)]
fn spin(ns: u64) -> u64 {
    let end = thread_cpu_ns() + ns;
    let mut x = 1u64;
    while thread_cpu_ns() < end {
        for _ in 0..200 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

#[inline(never)]
#[cfg_attr(not(feature = "symbolize"), allow(dead_code))]
fn hot_seventy(ns: u64) -> u64 {
    spin(ns * 7)
}

#[inline(never)]
#[cfg_attr(not(feature = "symbolize"), allow(dead_code))]
fn warm_twenty(ns: u64) -> u64 {
    spin(ns * 2)
}

#[inline(never)]
fn cool_ten(ns: u64) -> u64 {
    spin(ns)
}

#[test]
#[cfg(feature = "symbolize")]
fn shares_of_three_functions() {
    use callstack::profile::{top, Names};
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let p = Profiler::start(1000).unwrap();
    let worker = std::thread::Builder::new()
        .name("worker".into())
        .spawn(|| {
            // Chunks of pseudo-random length, so that the kernel's timer
            // tick (which drives CPU timers) does not alias with the cycle.
            let mut x = 0;
            let mut r = 0x2545_f491_4f6c_dd1du64;
            for _ in 0..100 {
                r ^= r << 13;
                r ^= r >> 7;
                r ^= r << 17;
                let unit = 600_000 + r % 800_000;
                x ^= hot_seventy(unit);
                x ^= warm_twenty(unit);
                x ^= cool_ten(unit);
            }
            x
        })
        .unwrap();
    std::hint::black_box(worker.join().unwrap());
    let mut profile = p.stop();
    assert!(profile.duration_ns > 0);
    let tid = *profile
        .threads
        .iter()
        .find(|(_, n)| n.as_str() == "worker")
        .expect("the worker thread was found")
        .0;
    profile.stacks.retain(|s| s.thread == Some(tid));
    let names = Names::symbolize(&profile, None, &[]);
    // cpu/nanoseconds: a signal weighted by the timer periods it stands for.
    let cpu = profile.sample_type_index("cpu").unwrap();
    let total = profile.total(cpu);
    // On a loaded machine the collector may come late: a thread's ring
    // overflows, or its timer is armed some time after it started. Lost signals count here; the shares below are of those
    // kept.
    let lost = profile.lost as i64 * profile.period;
    assert!(
        total + lost > 300_000_000,
        "only {total} ns (and {lost} ns lost) of ~1 s of CPU"
    );
    let t = top(&profile, &names, cpu);
    let share = |f: &str| {
        let v: i64 = t
            .iter()
            .filter(|e| e.function.ends_with(f))
            .map(|e| e.total_value)
            .max()
            .unwrap_or(0);
        100.0 * v as f64 / total as f64
    };
    let (a, b, c) = (
        share("hot_seventy"),
        share("warm_twenty"),
        share("cool_ten"),
    );
    eprintln!(
        "{} signals, {total} ns, lost {}: {a:.1}% {b:.1}% {c:.1}%",
        profile.total(0),
        profile.lost
    );
    // A share measured from n signals is off by sqrt(p (1 - p) / n) at one
    // sigma (the kernel's CPU timers tick at 250 Hz on many machines: about
    // 200 signals a second, each weighted by the periods it stands for).
    // Allowed: 5 points, or 3.5 sigma where that is wider (about 1 run in
    // 2000 fails by chance; a wrong unwind moves a share far more).
    let n = profile.total(0).max(1) as f64;
    let off = |p: f64| (3.5 * 100.0 * (p * (1.0 - p) / n).sqrt()).max(5.0);
    assert!((a - 70.0).abs() < off(0.7), "hot_seventy {a:.1}%");
    assert!((b - 20.0).abs() < off(0.2), "warm_twenty {b:.1}%");
    assert!((c - 10.0).abs() < off(0.1), "cool_ten {c:.1}%");
}

/// One profiler at a time in a process: the tests take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A short profile of this thread, written as a trace file and as pprof,
/// read back: every sample kept, the thread named (no symbolizer needed).
#[test]
fn profile_round_trips() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let p = Profiler::start(500).unwrap();
    assert!(matches!(
        Profiler::start(500),
        Err(callstack::profiler::ProfilerError::AlreadyRunning)
    ));
    std::hint::black_box(cool_ten(100_000_000));
    let profile = p.stop();
    assert!(profile.total(0) > 0, "no samples");
    assert_eq!(profile.lost, 0);
    assert!(!profile.modules.is_empty());
    let mut buf = Vec::new();
    profile.write_trace(&mut buf).unwrap();
    let back = callstack::profile::Profile::read_trace(&buf[..]).unwrap();
    assert_eq!(back.stacks, profile.stacks);
    assert_eq!(back.threads, profile.threads);
    let names = callstack::profile::Names::unresolved(&profile);
    assert!(!callstack::profile::pprof::encode(&profile, &names).is_empty());
    // A second profiler may start once the first has stopped.
    drop(Profiler::start(100).unwrap());
}

#[test]
fn bad_rate_is_an_error() {
    assert!(Profiler::start(0).is_err());
}

/// Recurses `n` frames deep, then burns `ns` of CPU at the bottom.
#[inline(never)]
fn deep(n: u32, ns: u64) -> u64 {
    if n == 0 {
        return spin(ns);
    }
    // Not a tail call: each level keeps its frame.
    std::hint::black_box(deep(n - 1, ns)).wrapping_add(1)
}

/// Samples 100 frames deep, about 100 words of a thread's ring each,
/// taken for longer than the ring holds (8192 words at 100 Hz): the ring
/// wraps around its end many times and every sample comes out whole, the
/// recursion's return address 100 times in each.
#[test]
fn deep_samples_across_the_ring_end() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let p = Profiler::start(100).unwrap();
    let worker = std::thread::Builder::new()
        .name("deep".into())
        .spawn(|| {
            let t = std::time::Instant::now();
            let c0 = thread_cpu_ns();
            let r = deep(100, 1_500_000_000);
            eprintln!(
                "deep thread: {:?} wall, {} ns cpu",
                t.elapsed(),
                thread_cpu_ns() - c0
            );
            r
        })
        .unwrap();
    std::hint::black_box(worker.join().unwrap());
    let profile = p.stop();
    let tid = *profile
        .threads
        .iter()
        .find(|(_, n)| n.as_str() == "deep")
        .unwrap_or_else(|| {
            panic!(
                "no deep thread: {:?}, {} lost",
                profile.threads, profile.lost
            )
        })
        .0;
    let (mut whole, mut all) = (0i64, 0i64);
    for s in profile.stacks.iter().filter(|s| s.thread == Some(tid)) {
        let mut counts = std::collections::HashMap::<usize, u32>::new();
        for f in &s.frames {
            *counts.entry(*f).or_default() += 1;
        }
        let most = counts.values().copied().max().unwrap_or(0);
        all += s.values[0];
        if most >= 100 {
            whole += s.values[0];
        }
    }
    eprintln!("{whole} whole of {all}, {} lost", profile.lost);
    // 8192 words hold about 80 such samples: over 1.5 s at 100 Hz, some
    // 150 (fewer where the kernel's timer coalesces periods).
    assert!(
        all + profile.lost as i64 >= 90,
        "{all} samples, {} lost",
        profile.lost
    );
    assert!(whole * 100 >= all * 95, "{whole} whole of {all}");
}
