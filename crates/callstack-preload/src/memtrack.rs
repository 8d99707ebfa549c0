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
//! - Start (a constructor): reads `CALLSTACK_MEMTRACK_OUT`. Recording
//!   starts here, so blocks allocated before (by the loader and libc's
//!   start-up) are unknown to the recorder: their frees are counted and
//!   ignored.
//! - With `CALLSTACK_MEMTRACK_DIR` (what `callstack memtrack` sets), the
//!   recorder's tables live in `DIR/PID.tables`, a shared file mapping
//!   laid out as [`callstack::alloc::shared`] says, locked (`fcntl`) for
//!   the life of the process: whatever ends the process (`_exit`, abort,
//!   a fatal signal, SIGKILL), `callstack memtrack` finds the lock free and
//!   reads every record from the file. The process's live and peak heap
//!   bytes are counted there too, and their sum over all processes of the
//!   run in `DIR/global`. A forked child (`pthread_atfork`) copies the
//!   tables into its own file and maps it in place of its parent's (the
//!   parent waits for the copy); a
//!   program exec'd by a tracked one takes over the file of its pid.
//! - Exit (`atexit`): recording stops and the [`HeapSnapshot`] is written
//!   to `FILE.PID` (with `CALLSTACK_MEMTRACK_DIR`; `callstack memtrack`
//!   renames the recording of the program it started to FILE). Without
//!   it, the first process to create FILE (`O_EXCL`) writes FILE, others
//!   `FILE.PID`.
//!
//! [`capture_exact`]: callstack::capture_exact
//! [`HeapSnapshot`]: callstack::alloc::HeapSnapshot

use callstack::alloc::shared::{self, GlobalHeap, TablesHeader};
use callstack::alloc::{Capture, Recorder, MAX_DEPTH};
use libc::{c_int, c_void, size_t};
use std::cell::{Cell, UnsafeCell};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};

/// The environment variable naming the recording file.
pub const ENV_OUT: &str = "CALLSTACK_MEMTRACK_OUT";
/// `fast` or `exact` (the default): how stacks are captured.
pub const ENV_CAPTURE: &str = "CALLSTACK_MEMTRACK_CAPTURE";
/// The directory of the shared tables files (`PID.tables`, `global`).
pub const ENV_DIR: &str = "CALLSTACK_MEMTRACK_DIR";
/// Mean bytes between sampled allocations (unset or 0: every allocation;
/// see [`callstack::alloc::sample`]).
pub const ENV_SAMPLE_BYTES: &str = "CALLSTACK_MEMTRACK_SAMPLE_BYTES";

static RECORDER: Recorder = Recorder::new();
static ACTIVE: AtomicBool = AtomicBool::new(false);
static EXACT: AtomicBool = AtomicBool::new(true);
static OWNER_PID: AtomicI32 = AtomicI32::new(0);
static OWNER_FD: AtomicI32 = AtomicI32::new(-1);

struct PathBuf4k(UnsafeCell<[u8; 4096]>);
// SAFETY: written once by the constructor (single-threaded), then only read.
unsafe impl Sync for PathBuf4k {}
static OUT_PATH: PathBuf4k = PathBuf4k(UnsafeCell::new([0; 4096]));
static DIR_PATH: PathBuf4k = PathBuf4k(UnsafeCell::new([0; 4096]));

/// The tables file's mapping (null: the recorder maps its own tables).
static TABLES: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static TABLES_FD: AtomicI32 = AtomicI32::new(-1);
/// The run's [`GlobalHeap`] page (null: none).
static GLOBAL: AtomicPtr<GlobalHeap> = AtomicPtr::new(std::ptr::null_mut());

#[inline(always)]
fn header() -> Option<&'static TablesHeader> {
    let p = TABLES.load(Relaxed);
    if p.is_null() {
        None
    } else {
        // SAFETY: a tables mapping, set up before recording starts and
        // never unmapped (a fork maps the child's file at the same place).
        Some(unsafe { shared::header(p) })
    }
}

