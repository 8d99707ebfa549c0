//! A signal at every instruction of the exit-hook trampoline, by single
//! stepping: a hooked function raises SIGUSR1, whose handler sets the trap
//! flag (EFLAGS bit 8) in the interrupted context, so that SIGTRAP fires
//! after every instruction from there on. At each SIGTRAP whose pc lies in
//! the trampoline, the handler checks `capture_from_context` (the chain is
//! that pc, then the hooked frame's real caller and the rest of the chain as
//! captured inside the hooked function), `capture_exact` from the handler
//! (the same chain after the signal frame) and `capture_fast` from the
//! handler (the frame-record chain: the real caller while the trampoline's
//! own record is up, the caller's callers otherwise, never the trampoline)
//! and glibc's `backtrace()` from the handler (libgcc, through the
//! trampoline's CFI: the same chain as `capture_exact`'s).
//! The flag is cleared once the trampoline has jumped to the real caller.
//! Runs with 0, 1 and 2 values left on the x87 stack by the hooked function
//! (the trampoline's three paths through its x87 save and restore).
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

const MAX: usize = 128;

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicUsize = AtomicUsize::new(0);
/// The chain captured (exact) inside the hooked function: `[in hooked,
/// in its caller, ...]`.
static BASE: [AtomicUsize; MAX] = [ZERO; MAX];
static BASE_LEN: AtomicUsize = AtomicUsize::new(0);
/// The same by frame records.
static BASE_FAST: [AtomicUsize; MAX] = [ZERO; MAX];
static BASE_FAST_LEN: AtomicUsize = AtomicUsize::new(0);
/// Stepping: set by SIGUSR1's handler, cleared at the real caller.
static STEPPING: AtomicBool = AtomicBool::new(false);
/// Whether the trampoline was entered in this run.
static ENTERED: AtomicBool = AtomicBool::new(false);
/// The first and last trampoline pcs stepped, how many steps were in it,
/// and the pc right after the last one.
static FIRST: AtomicUsize = AtomicUsize::new(0);
static LAST: AtomicUsize = AtomicUsize::new(0);
static STEPS: AtomicU64 = AtomicU64::new(0);
static LEFT_TO: AtomicUsize = AtomicUsize::new(0);
/// Fast captures that held the real caller (the trampoline's record up).
static FAST_WITH_CALLER: AtomicU64 = AtomicU64::new(0);
/// The first failure: which check, the pc and the chain.
static BAD: AtomicU64 = AtomicU64::new(0);
static BAD_WHAT: AtomicUsize = AtomicUsize::new(0);
static BAD_PC: AtomicUsize = AtomicUsize::new(0);
static BAD_CHAIN: [AtomicUsize; MAX] = [ZERO; MAX];
static BAD_LEN: AtomicUsize = AtomicUsize::new(0);

const EFLAGS_TF: i64 = 0x100;

/// The end of the trampoline's code: just past its final `jmp r11`.
static END: AtomicUsize = AtomicUsize::new(0);

fn trampoline_end() -> usize {
    let t = trampoline();
    // SAFETY: the trampoline's code, a few hundred bytes, then more code of
    // this executable; read until its `jmp r11` (41 ff e3).
    let code = unsafe { core::slice::from_raw_parts(t as *const u8, 1024) };
    let at = code
        .windows(3)
        .position(|w| w == [0x41, 0xff, 0xe3])
        .expect("the trampoline's final jmp");
    t + at + 3
}

fn trampoline() -> usize {
    callstack::exit_hook::trampoline_address().unwrap()
}

fn load(a: &[AtomicUsize; MAX], n: usize) -> Vec<usize> {
    a[..n].iter().map(|x| x.load(Ordering::Relaxed)).collect()
}

/// Every failure as `what << 32 | pc - TRAMPOLINE` (the first 32).
static BAD_ALL: [AtomicUsize; 32] = [ZERO; 32];

fn fail(what: usize, pc: usize, chain: &[usize]) {
    let k = BAD.fetch_add(1, Ordering::Relaxed) as usize;
    if k < BAD_ALL.len() {
        BAD_ALL[k].store(what << 32 | (pc - trampoline()), Ordering::Relaxed);
    }
    if k == 0 {
        BAD_WHAT.store(what, Ordering::Relaxed);
        BAD_PC.store(pc, Ordering::Relaxed);
        for (i, &a) in chain.iter().enumerate() {
            BAD_CHAIN[i].store(a, Ordering::Relaxed);
        }
        BAD_LEN.store(chain.len(), Ordering::Relaxed);
    }
}

