//! The allocator hooks of `callstack memtrack`.
//!
//! Every hook calls the next definition of its function (`dlsym(RTLD_NEXT)`,
//! normally glibc's), then records the block in one process-wide
//! [`Recorder`] with the caller's stack ([`capture_exact`] unless
//! `CALLSTACK_MEMTRACK_CAPTURE=fast`). Recording allocates nothing and
//! takes no lock; a capture may allocate the first time it meets a module
//! (lazily built tables), and a thread-local flag keeps those blocks (and
//! the captures they would start) out.
//!
//! - Bootstrap: `dlsym` may itself call `calloc`/`malloc` before the real
//!   functions are known; those requests are served from a static arena
//!   (never freed, never recorded).
//! - Start (a constructor): reads `CALLSTACK_MEMTRACK_OUT`; the first
//!   process to create that file (`O_EXCL`) owns it. Recording starts here,
//!   so blocks allocated before (by the loader and libc's start-up) are
//!   unknown to the recorder: their frees are counted and ignored.
//! - Exit (`atexit`): recording stops and the [`HeapSnapshot`] is written
//!   to the owned file; a forked child, or a program exec'd by the traced
//!   one (it inherits the environment), writes `FILE.PID` instead.
//!
//! [`capture_exact`]: callstack::capture_exact
//! [`HeapSnapshot`]: callstack::alloc::HeapSnapshot

use callstack::alloc::{Capture, Recorder, MAX_DEPTH};
use libc::{c_int, c_void, size_t};
use std::cell::{Cell, UnsafeCell};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering::*};

/// The environment variable naming the recording file.
pub const ENV_OUT: &str = "CALLSTACK_MEMTRACK_OUT";
/// `fast` or `exact` (the default): how stacks are captured.
pub const ENV_CAPTURE: &str = "CALLSTACK_MEMTRACK_CAPTURE";

static RECORDER: Recorder = Recorder::new();
static ACTIVE: AtomicBool = AtomicBool::new(false);
static EXACT: AtomicBool = AtomicBool::new(true);
static OWNER_PID: AtomicI32 = AtomicI32::new(0);
static OWNER_FD: AtomicI32 = AtomicI32::new(-1);

struct PathBuf4k(UnsafeCell<[u8; 4096]>);
// SAFETY: written once by the constructor (single-threaded), then only read.
unsafe impl Sync for PathBuf4k {}
static OUT_PATH: PathBuf4k = PathBuf4k(UnsafeCell::new([0; 4096]));

// ---- the next allocator's functions -------------------------------------

const MALLOC: usize = 0;
const FREE: usize = 1;
const CALLOC: usize = 2;
const REALLOC: usize = 3;
const MEMALIGN: usize = 4;
const POSIX_MEMALIGN: usize = 5;
const ALIGNED_ALLOC: usize = 6;
const VALLOC: usize = 7;
const PVALLOC: usize = 8;
const NAMES: [&std::ffi::CStr; 9] = [
    c"malloc",
    c"free",
    c"calloc",
    c"realloc",
    c"memalign",
    c"posix_memalign",
    c"aligned_alloc",
    c"valloc",
    c"pvalloc",
];
static REAL: [AtomicUsize; 9] = [const { AtomicUsize::new(0) }; 9];
static RESOLVED: AtomicU8 = AtomicU8::new(0); // 0 no, 1 resolving, 2 done

/// The next definition of function `i`, or `None` while it is being looked
/// up (a `dlsym` that allocates: serve from the arena).
#[inline(always)]
fn real(i: usize) -> Option<usize> {
    if RESOLVED.load(Acquire) != 2 {
        resolve();
    }
    match REAL[i].load(Relaxed) {
        0 => None,
        f => Some(f),
    }
}

#[cold]
fn resolve() {
    if RESOLVED.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
        return;
    }
    for (slot, name) in REAL.iter().zip(NAMES) {
        // SAFETY: dlsym with a NUL-terminated name; it may call calloc or
        // malloc, which find RESOLVED == 1 and use the arena.
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        slot.store(f as usize, Relaxed);
    }
    RESOLVED.store(2, Release);
}

// ---- bootstrap arena ------------------------------------------------------

const ARENA_SIZE: usize = 256 * 1024;
#[repr(C, align(4096))]
struct Arena(UnsafeCell<[u8; ARENA_SIZE]>);
// SAFETY: disjoint ranges are handed out by an atomic bump pointer.
unsafe impl Sync for Arena {}
static ARENA: Arena = Arena(UnsafeCell::new([0; ARENA_SIZE]));
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

fn arena_base() -> usize {
    ARENA.0.get() as usize
}

