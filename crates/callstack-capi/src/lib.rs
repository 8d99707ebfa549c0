//! The C API of callstack: `libcallstack.a`, `libcallstack.so` and
//! `include/callstack.h`.
//!
//! Every function here is a thin shim over the Rust crate. The capture
//! entries are naked jumps into the Rust capture, so the frame they record
//! first is inside the C function that called them, exactly as in Rust.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

/// `uint32_t callstack_capture_fast(uint32_t skip, uint32_t max, uintptr_t* out);`
///
/// Walks the frame-pointer chain. `out[0]` is inside the caller; `skip`
/// drops that many more. Returns the number of entries written (at most
/// `max`). A null `out` or `max == 0` returns 0. Async-signal-safe.
///
/// # Safety
/// `out` must be valid for `max` writes of `uintptr_t`, or null.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_capture_fast(skip: u32, max: u32, out: *mut usize) -> u32 {
    // SAFETY: a tail jump with the same arguments: the Rust entry sees the C
    // caller's return address as its own.
    core::arch::naked_asm!(".cfi_startproc", "jmp {raw}", ".cfi_endproc", raw = sym callstack::__capture_fast_raw)
}

/// See the x86-64 version.
///
/// # Safety
/// `out` must be valid for `max` writes of `uintptr_t`, or null.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_capture_fast(skip: u32, max: u32, out: *mut usize) -> u32 {
    // SAFETY: a tail branch with the same arguments, as on x86-64.
    core::arch::naked_asm!(".cfi_startproc", "b {raw}", ".cfi_endproc", raw = sym callstack::__capture_fast_raw)
}

/// Other targets: no capture, returns 0.
///
/// # Safety
/// Always safe; kept `unsafe` for the same signature everywhere.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_capture_fast(_skip: u32, _max: u32, _out: *mut usize) -> u32 {
    0
}

/// `uint32_t callstack_capture_exact(uint32_t skip, uint32_t max, uintptr_t* out);`
///
/// Unwinds from DWARF CFI (right without frame pointers). `out[0]` is inside
/// the caller; `skip` drops that many more. Returns the number of entries
/// written (at most `max`). A null `out` or `max == 0` returns 0.
/// Async-signal-safe.
///
/// # Safety
/// `out` must be valid for `max` writes of `uintptr_t`, or null.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_capture_exact(skip: u32, max: u32, out: *mut usize) -> u32 {
    // SAFETY: a tail jump with the same arguments: the Rust entry sees the C
    // caller's return address and registers as its own caller's.
    core::arch::naked_asm!(".cfi_startproc", "jmp {raw}", ".cfi_endproc", raw = sym callstack::__capture_exact_raw)
}

/// See the x86-64 version.
///
/// # Safety
/// `out` must be valid for `max` writes of `uintptr_t`, or null.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_capture_exact(skip: u32, max: u32, out: *mut usize) -> u32 {
    // SAFETY: a tail branch with the same arguments, as on x86-64.
    core::arch::naked_asm!(".cfi_startproc", "b {raw}", ".cfi_endproc", raw = sym callstack::__capture_exact_raw)
}

/// Other targets: no capture, returns 0.
///
/// # Safety
/// Always safe; kept `unsafe` for the same signature everywhere.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_capture_exact(_skip: u32, _max: u32, _out: *mut usize) -> u32 {
    0
}