/// Whether `chain` ends with `tail`.
fn ends_with(chain: &[usize], tail: &[AtomicUsize]) -> bool {
    chain.len() >= tail.len()
        && chain[chain.len() - tail.len()..]
            .iter()
            .zip(tail)
            .all(|(a, b)| *a == b.load(Ordering::Relaxed))
}

extern "C" fn on_usr1(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes the interrupted context, restored on return.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    STEPPING.store(true, Ordering::Relaxed);
    uc.uc_mcontext.gregs[libc::REG_EFL as usize] |= EFLAGS_TF;
}

extern "C" fn on_trap(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes the interrupted context, restored on return.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    if !STEPPING.load(Ordering::Relaxed) {
        uc.uc_mcontext.gregs[libc::REG_EFL as usize] &= !EFLAGS_TF;
        return;
    }
    let pc = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
    let t = trampoline();
    let base_len = BASE_LEN.load(Ordering::Relaxed);
    let caller = BASE[1].load(Ordering::Relaxed);
    // The trampoline's code: from TRAMPOLINE to its final `jmp` (its
    // callees, the dispatcher and the hook, lie elsewhere).
    let inside = pc >= t && pc < END.load(Ordering::Relaxed);
    if !inside {
        if ENTERED.load(Ordering::Relaxed) && pc == caller {
            // Jumped to the real caller: done.
            LEFT_TO.store(pc, Ordering::Relaxed);
            STEPPING.store(false, Ordering::Relaxed);
            uc.uc_mcontext.gregs[libc::REG_EFL as usize] &= !EFLAGS_TF;
        }
        return;
    }
    if !ENTERED.swap(true, Ordering::Relaxed) {
        FIRST.store(pc, Ordering::Relaxed);
    }
    LAST.store(pc, Ordering::Relaxed);
    STEPS.fetch_add(1, Ordering::Relaxed);

    // From the interrupted context: [pc, caller, the caller's callers].
    let mut out = [0usize; MAX];
    let n = callstack::capture_from_context(uc, &mut out);
    let ok =
        n == base_len && out[0] == pc && (1..n).all(|i| out[i] == BASE[i].load(Ordering::Relaxed));
    if !ok {
        fail(1, pc, &out[..n]);
    }

    // From the handler: its own frames, the signal frame, then the same.
    let n = callstack::capture_exact(0, &mut out);
    let at = out[..n].iter().position(|&a| a == pc);
    let ok = match at {
        Some(j) => n - j == base_len && ends_with(&out[j + 1..n], &BASE[1..base_len]),
        None => false,
    };
    if !ok {
        fail(2, pc, &out[..n]);
    }

    // By frame records from the handler: the record at the interrupted rbp
    // is the trampoline's (its return address is the real caller) or the
    // caller's own (its return address is the caller's caller), as for any
    // function interrupted outside its frame record.
    let n = callstack::capture_fast(0, &mut out);
    let blen = BASE_FAST_LEN.load(Ordering::Relaxed);
    let chain = &out[..n];
    let ok = !chain.contains(&t)
        && if ends_with(chain, &BASE_FAST[1..blen]) {
            FAST_WITH_CALLER.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            ends_with(chain, &BASE_FAST[2..blen])
        };
    if !ok {
        fail(3, pc, chain);
    }

    // libgcc (glibc's backtrace()), from the handler: the same chain after
    // the signal frame (its pcs are return addresses but for the
    // interrupted one, exact after a signal frame).
    let mut bt = [core::ptr::null_mut::<libc::c_void>(); MAX];
    // SAFETY: `MAX` slots; libgcc is loaded (the test called backtrace()
    // before stepping).
    let n = unsafe { backtrace(bt.as_mut_ptr(), MAX as libc::c_int) } as usize;
    let chain: Vec<usize> = bt[..n].iter().map(|&p| p as usize).collect();
    let ok = match chain.iter().position(|&a| a == pc) {
        Some(j) => ends_with(&chain[j + 1..], &BASE[1..base_len]),
        None => false,
    };
    if !ok {
        fail(4, pc, &chain);
    }
}