fn in_arena(p: *mut c_void) -> bool {
    let p = p as usize;
    p >= arena_base() && p < arena_base() + ARENA_SIZE
}

/// A zeroed block from the arena, with its size in the 8 bytes before it.
fn arena_alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.max(16);
    let mut cur = ARENA_USED.load(Relaxed);
    loop {
        let start = (arena_base() + cur + 8 + align - 1) & !(align - 1);
        let end = start - arena_base() + size;
        if end > ARENA_SIZE {
            return std::ptr::null_mut();
        }
        match ARENA_USED.compare_exchange_weak(cur, end, Relaxed, Relaxed) {
            Ok(_) => {
                // SAFETY: [start - 8, start + size) is inside the arena and
                // now ours alone.
                unsafe { ((start - 8) as *mut usize).write(size) };
                return start as *mut c_void;
            }
            Err(c) => cur = c,
        }
    }
}

fn arena_size(p: *mut c_void) -> usize {
    // SAFETY: an arena block has its size in the 8 bytes before it.
    unsafe { ((p as usize - 8) as *const usize).read() }
}

// ---- recording ----------------------------------------------------------

/// Records `p` with the stack of the hook's caller. Inlined into each hook,
/// so that skipping one frame drops the hook itself.
#[inline(always)]
fn track(p: *mut c_void, size: usize) {
    if p.is_null() || !ACTIVE.load(Relaxed) {
        return;
    }
    // A capture may allocate the first time it meets a module (lazily
    // built tables): those blocks are the tool's own, not recorded, and
    // must not start another capture.
    if IN_HOOK.get() {
        return;
    }
    IN_HOOK.set(true);
    let mut frames = [0usize; MAX_DEPTH];
    let n = if EXACT.load(Relaxed) {
        callstack::capture_exact(1, &mut frames)
    } else {
        callstack::capture_fast(1, &mut frames)
    };
    RECORDER.record_alloc(&frames[..n], p as usize, size);
    IN_HOOK.set(false);
}

thread_local! {
    // Whether this thread is inside `track`. A const initializer and no
    // `Drop`: a plain TLS slot, no registration and no allocation on first
    // use. This library is loaded at start-up (LD_PRELOAD), so its TLS is
    // in the static TLS block of every thread and `__tls_get_addr` takes
    // its fast path (it would allocate only for a dlopen'd library). After
    // the program dlopens a library with TLS, the first access may take
    // the slow path; test `dlopen_of_a_tls_library` runs that case.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

// ---- the hooks ----------------------------------------------------------

/// `malloc`, recorded.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    let Some(f) = real(MALLOC) else {
        return arena_alloc(size, 16);
    };
    // SAFETY: `f` is the next `malloc`.
    let p = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(size_t) -> *mut c_void>(f)(size)
    };
    track(p, size);
    p
}

/// `calloc`, recorded.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        return std::ptr::null_mut();
    };
    let Some(f) = real(CALLOC) else {
        return arena_alloc(total, 16);
    };
    // SAFETY: `f` is the next `calloc`.
    let p = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(size_t, size_t) -> *mut c_void>(f)(
            n, size,
        )
    };
    track(p, total);
    p
}

/// `free`, recorded.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || in_arena(p) {
        return;
    }
    if ACTIVE.load(Relaxed) {
        RECORDER.record_free(p as usize);
    }
    if let Some(f) = real(FREE) {
        // SAFETY: `f` is the next `free`; `p` came from the next allocator.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void)>(f)(p) }
    }
}

/// `realloc`, recorded: the old block freed, the new one allocated.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { realloc_impl(p, size) }
}

/// `reallocarray`, recorded like `realloc` (glibc's calls its own realloc
/// directly, past our hook).
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        // SAFETY: setting errno, as glibc does.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's contract.
    unsafe { realloc_impl(p, total) }
}

#[inline(always)]
unsafe fn realloc_impl(p: *mut c_void, size: size_t) -> *mut c_void {
    if in_arena(p) {
        // SAFETY: a fresh block, then a copy of the arena block's bytes.
        unsafe {
            let q = malloc(size);
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(
                    p as *const u8,
                    q as *mut u8,
                    arena_size(p).min(size),
                );
            }
            return q;
        }
    }
    let Some(f) = real(REALLOC) else {
        return arena_alloc(size, 16);
    };
    let active = ACTIVE.load(Relaxed);
    let taken = if active && !p.is_null() {
        RECORDER.take(p as usize)
    } else {
        None
    };
    // SAFETY: `f` is the next `realloc`.
    let q = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void, size_t) -> *mut c_void>(f)(
            p, size,
        )
    };
    if let Some(t) = taken {
        if q.is_null() && size != 0 {
            RECORDER.put_back(p as usize, t); // failed: the old block stays
        } else {
            RECORDER.commit_free(t);
        }
    }
    track(q, size);
    q
}