#[inline(always)]
fn global() -> Option<&'static GlobalHeap> {
    // SAFETY: null or the run's global page, mapped for good.
    unsafe { GLOBAL.load(Relaxed).as_ref() }
}

/// Counts a recorded block's bytes as live in this process (and the run).
#[inline(always)]
fn live_add(size: usize) {
    if let Some(h) = header() {
        h.add(size as u64, global());
    }
}

/// Counts a recorded block's bytes as freed.
#[inline(always)]
fn live_sub(size: u64) {
    if let Some(h) = header() {
        h.sub(size, global());
    }
}

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
    // Sampling first: an allocation not picked costs this one thread-local
    // update (and the tool's own blocks count towards the next sample).
    let mean = RECORDER.sample_bytes();
    if mean != 0 && !callstack::alloc::sample::take_sample(mean, size) {
        return;
    }
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
    live_add(match mean {
        0 => size,
        m => callstack::alloc::sample::estimated_bytes(m, size as u64) as usize,
    });
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
    // The pipe of the fork this thread is making (see `before_fork`):
    // read end, write end; -1 when none.
    static FORK_PIPE: Cell<[c_int; 2]> = const { Cell::new([-1, -1]) };
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
        // SAFETY: setting errno, as glibc does.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
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
        if let Some(t) = RECORDER.take(p as usize) {
            let bytes = t.weighted_bytes();
            RECORDER.commit_free(t);
            live_sub(bytes);
        }
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
            let bytes = t.weighted_bytes();
            RECORDER.commit_free(t);
            live_sub(bytes);
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

/// `DIR/NAME` as a NUL-terminated path in `buf`; `None` if too long.
fn dir_file<'a>(buf: &'a mut [u8; 4200], name: &[u8]) -> Option<&'a std::ffi::CStr> {
    // SAFETY: DIR_PATH is written once by the constructor, NUL-terminated.
    let dir = unsafe { std::ffi::CStr::from_ptr((*DIR_PATH.0.get()).as_ptr().cast()) }.to_bytes();
    let n = dir.len() + 1 + name.len();
    if dir.is_empty() || n + 1 > buf.len() {
        return None;
    }
    buf[..dir.len()].copy_from_slice(dir);
    buf[dir.len()] = b'/';
    buf[dir.len() + 1..n].copy_from_slice(name);
    buf[n] = 0;
    std::ffi::CStr::from_bytes_with_nul(&buf[..=n]).ok()
}

/// `PID.tables` without allocating.
fn tables_name(pid: i32, out: &mut [u8; 32]) -> &[u8] {
    let mut digits = [0u8; 12];
    let mut n = 0;
    let mut v = pid.unsigned_abs();
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let mut len = 0;
    for d in digits[..n].iter().rev() {
        out[len] = *d;
        len += 1;
    }
    out[len..len + 7].copy_from_slice(b".tables");
    &out[..len + 7]
}

/// Takes a write lock on the whole file: held while the process lives
/// (a `fcntl` lock is the process's, released by the kernel however it
/// ends, and not inherited by a fork).
fn lock(fd: c_int) -> bool {
    // SAFETY: a zeroed flock describing the whole file, for fcntl.
    unsafe {
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        libc::fcntl(fd, libc::F_SETLK, &fl) == 0
    }
}

/// Maps the run's global page `DIR/global` (made by `callstack memtrack`).
fn map_global() {
    let mut buf = [0u8; 4200];
    let Some(path) = dir_file(&mut buf, b"global") else {
        return;
    };
    // SAFETY: open/fstat/ftruncate/mmap of our own file; the mapping is
    // kept for good.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o600,
        );
        if fd < 0 {
            return;
        }
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) == 0 && st.st_size < 4096 {
            libc::ftruncate(fd, 4096);
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        libc::close(fd);
        if p != libc::MAP_FAILED {
            GLOBAL.store(p.cast(), Relaxed);
        }
    }
}

