//! The per-pc cache of instruction-analysis results
//! (`callstack::unwind::insn::cache`), in-process through C code built
//! without CFI and without frame pointers (a shared library dlopened here):
//!
//! - a warm capture returns the same chain (addresses and methods) as the
//!   first, and takes its rules from the cache (it fills nothing);
//! - captures, cold and warm, in a signal handler and out of it, allocate
//!   nothing;
//! - strace shows no system call in cold or warm captures (the child
//!   process is this test binary, run again under strace).
#![cfg(target_arch = "x86_64")]

use callstack::unwind::insn::{cache, InProcess, Method};
use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

#[global_allocator]
static A: testsupport::alloc::Counting = testsupport::alloc::Counting;

// ---------------------------------------------------------------- library

fn build_nocfi_so(dir: &Path) -> PathBuf {
    let fx = testsupport::c_fixtures();
    let out = dir.join("libinsn-cache-o2-nocfi.so");
    let o = Command::new("gcc")
        .args([
            "-O2",
            "-fomit-frame-pointer",
            "-fPIC",
            "-shared",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ])
        .arg(fx.join("insn_chain.c"))
        .arg(fx.join("insn_asm_x86_64.S"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

use testsupport::insn_lib::{load, Lib};

/// A capture's result, in fixed storage (the callback runs where nothing
/// may allocate).
struct Capture {
    snap: *const InProcess,
    frames: [(u64, Method); 128],
    n: usize,
}

extern "C" fn insn_cb(arg: *mut c_void) {
    // SAFETY: `arg` is the `Capture` given to `run`.
    let cap = unsafe { &mut *(arg as *mut Capture) };
    // SAFETY: the snapshot outlives the call.
    cap.n = unsafe { &*cap.snap }.capture_with_methods(&mut cap.frames);
}

/// Captures through the library's no-CFI chain: `insn_entry` calls its
/// functions, the innermost calls `insn_cb`. One call site for every run,
/// so the frames below are the same.
#[inline(never)]
fn run(lib: &Lib, cap: &mut Capture) {
    // SAFETY: `insn_entry` calls `insn_cb(cap)` once and returns.
    unsafe { (lib.entry)(insn_cb, cap as *mut Capture as *mut c_void) };
    std::hint::black_box(());
}

fn frames(cap: &Capture) -> Vec<(u64, Method)> {
    cap.frames[..cap.n].to_vec()
}

fn lib_frames(lib: &Lib, f: &[(u64, Method)]) -> usize {
    f.iter()
        .filter(|(pc, m)| {
            (lib.base..lib.end).contains(&(*pc as usize)) && matches!(m, Method::Insn)
        })
        .count()
}

fn setup(name: &str) -> (Lib, &'static InProcess) {
    let dir = testsupport::scratch_dir(name);
    let lib = load(&build_nocfi_so(&dir));
    let snap: &'static InProcess = Box::leak(Box::new(InProcess::new()));
    callstack::prepare_thread();
    (lib, snap)
}

fn new_capture(snap: &InProcess) -> Box<Capture> {
    Box::new(Capture {
        snap,
        frames: [(0, Method::Context); 128],
        n: 0,
    })
}

// ---------------------------------------------------------------- tests

/// Serializes the tests of this binary: they share the process's cache.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn warm_capture_equals_cold_and_hits_the_cache() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (lib, snap) = setup("insn-cache-warm");
    let c = cache::in_process_cache();
    // InProcess::new cleared the cache.
    assert!(c.is_empty(), "{} entries after InProcess::new", c.len());
    let mut cap = new_capture(snap);
    // One call site for all runs (the frames below `run` are the same).
    let mut chains = vec![];
    let mut fills = vec![c.fills()];
    for _ in 0..3 {
        run(&lib, &mut cap);
        chains.push(frames(&cap));
        fills.push(c.fills());
    }
    let (cold, warm, warm2) = (&chains[0], &chains[1], &chains[2]);
    let (f1, f2) = (fills[1] - fills[0], fills[2] - fills[1]);
    assert_eq!(cold, warm, "warm chain differs from the cold one");
    assert_eq!(cold, warm2, "second warm chain differs");
    // The library's own chain (no CFI, no frame pointer) was walked by
    // instruction analysis: insn_entry -> a -> b -> c -> d (and the asm
    // function), at least 4 frames.
    assert!(
        lib_frames(&lib, cold) >= 4,
        "library frames by insn: {cold:x?}"
    );
    // The cold capture filled the cache; the warm one found its rules there
    // (a set conflict may evict an entry or two, never most).
    let (cold_fills, warm_fills) = (f1, f2);
    assert!(
        cold_fills >= cold.len() as u64 / 2,
        "cold fills {cold_fills}"
    );
    assert!(
        warm_fills * 4 <= cold_fills,
        "warm capture filled {warm_fills} lines (cold {cold_fills})"
    );
    assert!(c.len() >= lib_frames(&lib, cold));
}

extern "C" fn exact_cb(arg: *mut c_void) {
    // SAFETY: `arg` is the `Capture` given to `run_exact`.
    let cap = unsafe { &mut *(arg as *mut Capture) };
    let mut out = [callstack::unwind::Frame {
        pc: 0,
        sp: 0,
        fp: 0,
        method: Method::Context,
    }; 128];
    let (n, _) = callstack::capture_exact_with_info(0, &mut out);
    for (o, f) in cap.frames.iter_mut().zip(&out[..n]) {
        *o = (f.pc, f.method);
    }
    cap.n = n;
}

/// `capture_exact` through the same chain: CFI for the Rust frames, the
/// instruction-analysis fallback (`InsnFallback`) for the library's. Warm
/// equals cold; when `capture_exact`'s fallback uses
/// `cache::fallback_cache()`, the warm capture takes its rules from it.
#[test]
fn capture_exact_warm_equals_cold_through_no_cfi_code() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (lib, snap) = setup("insn-cache-exact");
    callstack::prepare();
    let c = cache::fallback_cache();
    let mut cap = new_capture(snap);
    let mut chains = vec![];
    let mut fills = vec![c.fills()];
    for _ in 0..3 {
        // SAFETY: `insn_entry` calls `exact_cb(cap)` once and returns.
        unsafe { (lib.entry)(exact_cb, &mut *cap as *mut Capture as *mut c_void) };
        chains.push(frames(&cap));
        fills.push(c.fills());
    }
    assert_eq!(chains[0], chains[1], "warm capture_exact differs");
    assert_eq!(chains[0], chains[2], "second warm capture_exact differs");
    assert!(
        lib_frames(&lib, &chains[0]) >= 4,
        "library frames by insn: {:x?}",
        chains[0]
    );
    let (cold_fills, warm_fills) = (fills[1] - fills[0], fills[2] - fills[1]);
    println!("fallback cache lines filled: cold {cold_fills}, warm {warm_fills}");
    assert!(
        warm_fills * 4 <= cold_fills,
        "warm capture_exact filled {warm_fills} lines (cold {cold_fills})"
    );
}

static HANDLER_CAP: AtomicUsize = AtomicUsize::new(0);
static HANDLER_LIB: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_usr1(_: c_int) {
    let cap = HANDLER_CAP.load(Ordering::SeqCst) as *mut Capture;
    let lib = HANDLER_LIB.load(Ordering::SeqCst) as *const Lib;
    // SAFETY: both were set by the test before raising and outlive it.
    unsafe { run(&*lib, &mut *cap) };
}

#[inline(never)]
fn raise_usr1() {
    // SAFETY: raising a signal whose handler is installed.
    unsafe { libc::raise(libc::SIGUSR1) };
    std::hint::black_box(());
}

fn install_usr1() {
    // SAFETY: installing a plain handler for SIGUSR1.
    unsafe { libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t) };
}

