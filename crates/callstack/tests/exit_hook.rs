//! Exit hooks (`callstack::exit_hook`): hooks run when the hooked frame
//! returns, in order, with every return register intact; captures below a
//! hooked frame, inside a hook and from a signal equal the captures without
//! hooks; a panic unwinds through a hooked frame.
#![cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_os = "linux"
))]

use callstack::exit_hook;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

// The tests share the process-wide skipped counter; run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A hook that clobbers every return register it can reach.
fn clobber() {
    let x = black_box(1.2345f64);
    let v = black_box([x * 3.0, x / 7.0, x + 11.0, x - 5.0]);
    black_box(v.iter().sum::<f64>().sqrt());
    black_box(u128::from(black_box(0xdead_beefu64)) * 0x1_0000_0001);
    let s = format!("{:?}", black_box(v));
    black_box(s);
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pair {
    a: f64,
    b: f64,
}

#[inline(never)]
extern "C" fn ret_u128(hook: bool) -> u128 {
    if hook {
        exit_hook::install(0, clobber).unwrap();
    }
    black_box(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210u128)
}

#[inline(never)]
extern "C" fn ret_pair(hook: bool) -> Pair {
    if hook {
        exit_hook::install(0, clobber).unwrap();
    }
    black_box(Pair { a: 1.5, b: -2.25 })
}

#[inline(never)]
extern "C" fn ret_f32(hook: bool) -> f32 {
    if hook {
        exit_hook::install(0, clobber).unwrap();
    }
    black_box(3.75f32)
}

/// Four doubles: AArch64 returns them in d0-d3 (a homogeneous aggregate).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Quad {
    a: f64,
    b: f64,
    c: f64,
    d: f64,
}

#[inline(never)]
extern "C" fn ret_quad(hook: bool) -> Quad {
    if hook {
        exit_hook::install(0, clobber).unwrap();
    }
    black_box(Quad {
        a: 0.5,
        b: -1.75,
        c: 1e300,
        d: f64::MIN_POSITIVE,
    })
}

/// Too large for registers: returned through memory the caller passes
/// (AArch64: its address in x8).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Big {
    w: [u64; 6],
}

#[inline(never)]
extern "C" fn ret_big(hook: bool) -> Big {
    if hook {
        exit_hook::install(0, clobber).unwrap();
    }
    black_box(Big {
        w: [1, u64::MAX, 3, 0x8000_0000_0000_0000, 5, 6],
    })
}

#[inline(never)]
extern "C" fn ret_f64(hook: bool) -> f64 {
    if hook {
        exit_hook::install(0, clobber).unwrap();
    }
    black_box(-6.125f64)
}

#[test]
fn return_registers_survive_the_hook() {
    let _g = serial();
    for _ in 0..3 {
        assert_eq!(ret_u128(true), ret_u128(false));
        assert_eq!(ret_pair(true), ret_pair(false));
        assert_eq!(ret_f32(true), ret_f32(false));
        assert_eq!(ret_f64(true), ret_f64(false));
        assert_eq!(ret_quad(true), ret_quad(false));
        assert_eq!(ret_big(true), ret_big(false));
    }
}

static ORDER: AtomicU64 = AtomicU64::new(0);

fn push_digit(d: u64) {
    let o = ORDER.load(Ordering::Relaxed);
    ORDER.store(o * 10 + d, Ordering::Relaxed);
}

#[inline(never)]
fn nested_inner() -> u32 {
    exit_hook::install(0, || push_digit(1)).unwrap();
    exit_hook::install(1, || push_digit(3)).unwrap();
    // A second and a third hook on `nested_inner`: the last installed runs
    // first.
    exit_hook::install(0, || push_digit(2)).unwrap();
    exit_hook::install(0, || push_digit(4)).unwrap();
    black_box(7)
}