/// Opens `DIR/PID.tables` for this process, empty and sized, locked.
/// An image that exec'd into this one (same pid) left its tables there:
/// its heap is gone, so the run's sum loses it.
fn open_tables(pid: i32, len: usize) -> Option<c_int> {
    let mut name = [0u8; 32];
    let name = tables_name(pid, &mut name);
    let mut buf = [0u8; 4200];
    let path = dir_file(&mut buf, name)?;
    // SAFETY: open/pread/ftruncate of our own file.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o600,
        );
        if fd < 0 {
            return None;
        }
        let mut head = [0u64; 9];
        let want = std::mem::size_of_val(&head);
        if libc::pread(fd, head.as_mut_ptr().cast(), want, 0) == want as isize
            && head[0] == shared::TABLES_MAGIC
            && head[6] == shared::STATE_RUNNING
        {
            if let Some(g) = global() {
                g.live.fetch_sub(head[7], Relaxed);
            }
        }
        if libc::ftruncate(fd, 0) != 0 || libc::ftruncate(fd, len as libc::off_t) != 0 || !lock(fd)
        {
            libc::close(fd);
            return None;
        }
        Some(fd)
    }
}

/// Fills the header of a fresh tables mapping (the magic last).
fn fill_header(base: *mut u8, pid: i32) {
    // SAFETY: `base` maps a tables file; this process is its only writer.
    let h = unsafe { shared::header(base) };
    let (sb, lb) = RECORDER.capacity_bits();
    h.pid.store(pid as u64, Relaxed);
    // SAFETY: getppid has no preconditions.
    h.ppid.store(unsafe { libc::getppid() } as u64, Relaxed);
    h.capture.store(EXACT.load(Relaxed) as u64, Relaxed);
    h.site_bits.store(sb as u64, Relaxed);
    h.live_bits.store(lb as u64, Relaxed);
    h.state.store(shared::STATE_RUNNING, Relaxed);
    if let Ok(cmd) = std::fs::read("/proc/self/cmdline") {
        // SAFETY: as above.
        unsafe { shared::set_command(base, &cmd) };
    }
    h.magic.store(shared::TABLES_MAGIC, Release);
}

/// Sets up this process's tables file and hands its storage to the
/// recorder. `false`: the recorder keeps its own (anonymous) tables.
fn setup_tables() -> bool {
    map_global();
    let len = shared::tables_len(&RECORDER);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let Some(fd) = open_tables(pid, len) else {
        return false;
    };
    // SAFETY: a shared mapping of the file just sized to `len`.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return false;
    }
    let base = p as *mut u8;
    fill_header(base, pid);
    // SAFETY: the storage part of the mapping, page-aligned, mapped for
    // good; nothing has recorded yet.
    if !unsafe { RECORDER.use_storage(base.add(shared::RECORDER_OFFSET)) } {
        return false;
    }
    TABLES_FD.store(fd, Relaxed);
    TABLES.store(base, Release);
    true
}

/// Writes the current module list into the tables file.
fn publish_modules() {
    let base = TABLES.load(Acquire);
    if base.is_null() {
        return;
    }
    if let Ok(bytes) = shared::modules_bytes() {
        // SAFETY: our tables mapping; called at start only (one thread).
        unsafe { shared::publish_modules(base, &bytes) };
    }
}

/// In a forked child: its own tables file, a copy of its parent's at the
/// moment of the fork, mapped over the parent's at the same address (the
/// recorder's pointers stay valid). If that fails the child records
/// nothing (it must not write into its parent's tables).
///
/// The copy is of the tables at the fork only if the parent does not
/// change them meanwhile: the parent waits in [`after_fork_parent`] until
/// the child has copied them (or died), through a pipe made in
/// [`before_fork`] that the child writes one byte to. (Other threads of a
/// multithreaded parent go on allocating during the copy; the blocks they
/// make or free then may be in the child's copy or not.)
extern "C" fn after_fork_child() {
    let [rd, wr] = FORK_PIPE.replace([-1, -1]);
    if rd >= 0 {
        // SAFETY: the read end, ours in this process.
        unsafe { libc::close(rd) };
    }
    let base = TABLES.load(Acquire);
    if !base.is_null() && ACTIVE.swap(false, AcqRel) {
        if fork_tables(base) {
            ACTIVE.store(true, Release);
        } else {
            RECORDER.set_enabled(false);
            TABLES.store(std::ptr::null_mut(), Release);
        }
    }
    if wr >= 0 {
        // SAFETY: one byte from the stack to the write end, then closed.
        unsafe {
            libc::write(wr, b"c".as_ptr().cast(), 1);
            libc::close(wr);
        }
    }
}

