//! A program that crashes on purpose, for the crash-report tests.
//!
//! `crash_fixture SCENARIO` installs the crash handler (report file from
//! `CRASH_REPORT_FILE`, panic hook on), then crashes:
//! `null`, `abort`, `ill`, `trap`, `overflow`, `thread`, `thread-overflow`,
//! `malloc`, `panic`,
//! `prev-handler` (a SIGSEGV handler of its own installed before ours),
//! `alloc-count` (a null dereference with allocations counted from the
//! fault until our handler chains to the fixture's own handler, which
//! prints the count: the crash report must allocate nothing).
//! Each scenario goes through a few named, never-inlined functions so the
//! tests can check the chain of names.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The system allocator, counting allocations while `ARMED`.
struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static DURING_CRASH: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            DURING_CRASH.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if ARMED.load(Ordering::Relaxed) {
            DURING_CRASH.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[inline(never)]
fn rust_null_deref() {
    let p: *mut u32 = black_box(core::ptr::null_mut());
    // SAFETY: not safe at all: this is the crash under test.
    unsafe { core::ptr::write_volatile(p, 42) };
}

/// A call through a null function pointer: the crash is at pc 0.
#[inline(never)]
fn rust_call_null() {
    // SAFETY: not safe at all: this is the crash under test (a null
    // function pointer, made through an integer the optimizer cannot see).
    let f: extern "C" fn() =
        unsafe { core::mem::transmute::<usize, extern "C" fn()>(black_box(0usize)) };
    f();
    // Not a tail call: the return address stays inside this function.
    black_box(());
}

/// Crashes below two frames whose exit hooks are pending (this one and
/// `rust_level_two`): their return addresses are the trampoline's, and the
/// report must name their real callers.
#[inline(never)]
fn rust_hooked() {
    callstack::exit_hook::install(0, || {}).expect("hook rust_hooked");
    callstack::exit_hook::install(1, || {}).expect("hook rust_level_two");
    rust_null_deref();
    black_box(());
}

#[inline(never)]
fn rust_level_two(what: &str) {
    match what {
        "null" | "prev-handler" => rust_null_deref(),
        "call-null" => rust_call_null(),
        "alloc-count" => {
            ARMED.store(true, Ordering::SeqCst);
            rust_null_deref()
        }
        "abort" => rust_abort(),
        "ill" => rust_illegal(),
        "trap" => rust_trap(),
        "panic" => rust_panicking(),
        "malloc" => rust_malloc_crash(),
        "hooked" => rust_hooked(),
        _ => eprintln!("unknown scenario {what}"),
    }
    black_box(());
}

#[inline(never)]
fn rust_level_one(what: &str) {
    rust_level_two(what);
    black_box(());
}

#[inline(never)]
fn rust_abort() {
    std::process::abort();
}

#[inline(never)]
fn rust_illegal() {
    // SAFETY: raises SIGILL on purpose (an instruction every decoder
    // refuses).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!("ud2")
    };
    // SAFETY: as above.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!("udf #0")
    };
    // SAFETY: as above.
    #[cfg(target_arch = "riscv64")]
    unsafe {
        core::arch::asm!("unimp")
    };
}

#[inline(never)]
fn rust_trap() {
    // SAFETY: raises SIGTRAP on purpose (the breakpoint instruction).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!("int3")
    };
    // SAFETY: as above.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!("brk #0")
    };
    // SAFETY: as above.
    #[cfg(target_arch = "riscv64")]
    unsafe {
        core::arch::asm!("ebreak")
    };
    black_box(());
}

#[inline(never)]
fn rust_panicking() {
    panic!("the fixture panics on purpose");
}

#[inline(never)]
fn rust_recurse(depth: u64) -> u64 {
    let pad = black_box([depth; 64]);
    if black_box(true) {
        return rust_recurse(depth + 1) + pad[3];
    }
    pad[0]
}

#[inline(never)]
fn rust_thread_crash() {
    rust_null_deref();
    black_box(());
}

/// Corrupts a free chunk of the unsorted bin, so the next large malloc
/// faults inside glibc's `_int_malloc` while it holds the arena lock;
/// another thread is meanwhile taking the same lock in a loop
/// (`malloc_info`), so it holds it or waits for it when we crash.
#[inline(never)]
fn rust_malloc_crash() {
    std::thread::Builder::new()
        .name("malloc-locker".into())
        .spawn(|| {
            // SAFETY: plain libc calls; malloc_info walks the bins through
            // their forward links, which the corruption leaves intact.
            unsafe {
                let f = libc::fopen(c"/dev/null".as_ptr(), c"w".as_ptr());
                loop {
                    libc::malloc_info(0, f);
                }
            }
        })
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    // SAFETY: not safe at all: heap corruption is the crash under test.
    unsafe {
        // No fastbins (mallopt consolidates the existing ones first), and
        // an odd large size: `a` and `guard` are carved one after the other
        // (from the top chunk or one free chunk), so the freed `a` lands in
        // the unsorted bin, not merged with a neighbour, whatever the heap
        // held before.
        libc::mallopt(libc::M_MXFAST, 0);
        let a = libc::malloc(0x1d30) as *mut usize;
        let guard = libc::malloc(0x1d30);
        black_box(guard);
        libc::free(a.cast());
        // The freed chunk's `bk` link: point it at unmapped memory.
        core::ptr::write_volatile(a.add(1), 0x10);
        let b = rust_malloc_victim(0x1d30);
        black_box(b);
    }
}

#[inline(never)]
fn rust_malloc_victim(n: usize) -> *mut libc::c_void {
    // SAFETY: the heap is corrupt on purpose; this malloc faults.
    let p = unsafe { libc::malloc(black_box(n)) };
    black_box(p)
}

extern "C" fn own_segv_handler(_sig: i32) {
    ARMED.store(false, Ordering::SeqCst);
    let msg = b"fixture: own SIGSEGV handler ran\n";
    let mut line = *b"fixture: allocations during the crash report: 0000\n";
    let n = DURING_CRASH.load(Ordering::SeqCst).min(9999);
    for (i, d) in [1000, 100, 10, 1].iter().enumerate() {
        line[46 + i] = b'0' + ((n / d) % 10) as u8;
    }
    // SAFETY: write(2) and signal(2) are async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::write(2, line.as_ptr().cast(), line.len());
        libc::signal(libc::SIGSEGV, libc::SIG_DFL);
    }
}

fn main() {
    let what = std::env::args().nth(1).unwrap_or_default();
    if what == "prev-handler" || what == "alloc-count" {
        let h: extern "C" fn(i32) = own_segv_handler;
        // SAFETY: installing a plain handler.
        unsafe { libc::signal(libc::SIGSEGV, h as libc::sighandler_t) };
    }
    callstack::crash::install(callstack::crash::Options {
        report_path: std::env::var_os("CRASH_REPORT_FILE").map(Into::into),
        panic_hook: true,
        ..Default::default()
    })
    .expect("install the crash handler");
    match what.as_str() {
        "overflow" => {
            black_box(rust_recurse(0));
        }
        "thread-overflow" => {
            // No install_thread(): the report runs on its own stack, so the
            // small alternate stack the standard library gives each thread
            // is enough.
            std::thread::Builder::new()
                .name("overflower".into())
                .spawn(|| black_box(rust_recurse(0)))
                .unwrap()
                .join()
                .ok();
        }
        "thread" => {
            std::thread::Builder::new()
                .name("crasher".into())
                .spawn(rust_thread_crash)
                .unwrap()
                .join()
                .ok();
        }
        _ => rust_level_one(&what),
    }
    println!("fixture: no crash");
}