#[inline(never)]
fn nested_outer() -> u32 {
    let v = nested_inner();
    // `nested_inner`'s hooks have run; `nested_outer`'s has not.
    push_digit(9);
    black_box(v + 1)
}

#[test]
fn nested_hooks_run_in_order() {
    let _g = serial();
    ORDER.store(0, Ordering::Relaxed);
    assert_eq!(nested_outer(), 8);
    assert_eq!(ORDER.load(Ordering::Relaxed), 4_2_1_9_3);
}

/// Captures from inside `hooked` (before and after installing its hook),
/// and from its hook.
struct Seen {
    fast: Vec<usize>,
    exact: Vec<usize>,
    fast_hooked: Vec<usize>,
    exact_hooked: Vec<usize>,
    in_hook: Vec<usize>,
}

static IN_HOOK: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn capture_exact_vec() -> Vec<usize> {
    let mut out = [0usize; 128];
    let n = callstack::capture_exact(0, &mut out);
    out[..n].to_vec()
}

fn capture_fast_vec() -> Vec<usize> {
    let mut out = [0usize; 128];
    let n = callstack::capture_fast(0, &mut out);
    out[..n].to_vec()
}

#[inline(never)]
fn hooked(depth: u32) -> Seen {
    let fast = capture_fast_vec();
    let exact = capture_exact_vec();
    exit_hook::install(depth, || {
        *IN_HOOK.lock().unwrap() = capture_exact_vec();
    })
    .unwrap();
    let fast_hooked = capture_fast_vec();
    let exact_hooked = capture_exact_vec();
    black_box(Seen {
        fast,
        exact,
        fast_hooked,
        exact_hooked,
        in_hook: Vec::new(),
    })
}

#[inline(never)]
fn caller_of_hooked(depth: u32) -> Seen {
    let mut s = hooked(depth);
    black_box(&mut s);
    s.in_hook = IN_HOOK.lock().unwrap().clone();
    s
}

#[inline(never)]
fn caller_of_caller() -> Seen {
    let s = caller_of_hooked(1);
    black_box(s)
}

#[test]
fn captures_below_a_hooked_frame_are_unchanged() {
    let _g = serial();
    for _ in 0..3 {
        for s in [caller_of_hooked(0), caller_of_caller()] {
            // Frames 0 (in `capture_*_vec`) and 1 (the call sites in
            // `hooked`) differ; every caller from there on is the same.
            assert!(s.exact.len() > 4, "{:x?}", s.exact);
            assert_eq!(s.exact[2..], s.exact_hooked[2..]);
            assert_eq!(s.fast.len(), s.fast_hooked.len());
            assert_eq!(s.fast[2..], s.fast_hooked[2..]);
            assert!(!s.exact_hooked.contains(&trampoline()));
            assert!(!s.fast_hooked.contains(&trampoline()));
        }
    }
}

fn trampoline() -> usize {
    exit_hook::trampoline_address().unwrap()
}

#[test]
fn a_capture_inside_the_hook_passes_through_the_trampoline() {
    let _g = serial();
    let s = caller_of_hooked(0);
    // In `hooked`: [hooked, caller_of_hooked, the test, ...]. In the hook:
    // [the hook closure, ..., dispatch, trampoline, caller_of_hooked, the
    // test, ...]: everything from `caller_of_hooked` on is the same.
    let tail = &s.exact[2..];
    assert!(
        s.in_hook.ends_with(tail),
        "in hook {:x?}\nin hooked {:x?}",
        s.in_hook,
        s.exact
    );
}

#[inline(never)]
fn panicking(hook_runs: &'static AtomicU64) -> u32 {
    exit_hook::install(0, move || {
        hook_runs.fetch_add(1, Ordering::Relaxed);
    })
    .unwrap();
    if black_box(true) {
        panic!("through a hooked frame");
    }
    black_box(1)
}

#[inline(never)]
fn calls_panicking(hook_runs: &'static AtomicU64) -> u32 {
    black_box(panicking(hook_runs)) + 1
}