/// Before a fork of a tracked process: the pipe through which the child
/// tells its parent that it has copied the tables.
extern "C" fn before_fork() {
    if TABLES.load(Acquire).is_null() || !ACTIVE.load(Acquire) {
        return;
    }
    let mut fds = [-1 as c_int; 2];
    // SAFETY: pipe2 fills the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0 {
        FORK_PIPE.set(fds);
    }
}

/// In the parent after a fork: waits until the child has copied the
/// tables (its byte), or has died or failed (end of file), before the
/// parent changes them. A child of another thread forking meanwhile may
/// hold the write end too (until it execs or exits): the wait is bounded.
extern "C" fn after_fork_parent() {
    let [rd, wr] = FORK_PIPE.replace([-1, -1]);
    if rd < 0 {
        return;
    }
    // SAFETY: our pipe's descriptors: the write end closed, the read end
    // polled, read and closed; errno of this thread kept.
    unsafe {
        let errno = *libc::__errno_location();
        libc::close(wr);
        let mut pfd = libc::pollfd {
            fd: rd,
            events: libc::POLLIN,
            revents: 0,
        };
        // At most 2 s: the child writes its byte as soon as it has
        // copied; only a child killed meanwhile whose write end another
        // child also holds leaves the whole wait.
        for _ in 0..20 {
            let n = libc::poll(&mut pfd, 1, 100);
            if n > 0 {
                let mut b = 0u8;
                libc::read(rd, (&mut b as *mut u8).cast(), 1);
                break;
            }
            if n < 0 && *libc::__errno_location() != libc::EINTR {
                break;
            }
        }
        libc::close(rd);
        *libc::__errno_location() = errno;
    }
}

fn fork_tables(base: *mut u8) -> bool {
    let len = shared::tables_len(&RECORDER);
    let old = TABLES_FD.load(Relaxed);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let Some(fd) = open_tables(pid, len) else {
        return false;
    };
    // SAFETY: copying the pages of the parent's file that hold data (its
    // holes stay holes) into the new file, then mapping the new file in
    // place of the old one; this thread is the only one.
    unsafe {
        // The recorder keeps the pages it touches few (dense site
        // records, a small index, live slots in address order): a dozen
        // extents for a shell's heap.
        if !copy_extents(fd, old, base, len) {
            libc::close(fd);
            return false;
        }
        let p = libc::mmap(
            base.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        );
        if p != base.cast() {
            libc::close(fd);
            return false;
        }
        libc::close(old);
    }
    TABLES_FD.store(fd, Relaxed);
    fill_header(base, pid);
    // The child holds a copy of its parent's heap.
    if let (Some(h), Some(g)) = (header(), global()) {
        g.add(h.live.load(Relaxed));
    }
    true
}

