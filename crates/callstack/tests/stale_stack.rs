//! Stacks that share a `/proc/self/maps` line with the thread's descriptor.
//!
//! The kernel merges adjacent anonymous `rw-p` mappings into one line, and
//! the first stack a program maps for a coroutine or a signal usually lands
//! right below the main thread's descriptor (TCB) mapping. Such a stack is
//! not the thread's own: it can be unmapped and something smaller mapped
//! at its address at any time. Each case here maps a stack merged with a
//! descriptor's mapping, captures on it (`capture_fast`, `capture_exact`,
//! `capture_from_context`), unmaps it, maps 64 KiB at its address and
//! captures there with a frame-record chain whose saved frame pointer
//! points into the freed part: the walk must stop at that record, not
//! fault.
//!
//! - `main_coroutine`: the main thread, a `makecontext` stack mapped right
//!   below its TCB mapping.
//! - `main_sigaltstack`: the main thread, a `sigaltstack` mapped there.
//! - `setstack_coroutine`: a thread whose stack is memory given with
//!   `pthread_attr_setstack` (no guard page), a coroutine stack mapped right
//!   below it.
//! - `setstack_sigaltstack`: such a thread, a `sigaltstack` mapped right
//!   below its stack.
//! - `caching`: a thread's own stack is still cached: after the first
//!   capture, captures make no lookup (main thread, a `std::thread`, a
//!   thread with a `pthread_attr_setstack` stack, one with no guard page).
//!
//! `harness = false`: the main thread's cases must run on the main thread.
//! Arguments filter the cases by name.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let want = |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    #[cfg(all(
        target_os = "linux",
        target_env = "gnu",
        any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        )
    ))]
    scenarios::run(&want);
    #[cfg(not(all(
        target_os = "linux",
        target_env = "gnu",
        any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        )
    )))]
    let _ = want;
}

/// The architecture's part: frame-pointer calls and context registers.
#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )
))]
#[path = "common/crafted.rs"]
mod crafted;

/// The cases, the same on every architecture.
#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )
))]
mod scenarios {
    use super::crafted::{capture_with_fp, fp_of_record, set_fp, set_pc, RawCapture};
    use std::hint::black_box;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const BIG: usize = 1 << 20;
    const SMALL: usize = 64 << 10;
    const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

    pub fn run(want: &dyn Fn(&str) -> bool) {
        let cases: [(&str, fn()); 7] = [
            ("main_coroutine", main_coroutine),
            ("main_sigaltstack", main_sigaltstack),
            ("setstack_coroutine", setstack_coroutine),
            ("setstack_sigaltstack", setstack_sigaltstack),
            // Again, now that a thread has shown where glibc records a
            // thread's stack: the main thread is then recognised by its
            // descriptor, not by its thread id.
            ("main_coroutine_again", main_coroutine),
            ("main_sigaltstack_again", main_sigaltstack),
            // Last: its threads' stacks stay mapped (glibc keeps them for
            // reuse), maybe right below the main thread's descriptor.
            ("caching", caching),
        ];
        for (name, case) in cases {
            if want(name) {
                eprintln!("stale_stack: {name}");
                SKIPPED.store(false, Ordering::Relaxed);
                case();
                if SKIPPED.load(Ordering::Relaxed) {
                    eprintln!("stale_stack: {name} skipped");
                } else {
                    eprintln!("stale_stack: {name} ok");
                }
            }
        }
    }

    // ------------------------------------------------------------ maps