#[test]
fn a_panic_unwinds_through_a_hooked_frame() {
    let _g = serial();
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let before = exit_hook::skipped();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(|| calls_panicking(&RUNS));
    std::panic::set_hook(hook);
    assert!(r.is_err());
    // The frame never returned: its hook did not run, and the next hook on
    // this thread notices.
    assert_eq!(RUNS.load(Ordering::Relaxed), 0);
    ORDER.store(0, Ordering::Relaxed);
    nested_outer();
    assert_eq!(exit_hook::skipped(), before + 1);
}

static mut SIG_BUF: [usize; 128] = [0; 128];
static SIG_N: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_usr2(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid ucontext; the buffer is only
    // written here, read after `raise` returns.
    unsafe {
        let uc = &*(ctx as *const libc::ucontext_t);
        let buf = &mut *core::ptr::addr_of_mut!(SIG_BUF);
        let n = callstack::capture_from_context(uc, buf);
        SIG_N.store(n as u64, Ordering::Relaxed);
    }
}

#[inline(never)]
fn hooked_raises(hook: bool) -> Vec<usize> {
    if hook {
        exit_hook::install(0, || {}).unwrap();
    }
    // SAFETY: SIGUSR2's handler is installed by the test.
    unsafe { libc::raise(libc::SIGUSR2) };
    let n = SIG_N.load(Ordering::Relaxed) as usize;
    // SAFETY: the handler has returned.
    let v = unsafe { (&*core::ptr::addr_of!(SIG_BUF))[..n].to_vec() };
    black_box(v)
}

#[inline(never)]
fn calls_hooked_raises(hook: bool) -> Vec<usize> {
    let v = hooked_raises(hook);
    black_box(v)
}

#[test]
fn a_capture_from_a_signal_context_is_unchanged() {
    let _g = serial();
    // SAFETY: installs a handler that only captures.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_usr2 as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigaction(libc::SIGUSR2, &sa, core::ptr::null_mut());
    }
    // One call site for both, so that every frame may be compared.
    let mut chains = vec![];
    for hook in [false, true] {
        chains.push(calls_hooked_raises(hook));
    }
    let (plain, hooked) = (&chains[0], &chains[1]);
    assert!(plain.len() > 5, "{plain:x?}");
    assert_eq!(plain, hooked);
}

static CANCEL_RUNS: AtomicU64 = AtomicU64::new(0);

#[inline(never)]
fn cancels(which: u32) -> u32 {
    let a = exit_hook::install(0, || {
        CANCEL_RUNS.fetch_add(1, Ordering::Relaxed);
    })
    .unwrap();
    let b = exit_hook::install(0, || {
        CANCEL_RUNS.fetch_add(10, Ordering::Relaxed);
    })
    .unwrap();
    match which {
        0 => assert!(a.cancel()),
        1 => {
            assert!(a.cancel());
            assert!(b.cancel());
        }
        _ => {}
    }
    black_box(5)
}

#[inline(never)]
fn cancels_capture(which: u32) -> (u32, Vec<usize>) {
    let v = cancels(which);
    (v, capture_exact_vec())
}

#[test]
fn a_cancelled_hook_does_not_run() {
    let _g = serial();
    CANCEL_RUNS.store(0, Ordering::Relaxed);
    assert_eq!(cancels_capture(0).0, 5);
    assert_eq!(CANCEL_RUNS.load(Ordering::Relaxed), 10);
    // Both cancelled: the frame returns directly (its return address is
    // back), and nothing runs.
    CANCEL_RUNS.store(0, Ordering::Relaxed);
    assert_eq!(cancels_capture(1).0, 5);
    assert_eq!(CANCEL_RUNS.load(Ordering::Relaxed), 0);
    CANCEL_RUNS.store(0, Ordering::Relaxed);
    assert_eq!(cancels_capture(2).0, 5);
    assert_eq!(CANCEL_RUNS.load(Ordering::Relaxed), 11);
}