/// Copies the data extents of the file `old` (found with `SEEK_DATA` and
/// `SEEK_HOLE`) from its mapping at `base` into `fd` at the same offsets;
/// without `SEEK_DATA`, all `len` bytes.
///
/// # Safety
/// `base` maps `len` bytes of `old`.
unsafe fn copy_extents(fd: c_int, old: c_int, base: *mut u8, len: usize) -> bool {
    let mut off: libc::off_t = 0;
    let end = len as libc::off_t;
    while off < end {
        // SAFETY: lseek on our descriptor.
        let data = unsafe { libc::lseek(old, off, libc::SEEK_DATA) };
        if data < 0 {
            // SAFETY: errno of this thread.
            if unsafe { *libc::__errno_location() } == libc::ENXIO {
                return true; // no data after `off`
            }
            // No SEEK_DATA here: copy everything.
            // SAFETY: [off, end) is inside the mapping.
            return unsafe { copy_range(fd, base, off, end) };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(old, data, libc::SEEK_HOLE) }.clamp(data, end);
        if hole <= data {
            return true;
        }
        // SAFETY: [data, hole) is inside the mapping.
        if !unsafe { copy_range(fd, base, data, hole) } {
            return false;
        }
        off = hole;
    }
    true
}

/// Writes `[from, to)` of the mapping at `base` into `fd` at the same
/// offsets.
///
/// # Safety
/// `base` maps at least `to` bytes.
unsafe fn copy_range(fd: c_int, base: *mut u8, from: libc::off_t, to: libc::off_t) -> bool {
    let mut at = from;
    while at < to {
        // SAFETY: [at, to) is inside the mapping.
        let n = unsafe { libc::pwrite(fd, base.add(at as usize).cast(), (to - at) as usize, at) };
        if n <= 0 {
            return false;
        }
        at += n as libc::off_t;
    }
    true
}

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
        // Before the tables are set up: they keep the mean for their reader.
        let mean = libc::getenv(c"CALLSTACK_MEMTRACK_SAMPLE_BYTES".as_ptr());
        if !mean.is_null() {
            let m = std::ffi::CStr::from_ptr(mean).to_bytes();
            if let Some(n) = std::str::from_utf8(m)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
            {
                RECORDER.set_sample_bytes(n);
            }
        }
        let dir = libc::getenv(c"CALLSTACK_MEMTRACK_DIR".as_ptr());
        let mut tables = false;
        if !dir.is_null() {
            let d = std::ffi::CStr::from_ptr(dir).to_bytes();
            if !d.is_empty() && d.len() < 4000 {
                let buf = &mut *DIR_PATH.0.get();
                buf[..d.len()].copy_from_slice(d);
                buf[d.len()] = 0;
                tables = setup_tables();
            }
        }
        if !tables {
            let fd = libc::open(
                out,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o644,
            );
            if fd >= 0 {
                OWNER_FD.store(fd, Relaxed);
                OWNER_PID.store(libc::getpid(), Relaxed);
            }
        }
        // Build the disassembler's tables now (this library's own
        // constructor for them may run after this one): not recorded.
        callstack::unwind::insn::warm_up();
        if !fast {
            // Compile every module's CFI now (allocates: not recorded yet).
            callstack::prepare();
        }
        publish_modules();
        libc::atexit(finish);
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_parent),
            Some(after_fork_child),
        );
    }
    ACTIVE.store(true, Release);
}

extern "C" fn finish() {
    if !ACTIVE.swap(false, AcqRel) {
        return;
    }
    RECORDER.set_enabled(false);
    // Only the data of the tables file: reading its holes would allocate
    // them (tmpfs).
    let extents = if TABLES.load(Acquire).is_null() {
        None
    } else {
        shared::data_extents(
            TABLES_FD.load(Relaxed),
            shared::RECORDER_OFFSET,
            RECORDER.storage_len(),
        )
    };
    let mut snap = match extents {
        Some(e) => RECORDER.snapshot_of_extents(&e),
        None => RECORDER.snapshot(),
    };
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
    let written = match file {
        Ok(f) => {
            use std::io::Write;
            let mut w = std::io::BufWriter::new(f);
            snap.write_to(&mut w).is_ok() && w.flush().is_ok()
        }
        Err(_) => false,
    };
    if let Some(h) = header() {
        if written {
            h.state.store(shared::STATE_WRITTEN, Release);
        }
        // The process's heap goes away with it.
        if let Some(g) = global() {
            g.live.fetch_sub(h.live.load(Relaxed), Relaxed);
        }
    }
}
