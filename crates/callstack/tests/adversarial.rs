//! Adversarial captures: contexts and stacks built to make a capture fault,
//! hang or report garbage. Zero faults (a fault kills this process), zero
//! hangs (a watchdog aborts it), zero frames outside executable code.
//!
//! `harness = false`: `main` runs the cases in order on the process's main
//! thread (whose stack is found differently from a spawned thread's), the
//! first one before anything has captured on it.
//!
//! - The first capture in a `SIGPROF` handler on the main thread, with no
//!   stack bounds cached, landing on a `ret`: as good as `capture_exact`.
//! - Crafted contexts whose sp is in a `PROT_NONE` page, `[vsyscall]`,
//!   read-only memory, unmapped memory, below the main stack, or foreign
//!   (heap) memory full of garbage: the pc alone, or frames in code.
//! - Stack switching: captures on a 1 MiB `makecontext` stack, which is then
//!   unmapped and 64 KiB mapped at its address, with a saved frame pointer
//!   into the freed part.
//! - Garbage frame chains: random words, self pointers, heap and data
//!   pointers as frame records.
//! - A `SIGPROF` storm at several kHz on busy threads while another thread
//!   loads and unloads a library built without frame pointers: every frame
//!   of `capture_fast` and `capture_from_context` lies in executable code.

// The scenarios run on x86-64, AArch64 and RISC-V 64 (their few
// architecture-specific parts are in `crafted` and `ret_loop`); elsewhere
// only the helpers remain.
#![cfg_attr(
    not(all(
        target_os = "linux",
        any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        )
    )),
    allow(dead_code, unused_imports)
)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn main() {
    // Arguments of the libtest protocol (`--list`, filters): nothing to
    // list, run everything.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(120));
        eprintln!("adversarial: hang (watchdog after 120 s)");
        std::process::abort();
    });
    #[cfg(all(
        target_os = "linux",
        any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        )
    ))]
    scenarios::run_all();
}

/// The architecture's part: frame-pointer calls and context registers.
#[cfg(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )
))]
#[path = "common/crafted.rs"]
mod crafted;

/// Executable ranges of `/proc/self/maps`.
fn exec_ranges() -> Vec<(usize, usize)> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (range, perms) = (it.next()?, it.next()?);
            if perms.as_bytes().get(2) != Some(&b'x') {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect()
}

/// The line of `/proc/self/maps` whose path field is `name`.
fn mapping_named(name: &str) -> Option<(usize, usize)> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .find(|l| l.ends_with(name))
        .and_then(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        })
}

fn is_mapped(addr: usize) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        })
        .any(|(a, b)| a <= addr && addr < b)
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn mmap(addr: usize, len: usize, prot: i32, fixed: bool) -> usize {
    let flags =
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if fixed { libc::MAP_FIXED_NOREPLACE } else { 0 };
    // SAFETY: an anonymous mapping; with MAP_FIXED_NOREPLACE it never
    // replaces an existing one.
    let p = unsafe { libc::mmap(addr as *mut libc::c_void, len, prot, flags, -1, 0) };
    assert_ne!(p, libc::MAP_FAILED, "mmap {addr:#x} {len}");
    p as usize
}

fn munmap(addr: usize, len: usize) {
    // SAFETY: only mappings this test made.
    assert_eq!(unsafe { libc::munmap(addr as *mut libc::c_void, len) }, 0);
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

/// Fixed-size table of executable ranges readable from a signal handler.
struct CodeTable {
    ranges: [(AtomicUsize, AtomicUsize); 256],
    len: AtomicUsize,
}

impl CodeTable {
    const fn new() -> Self {
        CodeTable {
            ranges: [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; 256],
            len: AtomicUsize::new(0),
        }
    }
    fn fill(&self) {
        let r = exec_ranges();
        assert!(r.len() <= 256);
        for (i, &(a, b)) in r.iter().enumerate() {
            self.ranges[i].0.store(a, Ordering::Relaxed);
            self.ranges[i].1.store(b, Ordering::Relaxed);
        }
        self.len.store(r.len(), Ordering::Release);
    }
    fn contains(&self, x: usize) -> bool {
        let n = self.len.load(Ordering::Acquire);
        self.ranges[..n]
            .iter()
            .any(|(a, b)| a.load(Ordering::Relaxed) <= x && x < b.load(Ordering::Relaxed))
    }
}

/// The cases, the same on every architecture.
#[cfg(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )
))]
mod scenarios {
    use super::crafted::{self, capture_with_fp, set_fp, set_pc, set_sp, RawCapture};
    use super::ret_loop::{adv_leaf_rets, adv_ret_loop, adv_ret_site};
    use super::*;
    use std::hint::black_box;