/// `uint32_t callstack_capture_from_context(const void* ucontext, uint32_t max, uintptr_t* out);`
///
/// Unwinds the code a signal interrupted, from the handler's third argument
/// (a `ucontext_t*`). `out[0]` is the interrupted pc. A null `ucontext` or
/// `out`, or `max == 0`, returns 0. Async-signal-safe.
///
/// # Safety
/// `ucontext` must point at a `ucontext_t` (or be null); `out` must be valid
/// for `max` writes, or null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_capture_from_context(
    ucontext: *const core::ffi::c_void,
    max: u32,
    out: *mut usize,
) -> u32 {
    if ucontext.is_null() || out.is_null() || max == 0 {
        return 0;
    }
    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    {
        // SAFETY: the caller promises a `ucontext_t` and `max` slots.
        let (uc, out) = unsafe {
            (
                &*(ucontext as *const libc::ucontext_t),
                core::slice::from_raw_parts_mut(out, max as usize),
            )
        };
        callstack::capture_from_context(uc, out) as u32
    }
    // Windows x64: `ucontext` is a `CONTEXT*` (an exception's).
    #[cfg(all(windows, target_arch = "x86_64"))]
    {
        // SAFETY: the caller promises a `CONTEXT` and `max` slots.
        unsafe {
            let out = core::slice::from_raw_parts_mut(out, max as usize);
            callstack::capture_from_context(ucontext, out) as u32
        }
    }
    #[cfg(not(any(
        all(
            target_os = "linux",
            any(target_arch = "x86_64", target_arch = "aarch64")
        ),
        all(windows, target_arch = "x86_64")
    )))]
    {
        0
    }
}

/// `void callstack_prepare(void);`
///
/// Compiles the unwind tables of every loaded object now (see
/// `callstack::prepare`). Optional with glibc 2.35+; call it again after
/// `dlclose`. Not async-signal-safe. On Windows x64 it makes the captures
/// follow modules' unloading (see `callstack::prepare` there).
#[unsafe(no_mangle)]
pub extern "C" fn callstack_prepare() {
    #[cfg(any(not(windows), target_arch = "x86_64"))]
    callstack::prepare();
}

/// `uint64_t callstack_hash(const uintptr_t* frames, uint32_t count);`
///
/// The 64-bit stack hash of `count` addresses (see `callstack::hash_frames`).
/// A null `frames` hashes as an empty list.
///
/// # Safety
/// `frames` must be valid for `count` reads, or null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_hash(frames: *const usize, count: u32) -> u64 {
    if frames.is_null() {
        return callstack::hash_frames(&[]);
    }
    // SAFETY: the caller promises `count` readable entries.
    let s = unsafe { core::slice::from_raw_parts(frames, count as usize) };
    callstack::hash_frames(s)
}

/// `void callstack_prepare_thread(void);`
///
/// Looks up the calling thread's stack bounds now, so that even its first
/// capture makes no system call. Optional. Not async-signal-safe (see
/// `callstack::prepare_thread`).
#[unsafe(no_mangle)]
pub extern "C" fn callstack_prepare_thread() {
    callstack::prepare_thread();
}

/// `int callstack_install_crash_handler(const char* report_path_or_null);`
///
/// Installs the crash handlers (see `callstack::crash`): on SIGSEGV,
/// SIGBUS, SIGILL, SIGFPE, SIGABRT or SIGTRAP, a raw report (signal, thread,
/// frames as module+offset+build-id) is written to stderr and, if
/// `report_path_or_null` is not null, appended to that file; then a helper
/// process prints the symbolized report (and writes a minidump first when
/// `CALLSTACK_CRASH_MINIDUMP_DIR` names a directory); then the process dies
/// as it would have. The helper and its timeout can be set with the
/// environment variables `CALLSTACK_CRASH_HELPER` (`none` to skip
/// symbolizing) and `CALLSTACK_CRASH_TIMEOUT_MS`. Returns 0 on success, -1
/// on failure (with `errno` set).
///
/// On Windows: an unhandled-exception filter (access violation, illegal
/// instruction, division by zero, stack overflow, ...) and `abort()`'s
/// SIGABRT; the report is written by a handler thread and the minidump is
/// in the native Windows layout (see `callstack::crash`).
///
/// If `CALLSTACK_CRASH_SYMBOLIZE=1` is in the environment, this process is
/// the symbolizing helper: the call reads a raw report on standard input,
/// prints it symbolized and exits.
///
/// # Safety
/// `report_path_or_null` must be null or a NUL-terminated string.
#[cfg(any(target_os = "linux", windows))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_install_crash_handler(
    report_path_or_null: *const core::ffi::c_char,
) -> core::ffi::c_int {
    // SAFETY: forwarded from our caller; a null directory is allowed.
    unsafe {
        callstack_install_crash_handler_with_minidumps(report_path_or_null, core::ptr::null())
    }
}

