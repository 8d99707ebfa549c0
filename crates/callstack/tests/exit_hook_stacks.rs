//! Exit hooks pending on several stacks of one thread (ucontext coroutines,
//! an alternate signal stack) and on threads that end with hooks pending.
//! An entry is stale only for a frame of its own stack; a thread's entries
//! are dropped and counted when it ends.
#![cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_os = "linux"
))]

use callstack::exit_hook;
use std::cell::RefCell;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

// The tests share the process-wide skipped counter; run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the test runs under qemu-user (scripts/test-aarch64.sh), where
/// `why` keeps it from meaning anything: then it says so and is skipped.
fn skipped_under_qemu(why: &str) -> bool {
    let qemu = std::env::var_os("CALLSTACK_TEST_QEMU").is_some();
    if qemu {
        eprintln!("skipped under qemu-user: {why}");
    }
    qemu
}

thread_local! {
    static ORDER: RefCell<String> = const { RefCell::new(String::new()) };
}

fn mark(c: char) {
    ORDER.with(|o| o.borrow_mut().push(c));
}

#[inline(never)]
fn hook(depth: u32, c: char) {
    exit_hook::install(depth + 1, move || mark(c)).unwrap();
}

// ---- ucontext coroutines ----

const STACK: usize = 64 * 1024;

struct Coros {
    main: libc::ucontext_t,
    a: libc::ucontext_t,
    b: libc::ucontext_t,
}

static mut COROS: Option<Box<Coros>> = None;

fn coros() -> *mut Coros {
    // SAFETY: set before the coroutines start, on this thread only.
    unsafe { &mut **(*core::ptr::addr_of_mut!(COROS)).as_mut().unwrap() }
}

#[derive(Clone, Copy)]
enum Who {
    Main,
    A,
    B,
}

fn ctx(w: Who) -> *mut libc::ucontext_t {
    let c = coros();
    // SAFETY: fields of the live `Coros`.
    unsafe {
        match w {
            Who::Main => &raw mut (*c).main,
            Who::A => &raw mut (*c).a,
            Who::B => &raw mut (*c).b,
        }
    }
}

fn switch(from: Who, to: Who) {
    // SAFETY: both contexts are initialized; `to` is suspended.
    assert_eq!(unsafe { libc::swapcontext(ctx(from), ctx(to)) }, 0);
}

#[inline(never)]
fn coro_leaf(me: Who, next: Who, c: char) {
    hook(1, c.to_ascii_uppercase());
    switch(me, next);
    black_box(());
}

#[inline(never)]
fn coro_level(me: Who, next: Who, c: char) {
    hook(0, c);
    switch(me, next);
    coro_leaf(me, next, c);
    black_box(());
}

#[inline(never)]
fn panics_deep(n: u32) {
    let pad = black_box([n as u8; 64]);
    if n == 0 {
        hook(0, 'x');
        panic!("over a hooked frame");
    }
    panics_deep(n - 1);
    black_box(pad);
}

extern "C" fn coro_a() {
    // A hooked frame left by a panic caught on this coroutine's stack: the
    // next install on this stack drops and counts it.
    let r = std::panic::catch_unwind(|| panics_deep(12));
    assert!(r.is_err());
    coro_level(Who::A, Who::B, 'a');
    mark('1');
}

extern "C" fn coro_b() {
    coro_level(Who::B, Who::Main, 'b');
    mark('2');
}

#[inline(never)]
fn main_level() {
    hook(0, 'm');
    switch(Who::Main, Who::A);
    hook(0, 'n');
    switch(Who::Main, Who::B);
    black_box(());
}