type AlignFn = unsafe extern "C" fn(size_t, size_t) -> *mut c_void;

/// `memalign`, recorded.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    let Some(f) = real(MEMALIGN) else {
        return arena_alloc(size, align.next_power_of_two());
    };
    // SAFETY: `f` is the next `memalign`.
    let p = unsafe { std::mem::transmute::<usize, AlignFn>(f)(align, size) };
    track(p, size);
    p
}

/// `aligned_alloc`, recorded.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    let Some(f) = real(ALIGNED_ALLOC) else {
        return arena_alloc(size, align.next_power_of_two());
    };
    // SAFETY: `f` is the next `aligned_alloc`.
    let p = unsafe { std::mem::transmute::<usize, AlignFn>(f)(align, size) };
    track(p, size);
    p
}

/// `posix_memalign`, recorded.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    let Some(f) = real(POSIX_MEMALIGN) else {
        let p = arena_alloc(size, align.next_power_of_two());
        if p.is_null() {
            return libc::ENOMEM;
        }
        // SAFETY: the caller's out pointer.
        unsafe { *out = p };
        return 0;
    };
    // SAFETY: `f` is the next `posix_memalign`.
    let r = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut *mut c_void, size_t, size_t) -> c_int>(
            f,
        )(out, align, size)
    };
    if r == 0 {
        // SAFETY: on success the next allocator stored the block at `out`.
        track(unsafe { *out }, size);
    }
    r
}

/// `valloc`, recorded.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    let Some(f) = real(VALLOC) else {
        return arena_alloc(size, 4096);
    };
    // SAFETY: `f` is the next `valloc`.
    let p = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(size_t) -> *mut c_void>(f)(size)
    };
    track(p, size);
    p
}

/// `pvalloc`, recorded (with the size asked for, not the page-rounded one).
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let Some(f) = real(PVALLOC) else {
        return arena_alloc(size, 4096);
    };
    // SAFETY: `f` is the next `pvalloc`.
    let p = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(size_t) -> *mut c_void>(f)(size)
    };
    track(p, size);
    p
}

// ---- start and exit -----------------------------------------------------

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    resolve();
    // SAFETY: getenv with NUL-terminated names; the constructor runs before
    // main, on one thread.
    unsafe {
        let out = libc::getenv(c"CALLSTACK_MEMTRACK_OUT".as_ptr());
        if out.is_null() {
            return;
        }
        let path = std::ffi::CStr::from_ptr(out).to_bytes();
        if path.is_empty() || path.len() >= 4000 {
            return;
        }
        let buf = &mut *OUT_PATH.0.get();
        buf[..path.len()].copy_from_slice(path);
        buf[path.len()] = 0;
        let cap = libc::getenv(c"CALLSTACK_MEMTRACK_CAPTURE".as_ptr());
        let fast = !cap.is_null() && std::ffi::CStr::from_ptr(cap).to_bytes() == b"fast";
        EXACT.store(!fast, Relaxed);
        let fd = libc::open(
            out,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o644,
        );
        if fd >= 0 {
            OWNER_FD.store(fd, Relaxed);
            OWNER_PID.store(libc::getpid(), Relaxed);
        }
        // Build the disassembler's tables now (this library's own
        // constructor for them may run after this one): not recorded.
        callstack::unwind::insn::warm_up();
        if !fast {
            // Compile every module's CFI now (allocates: not recorded yet).
            callstack::prepare();
        }
        libc::atexit(finish);
    }
    ACTIVE.store(true, Release);
}

extern "C" fn finish() {
    if !ACTIVE.swap(false, AcqRel) {
        return;
    }
    RECORDER.set_enabled(false);
    let mut snap = RECORDER.snapshot();
    snap.capture = if EXACT.load(Relaxed) {
        Capture::Exact
    } else {
        Capture::Fast
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // SAFETY: written by the constructor, NUL-terminated.
    let path = unsafe { std::ffi::CStr::from_ptr((*OUT_PATH.0.get()).as_ptr().cast()) };
    let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(path.to_bytes()));
    let file = if pid == OWNER_PID.load(Relaxed) {
        use std::os::fd::FromRawFd;
        // SAFETY: the descriptor this process opened in the constructor,
        // used only here.
        Ok(unsafe { std::fs::File::from_raw_fd(OWNER_FD.load(Relaxed)) })
    } else {
        let mut p = path.into_os_string();
        p.push(format!(".{pid}"));
        std::fs::File::create(p)
    };
    if let Ok(f) = file {
        let _ = snap.write_to(std::io::BufWriter::new(f));
    }
}