#[test]
fn a_handle_of_a_returned_frame_cancels_nothing() {
    let _g = serial();
    #[inline(never)]
    fn leak_handle() -> exit_hook::Installed {
        let h = exit_hook::install(0, || {}).unwrap();
        black_box(h)
    }
    let h = leak_handle();
    // The same frame address again, hooked anew: the old handle is stale.
    let h2 = leak_handle();
    assert!(!h.cancel());
    let _ = h2;
}

/// The depth, for `install` called by the caller of this function, of the
/// frame that the innermost `catch_unwind`'s catching frame calls directly.
/// The catching frame is the one running `__rust_try` (a frame of its own
/// in a debug build, whose callee is std's `do_call`) or, optimized, the one
/// `catch_unwind` is inlined into (its callee is then the closure's).
#[inline(never)]
fn depth_below_catch() -> u32 {
    use callstack::symbolize::{Address, Symbolizer};
    let mut out = [0usize; 64];
    let n = callstack::capture_exact(0, &mut out);
    let mut s = Symbolizer::new();
    // Frame 0 is this function, 1 its caller (depth 0).
    let catching = (2..n)
        .find(|&i| {
            s.symbolize(Address::Return(out[i]))
                .frames
                .iter()
                .filter_map(|f| f.function.as_deref())
                .any(|name| {
                    name == "__rust_try"
                        || ((name.starts_with("std::panicking::catch_unwind")
                            || name.starts_with("std::panicking::try"))
                            && !name.contains("do_call"))
                })
        })
        .expect("no catch_unwind frame above");
    assert!(catching >= 2, "{out:x?}");
    (catching - 2) as u32
}

static CAUGHT_RUNS: AtomicU64 = AtomicU64::new(0);

fn caught_hook() {
    CAUGHT_RUNS.fetch_add(1, Ordering::Relaxed);
}

/// Hooks frames below the catching frame, then panics: `which` 0 hooks the
/// frame the catching frame calls, 1 the one below it (caught two frames
/// up), 2 both (hooks on the thrower's side and on its caller).
#[inline(never)]
fn panics_below_catch(which: u32) -> u32 {
    let d = depth_below_catch();
    if which != 1 {
        exit_hook::install(d, caught_hook).unwrap();
    }
    if which != 0 {
        assert!(d >= 1, "no frame between the panic and the catching frame");
        exit_hook::install(d - 1, caught_hook).unwrap();
    }
    if black_box(true) {
        panic!("caught below a hooked frame");
    }
    black_box(which)
}

#[inline(never)]
fn calls_panics_below_catch(which: u32) -> u32 {
    black_box(panics_below_catch(which)) + 1
}

/// Catches a panic of `f` with the panic message silenced; then the next
/// hooks on the thread run (`nested_outer`). Returns whether it panicked
/// and how many hooks were counted skipped.
fn catch_quietly(f: impl FnOnce() -> u32 + std::panic::UnwindSafe) -> (bool, u64) {
    let before = exit_hook::skipped();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(f);
    std::panic::set_hook(hook);
    ORDER.store(0, Ordering::Relaxed);
    nested_outer();
    (r.is_err(), exit_hook::skipped() - before)
}

#[test]
fn a_panic_caught_by_the_hooked_frames_direct_caller() {
    let _g = serial();
    CAUGHT_RUNS.store(0, Ordering::Relaxed);
    // The frame hooked is the one `catch_unwind`'s catching frame calls:
    // libgcc must not take the trampoline's frame for the catching one.
    assert_eq!(catch_quietly(|| calls_panics_below_catch(0)), (true, 1));
    // The shape of the module's docs: the closure's callee hooks itself.
    assert_eq!(
        catch_quietly(|| {
            #[inline(never)]
            fn hooked_panics() -> u32 {
                exit_hook::install(0, caught_hook).unwrap();
                if black_box(true) {
                    panic!("caught by the caller");
                }
                1
            }
            hooked_panics()
        }),
        (true, 1)
    );
    assert_eq!(CAUGHT_RUNS.load(Ordering::Relaxed), 0);
}