fn run_coros(stacks: &mut [u8], a_first: bool) -> (String, u64) {
    let before = exit_hook::skipped();
    ORDER.with(|o| o.borrow_mut().clear());
    // SAFETY: zeroed contexts are filled by getcontext before use.
    unsafe {
        *core::ptr::addr_of_mut!(COROS) = Some(Box::new(core::mem::zeroed()));
    }
    let (lo, hi) = stacks.split_at_mut(STACK);
    let (sa, sb) = if a_first { (lo, hi) } else { (hi, lo) };
    for (w, s, f) in [
        (Who::A, sa, coro_a as extern "C" fn()),
        (Who::B, sb, coro_b),
    ] {
        let c = ctx(w);
        // SAFETY: `c` is a live context; the stack outlives the coroutine
        // (both end before this function returns).
        unsafe {
            assert_eq!(libc::getcontext(c), 0);
            (*c).uc_stack.ss_sp = s.as_mut_ptr().cast();
            (*c).uc_stack.ss_size = s.len();
            (*c).uc_link = ctx(Who::Main);
            libc::makecontext(c, f, 0);
        }
    }
    main_level();
    switch(Who::Main, Who::A);
    switch(Who::Main, Who::A);
    let order = ORDER.with(|o| o.borrow().clone());
    (order, exit_hook::skipped() - before)
}

#[test]
fn coroutines_with_hooks_pending_return_in_any_order() {
    let _g = serial();
    // Both coroutine stacks in one allocation (one mapping), in either
    // order of addresses.
    let mut stacks = vec![0u8; 2 * STACK];
    for a_first in [true, false, true] {
        let (order, skipped) = run_coros(&mut stacks, a_first);
        // main_level's two hooks when it returns ('n' last installed), B's
        // ('B' then 'b', then B ends), A's.
        assert_eq!(order, "nmBb2Aa1", "a first: {a_first}");
        assert_eq!(skipped, 1, "a first: {a_first}");
    }
}

// ---- an alternate signal stack above the thread's frames ----

#[inline(never)]
fn handler_leaf() {
    hook(0, 's');
    hook(1, 'h');
    black_box(());
}

extern "C" fn on_usr1(_: libc::c_int) {
    handler_leaf();
    mark('H');
}

#[inline(never)]
fn alt_inner() {
    hook(0, 'i');
    // SAFETY: SIGUSR1's handler is installed by the test.
    unsafe { libc::raise(libc::SIGUSR1) };
    hook(0, 'j');
    black_box(());
}

#[inline(never)]
fn alt_outer() {
    hook(0, 'o');
    alt_inner();
    black_box(());
}