unsafe extern "C" {
    /// glibc's `backtrace(3)`, through libgcc's unwinder.
    fn backtrace(buffer: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int;
}

static HOOK_RAN: AtomicU64 = AtomicU64::new(0);

/// Hooks itself, records the chains, has SIGUSR1 set the trap flag, and
/// returns (with `x87` values left on the x87 register stack) through the
/// trampoline.
#[inline(never)]
fn hooked(x87: u32) -> u64 {
    let mut out = [0usize; MAX];
    let n = callstack::capture_exact(0, &mut out);
    for (i, &a) in out[..n].iter().enumerate() {
        BASE[i].store(a, Ordering::Relaxed);
    }
    BASE_LEN.store(n, Ordering::Relaxed);
    let n = callstack::capture_fast(0, &mut out);
    for (i, &a) in out[..n].iter().enumerate() {
        BASE_FAST[i].store(a, Ordering::Relaxed);
    }
    BASE_FAST_LEN.store(n, Ordering::Relaxed);
    callstack::exit_hook::install(0, || {
        HOOK_RAN.fetch_add(1, Ordering::Relaxed);
    })
    .unwrap();
    // SAFETY: SIGUSR1's handler is installed by the test.
    unsafe { libc::raise(libc::SIGUSR1) };
    // SAFETY: pushes values on the x87 stack, which the caller pops (the
    // rest of this function uses SSE only).
    unsafe {
        match x87 {
            1 => core::arch::asm!("fld1", options(nostack)),
            2 => core::arch::asm!("fld1", "fldz", options(nostack)),
            _ => {}
        }
    }
    black_box(7)
}

#[inline(never)]
fn caller_of_hooked(x87: u32) -> u64 {
    let v = hooked(x87);
    // SAFETY: pops what `hooked` left on the x87 stack.
    unsafe {
        match x87 {
            1 => core::arch::asm!("fstp st(0)", options(nostack)),
            2 => core::arch::asm!("fstp st(0)", "fstp st(0)", options(nostack)),
            _ => {}
        }
    }
    black_box(v + 1)
}

static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn every_trampoline_instruction_unwinds_to_the_real_caller() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: handlers that set or clear the trap flag and capture.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigaction(libc::SIGUSR1, &sa, core::ptr::null_mut());
        sa.sa_sigaction = on_trap as *const () as usize;
        libc::sigaction(libc::SIGTRAP, &sa, core::ptr::null_mut());
    }
    END.store(trampoline_end(), Ordering::Relaxed);
    // Loads libgcc for backtrace() outside the handler.
    let mut bt = [core::ptr::null_mut::<libc::c_void>(); 8];
    // SAFETY: 8 slots.
    unsafe { backtrace(bt.as_mut_ptr(), 8) };
    for x87 in [0, 1, 2] {
        ENTERED.store(false, Ordering::Relaxed);
        STEPS.store(0, Ordering::Relaxed);
        FAST_WITH_CALLER.store(0, Ordering::Relaxed);
        LEFT_TO.store(0, Ordering::Relaxed);
        let ran = HOOK_RAN.load(Ordering::Relaxed);
        assert_eq!(caller_of_hooked(x87), 8);
        assert!(!STEPPING.load(Ordering::Relaxed), "x87 {x87}: never left");
        assert_eq!(HOOK_RAN.load(Ordering::Relaxed), ran + 1);
        let bad = BAD.load(Ordering::Relaxed);
        if bad > 0 {
            let what = [
                "",
                "capture_from_context",
                "capture_exact",
                "capture_fast",
                "backtrace",
            ][BAD_WHAT.load(Ordering::Relaxed)];
            let pc = BAD_PC.load(Ordering::Relaxed);
            let all: Vec<String> = BAD_ALL[..(bad as usize).min(32)]
                .iter()
                .map(|w| {
                    let w = w.load(Ordering::Relaxed);
                    format!("check {} at +{:#x}", w >> 32, w & 0xffff_ffff)
                })
                .collect();
            panic!(
                "x87 {x87}: {bad} bad captures ({all:?}); first: {what} at trampoline + {:#x}: {:x?}\n\
                 expected after the pc: {:x?}\nfast base: {:x?}",
                pc - trampoline(),
                load(&BAD_CHAIN, BAD_LEN.load(Ordering::Relaxed)),
                &load(&BASE, BASE_LEN.load(Ordering::Relaxed))[1..],
                load(&BASE_FAST, BASE_FAST_LEN.load(Ordering::Relaxed)),
            );
        }
        // Stepped from the trampoline's first instruction to its final
        // jump, which went to the real caller.
        assert_eq!(FIRST.load(Ordering::Relaxed), trampoline(), "x87 {x87}");
        assert_eq!(
            LEFT_TO.load(Ordering::Relaxed),
            BASE[1].load(Ordering::Relaxed),
            "x87 {x87}"
        );
        let steps = STEPS.load(Ordering::Relaxed);
        assert!(steps >= 40, "x87 {x87}: {steps} steps");
        // The trampoline's frame record was up for part of them.
        let with = FAST_WITH_CALLER.load(Ordering::Relaxed);
        assert!(with > 0 && with < steps, "x87 {x87}: {with} of {steps}");
    }
}