    /// The `/proc/self/maps` line holding `addr`: start, end, permissions.
    fn line_of(addr: usize) -> Option<(usize, usize, String)> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for l in maps.lines() {
            let mut it = l.split_whitespace();
            let range = it.next()?;
            let perms = it.next()?.to_string();
            let (a, b) = range.split_once('-')?;
            let a = usize::from_str_radix(a, 16).ok()?;
            let b = usize::from_str_radix(b, 16).ok()?;
            if a <= addr && addr < b {
                return Some((a, b, perms));
            }
        }
        None
    }

    fn exec_ranges() -> Vec<(usize, usize)> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let (a, b) = it.next()?.split_once('-')?;
                let perms = it.next()?;
                perms.contains('x').then(|| {
                    (
                        usize::from_str_radix(a, 16).unwrap(),
                        usize::from_str_radix(b, 16).unwrap(),
                    )
                })
            })
            .collect()
    }

    /// An anonymous `rw-p` mapping of `len` bytes at exactly `addr`.
    fn map_at(addr: usize, len: usize) {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
        // SAFETY: an anonymous mapping that never replaces an existing one.
        let p = unsafe { libc::mmap(addr as *mut libc::c_void, len, RW, flags, -1, 0) };
        assert_eq!(
            p as usize,
            addr,
            "mmap at {addr:#x}, {len} bytes: {}",
            std::io::Error::last_os_error()
        );
    }

    fn unmap(addr: usize, len: usize) {
        // SAFETY: only mappings this test made.
        assert_eq!(unsafe { libc::munmap(addr as *mut libc::c_void, len) }, 0);
    }

    /// Bytes of free address space right below the line holding `addr`.
    fn room_below(addr: usize) -> usize {
        let (lo, _, _) = line_of(addr).expect("a line");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let below = maps
            .lines()
            .filter_map(|l| {
                let (_, b) = l.split_whitespace().next()?.split_once('-')?;
                usize::from_str_radix(b, 16).ok()
            })
            .filter(|&b| b <= lo)
            .max()
            .unwrap_or(0);
        lo - below
    }

    /// The sizes of a case whose first stack, `want` bytes, is to be
    /// mapped where `room` bytes are free: that stack's size, the smaller
    /// one mapped at its address after it, and the offset of the freed
    /// address the crafted chain points to. `want`, 64 KiB and 64 KiB above
    /// the smaller stack when there is room (on a kernel's layout there is:
    /// the descriptor's mapping sits at the top of a wide gap). Under
    /// qemu-user, which packs the guest's mappings bottom-up, the main
    /// thread's descriptor can have a few pages free below it: then the
    /// room less a page, that less 12 KiB, and 8 KiB into the freed part; `None` (a
    /// skip, said on stderr) below 48 KiB.
    fn sizes(room: usize, want: usize) -> Option<(usize, usize, usize)> {
        if room >= want {
            return Some((want, SMALL, SMALL + 64 * 1024));
        }
        // A page left free below, so that the stack is not merged with a
        // line under it too.
        let big = room.saturating_sub(4096) & !0xfff;
        if big < 48 << 10 {
            SKIPPED.store(true, Ordering::Relaxed);
            eprintln!(
                "stale_stack: skipped: {} KiB free below the descriptor's mapping, fewer than 48",
                room >> 10
            );
            return None;
        }
        eprintln!(
            "stale_stack: {} KiB free below the descriptor's mapping (qemu-user's layout): stacks of that size",
            big >> 10
        );
        // The smaller stack keeps all but 12 KiB: half of 56 KiB overflowed
        // (capture_exact of a debug build in a handler, below qemu's
        // AArch64 signal frame).
        Some((big, big - (12 << 10), big - (4 << 10)))
    }

    /// Maps `len` bytes right below the line holding `addr`, so that the
    /// kernel merges them into that line (asserted); returns the address.
    fn map_merged_below(addr: usize, len: usize) -> usize {
        let (lo, hi, perms) = line_of(addr).expect("a line");
        assert_eq!(perms, "rw-p", "line of {addr:#x}");
        let base = lo - len;
        assert!(
            line_of(base).is_none(),
            "{base:#x} is free below the line of {addr:#x}:\n{}",
            std::fs::read_to_string("/proc/self/maps").unwrap()
        );
        map_at(base, len);
        let merged = line_of(base).unwrap();
        assert_eq!(
            (merged.0, merged.1),
            (base, hi),
            "the kernel merged the lines"
        );
        base
    }

    /// The main thread's descriptor.
    fn tcb() -> usize {
        // SAFETY: pthread_self reads the thread pointer.
        unsafe { libc::pthread_self() as usize }
    }

    // ------------------------------------------------------ the captures

    /// Set by a case that found no room for its stack (see [`sizes`]).
    static SKIPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    /// What the captures on the current stack should meet: 0 for the
    /// ordinary ones, else the freed address the crafted chain points to.
    static STALE: AtomicUsize = AtomicUsize::new(0);
    /// How deep `recurse` goes before capturing.
    static DEPTH: AtomicUsize = AtomicUsize::new(0);
    /// The captures that ran (each one's checks passed).
    static DONE: AtomicUsize = AtomicUsize::new(0);

    /// One capture's result, kept for checks outside the signal handler.
    struct Outs {
        bufs: [[usize; 64]; 6],
        lens: [usize; 6],
        pcs: [usize; 2],
        /// The context for `capture_from_context`, here rather than in
        /// `recurse`'s frame: AArch64's `ucontext_t` is 4.5 KiB, and
        /// `recurse` runs 21 deep on stacks of 56 KiB under qemu-user.
        uc: libc::ucontext_t,
    }
    /// The results of the last captures, written by the capture (maybe in a
    /// signal handler) and read after it, on one thread at a time.
    struct Shared(std::cell::UnsafeCell<Outs>);
    // SAFETY: one case runs at a time, its captures and checks in turn.
    unsafe impl Sync for Shared {}
    static OUTS: Shared = Shared(std::cell::UnsafeCell::new(Outs {
        bufs: [[0; 64]; 6],
        lens: [0; 6],
        pcs: [0; 2],
        // SAFETY: ucontext_t is plain data; zero is a valid placeholder.
        uc: unsafe { std::mem::zeroed() },
    }));

    /// Recurses `DEPTH` frames, then captures: the ordinary captures, or
    /// (with `STALE` set) the crafted ones. Async-signal-safe (it also runs
    /// in a signal handler): results go to `OUTS`, checked by [`check`].
    #[inline(never)]
    fn recurse(depth: usize) {
        if depth > 0 {
            recurse(black_box(depth - 1));
            black_box(depth);
            return;
        }
        // SAFETY: one capture at a time; `check` reads OUTS afterwards.
        let o = unsafe { &mut *OUTS.0.get() };
        o.lens = [0; 6];
        let stale = STALE.load(Ordering::Relaxed);
        if stale == 0 {
            o.lens[0] = callstack::capture_fast(0, &mut o.bufs[0]);
            o.lens[1] = callstack::capture_exact(0, &mut o.bufs[1]);
            // SAFETY: a ucontext_t filled by getcontext.
            if unsafe { super::crafted::getcontext(&mut o.uc) } == 0 {
                o.lens[2] = callstack::capture_from_context(&o.uc, &mut o.bufs[2]);
            }
            // Last, a capture that stays on this stack (a walk that leaves
            // it for another, through a signal frame, looks that one up
            // too): whatever it cached is what the next capture on this
            // thread finds.
            let mut few = [0usize; 4];
            callstack::capture_fast(0, &mut few);
        } else {
            // A frame record on this stack whose saved frame pointer points
            // into the freed part, its return address `code` (inside this
            // function, after a call: its CFA is frame-pointer based there).
            let code = o.pcs[1];
            let record = [stale, code];
            let fp = fp_of_record(black_box(&record).as_ptr());
            let fast: RawCapture = callstack::__capture_fast_raw;
            let exact: RawCapture = callstack::__capture_exact_raw;
            // SAFETY: each buffer has 64 slots.
            unsafe {
                o.lens[3] = capture_with_fp(fp, 64, o.bufs[3].as_mut_ptr(), fast) as usize;
                o.lens[4] = capture_with_fp(fp, 64, o.bufs[4].as_mut_ptr(), exact) as usize;
            }
            // A context at `code` with its frame pointer in the freed part:
            // its CFA rule reads there.
            // SAFETY: a ucontext_t filled by getcontext.
            if unsafe { super::crafted::getcontext(&mut o.uc) } == 0 {
                set_pc(&mut o.uc, code);
                set_fp(&mut o.uc, stale);
                o.lens[5] = callstack::capture_from_context(&o.uc, &mut o.bufs[5]);
            }
            black_box(&record);
        }
        DONE.fetch_add(1, Ordering::Relaxed);
    }

    fn names(out: &[usize]) -> Vec<String> {
        let mut s = callstack::Symbolizer::new();
        out.iter()
            .map(|&pc| {
                let r = s.symbolize(callstack::symbolize::Address::Return(pc));
                r.frames
                    .last()
                    .and_then(|f| f.function.as_deref().map(String::from))
                    .unwrap_or_else(|| "??".into())
            })
            .collect()
    }

    /// Checks the last run of [`recurse`] (`depth` deep, ordinary or
    /// crafted), whose outermost frame of interest is `outer`.
    fn check(depth: usize, outer: &str) {
        // SAFETY: the capture is over.
        let o = unsafe { &mut *OUTS.0.get() };
        let code = exec_ranges();
        let in_code = |a: usize| code.iter().any(|&(lo, hi)| lo <= a && a < hi);
        if STALE.load(Ordering::Relaxed) == 0 {
            for (i, what) in ["capture_fast", "capture_exact", "capture_from_context"]
                .iter()
                .enumerate()
            {
                let out = &o.bufs[i][..o.lens[i]];
                let names = names(out);
                let want_recurse = depth + 1;
                assert!(
                    names.len() > want_recurse
                        && names[..want_recurse]
                            .iter()
                            .all(|n| n == "stale_stack::scenarios::recurse")
                        && names[want_recurse] == outer,
                    "{what}: {names:?}"
                );
                assert!(out.iter().all(|&a| in_code(a)), "{what}: {out:x?}");
            }
            // A return address inside `recurse` after a call, for the
            // crafted captures.
            o.pcs[1] = o.bufs[0][1];
        } else {
            let base = capture_with_fp
                as unsafe extern "C" fn(usize, u32, *mut usize, RawCapture) -> u32
                as usize;
            let code_pc = o.pcs[1];
            // capture_fast: the entry's caller, the crafted record's return
            // address, and nothing from the freed part.
            let fast = &o.bufs[3][..o.lens[3]];
            assert_eq!(fast.len(), 2, "capture_fast {fast:x?}");
            assert!(
                fast[0] > base && fast[0] - base < 32,
                "capture_fast {fast:x?}"
            );
            assert_eq!(fast[1], code_pc, "capture_fast {fast:x?}");
            // capture_exact: the entry's caller first; whatever the caller's
            // frame gives after it is code.
            let exact = &o.bufs[4][..o.lens[4]];
            assert!(!exact.is_empty(), "capture_exact");
            assert!(
                exact[0] > base && exact[0] - base < 32,
                "capture_exact {exact:x?}"
            );
            assert!(
                exact.iter().all(|&a| in_code(a)),
                "capture_exact {exact:x?}"
            );
            // capture_from_context: the crafted pc, then code only.
            let ctx = &o.bufs[5][..o.lens[5]];
            assert_eq!(ctx.first(), Some(&code_pc), "capture_from_context {ctx:x?}");
            assert!(
                ctx.iter().all(|&a| in_code(a)),
                "capture_from_context {ctx:x?}"
            );
        }
    }

    // ----------------------------------------------------- coroutines

    thread_local! {
        static CTX: std::cell::UnsafeCell<(libc::ucontext_t, libc::ucontext_t)> =
            // SAFETY: ucontext_t is plain data; zero is a valid placeholder.
            const { std::cell::UnsafeCell::new(unsafe { std::mem::zeroed() }) };
    }

    extern "C" fn co_entry() {
        co_body();
        CTX.with(|c| {
            let c = c.get();
            // SAFETY: both contexts live in this thread's CTX; the caller
            // is suspended in swapcontext and resumes here.
            unsafe { super::crafted::swapcontext(&mut (*c).1, &(*c).0) };
        });
    }

    #[inline(never)]
    fn co_body() {
        recurse(DEPTH.load(Ordering::Relaxed));
        black_box(());
    }

    /// Runs `co_body` on `[base, base + len)` and comes back.
    fn run_on(base: usize, len: usize) {
        let before = DONE.load(Ordering::Relaxed);
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
        assert_eq!(DONE.load(Ordering::Relaxed), before + 1);
    }

    /// The whole scenario on coroutine stacks, the first one merged into
    /// the line of `merged_with`.
    fn coroutine_scenario(merged_with: usize) {
        STALE.store(0, Ordering::Relaxed);
        DEPTH.store(20, Ordering::Relaxed);
        let Some((big, small, freed_at)) = sizes(room_below(merged_with), BIG) else {
            return;
        };
        let base = map_merged_below(merged_with, big);
        run_on(base, big);
        check(20, "stale_stack::scenarios::co_body");
        run_on(base, big);
        check(20, "stale_stack::scenarios::co_body");
        unmap(base, big);
        map_at(base, small);
        let freed = base + freed_at;
        assert!(line_of(freed).is_none(), "{freed:#x} stays free");
        STALE.store(freed & !15, Ordering::Relaxed);
        DEPTH.store(3, Ordering::Relaxed);
        run_on(base, small);
        check(3, "");
        STALE.store(0, Ordering::Relaxed);
        unmap(base, small);
        // The thread's own stack still unwinds.
        DEPTH.store(2, Ordering::Relaxed);
        own_stack_capture();
        check(2, "stale_stack::scenarios::own_stack_capture");
    }

    #[inline(never)]
    fn own_stack_capture() {
        recurse(DEPTH.load(Ordering::Relaxed));
        black_box(());
    }

    fn main_coroutine() {
        coroutine_scenario(tcb());
    }

    // ----------------------------------------------------- sigaltstack

    extern "C" fn on_usr1(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        handler_body();
    }

    #[inline(never)]
    fn handler_body() {
        recurse(DEPTH.load(Ordering::Relaxed));
        black_box(());
    }

    fn set_altstack(base: usize, len: usize, disable: bool) {
        let ss = libc::stack_t {
            ss_sp: base as *mut libc::c_void,
            ss_flags: if disable { libc::SS_DISABLE } else { 0 },
            ss_size: len,
        };
        // SAFETY: a stack this test mapped, or disabling it.
        assert_eq!(unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) }, 0);
    }

    fn raise_usr1() {
        let before = DONE.load(Ordering::Relaxed);
        // SAFETY: the handler is installed.
        unsafe { libc::raise(libc::SIGUSR1) };
        assert_eq!(DONE.load(Ordering::Relaxed), before + 1);
    }

    fn main_sigaltstack() {
        sigaltstack_scenario();
    }

    /// The whole scenario on alternate signal stacks of the calling thread,
    /// the first one merged into the line of its descriptor.
    fn sigaltstack_scenario() {
        const ALT: usize = 256 << 10;
        let Some((alt, small, freed_at)) = sizes(room_below(tcb()), ALT) else {
            return;
        };
        // SAFETY: a plain sigaction with SA_SIGINFO | SA_ONSTACK and a
        // handler of that type; the old one is restored below.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_usr1
                as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, &mut old), 0);
        }
        // The old alternate stack (Rust's), put back at the end.
        // SAFETY: a query.
        let mut prev: libc::stack_t = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::sigaltstack(std::ptr::null(), &mut prev) }, 0);

        STALE.store(0, Ordering::Relaxed);
        DEPTH.store(10, Ordering::Relaxed);
        let base = map_merged_below(tcb(), alt);
        set_altstack(base, alt, false);
        raise_usr1();
        check(10, "stale_stack::scenarios::handler_body");
        raise_usr1();
        check(10, "stale_stack::scenarios::handler_body");
        set_altstack(0, 0, true);
        unmap(base, alt);
        map_at(base, small);
        let freed = base + freed_at;
        assert!(line_of(freed).is_none(), "{freed:#x} stays free");
        set_altstack(base, small, false);
        STALE.store(freed & !15, Ordering::Relaxed);
        DEPTH.store(3, Ordering::Relaxed);
        raise_usr1();
        check(3, "");
        STALE.store(0, Ordering::Relaxed);
        set_altstack(0, 0, true);
        unmap(base, small);
        // SAFETY: restoring what was there.
        unsafe {
            assert_eq!(libc::sigaltstack(&prev, std::ptr::null_mut()), 0);
            assert_eq!(
                libc::sigaction(libc::SIGUSR1, &old, std::ptr::null_mut()),
                0
            );
        }
        DEPTH.store(2, Ordering::Relaxed);
        own_stack_capture();
        check(2, "stale_stack::scenarios::own_stack_capture");
    }

    // ------------------------------------------- pthread_attr_setstack

    /// Runs `f` on a new thread made with `attr_fn` applied to its
    /// attributes, and waits for it.
    fn on_thread(attr_fn: impl FnOnce(*mut libc::pthread_attr_t), f: fn()) {
        extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
            // SAFETY: `arg` is the `fn()` passed below, boxed.
            let f = unsafe { Box::from_raw(arg as *mut fn()) };
            f();
            std::ptr::null_mut()
        }
        // SAFETY: a pthread attribute object initialized, used and
        // destroyed here; the thread is joined before returning.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            assert_eq!(libc::pthread_attr_init(&mut attr), 0);
            attr_fn(&mut attr);
            let mut t: libc::pthread_t = 0;
            let arg = Box::into_raw(Box::new(f)) as *mut libc::c_void;
            assert_eq!(libc::pthread_create(&mut t, &attr, start, arg), 0);
            assert_eq!(libc::pthread_join(t, std::ptr::null_mut()), 0);
            libc::pthread_attr_destroy(&mut attr);
        }
    }

    /// `len` bytes of fresh memory with free address space `below` bytes
    /// under it, and a page more (with `below` > 0), so that what is mapped
    /// in the room merges only with this memory (qemu-user places a new
    /// mapping right above the last one).
    fn map_with_room_below(len: usize, below: usize) -> usize {
        let below = if below > 0 { below + 4096 } else { 0 };
        // SAFETY: an anonymous mapping; its lower part is unmapped again.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + below,
                RW,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        if below > 0 {
            unmap(p as usize, below);
        }
        p as usize + below
    }

    fn setstack_sigaltstack() {
        const TS: usize = 512 << 10;
        let stack = map_with_room_below(TS, BIG);
        on_thread(
            // SAFETY: the memory mapped above, unmapped after the join.
            |a| {
                assert_eq!(
                    unsafe { libc::pthread_attr_setstack(a, stack as *mut _, TS) },
                    0
                )
            },
            sigaltstack_scenario,
        );
        unmap(stack, TS);
    }

    fn setstack_coroutine() {
        const TS: usize = 512 << 10;
        let stack = map_with_room_below(TS, BIG);
        on_thread(
            // SAFETY: the memory mapped above, unmapped after the join.
            |a| {
                assert_eq!(
                    unsafe { libc::pthread_attr_setstack(a, stack as *mut _, TS) },
                    0
                )
            },
            || coroutine_scenario(tcb()),
        );
        unmap(stack, TS);
    }

    // --------------------------------------------------------- caching

    #[inline(never)]
    fn warm_captures() {
        let mut out = [0usize; 64];
        // The first capture of each kind may look the bounds up.
        let a = callstack::capture_fast(0, &mut out);
        let b = callstack::capture_exact(0, &mut out);
        assert!(a >= 2 && b >= 2, "{a} {b}");
        let before = callstack::__stack_lookups();
        for _ in 0..100 {
            assert_eq!(callstack::capture_fast(0, &mut out), a);
            assert_eq!(callstack::capture_exact(0, &mut out), b);
        }
        let after = callstack::__stack_lookups();
        assert_eq!(after, before, "warm captures looked the stack up");
    }

    fn caching() {
        warm_captures();
        std::thread::spawn(warm_captures).join().unwrap();
        std::thread::spawn(|| {
            callstack::prepare_thread();
            let before = callstack::__stack_lookups();
            let mut out = [0usize; 64];
            assert!(callstack::capture_fast(0, &mut out) >= 2);
            assert_eq!(callstack::__stack_lookups(), before, "after prepare_thread");
        })
        .join()
        .unwrap();
        const TS: usize = 512 << 10;
        let stack = map_with_room_below(TS, 0);
        on_thread(
            // SAFETY: the memory mapped above, unmapped after the join.
            |a| {
                assert_eq!(
                    unsafe { libc::pthread_attr_setstack(a, stack as *mut _, TS) },
                    0
                )
            },
            warm_captures,
        );
        unmap(stack, TS);
        on_thread(
            // SAFETY: a valid attribute object.
            |a| assert_eq!(unsafe { libc::pthread_attr_setguardsize(a, 0) }, 0),
            warm_captures,
        );
    }
}