#[test]
fn a_handler_on_an_alternate_stack_hooks_frames() {
    let _g = serial();
    const ALT: usize = 256 * 1024;
    // SAFETY: a fresh private mapping (mapped before the thread, so that
    // the thread's stack lies below it), and a handler that only hooks.
    let alt = unsafe {
        let m = libc::mmap(
            core::ptr::null_mut(),
            ALT,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(m, libc::MAP_FAILED);
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_ONSTACK;
        libc::sigaction(libc::SIGUSR1, &sa, core::ptr::null_mut());
        m as usize
    };
    let before = exit_hook::skipped();
    let order = std::thread::spawn(move || {
        let ss = libc::stack_t {
            ss_sp: alt as *mut libc::c_void,
            ss_flags: 0,
            ss_size: ALT,
        };
        let here = black_box(0u8);
        let sp = &here as *const u8 as usize;
        // qemu-user maps upwards: there the thread's stack, mapped after
        // the alternate one, lies above it. Another mapping, asked for
        // above this stack, gives the layout under test. Only a mapping
        // where it was asked for will do: when the hint is taken (a malloc
        // arena's reserve lies there when this test runs first), qemu-user
        // maps far away, at an address its /proc/self/maps does not list,
        // and no stack there can be told from wild memory.
        let mut ss = ss;
        let mut moved = 0;
        if sp > alt {
            for k in 1..64usize {
                let hint = (sp + k * (64 << 20)) & !0xfff;
                // SAFETY: a fresh private mapping at a free address near the
                // hint, unmapped below or at once when elsewhere.
                let m = unsafe {
                    libc::mmap(
                        hint as *mut libc::c_void,
                        ALT,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                };
                assert_ne!(m, libc::MAP_FAILED);
                if m as usize == hint {
                    moved = hint;
                    break;
                }
                // SAFETY: the mapping just made, not used.
                unsafe { libc::munmap(m, ALT) };
            }
            assert_ne!(moved, 0, "no free room above the thread's stack");
            ss.ss_sp = moved as *mut libc::c_void;
        }
        // SAFETY: the mapping stays until the thread is joined.
        assert_eq!(unsafe { libc::sigaltstack(&ss, core::ptr::null_mut()) }, 0);
        alt_outer();
        let off = libc::stack_t {
            ss_sp: core::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
        // SAFETY: disables the alternate stack before the thread ends.
        unsafe { libc::sigaltstack(&off, core::ptr::null_mut()) };
        let used = if moved != 0 {
            // SAFETY: the second mapping, no longer in use.
            unsafe { libc::munmap(moved as *mut libc::c_void, ALT) };
            moved
        } else {
            alt
        };
        (ORDER.with(|o| o.borrow().clone()), sp, used)
    })
    .join()
    .unwrap();
    // SAFETY: unmaps the alternate stack, no longer in use.
    unsafe { libc::munmap(alt as *mut libc::c_void, ALT) };
    assert!(
        order.1 < order.2,
        "the thread's stack is above the alternate one"
    );
    assert_eq!(order.0, "sHhjio");
    assert_eq!(exit_hook::skipped(), before);
}

// ---- threads ending with hooks pending ----

static RAN: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// A hook's state that counts its drops (once per hook that never runs).
struct Counted(u64);
impl Drop for Counted {
    fn drop(&mut self) {
        DROPPED.fetch_add(black_box(self.0), Ordering::Relaxed);
    }
}

#[inline(never)]
fn counted_hook(depth: u32) {
    let c = Counted(1);
    exit_hook::install(depth + 1, move || {
        RAN.fetch_add(c.0, Ordering::Relaxed);
        core::mem::forget(c);
    })
    .unwrap();
}

#[inline(never)]
fn ends_in_panic() {
    counted_hook(0);
    counted_hook(1);
    counted_hook(0);
    panic!("the thread ends with hooks pending");
}

#[inline(never)]
fn at_depth(n: u32) {
    let pad = black_box([0u8; 32]);
    if n == 0 {
        counted_hook(0);
        ends_in_panic();
    } else {
        at_depth(n - 1);
    }
    black_box(pad);
}

#[test]
fn threads_ending_with_hooks_pending_free_and_count_them() {
    if skipped_under_qemu(
        "qemu-user's /proc/self/maps, read while other threads map and unmap \
         their stacks, now and then misses a new thread's stack (about one \
         capture_exact in 2000 on a fresh thread finds no stack), and an \
         install whose walk fails is an error this test counts",
    ) {
        return;
    }
    let _g = serial();
    const THREADS: u64 = 3000;
    let before = exit_hook::skipped();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for batch in 0..THREADS / 50 {
        let ts: Vec<_> = (0..50)
            .map(|i| {
                let depth = ((batch * 50 + i) % 97) as u32;
                std::thread::spawn(move || {
                    // Caught in the thread, whose closure then returns: its
                    // four hooks never ran.
                    let r = std::panic::catch_unwind(|| at_depth(depth));
                    assert!(r.is_err());
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
    }
    std::panic::set_hook(hook);
    assert_eq!(RAN.load(Ordering::Relaxed), 0);
    assert_eq!(exit_hook::skipped() - before, 4 * THREADS);
    assert_eq!(DROPPED.load(Ordering::Relaxed), 4 * THREADS);
    // Fresh threads still install (the table was never left full).
    let ts: Vec<_> = (0..64)
        .map(|_| {
            std::thread::spawn(|| {
                #[inline(never)]
                fn runs() {
                    counted_hook(0);
                }
                runs();
            })
        })
        .collect();
    for t in ts {
        t.join().unwrap();
    }
    assert_eq!(RAN.load(Ordering::Relaxed), 64);
}