/// A C string argument as a path (`None` for null).
///
/// # Safety
/// `p` is null or a NUL-terminated string.
#[cfg(any(target_os = "linux", windows))]
unsafe fn opt_path(p: *const core::ffi::c_char) -> Option<std::path::PathBuf> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller promises a NUL-terminated string.
    let bytes = unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes();
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
    }
    // Windows: the path as UTF-8 (what the C API's other strings are).
    #[cfg(windows)]
    Some(std::path::PathBuf::from(
        String::from_utf8_lossy(bytes).into_owned(),
    ))
}

/// `int callstack_install_crash_handler_with_minidumps(const char* report_path_or_null, const char* minidump_dir_or_null);`
///
/// [`callstack_install_crash_handler`], and on a crash a minidump of the
/// whole process (every thread, the modules with their build-ids, the
/// exception) written into `minidump_dir_or_null` (created if missing) as
/// `<exe>-<pid>-<unix-seconds>.dmp` by the helper process, before the
/// symbolized report, which names the file on a `minidump: PATH` line. A
/// null directory falls back to `CALLSTACK_CRASH_MINIDUMP_DIR`, else no
/// dump. Returns 0 on success, -1 on failure (with `errno` set).
///
/// # Safety
/// Each argument must be null or a NUL-terminated string.
#[cfg(any(target_os = "linux", windows))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_install_crash_handler_with_minidumps(
    report_path_or_null: *const core::ffi::c_char,
    minidump_dir_or_null: *const core::ffi::c_char,
) -> core::ffi::c_int {
    // SAFETY: the caller promises null or NUL-terminated strings.
    let (report_path, minidump_dir) = unsafe {
        (
            opt_path(report_path_or_null),
            opt_path(minidump_dir_or_null),
        )
    };
    let r = std::panic::catch_unwind(|| {
        callstack::crash::install(callstack::crash::Options {
            report_path,
            minidump_dir,
            ..Default::default()
        })
    });
    match r {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            // SAFETY: setting this thread's errno.
            #[cfg(target_os = "linux")]
            unsafe {
                *libc::__errno_location() = e.raw_os_error().unwrap_or(libc::EINVAL)
            };
            #[cfg(windows)]
            let _ = e;
            -1
        }
        Err(_) => -1,
    }
}

/// `int callstack_crash_thread_init(void);`
///
/// Gives the calling thread an alternate signal stack so that its stack
/// overflow is reported too. Call it at the start of every thread you
/// create (the thread that called `callstack_install_crash_handler` needs
/// nothing more). Idempotent. Returns 0 on success, -1 on failure.
#[cfg(target_os = "linux")]
#[unsafe(no_mangle)]
pub extern "C" fn callstack_crash_thread_init() -> core::ffi::c_int {
    match callstack::crash::install_thread() {
        Ok(()) => 0,
        Err(_) => -1,
    }
}

/// `CALLSTACK_SYMBOLIZE_EXACT`: the address is an exact pc (a fault's pc,
/// `out[0]` of `callstack_capture_from_context`), not a return address.
pub const CALLSTACK_SYMBOLIZE_EXACT: u32 = 1;
/// Invalid arguments (a null buffer with a nonzero length, null frames).
pub const CALLSTACK_EINVAL: i32 = -1;
/// No loaded module contains the address.
pub const CALLSTACK_ENOMODULE: i32 = -2;
/// Writing to the file descriptor failed (`errno` is set).
pub const CALLSTACK_EIO: i32 = -3;

#[cfg(feature = "symbolize")]
/// Runs `f` on the process's symbolizer (the library's, shared with
/// `called_from`; see `callstack::symbolize::with_process_symbolizer`),
/// catching panics (none cross the C boundary).
fn with_symbolizer<R>(
    probe: usize,
    f: impl FnOnce(&mut callstack::symbolize::Symbolizer) -> R,
) -> Option<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        callstack::symbolize::with_process_symbolizer(probe, f)
    }))
    .ok()
}