    pub fn run_all() {
        let t0 = Instant::now();
        // ADV_ONLY=<part of a name> runs only the matching cases.
        let only = std::env::var("ADV_ONLY").ok();
        let step = |name: &str, f: &dyn Fn()| {
            if only.as_deref().is_some_and(|o| !name.contains(o)) {
                return;
            }
            let t = Instant::now();
            f();
            eprintln!("ok: {name} ({:.1} s)", t.elapsed().as_secs_f64());
        };
        step(
            "first capture on the main thread, signal on a ret",
            &first_capture_on_a_ret,
        );
        step("crafted contexts, main thread", &crafted_contexts);
        step("crafted contexts, spawned thread", &|| {
            std::thread::spawn(crafted_contexts).join().unwrap()
        });
        step("stack switching: unmap and remap", &stack_switching);
        step("stack switching on a thread", &|| {
            std::thread::spawn(stack_switching).join().unwrap()
        });
        step("garbage frame chains", &garbage_chains);
        if cfg!(target_arch = "riscv64") {
            // Under qemu-riscv64 the loader thread can still starve: a
            // sample through code without CFI (Debian's riscv64 glibc has
            // none for start_thread, malloc or the string functions) runs
            // prologue analysis, which caches nothing on RISC
            // architectures. Of six runs here, five passed (19 to 24
            // plugin loads in 3 s) and in one the loader made 9 loads in a
            // minute (samples then took about 10 ms each).
            eprintln!("skipped on riscv64: SIGPROF storm with dlopen/dlclose");
        } else {
            step("SIGPROF storm with dlopen/dlclose", &storm);
        }
        eprintln!(
            "adversarial: all passed in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
    }

    fn context() -> libc::ucontext_t {
        // SAFETY: getcontext fills a zeroed ucontext_t we own.
        unsafe {
            let mut uc: libc::ucontext_t = std::mem::zeroed();
            assert_eq!(super::crafted::getcontext(&mut uc), 0);
            uc
        }
    }

    fn set_regs(uc: &mut libc::ucontext_t, pc: usize, sp: usize, fp: usize) {
        set_pc(uc, pc);
        set_sp(uc, sp);
        set_fp(uc, fp);
    }

    // ------------------------------------------------ first capture on a ret

    /// Whether the test runs under qemu-user (`CALLSTACK_TEST_QEMU`).
    static QEMU: AtomicBool = AtomicBool::new(false);
    static RET_SAMPLES: AtomicUsize = AtomicUsize::new(0);
    static RET_ON_RET: AtomicUsize = AtomicUsize::new(0);
    static RET_BAD: AtomicUsize = AtomicUsize::new(0);
    static RET_BAD_N: AtomicUsize = AtomicUsize::new(0);
    static RET_BAD_EXACT: AtomicUsize = AtomicUsize::new(0);
    static RET_CRAFTED: AtomicUsize = AtomicUsize::new(0);
    static RET_CRAFTED_BAD: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn on_ret_sample(_: libc::c_int, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid ucontext_t.
        let uc = unsafe { &*(uc as *const libc::ucontext_t) };
        let pc = crafted::pc(uc);
        // Interrupted in the loop (not in the leaf): the same moment, moved
        // onto the leaf's `ret`, is crafted first (nothing has captured on
        // this thread, and no capture caches the main stack).
        let mut crafted = [0usize; 64];
        let mut k = 0;
        let in_loop = super::ret_loop::in_loop(pc);
        if in_loop {
            let c = super::ret_loop::onto_leaf(uc);
            k = callstack::capture_from_context(&c, &mut crafted);
        }
        let mut ctx = [0usize; 64];
        let n = callstack::capture_from_context(uc, &mut ctx);
        if in_loop {
            RET_CRAFTED.fetch_add(1, Ordering::Relaxed);
            // The leaf, the call site, then the loop's callers.
            let good = k >= 3
                && n >= 2
                && crafted[0] == adv_leaf_rets as *const () as usize
                && crafted[1] == adv_ret_site as *const () as usize
                && crafted[2..k] == ctx[1..n];
            if !good {
                RET_CRAFTED_BAD.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut exact = [0usize; 96];
        let m = callstack::capture_exact(0, &mut exact);
        RET_SAMPLES.fetch_add(1, Ordering::Relaxed);
        if pc == adv_leaf_rets as *const () as usize {
            RET_ON_RET.fetch_add(1, Ordering::Relaxed);
        }
        // The context's chain is the tail of the handler's own capture,
        // from the interrupted pc on. Under qemu-riscv64 no walk from a
        // handler crosses the signal frame (the signal-return trampoline
        // is an anonymous page, in no module, qemu maps no vDSO whose CFI
        // would cover one, and RISC-V's frame has no mark to know it by, as
        // AArch64's FP/SIMD record is): there the reference is a later
        // capture from the same context, once the first ones have cached
        // the stack, and the chain must go past the loop.
        let same = if QEMU.load(Ordering::Relaxed) && cfg!(target_arch = "riscv64") {
            let mut later = [0usize; 64];
            let l = callstack::capture_from_context(uc, &mut later);
            n >= 3 && later[..l] == ctx[..n]
        } else {
            match exact[..m].iter().position(|&a| a == pc) {
                Some(i) => n >= 1 && exact[i..m] == ctx[..n],
                None => false,
            }
        };
        if !same {
            RET_BAD.fetch_add(1, Ordering::Relaxed);
            RET_BAD_N.store(n, Ordering::Relaxed);
            RET_BAD_EXACT.store(m, Ordering::Relaxed);
        }
    }

    #[inline(never)]
    fn call_leaf_loop(stop: &AtomicBool) {
        let f: unsafe extern "C" fn() = black_box(adv_ret_loop);
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: a loop of calls to a leaf that returns at once.
            unsafe { f() };
        }
    }

    /// The first capture in a handler on the main thread, before anything
    /// cached its stack, is as good as later ones: the same chain as
    /// `capture_exact` in that handler, also when the signal lands on `ret`.
    fn first_capture_on_a_ret() {
        QEMU.store(
            std::env::var_os("CALLSTACK_TEST_QEMU").is_some(),
            Ordering::Relaxed,
        );
        install(libc::SIGPROF, on_ret_sample);
        // SAFETY: pthread_self is always safe.
        let main = unsafe { libc::pthread_self() } as usize;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let killer = std::thread::spawn(move || {
            let t = Instant::now();
            while (RET_SAMPLES.load(Ordering::Relaxed) < 1000
                || RET_CRAFTED.load(Ordering::Relaxed) < 200)
                && t.elapsed() < Duration::from_secs(5)
            {
                // SAFETY: the main thread outlives this loop (joined below).
                unsafe { libc::pthread_kill(main as libc::pthread_t, libc::SIGPROF) };
                std::thread::sleep(Duration::from_micros(100));
            }
            s2.store(true, Ordering::Relaxed);
        });
        call_leaf_loop(&stop);
        killer.join().unwrap();
        let samples = RET_SAMPLES.load(Ordering::Relaxed);
        let on_ret = RET_ON_RET.load(Ordering::Relaxed);
        let bad = RET_BAD.load(Ordering::Relaxed);
        let crafted = RET_CRAFTED.load(Ordering::Relaxed);
        let crafted_bad = RET_CRAFTED_BAD.load(Ordering::Relaxed);
        eprintln!(
            "  {samples} samples, {on_ret} on the ret, {bad} differ; {crafted} moved onto the ret, {crafted_bad} wrong"
        );
        assert!(samples >= 200, "{samples} samples");
        assert!(crafted >= 20, "{crafted} samples in the loop");
        assert_eq!(crafted_bad, 0, "a capture on the ret lost frames");
        assert_eq!(
            bad,
            0,
            "capture_from_context differs from capture_exact (last: {} vs {} frames)",
            RET_BAD_N.load(Ordering::Relaxed),
            RET_BAD_EXACT.load(Ordering::Relaxed)
        );
        // SAFETY: restores the default action.
        unsafe { libc::signal(libc::SIGPROF, libc::SIG_IGN) };
    }

    // ------------------------------------------------ crafted contexts

    /// Captures from a context with these registers: every return address
    /// (after the pc) must be code; returns how many frames.
    fn capture_crafted(pc: usize, sp: usize, fp: usize) -> usize {
        let code = exec_ranges();
        let in_code = |a: usize| code.iter().any(|&(lo, hi)| lo <= a && a < hi);
        let mut uc = context();
        set_regs(&mut uc, pc, sp, fp);
        let mut out = [0usize; 64];
        let n = callstack::capture_from_context(&uc, &mut out);
        assert!(n <= 64);
        for &ra in &out[1.min(n)..n] {
            assert!(
                in_code(ra),
                "non-code frame {ra:#x} from sp {sp:#x}: {:x?}",
                &out[..n]
            );
        }
        let mut frames = [callstack::Frame {
            pc: 0,
            sp: 0,
            fp: 0,
            method: callstack::Method::Cfi,
        }; 64];
        let (m, _) = callstack::capture_from_context_with_info(&uc, &mut frames);
        assert_eq!(m, n, "with and without info differ from sp {sp:#x}");
        n
    }

    /// The stack pointer of a context that is in no stack gives the pc alone.
    fn assert_pc_alone(what: &str, sp: usize) {
        let pc = crafted_contexts as *const () as usize + 4;
        for fp in [0, sp, sp.wrapping_add(16)] {
            let n = capture_crafted(pc, sp, fp);
            assert_eq!(n, 1, "{what}: sp {sp:#x}, fp {fp:#x}: {n} frames");
        }
    }

    fn crafted_contexts() {
        // A PROT_NONE page, and one inside a readable area.
        let none = mmap(0, 4096, libc::PROT_NONE, false);
        assert_pc_alone("PROT_NONE", none + 2048);
        assert_pc_alone("PROT_NONE", none);
        let area = mmap(0, 3 * 4096, libc::PROT_READ | libc::PROT_WRITE, false);
        // SAFETY: the middle page of our own mapping.
        assert_eq!(
            unsafe { libc::mprotect((area + 4096) as *mut libc::c_void, 4096, libc::PROT_NONE) },
            0
        );
        assert_pc_alone("PROT_NONE between readable pages", area + 4096 + 8);
        // [vsyscall], where the kernel has it.
        if let Some((lo, _)) = mapping_named("[vsyscall]") {
            assert_pc_alone("[vsyscall]", lo);
            assert_pc_alone("[vsyscall]", lo + 0x800);
        }
        // Read-only memory and [vvar].
        let ro = mmap(0, 4096, libc::PROT_READ, false);
        assert_pc_alone("read-only", ro + 64);
        if let Some((lo, _)) = mapping_named("[vvar]") {
            assert_pc_alone("[vvar]", lo + 64);
        }
        // Unmapped memory.
        let gone = mmap(0, 4096, libc::PROT_READ | libc::PROT_WRITE, false);
        munmap(gone, 4096);
        assert_pc_alone("unmapped", gone + 64);
        assert_pc_alone("null page", 64);
        assert_pc_alone("top of the address space", usize::MAX - 7);
        // Below the main thread's stack (inside the 8 MiB the stack may
        // grow to, but not mapped).
        let (stack_lo, stack_hi) = mapping_named("[stack]").unwrap();
        for below in [4096usize, 64 << 10, 1 << 20, (7 << 20) + (512 << 10)] {
            let sp = stack_lo.saturating_sub(below) & !15;
            if stack_hi - sp < 8 << 20 && !is_mapped(sp) {
                assert_pc_alone("below the main stack", sp);
            }
        }
        // Foreign memory full of garbage: a heap buffer of random words,
        // self pointers, code and stack addresses.
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut heap = vec![0usize; 4096];
        let base = heap.as_ptr() as usize;
        let code = crafted_contexts as *const () as usize;
        let here = &rng as *const Rng as usize;
        for round in 0..64 {
            for w in heap.iter_mut() {
                let r = rng.next() as usize;
                *w = match r % 6 {
                    0 => r,
                    1 => base + (r >> 8) % (4096 * 8),
                    2 => code + (r >> 8) % 4096,
                    3 => here + (r >> 8) % 4096,
                    4 => 0,
                    _ => (r >> 8) % 4096,
                };
            }
            let sp = base + (round * 61 % 4000) * 8;
            let fp = heap[round];
            let n = capture_crafted(code + 4, black_box(sp), fp);
            assert!(n >= 1);
            // A garbage pc too.
            capture_crafted(heap[round + 1], sp, fp);
        }
        // The stack, but far below the current frame (stale, unused part).
        let local = [0usize; 4];
        let sp = (local.as_ptr() as usize - 256 * 1024) & !15;
        if is_mapped(sp) {
            capture_crafted(code + 4, sp, 0);
        }
        munmap(none, 4096);
        munmap(area, 3 * 4096);
        munmap(ro, 4096);
        drop(heap);
    }

    // ------------------------------------------------ stack switching

    fn fast_raw() -> RawCapture {
        callstack::__capture_fast_raw
    }
    fn exact_raw() -> RawCapture {
        callstack::__capture_exact_raw
    }

    static CO_FP: AtomicUsize = AtomicUsize::new(0);
    static CO_DEPTH: AtomicUsize = AtomicUsize::new(0);
    static CO_FAST: AtomicUsize = AtomicUsize::new(0);
    static CO_EXACT: AtomicUsize = AtomicUsize::new(0);
    static CO_BAD: AtomicUsize = AtomicUsize::new(0);

    thread_local! {
        static CTX: std::cell::UnsafeCell<(libc::ucontext_t, libc::ucontext_t)> =
            // SAFETY: ucontext_t is plain data; zero is a valid placeholder.
            const { std::cell::UnsafeCell::new(unsafe { std::mem::zeroed() }) };
    }

    fn check_code(out: &[usize]) {
        let code = exec_ranges();
        for &a in out {
            if !code.iter().any(|&(lo, hi)| lo <= a && a < hi) {
                CO_BAD.fetch_add(1, Ordering::Relaxed);
                eprintln!("  non-code frame {a:#x} in {out:x?}");
            }
        }
    }

    #[inline(never)]
    fn co_recurse(depth: usize) {
        if depth > 0 {
            co_recurse(black_box(depth - 1));
            black_box(depth);
            return;
        }
        let mut out = [0usize; 64];
        let n = callstack::capture_fast(0, &mut out);
        CO_FAST.store(n, Ordering::Relaxed);
        check_code(&out[..n]);
        let n = callstack::capture_exact(0, &mut out);
        CO_EXACT.store(n, Ordering::Relaxed);
        check_code(&out[..n]);
        let fp = CO_FP.load(Ordering::Relaxed);
        if fp != 0 {
            for capture in [fast_raw(), exact_raw()] {
                // SAFETY: `out` has 64 slots.
                let n = unsafe { capture_with_fp(black_box(fp), 64, out.as_mut_ptr(), capture) };
                check_code(&out[..n as usize]);
            }
        }
    }

    extern "C" fn co_entry() {
        co_recurse(CO_DEPTH.load(Ordering::Relaxed));
        CTX.with(|c| {
            let c = c.get();
            // SAFETY: both contexts live in this thread's CTX; the caller
            // is suspended in swapcontext and resumes here.
            unsafe { super::crafted::swapcontext(&mut (*c).1, &(*c).0) };
        });
    }

    /// Runs `co_entry` on `[base, base + len)` and comes back.
    fn run_on(base: usize, len: usize) {
        CTX.with(|c| {
            let c = c.get();
            // SAFETY: the coroutine context gets the stack we mapped; it
            // swaps back to `(*c).0` before returning, so uc_link is unused.
            unsafe {
                assert_eq!(super::crafted::getcontext(&mut (*c).1), 0);
                (*c).1.uc_stack.ss_sp = base as *mut libc::c_void;
                (*c).1.uc_stack.ss_size = len;
                (*c).1.uc_link = std::ptr::null_mut();
                super::crafted::makecontext(&mut (*c).1, co_entry, 0);
                assert_eq!(super::crafted::swapcontext(&mut (*c).0, &(*c).1), 0);
            }
        });
    }

    fn stack_switching() {
        const BIG: usize = 1 << 20;
        const SMALL: usize = 64 << 10;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        for round in 0..8 {
            // Captures on a 1 MiB stack.
            CO_FP.store(0, Ordering::Relaxed);
            CO_DEPTH.store(20, Ordering::Relaxed);
            let base = mmap(0, BIG, rw, false);
            run_on(base, BIG);
            assert!(
                CO_FAST.load(Ordering::Relaxed) >= 20,
                "fast on the big stack"
            );
            assert!(
                CO_EXACT.load(Ordering::Relaxed) >= 20,
                "exact on the big stack"
            );
            // Unmap it, map 64 KiB at its address; a saved frame pointer
            // into the freed part (aligned, above every sp of the small
            // stack).
            munmap(base, BIG);
            let small = mmap(base, SMALL, rw, true);
            assert_eq!(small, base);
            let freed = base + SMALL + (round + 1) * 64 * 1024;
            if is_mapped(freed) {
                munmap(small, SMALL);
                continue; // something else took the address meanwhile
            }
            CO_FP.store(freed, Ordering::Relaxed);
            CO_DEPTH.store(5, Ordering::Relaxed);
            run_on(small, SMALL);
            assert!(
                CO_FAST.load(Ordering::Relaxed) >= 5,
                "fast on the small stack"
            );
            munmap(small, SMALL);
            // The thread's own stack is still known.
            let mut out = [0usize; 64];
            assert!(callstack::capture_fast(0, &mut out) >= 2);
        }
        assert_eq!(CO_BAD.load(Ordering::Relaxed), 0, "non-code frames");
    }

    // ------------------------------------------------ garbage chains

    fn garbage_chains() {
        let code = exec_ranges();
        let in_code = |a: usize| code.iter().any(|&(lo, hi)| lo <= a && a < hi);
        let mut rng = Rng(0x1234_5678_9abc_def1);
        #[repr(C, align(16))]
        struct Area([usize; 1024]);
        let mut area = Area([0; 1024]);
        let heap = vec![7usize; 64];
        static DATA: [usize; 8] = [3; 8];
        let text = garbage_chains as *const () as usize;
        let mut out = [0usize; 64];
        for _ in 0..3000 {
            let base = area.0.as_ptr() as usize;
            for w in area.0.iter_mut() {
                let r = rng.next() as usize;
                *w = match r % 8 {
                    0 => r,
                    1 | 2 => base + ((r >> 8) % 1024) * 8,
                    3 => text + (r >> 8) % 256,
                    4 => heap.as_ptr() as usize + (r >> 8) % 256,
                    5 => DATA.as_ptr() as usize,
                    6 => 0x7fd9_8000_0002,
                    _ => (r >> 8) % 65536,
                };
            }
            black_box(&mut area);
            let fp = base + (rng.next() as usize % 1024) * 8;
            for capture in [fast_raw(), exact_raw()] {
                // SAFETY: `out` has 64 slots.
                let n = unsafe { capture_with_fp(black_box(fp), 64, out.as_mut_ptr(), capture) };
                for &a in &out[..n as usize] {
                    assert!(
                        in_code(a),
                        "non-code frame {a:#x}: {:x?}",
                        &out[..n as usize]
                    );
                }
            }
        }
    }

    // ------------------------------------------------ storm

    static CODE: CodeTable = CodeTable::new();
    /// The loaded plugin's executable range while its code may run.
    static LIB_LO: AtomicUsize = AtomicUsize::new(0);
    static LIB_HI: AtomicUsize = AtomicUsize::new(0);
    static STORM_ON: AtomicBool = AtomicBool::new(false);
    static SAMPLES: AtomicUsize = AtomicUsize::new(0);
    static FRAMES: AtomicUsize = AtomicUsize::new(0);
    static SUSPECTS: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
    static SUSPECT_N: AtomicUsize = AtomicUsize::new(0);

    fn suspect(a: usize) {
        let i = SUSPECT_N.fetch_add(1, Ordering::Relaxed);
        if i < SUSPECTS.len() {
            SUSPECTS[i].store(a, Ordering::Relaxed);
        }
    }

    fn storm_check(frames: &[usize]) {
        for &a in frames {
            let lib = LIB_LO.load(Ordering::Relaxed) <= a && a < LIB_HI.load(Ordering::Relaxed);
            if !lib && !CODE.contains(a) {
                suspect(a);
            }
        }
    }

    extern "C" fn on_storm(_: libc::c_int, _: *mut libc::siginfo_t, uc: *mut libc::c_void) {
        if !STORM_ON.load(Ordering::Relaxed) {
            return;
        }
        let mut out = [0usize; 128];
        let n = callstack::capture_fast(0, &mut out);
        storm_check(&out[..n]);
        // SAFETY: the kernel passes a valid ucontext_t.
        let uc = unsafe { &*(uc as *const libc::ucontext_t) };
        let m = callstack::capture_from_context(uc, &mut out);
        storm_check(&out[..m]);
        SAMPLES.fetch_add(1, Ordering::Relaxed);
        FRAMES.fetch_add(n + m, Ordering::Relaxed);
    }

    /// A timer sending SIGPROF to the calling thread every `period`.
    struct ThreadTimer(libc::timer_t);

    impl ThreadTimer {
        fn start(period: Duration) -> ThreadTimer {
            // SAFETY: a zeroed sigevent aimed at this thread; the timer is
            // deleted on drop, before the thread ends.
            unsafe {
                let mut sev: libc::sigevent = std::mem::zeroed();
                sev.sigev_notify = libc::SIGEV_THREAD_ID;
                sev.sigev_signo = libc::SIGPROF;
                sev.sigev_notify_thread_id = libc::gettid();
                let mut t: libc::timer_t = std::ptr::null_mut();
                assert_eq!(
                    libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut t),
                    0
                );
                let ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: period.as_nanos() as libc::c_long,
                };
                let spec = libc::itimerspec {
                    it_interval: ts,
                    it_value: ts,
                };
                assert_eq!(libc::timer_settime(t, 0, &spec, std::ptr::null_mut()), 0);
                ThreadTimer(t)
            }
        }
    }