#[test]
fn captures_do_not_allocate_cold_or_warm_in_a_signal_handler() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (lib, snap) = setup("insn-cache-noalloc");
    let mut cap = new_capture(snap);
    let mut hcap = new_capture(snap);
    HANDLER_CAP.store(&mut *hcap as *mut Capture as usize, Ordering::SeqCst);
    HANDLER_LIB.store(&lib as *const Lib as usize, Ordering::SeqCst);
    install_usr1();
    // Warm up what is not ours to test (the first raise).
    raise_usr1();
    cache::invalidate();
    // Runs 0 and 1: cold then warm; runs 2 and 3: in the handler, cold
    // (its frames were never analyzed) then warm. Results are copied into
    // fixed arrays: nothing in the armed part may allocate.
    let mut out = [[(0u64, Method::Context); 128]; 4];
    let mut n = [0usize; 4];
    let before = testsupport::alloc::thread_allocs();
    for i in 0..4 {
        if i < 2 {
            run(&lib, &mut cap);
            (out[i], n[i]) = (cap.frames, cap.n);
        } else {
            raise_usr1();
            (out[i], n[i]) = (hcap.frames, hcap.n);
        }
    }
    let after = testsupport::alloc::thread_allocs();
    assert_eq!(after - before, 0, "captures allocated");
    assert_eq!(out[0][..n[0]], out[1][..n[1]], "warm capture differs");
    assert_eq!(
        out[2][..n[2]],
        out[3][..n[3]],
        "warm handler capture differs"
    );
    let in_handler = &out[2][..n[2]];
    // The handler's capture went through the library and the signal frame.
    assert!(lib_frames(&lib, in_handler) >= 4, "{in_handler:x?}");
    assert!(
        in_handler.iter().any(|f| f.1 == Method::SignalFrame),
        "{in_handler:x?}"
    );
}