#[cfg(feature = "symbolize")]
/// The text of one address: its levels, innermost (inlined) first, one per
/// line, as `function at file:line` (`(inlined) ` before inlined levels;
/// `?? (module+0xoffset)` when nothing names it). `None` when no module
/// contains it.
fn describe(addr: usize, flags: u32) -> Option<Option<String>> {
    use callstack::symbolize::Address;
    let a = if flags & CALLSTACK_SYMBOLIZE_EXACT != 0 {
        Address::Exact(addr)
    } else {
        Address::Return(addr)
    };
    with_symbolizer(addr, |s| {
        let r = s.symbolize(a);
        r.module.as_ref()?;
        Some(r.to_string())
    })
}

#[cfg(feature = "symbolize")]
/// `int callstack_symbolize(uintptr_t addr, uint32_t flags, char* buf, size_t len);`
///
/// Writes into `buf` (NUL-terminated, truncated to `len - 1` bytes) the
/// levels of `addr`, innermost inlined first, one per line: `function at
/// file:line`, `(inlined) ` before an inlined level, `?? (module+0xoff)`
/// when nothing names it. `addr` is a return address (looked up at
/// `addr - 1`) unless `flags` has `CALLSTACK_SYMBOLIZE_EXACT`. Returns the
/// length of the whole text (excluding the NUL; `>= len` means it was
/// truncated, as `snprintf`), `CALLSTACK_ENOMODULE` (-2) when no loaded
/// module contains `addr` (`buf` gets an empty string), or
/// `CALLSTACK_EINVAL` (-1). Thread-safe (one lock); not async-signal-safe.
///
/// # Safety
/// `buf` must be valid for `len` writes, or null with `len == 0`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_symbolize(
    addr: usize,
    flags: u32,
    buf: *mut core::ffi::c_char,
    len: usize,
) -> i32 {
    if buf.is_null() && len != 0 {
        return CALLSTACK_EINVAL;
    }
    let out: &mut [u8] = if len == 0 {
        &mut []
    } else {
        // SAFETY: the caller promises `len` writable bytes at `buf`.
        unsafe { core::slice::from_raw_parts_mut(buf as *mut u8, len) }
    };
    let text = match describe(addr, flags) {
        None => return CALLSTACK_EINVAL,
        Some(None) => {
            if let Some(b) = out.first_mut() {
                *b = 0;
            }
            return CALLSTACK_ENOMODULE;
        }
        Some(Some(t)) => t,
    };
    if !out.is_empty() {
        let n = text.len().min(out.len() - 1);
        out[..n].copy_from_slice(&text.as_bytes()[..n]);
        out[n] = 0;
    }
    i32::try_from(text.len()).unwrap_or(i32::MAX)
}

#[cfg(feature = "symbolize")]
/// `int callstack_called_from(const char* name);`
///
/// 1 when the calling thread's stack passes through a function named
/// `name` (its whole name, `ns::f(int)`, or a prefix of it up to a `::`,
/// `(` or `<`: `ns::f`, `ns`), inlined frames included; 0 when not;
/// `CALLSTACK_EINVAL` (-1) when `name` is null or not UTF-8. As
/// `callstack::called_from`: the first call from a site symbolizes its
/// frames, later ones cost an exact capture and a cache probe per frame.
/// Not async-signal-safe.
///
/// # Safety
/// `name` must be null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_called_from(name: *const core::ffi::c_char) -> i32 {
    if name.is_null() {
        return CALLSTACK_EINVAL;
    }
    // SAFETY: the caller promises a NUL-terminated string.
    match unsafe { core::ffi::CStr::from_ptr(name) }.to_str() {
        Ok(n) => i32::from(callstack::called_from(n)),
        Err(_) => CALLSTACK_EINVAL,
    }
}

#[cfg(feature = "symbolize")]
/// `int callstack_called_from_any(const char* const* names, uint32_t count);`
///
/// [`callstack_called_from`] for any of `count` names, in one walk.
///
/// # Safety
/// `names` must be null with `count == 0`, or point at `count` pointers
/// that are each null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_called_from_any(
    names: *const *const core::ffi::c_char,
    count: u32,
) -> i32 {
    if names.is_null() {
        return if count == 0 { 0 } else { CALLSTACK_EINVAL };
    }
    // SAFETY: the caller promises `count` readable pointers at `names`.
    let ptrs = unsafe { core::slice::from_raw_parts(names, count as usize) };
    let mut list: Vec<&str> = Vec::with_capacity(ptrs.len());
    for &p in ptrs {
        if p.is_null() {
            return CALLSTACK_EINVAL;
        }
        // SAFETY: each pointer is a NUL-terminated string (as promised).
        match unsafe { core::ffi::CStr::from_ptr(p) }.to_str() {
            Ok(n) => list.push(n),
            Err(_) => return CALLSTACK_EINVAL,
        }
    }
    i32::from(callstack::called_from_any(&list))
}