    impl Drop for ThreadTimer {
        fn drop(&mut self) {
            // SAFETY: the timer made in `start`, deleted once.
            unsafe { libc::timer_delete(self.0) };
        }
    }

    /// Per-thread SIGPROF period of the storm (5 kHz).
    const STORM_PERIOD: Duration = Duration::from_micros(200);
    /// The storm's periods, per-thread timer and kills from the main
    /// thread: 5 kHz and 2 kHz, or under qemu-user (`CALLSTACK_TEST_QEMU`)
    /// 1 kHz and 500 Hz. There a sample costs about 0.35 ms (a debug build
    /// under qemu-aarch64): at 7 kHz the loader thread spends nearly all its
    /// time in the handler, and when samples cost a little more it starves
    /// (seen: 9 plugin loads in a minute).
    fn storm_periods() -> (Duration, Duration) {
        if std::env::var_os("CALLSTACK_TEST_QEMU").is_some() {
            (Duration::from_millis(1), Duration::from_millis(2))
        } else {
            (STORM_PERIOD, Duration::from_micros(500))
        }
    }

    #[inline(never)]
    fn busy_recurse(d: usize, sink: &mut usize) {
        if d > 0 {
            busy_recurse(d - 1, sink);
            *sink = sink.wrapping_add(d);
            return;
        }
        let v: Vec<usize> = (0..32).collect();
        *sink = sink.wrapping_add(v.iter().sum::<usize>());
        let s = format!("{sink}");
        *sink = sink.wrapping_add(s.len());
    }