#[test]
fn a_panic_caught_two_frames_above_a_hooked_frame() {
    let _g = serial();
    CAUGHT_RUNS.store(0, Ordering::Relaxed);
    assert_eq!(catch_quietly(|| calls_panics_below_catch(1)), (true, 1));
    // Hooks on two frames in a row, the catching frame right above them.
    assert_eq!(catch_quietly(|| calls_panics_below_catch(2)), (true, 2));
    assert_eq!(CAUGHT_RUNS.load(Ordering::Relaxed), 0);
}

/// The chain captured in `at_windows` (exact, from its caller on), and
/// the captures from contexts stopped at each instruction of the
/// trampoline's two windows where its frame holds no record.
#[cfg(target_arch = "aarch64")]
#[inline(never)]
fn at_windows() -> (Vec<usize>, Vec<(usize, Vec<usize>)>) {
    use callstack::{Frame, Method};
    exit_hook::install(0, || {}).unwrap();
    let blank = Frame {
        pc: 0,
        sp: 0,
        fp: 0,
        method: Method::Cfi,
    };
    let mut frames = [blank; 64];
    let (n, _) = callstack::capture_exact_with_info(0, &mut frames);
    assert!(n > 3);
    // Frame 1: this function's caller, as the trampoline returns to it:
    // its pc the original return address, its sp the key, its fp what
    // this function's epilogue restores.
    let caller = frames[1];
    let base: Vec<usize> = frames[1..n].iter().map(|f| f.pc as usize).collect();
    let t = trampoline();
    // SAFETY: the trampoline's code, a few hundred bytes, then more code
    // of this executable.
    let words = unsafe { core::slice::from_raw_parts(t as *const u32, 128) };
    // `stp x29, x11, [sp, #-16]!` stores the record; `ret` ends it.
    let found = t + 4 * words.iter().position(|&w| w == 0xa9bf_2ffd).unwrap();
    let tail = t + 4 * words.iter().position(|&w| w == 0xd65f_03c0).unwrap();
    assert!(t < found && found < tail, "{t:x} {found:x} {tail:x}");
    let mut seen = Vec::new();
    let pcs = (t..=found).step_by(4).chain([tail]);
    for pc in pcs {
        // SAFETY: a zeroed ucontext is a valid value; only its registers
        // are read.
        let mut uc: libc::ucontext_t = unsafe { core::mem::zeroed() };
        uc.uc_mcontext.pc = pc as u64;
        uc.uc_mcontext.sp = caller.sp;
        uc.uc_mcontext.regs[29] = caller.fp;
        // Before the record x30 is still the trampoline's address; at the
        // final `ret` it holds the original return address.
        uc.uc_mcontext.regs[30] = if pc == tail { caller.pc } else { t as u64 };
        let mut out = [0usize; 64];
        let k = callstack::capture_from_context(&uc, &mut out);
        seen.push((pc, out[..k].to_vec()));
    }
    black_box((base, seen))
}

/// A signal that stops the thread where the AArch64 trampoline's frame
/// holds no record (before it stores the original return address, and at
/// its final `ret`) is unwound to the hooked frame's real caller: contexts
/// made as the hardware would leave them at each such instruction.
#[cfg(target_arch = "aarch64")]
#[test]
fn contexts_in_the_trampolines_windows_unwind_to_the_real_caller() {
    let _g = serial();
    let (base, seen) = at_windows();
    assert!(seen.len() >= 10, "{}", seen.len());
    for (pc, chain) in seen {
        assert_eq!(chain.first(), Some(&pc));
        assert_eq!(chain[1..], base[..], "at {pc:#x}");
    }
}