#[cfg(feature = "symbolize")]
/// `int callstack_print_trace(const uintptr_t* frames, uint32_t count, uint32_t flags, int fd);`
///
/// Writes the frames to `fd`, one line per level:
/// `#N  0x... in function at file:line` (inlined levels share their `#N`
/// and are marked `(inlined)`; `?? (module+0xoff)` when nothing names a
/// frame, `?? (no module)` outside every module). `frames[0]` is a return
/// address unless `flags` has `CALLSTACK_SYMBOLIZE_EXACT` (a capture from
/// a signal context); the others are return addresses. Returns 0,
/// `CALLSTACK_EINVAL` (-1) or `CALLSTACK_EIO` (-3, `errno` set).
/// Thread-safe; not async-signal-safe (allocates, takes a lock).
///
/// # Safety
/// `frames` must be valid for `count` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn callstack_print_trace(
    frames: *const usize,
    count: u32,
    flags: u32,
    fd: core::ffi::c_int,
) -> i32 {
    if frames.is_null() && count != 0 {
        return CALLSTACK_EINVAL;
    }
    let frames: &[usize] = if count == 0 {
        &[]
    } else {
        // SAFETY: the caller promises `count` readable entries.
        unsafe { core::slice::from_raw_parts(frames, count as usize) }
    };
    // The same text as `Trace::symbolize` prints.
    let exact = flags & CALLSTACK_SYMBOLIZE_EXACT != 0;
    let Ok(text) = std::panic::catch_unwind(|| {
        callstack::symbolize::SymbolizedTrace::new(frames, exact).to_string()
    }) else {
        return CALLSTACK_EINVAL;
    };
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // The count's type is the platform's (`size_t`, or the CRT's
        // `unsigned int` on Windows): no more than `i32::MAX` at a time.
        let len = rest.len().min(i32::MAX as usize);
        // SAFETY: writing initialized bytes from a live slice.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), len as _) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return CALLSTACK_EIO;
        }
        rest = &rest[n as usize..];
    }
    0
}

/// `int callstack_exit_hook_install(uint32_t depth, void (*hook)(void*), void* arg);`
///
/// Runs `hook(arg)` right after the frame `depth` levels up returns: depth 0
/// is the function calling this, 1 its caller. See
/// [`callstack::exit_hook`]: the return value passes through untouched,
/// captures stay truthful, hooks on one frame run last installed first.
/// Returns 0, or -1 when the frame cannot be hooked (no such frame, too many
/// hooks, or a target other than x86-64 Linux). Not async-signal-safe.
///
/// # Safety
/// `hook` must be safe to call with `arg` once, on this thread, after the
/// frame returns.
#[cfg(target_os = "linux")]
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn callstack_exit_hook_install(
    depth: u32,
    hook: Option<unsafe extern "C" fn(*mut core::ffi::c_void)>,
    arg: *mut core::ffi::c_void,
) -> i32 {
    let Some(hook) = hook else { return -1 };
    match callstack::exit_hook::install_c(depth, hook, arg) {
        Ok(_) => 0,
        Err(_) => -1,
    }
}

/// `uint64_t callstack_exit_hook_skipped(void);`
///
/// How many hooks never ran because their frame was left without returning
/// (`longjmp`, an exception caught further up, `pthread_exit`, the end of
/// the thread); counted once, when a frame of the same stack next installs
/// or runs a hook, or when the thread ends.
#[cfg(target_os = "linux")]
#[unsafe(no_mangle)]
pub extern "C" fn callstack_exit_hook_skipped() -> u64 {
    callstack::exit_hook::skipped()
}