    fn storm() {
        let dir = testsupport::scratch_dir("adversarial-storm");
        let mut libs = Vec::new();
        for k in 0..2 {
            let so = dir.join(format!("libadv_plugin{k}.so"));
            testsupport::Gcc::new(&["adv_plugin.c"])
                .flags("-O2 -fomit-frame-pointer -shared -fPIC")
                .build(&so);
            libs.push(std::ffi::CString::new(so.to_str().unwrap()).unwrap());
        }
        install(libc::SIGPROF, on_storm);
        let (period, kill_period) = storm_periods();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut handles = Vec::new();
        let loads = std::sync::Arc::new(AtomicUsize::new(0));
        let lib_ranges = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        // The loader thread.
        {
            let (stop, tx, loads, lib_ranges) =
                (stop.clone(), tx.clone(), loads.clone(), lib_ranges.clone());
            let libs = libs.clone();
            handles.push(std::thread::spawn(move || {
                // SAFETY: pthread_self is always safe.
                tx.send(unsafe { libc::pthread_self() } as usize).unwrap();
                let _timer = ThreadTimer::start(period);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: loading our own plugin (no constructors),
                    // calling its function, unloading it; the signal mask
                    // calls take sets made here.
                    unsafe {
                        let h =
                            libc::dlopen(libs[i % 2].as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
                        assert!(!h.is_null());
                        let f = libc::dlsym(h, c"adv_plugin_work".as_ptr());
                        assert!(!f.is_null());
                        // The test's own bookkeeping (reading the maps)
                        // with SIGPROF held back: under qemu-user a read of
                        // /proc/self/maps (emulated) under the storm once
                        // left 9 loads in a minute. The loads and unloads
                        // themselves take the storm.
                        let mut prof: libc::sigset_t = std::mem::zeroed();
                        let mut old: libc::sigset_t = std::mem::zeroed();
                        libc::sigemptyset(&mut prof);
                        libc::sigaddset(&mut prof, libc::SIGPROF);
                        libc::pthread_sigmask(libc::SIG_BLOCK, &prof, &mut old);
                        let range = exec_ranges()
                            .into_iter()
                            .find(|&(a, b)| a <= f as usize && (f as usize) < b)
                            .unwrap();
                        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
                        lib_ranges.lock().unwrap().push(range);
                        LIB_LO.store(range.0, Ordering::Relaxed);
                        LIB_HI.store(range.1, Ordering::Relaxed);
                        let f: extern "C" fn(u32) -> u32 = std::mem::transmute(f);
                        black_box(f(black_box(i as u32)));
                        LIB_LO.store(0, Ordering::Relaxed);
                        LIB_HI.store(0, Ordering::Relaxed);
                        assert_eq!(libc::dlclose(h), 0);
                    }
                    loads.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            }));
        }
        for _ in 0..3 {
            let (stop, tx) = (stop.clone(), tx.clone());
            handles.push(std::thread::spawn(move || {
                // SAFETY: pthread_self is always safe.
                tx.send(unsafe { libc::pthread_self() } as usize).unwrap();
                let _timer = ThreadTimer::start(period);
                let mut sink = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    busy_recurse(12, &mut sink);
                }
                black_box(sink);
            }));
        }
        let tids: Vec<usize> = (0..handles.len()).map(|_| rx.recv().unwrap()).collect();
        // Let the threads start (Rust's thread start allocates, the loader
        // maps the plugin) before the code ranges are listed.
        std::thread::sleep(Duration::from_millis(50));
        CODE.fill();
        STORM_ON.store(true, Ordering::Relaxed);
        // Each thread's own timer, plus kills from here (`storm_periods`).
        // Three seconds, longer (up to a minute) until the plugin has been
        // loaded 10 times and 1000 samples taken (a slow emulator).
        let start = Instant::now();
        let enough =
            || loads.load(Ordering::Relaxed) >= 10 && SAMPLES.load(Ordering::Relaxed) >= 1000;
        while start.elapsed() < Duration::from_secs(3)
            || (!enough() && start.elapsed() < Duration::from_secs(60))
        {
            for &t in &tids {
                // SAFETY: the threads are alive until `stop` is set and joined.
                unsafe { libc::pthread_kill(t as libc::pthread_t, libc::SIGPROF) };
            }
            std::thread::sleep(kill_period);
        }
        STORM_ON.store(false, Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().unwrap();
        }
        let samples = SAMPLES.load(Ordering::Relaxed);
        let rate = samples as f64 / start.elapsed().as_secs_f64() / tids.len() as f64;
        // A suspect in code mapped since (a library loaded late) or in one
        // of the plugin's loads is code after all.
        let late = exec_ranges();
        let lib_ranges = lib_ranges.lock().unwrap();
        let n = SUSPECT_N.load(Ordering::Relaxed).min(SUSPECTS.len());
        let bad: Vec<usize> = SUSPECTS[..n]
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .filter(|&a| {
                !late
                    .iter()
                    .chain(lib_ranges.iter())
                    .any(|&(lo, hi)| lo <= a && a < hi)
            })
            .collect();
        eprintln!(
            "  {samples} samples ({rate:.0} Hz per thread), {} frames, {} plugin loads",
            FRAMES.load(Ordering::Relaxed),
            loads.load(Ordering::Relaxed)
        );
        assert!(samples >= 1000, "{samples} samples");
        // Under an emulator the loader thread may still be starved by the
        // storm (each signal costs it far more than natively): a few
        // loads and unloads under the storm are then what is tested.
        let min_loads = if std::env::var_os("CALLSTACK_TEST_QEMU").is_some() {
            3
        } else {
            10
        };
        let n_loads = loads.load(Ordering::Relaxed);
        assert!(n_loads >= min_loads, "{n_loads} plugin loads");
        assert!(bad.is_empty(), "non-code frames: {bad:x?}");
        // SAFETY: SIGPROF back to ignored (no more timers or kills).
        unsafe { libc::signal(libc::SIGPROF, libc::SIG_IGN) };
    }
}