const CHILD_ENV: &str = "CALLSTACK_INSN_CACHE_STRACE_LIB";

/// Marks a section boundary in the strace log.
fn marker() {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() };
}

/// The part run under strace (only when the parent test sets the variable).
#[test]
fn strace_child() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let lib = load(Path::new(&path));
    let snap: &'static InProcess = Box::leak(Box::new(InProcess::new()));
    callstack::prepare_thread();
    let mut cap = new_capture(snap);
    let mut hcap = new_capture(snap);
    HANDLER_CAP.store(&mut *hcap as *mut Capture as usize, Ordering::SeqCst);
    HANDLER_LIB.store(&lib as *const Lib as usize, Ordering::SeqCst);
    install_usr1();
    // One call site for the cold and the warm captures.
    let mut first = None;
    for i in 0..4 {
        marker(); // 1: cold capture, 2..4: warm ones
        run(&lib, &mut cap);
        if i == 0 {
            first = Some((cap.frames, cap.n));
        }
    }
    let cold = first.map(|(f, n)| f[..n].to_vec()).unwrap();
    marker(); // 5: raise, a capture in the handler (cache cleared: cold)
    cache::invalidate();
    raise_usr1();
    marker(); // 6: raise again (warm)
    raise_usr1();
    marker(); // 7: end
    assert_eq!(cold, frames(&cap));
    assert!(lib_frames(&lib, &cold) >= 4);
    assert!(lib_frames(&lib, &frames(&hcap)) >= 4);
}

#[test]
fn captures_make_no_system_calls() {
    if Command::new("strace").arg("-V").output().is_err() {
        panic!("strace is not installed (scripts/install-test-deps.sh installs it)");
    }
    let dir = testsupport::scratch_dir("insn-cache-strace");
    let so = build_nocfi_so(&dir);
    let log = dir.join("strace.log");
    let out = Command::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&log)
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "strace_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, &so)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    // Split at the markers; a section keeps only the calls of the thread
    // that made the markers.
    let sections = testsupport::strace_sections(&text);
    assert!(sections.len() >= 8, "{text}");
    assert!(sections[1].is_empty(), "cold capture: {:?}", sections[1]);
    for s in &sections[2..5] {
        assert!(s.is_empty(), "warm capture: {s:?}");
    }
    for (i, what) in [(5, "cold"), (6, "warm")] {
        // The signal's own calls only.
        assert!(
            sections[i].iter().all(|c| c.starts_with("gettid(")
                || c.starts_with("getpid(")
                || c.starts_with("tgkill(")
                || c.starts_with("rt_sigprocmask(")
                || c.starts_with("rt_sigreturn(")
                || c.starts_with("---")),
            "{what} capture in a signal handler: {:?}",
            sections[i]
        );
    }
}
