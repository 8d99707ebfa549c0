//! In-process machine-code unwinding through C code built without CFI and
//! without frame pointers (a shared library dlopened by this test), and on
//! x86-64 a hand-written assembly function without CFI (elsewhere that
//! middle frame is C, `insn_mid.c`).
//!
//! The truth is libgcc's `_Unwind_Backtrace` (CFI) through the same library
//! built with unwind tables (`.text` checked identical): both chains are
//! compared frame by frame, the library's frames by offset in the library.
//! `capture_exact` is checked on every architecture (under a qemu-user
//! stage the library is built by the stage's cross compiler), also from a
//! signal handler that interrupted the library, through the signal frame,
//! and allocating nothing; the machine-code-only walker `InProcess` too.

#[global_allocator]
static COUNTING: testsupport::alloc::Counting = testsupport::alloc::Counting;

use callstack::unwind::insn::InProcess;
use callstack::unwind::insn::Method;
use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

fn build_so(dir: &Path, opt: &str, cfi: bool, strip: bool) -> PathBuf {
    let fx = testsupport::c_fixtures();
    let out = dir.join(format!(
        "libinsn-{}-{}{}.so",
        opt.trim_start_matches('-'),
        if cfi { "cfi" } else { "nocfi" },
        if strip { "-s" } else { "" }
    ));
    // The stage's cross compiler under qemu-user (scripts/test-<arch>.sh).
    let cc = std::env::var("CALLSTACK_TEST_CC").unwrap_or_else(|_| "gcc".into());
    let mut cmd = Command::new(cc);
    cmd.arg(opt)
        .args(["-fomit-frame-pointer", "-fPIC", "-shared"]);
    if cfi {
        cmd.arg("-DWITH_CFI");
    } else {
        cmd.args(["-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]);
    }
    if strip {
        // Stripped at link time: the same .text, no symbol table.
        cmd.arg("-s");
    }
    let mid = if cfg!(target_arch = "x86_64") {
        "insn_asm_x86_64.S"
    } else {
        "insn_mid.c"
    };
    cmd.arg(fx.join("insn_chain.c"))
        .arg(fx.join(mid))
        .arg("-o")
        .arg(&out);
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// The `.text` section: its address and size, and its bytes but on
/// RISC-V 64, where the build with tables places `.text` elsewhere (and
/// so its `auipc` offsets differ) with the same code in it.
fn text(p: &Path) -> (u64, u64, Vec<u8>) {
    use object::{Object, ObjectSection};
    let d = std::fs::read(p).unwrap();
    let f = object::File::parse(&*d).unwrap();
    let t = f.section_by_name(".text").unwrap();
    let bytes = if cfg!(target_arch = "riscv64") {
        Vec::new()
    } else {
        t.data().unwrap().to_vec()
    };
    (t.address(), t.size(), bytes)
}

use testsupport::insn_lib::{load, Lib};

#[repr(C)]
struct UnwindContext {
    _p: [u8; 0],
}
extern "C" {
    fn _Unwind_Backtrace(
        f: extern "C" fn(*mut UnwindContext, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(ctx: *mut UnwindContext) -> usize;
}

extern "C" fn collect(ctx: *mut UnwindContext, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Vec` passed by `truth_cb`.
    let v = unsafe { &mut *(arg as *mut Vec<usize>) };
    // SAFETY: libgcc's context during its own walk.
    v.push(unsafe { _Unwind_GetIP(ctx) });
    0
}

struct Capture {
    snap: *const InProcess,
    frames: Vec<(u64, Method)>,
    truth: Vec<usize>,
    /// Allocations made by the capture under test.
    allocs: u64,
}

extern "C" fn truth_cb(arg: *mut c_void) {
    // SAFETY: `arg` is the `Capture` of `run`.
    let cap = unsafe { &mut *(arg as *mut Capture) };
    let mut v = Vec::new();
    // SAFETY: the callback and its argument live across the call.
    unsafe { _Unwind_Backtrace(collect, &mut v as *mut Vec<usize> as *mut c_void) };
    cap.truth = v;
}

extern "C" fn exact_cb(arg: *mut c_void) {
    // SAFETY: `arg` is the `Capture` of `run`.
    let cap = unsafe { &mut *(arg as *mut Capture) };
    let mut out = [callstack::unwind::Frame {
        pc: 0,
        sp: 0,
        fp: 0,
        method: Method::Context,
    }; 128];
    let before = testsupport::alloc::thread_allocs();
    let (n, _) = callstack::capture_exact_with_info(0, &mut out);
    cap.allocs = testsupport::alloc::thread_allocs() - before;
    cap.frames = out[..n].iter().map(|f| (f.pc, f.method)).collect();
}

// ------------------------------------------- from a handler, through a signal

const EMPTY: callstack::unwind::Frame = callstack::unwind::Frame {
    pc: 0,
    sp: 0,
    fp: 0,
    method: Method::Context,
};

/// What the `SIGUSR1` handler does: libgcc's walk (the truth) or ours.
static HANDLER_TRUTH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// What the handler captured: our frames, libgcc's pcs and their count.
struct HandlerOut(std::cell::UnsafeCell<([callstack::unwind::Frame; 128], [usize; 128], usize)>);
// SAFETY: written only by the handler, on the thread that raised it, and
// read by that thread once the handler has returned; the tests that raise
// run one at a time (`SERIAL`).
unsafe impl Sync for HandlerOut {}
static HANDLER: HandlerOut = HandlerOut(std::cell::UnsafeCell::new(([EMPTY; 128], [0; 128], 0)));
static HANDLER_N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static HANDLER_ALLOCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn collect_fixed(ctx: *mut UnwindContext, _: *mut c_void) -> c_int {
    // SAFETY: only the handler's libgcc walk writes these, on this thread;
    // read after the handler returned. libgcc's context during its walk.
    unsafe {
        let h = &mut *HANDLER.0.get();
        if h.2 < h.1.len() {
            h.1[h.2] = _Unwind_GetIP(ctx);
            h.2 += 1;
        }
    }
    0
}

extern "C" fn on_usr1(_: c_int, _: *mut libc::siginfo_t, _: *mut c_void) {
    use std::sync::atomic::Ordering::SeqCst;
    if HANDLER_TRUTH.load(SeqCst) {
        // SAFETY: as in `collect_fixed`; the callback lives across the call.
        unsafe {
            (*HANDLER.0.get()).2 = 0;
            _Unwind_Backtrace(collect_fixed, std::ptr::null_mut());
        }
        return;
    }
    let before = testsupport::alloc::thread_allocs();
    // SAFETY: written only here, on the thread that raised; read after the
    // handler returned.
    let out = unsafe { &mut (*HANDLER.0.get()).0 };
    let (n, _) = callstack::capture_exact_with_info(0, out);
    HANDLER_ALLOCS.store(testsupport::alloc::thread_allocs() - before, SeqCst);
    HANDLER_N.store(n, SeqCst);
}

/// Raises `SIGUSR1` (its handler `on_usr1`) from the library's `d`.
fn raise_usr1(truth: bool) {
    use std::sync::atomic::Ordering::SeqCst;
    HANDLER_TRUTH.store(truth, SeqCst);
    // SAFETY: a plain SA_SIGINFO handler of that type, then a synchronous
    // signal to this thread.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        libc::raise(libc::SIGUSR1);
    }
}

extern "C" fn truth_signal_cb(arg: *mut c_void) {
    // SAFETY: `arg` is the `Capture` of `run`.
    let cap = unsafe { &mut *(arg as *mut Capture) };
    raise_usr1(true);
    // SAFETY: the handler has returned.
    let h = unsafe { &*HANDLER.0.get() };
    cap.truth = h.1[..h.2].to_vec();
}

extern "C" fn exact_signal_cb(arg: *mut c_void) {
    use std::sync::atomic::Ordering::SeqCst;
    // SAFETY: `arg` is the `Capture` of `run`.
    let cap = unsafe { &mut *(arg as *mut Capture) };
    raise_usr1(false);
    let n = HANDLER_N.load(SeqCst);
    // SAFETY: the handler has returned.
    let frames = unsafe { &(*HANDLER.0.get()).0 };
    cap.frames = frames[..n].iter().map(|f| (f.pc, f.method)).collect();
    cap.allocs = HANDLER_ALLOCS.load(SeqCst);
}

extern "C" fn insn_cb(arg: *mut c_void) {
    // SAFETY: `arg` is the `Capture` of `run`.
    let cap = unsafe { &mut *(arg as *mut Capture) };
    let mut out = [(0u64, Method::Context); 128];
    let before = testsupport::alloc::thread_allocs();
    // SAFETY: the snapshot outlives the call.
    let n = unsafe { &*cap.snap }.capture_with_methods(&mut out);
    cap.allocs = testsupport::alloc::thread_allocs() - before;
    cap.frames = out[..n].to_vec();
}

#[inline(never)]
fn run(lib: &Lib, cb: extern "C" fn(*mut c_void), cap: &mut Capture) {
    // SAFETY: `insn_entry` calls `cb(cap)` once and returns.
    unsafe { (lib.entry)(cb, cap as *mut Capture as *mut c_void) };
    std::hint::black_box(());
}

/// Normalizes a pc: offsets from the library's `.text` (at `text` in the
/// file) inside the library, absolute elsewhere.
fn norm(lib: &Lib, text: u64, pc: usize) -> (bool, usize) {
    if lib.base <= pc && pc < lib.end {
        (true, (pc - lib.base).wrapping_sub(text as usize))
    } else {
        (false, pc)
    }
}

fn check(opt: &str, strip: bool) {
    check_with(opt, strip, insn_cb);
}

/// The same chain through `capture_exact`: CFI for the Rust frames, the
/// instruction-analysis fallback for the library's.
fn check_exact(opt: &str, strip: bool) {
    check_with(opt, strip, exact_cb);
}

/// The same from a signal handler that interrupted the library's innermost
/// frame (in `raise`): libgcc's chain there against `capture_exact`'s,
/// through the signal frame into the library.
fn check_exact_signal(opt: &str, strip: bool) {
    if cfg!(target_arch = "riscv64") && std::env::var_os("CALLSTACK_TEST_QEMU").is_some() {
        // qemu-riscv64's signal trampoline is an anonymous page in no
        // module (no vDSO), which a walk in process does not read, and
        // RISC-V's signal frame has no mark to know it by (AArch64's has
        // its FP/SIMD record): no walk from a handler crosses it there.
        eprintln!("skipped under qemu-riscv64: its signal trampoline is no module's code");
        return;
    }
    check_inner(opt, strip, truth_signal_cb, exact_signal_cb);
}

/// One test of this file at a time where a test counts the process's code
/// lookups ([`capture_exact_looks_code_up_once_per_segment`]).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn check_with(opt: &str, strip: bool, cb: extern "C" fn(*mut c_void)) {
    check_inner(opt, strip, truth_cb, cb);
}

fn check_inner(
    opt: &str,
    strip: bool,
    truth_cb: extern "C" fn(*mut c_void),
    cb: extern "C" fn(*mut c_void),
) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = testsupport::scratch_dir(&format!(
        "insn-inproc-{}-{strip}",
        opt.trim_start_matches('-')
    ));
    let cfi = build_so(&dir, opt, true, false);
    let nocfi = build_so(&dir, opt, false, strip);
    let (cfi_at, cfi_len, cfi_bytes) = text(&cfi);
    let (nocfi_at, nocfi_len, nocfi_bytes) = text(&nocfi);
    assert!(
        cfi_len == nocfi_len && cfi_bytes == nocfi_bytes,
        ".text differs"
    );
    let cfi = load(&cfi);
    let nocfi = load(&nocfi);
    let snap = InProcess::new();
    callstack::prepare();
    let mut cap = Capture {
        snap: &snap,
        frames: vec![],
        truth: vec![],
        allocs: 0,
    };
    // One call site for both runs, so the frames below are the same.
    for (lib, cb) in [(&cfi, truth_cb as extern "C" fn(*mut c_void)), (&nocfi, cb)] {
        run(lib, cb, &mut cap);
    }
    // libgcc ends with a 0 entry: not a frame.
    let truth: Vec<(bool, usize)> = cap
        .truth
        .iter()
        .filter(|&&p| p != 0)
        .map(|&p| norm(&cfi, cfi_at, p))
        .collect();
    let ours: Vec<(bool, usize)> = cap
        .frames
        .iter()
        .map(|f| norm(&nocfi, nocfi_at, f.0 as usize))
        .collect();
    // Align at the first frame inside the library (the return address in d).
    let t0 = truth
        .iter()
        .position(|f| f.0)
        .expect("library frame in truth");
    let o0 = ours
        .iter()
        .position(|f| f.0)
        .expect("library frame in ours");
    let truth = &truth[t0..];
    let ours_tail = &ours[o0..];
    // The library's 6 frames, then this test's `run` and the frames below
    // it, down to the thread's start.
    assert!(truth.len() >= 8, "{truth:x?}");
    let lib_frames = truth.iter().filter(|f| f.0).count();
    assert_eq!(
        lib_frames, 6,
        "the chain d c mid b a insn_entry: {truth:x?}"
    );
    assert!(
        ours_tail.len() >= truth.len() && ours_tail[..truth.len()] == *truth,
        "{opt} strip={strip}: chain differs\n truth: {truth:x?}\n  ours: {ours_tail:x?}\n methods: {:?}",
        cap.frames
    );
    assert_eq!(cap.allocs, 0, "{opt} strip={strip}: the capture allocated");
    // The callers of the library's 6 frames were found from the library's
    // code (it has no CFI and no frame pointer); a frame's method says how
    // the step from the frame below found it.
    for f in &cap.frames[o0 + 1..=o0 + 6] {
        assert!(
            matches!(f.1, Method::Insn | Method::Scan),
            "{opt} strip={strip}: {f:x?} in {:x?}",
            cap.frames
        );
    }
}

#[test]
fn capture_exact_o2_unstripped() {
    check_exact("-O2", false);
}

#[test]
fn capture_exact_o2_stripped() {
    check_exact("-O2", true);
}

#[test]
fn capture_exact_o0_unstripped() {
    check_exact("-O0", false);
}

#[test]
fn inprocess_o2_unstripped() {
    check("-O2", false);
}

#[test]
fn inprocess_o2_stripped() {
    check("-O2", true);
}

#[test]
fn inprocess_o0_unstripped() {
    check("-O0", false);
}

#[test]
fn inprocess_o0_stripped() {
    check("-O0", true);
}

#[test]
fn capture_exact_o0_stripped() {
    check_exact("-O0", true);
}

#[test]
fn capture_exact_in_a_handler_o2_stripped() {
    check_exact_signal("-O2", true);
}

#[test]
fn capture_exact_in_a_handler_o0_unstripped() {
    check_exact_signal("-O0", false);
}

/// Code lookups of the last warm `capture_exact` in [`lookups_cb`], and its
/// frames.
static LOOKUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static LOOKUP_FRAMES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn lookups_cb(_: *mut c_void) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = [0usize; 128];
    // Warm: the rules and the stack bounds are cached after this one.
    callstack::capture_exact(0, &mut out);
    let before = callstack::__code_lookups();
    let n = callstack::capture_exact(0, &mut out);
    LOOKUPS.store(callstack::__code_lookups() - before, Relaxed);
    LOOKUP_FRAMES.store(n, Relaxed);
}

/// A warm `capture_exact` through the stripped library (no CFI, no frame
/// pointers, no symbols: the analysis reads each function's code back from
/// the pc, two or four bytes at a time, to find where it starts) looks the
/// library's code segment up a few times per walk, not on every read (as
/// it did: 128 lookups in this walk on AArch64, 777 on RISC-V 64, where a
/// warm capture on a thread, through glibc's start_thread without CFI or
/// symbol, took 4.1 ms under qemu instead of 0.28).
#[test]
fn capture_exact_looks_code_up_once_per_segment() {
    use std::sync::atomic::Ordering::Relaxed;
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = testsupport::scratch_dir("insn-inproc-lookups");
    let lib = load(&build_so(&dir, "-O2", false, true));
    callstack::prepare();
    let mut cap = Capture {
        snap: std::ptr::null(),
        frames: vec![],
        truth: vec![],
        allocs: 0,
    };
    run(&lib, lookups_cb, &mut cap);
    let (lookups, frames) = (LOOKUPS.load(Relaxed), LOOKUP_FRAMES.load(Relaxed));
    eprintln!("{lookups} code lookups in a walk of {frames} frames");
    // The library's 6 frames, each read from its own code, then the
    // return address checked in its caller's: a lookup or two each when
    // the walk moves between the library and this test's code.
    assert!(frames >= 8, "{frames} frames");
    assert!(
        lookups <= 4 * frames,
        "{lookups} code lookups in a walk of {frames} frames"
    );
}