/// A loop calling a leaf that is a lone return, with CFI: a signal lands on
/// that return a good part of the time. `adv_ret_site` is the return
/// address of the loop's call. x86-64: `call` from a frame on `rbp`;
/// AArch64: a frame record, `bl`; RISC-V 64: a frame record below `s0`,
/// `jal` (uncompressed: 4 bytes each).
#[cfg(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )
))]
mod ret_loop {
    #[cfg(target_arch = "x86_64")]
    core::arch::global_asm!(
        ".text",
        ".globl adv_ret_loop",
        ".type adv_ret_loop, @function",
        "adv_ret_loop:",
        ".cfi_startproc",
        "push rbp",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset rbp, -16",
        "mov rbp, rsp",
        ".cfi_def_cfa_register rbp",
        "mov ecx, 10000",
        "2:",
        "call adv_leaf_rets",
        ".globl adv_ret_site",
        "adv_ret_site:",
        "dec ecx",
        "jnz 2b",
        "pop rbp",
        ".cfi_def_cfa rsp, 8",
        "ret",
        ".cfi_endproc",
        ".size adv_ret_loop, .-adv_ret_loop",
        ".globl adv_leaf_rets",
        ".type adv_leaf_rets, @function",
        "adv_leaf_rets:",
        ".cfi_startproc",
        "ret",
        ".cfi_endproc",
        ".size adv_leaf_rets, .-adv_leaf_rets",
    );
    #[cfg(target_arch = "aarch64")]
    core::arch::global_asm!(
        ".text",
        ".globl adv_ret_loop",
        ".type adv_ret_loop, %function",
        "adv_ret_loop:",
        ".cfi_startproc",
        "stp x29, x30, [sp, #-16]!",
        ".cfi_def_cfa_offset 16",
        ".cfi_offset x29, -16",
        ".cfi_offset x30, -8",
        "mov x29, sp",
        ".cfi_def_cfa x29, 16",
        "mov w9, #10000",
        "2:",
        "bl adv_leaf_rets",
        ".globl adv_ret_site",
        "adv_ret_site:",
        "subs w9, w9, #1",
        "b.ne 2b",
        ".cfi_def_cfa sp, 16",
        "ldp x29, x30, [sp], #16",
        ".cfi_def_cfa_offset 0",
        ".cfi_restore x29",
        ".cfi_restore x30",
        "ret",
        ".cfi_endproc",
        ".size adv_ret_loop, .-adv_ret_loop",
        ".globl adv_leaf_rets",
        ".type adv_leaf_rets, %function",
        "adv_leaf_rets:",
        ".cfi_startproc",
        "ret",
        ".cfi_endproc",
        ".size adv_leaf_rets, .-adv_leaf_rets",
    );
    #[cfg(target_arch = "riscv64")]
    core::arch::global_asm!(
        ".text",
        ".option push",
        ".option norvc",
        ".globl adv_ret_loop",
        ".type adv_ret_loop, @function",
        "adv_ret_loop:",
        ".cfi_startproc",
        "addi sp, sp, -16",
        ".cfi_def_cfa_offset 16",
        "sd ra, 8(sp)",
        "sd s0, 0(sp)",
        ".cfi_offset ra, -8",
        ".cfi_offset s0, -16",
        "addi s0, sp, 16",
        ".cfi_def_cfa s0, 0",
        "li t1, 10000",
        "2:",
        "jal ra, adv_leaf_rets",
        ".globl adv_ret_site",
        "adv_ret_site:",
        "addi t1, t1, -1",
        "bnez t1, 2b",
        ".cfi_def_cfa sp, 16",
        "ld s0, 0(sp)",
        "ld ra, 8(sp)",
        ".cfi_restore s0",
        ".cfi_restore ra",
        "addi sp, sp, 16",
        ".cfi_def_cfa_offset 0",
        "ret",
        ".cfi_endproc",
        ".size adv_ret_loop, .-adv_ret_loop",
        ".globl adv_leaf_rets",
        ".type adv_leaf_rets, @function",
        "adv_leaf_rets:",
        ".cfi_startproc",
        "ret",
        ".cfi_endproc",
        ".size adv_leaf_rets, .-adv_leaf_rets",
        ".option pop",
    );
    unsafe extern "C" {
        pub fn adv_ret_loop();
        pub fn adv_leaf_rets();
        pub fn adv_ret_site();
    }

    /// Whether `pc` is in the loop from its call (5 bytes) to its branch
    /// (`dec ecx`, `jnz`: 2 bytes each): the loop's frame is set up there.
    #[cfg(target_arch = "x86_64")]
    pub fn in_loop(pc: usize) -> bool {
        let site = adv_ret_site as *const () as usize;
        pc >= adv_ret_loop as *const () as usize && pc >= site - 5 && pc < site + 4
    }

    /// The context `uc` (interrupted in the loop) moved onto the leaf's
    /// `ret`, as if the loop had just called it: the return address pushed
    /// into the red zone below sp, which the asm loop does not use.
    #[cfg(target_arch = "x86_64")]
    pub fn onto_leaf(uc: &libc::ucontext_t) -> libc::ucontext_t {
        let sp = super::crafted::sp(uc);
        let mut c = *uc;
        // SAFETY: the red zone below the interrupted sp, which the kernel
        // left free and the asm loop does not use.
        unsafe { *((sp - 8) as *mut usize) = adv_ret_site as *const () as usize };
        super::crafted::set_pc(&mut c, adv_leaf_rets as *const () as usize);
        super::crafted::set_sp(&mut c, sp - 8);
        c
    }

    /// Whether `pc` is in the loop from its call (`bl`, `jal`) to its
    /// branch (`b.ne`, `bnez`), 4 bytes each: the loop's frame is set up there.
    #[cfg(not(target_arch = "x86_64"))]
    pub fn in_loop(pc: usize) -> bool {
        let site = adv_ret_site as *const () as usize;
        pc >= site - 4 && pc < site + 8
    }

    /// The context `uc` (interrupted in the loop) moved onto the leaf's
    /// `ret`, as if the loop had just called it: the link register (x30,
    /// `ra`) is the return address.
    #[cfg(not(target_arch = "x86_64"))]
    pub fn onto_leaf(uc: &libc::ucontext_t) -> libc::ucontext_t {
        let mut c = *uc;
        super::crafted::set_pc(&mut c, adv_leaf_rets as *const () as usize);
        super::crafted::set_lr(&mut c, adv_ret_site as *const () as usize);
        c
    }
}
