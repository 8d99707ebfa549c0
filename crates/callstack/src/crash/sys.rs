//! The system calls of the crash handler, each a thin async-signal-safe
//! wrapper with its `unsafe` kept here. Nothing here allocates or locks.

use core::cell::UnsafeCell;

/// Static storage shared without a lock. Whoever calls [`SyncCell::get`]
/// promises the access discipline written at its use (the crash lock, or
/// the single writer of a snapshot).
pub(crate) struct SyncCell<T>(UnsafeCell<T>);

// SAFETY: every access goes through `get` at a site that documents why no
// two threads access the same value at once.
unsafe impl<T> Sync for SyncCell<T> {}

impl<T> SyncCell<T> {
    pub(crate) const fn new(v: T) -> Self {
        SyncCell(UnsafeCell::new(v))
    }
    pub(crate) fn get(&self) -> *mut T {
        self.0.get()
    }
}

pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(v: i32) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = v }
}

/// Writes all of `bytes` to `fd`, retrying on `EINTR` and short writes.
pub(crate) fn write_all(fd: i32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid readable slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return;
        }
        if n == 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// `open(path, flags, 0o644)`; `path` must end with a NUL byte.
pub(crate) fn open(path: &[u8], flags: i32) -> i32 {
    if path.last() != Some(&0) {
        return -1;
    }
    // SAFETY: `path` is NUL-terminated.
    unsafe { libc::open(path.as_ptr().cast(), flags | libc::O_CLOEXEC, 0o644) }
}

pub(crate) fn close(fd: i32) {
    // SAFETY: closing a descriptor we opened.
    unsafe { libc::close(fd) };
}

pub(crate) fn gettid() -> i32 {
    // SAFETY: a system call without arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

pub(crate) fn getpid() -> i32 {
    // SAFETY: a system call without arguments.
    unsafe { libc::getpid() }
}

/// The calling thread's name (`prctl(PR_GET_NAME)`), up to 15 bytes.
pub(crate) fn thread_name(buf: &mut [u8; 16]) -> &[u8] {
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included.
    let r = unsafe {
        libc::prctl(
            libc::PR_GET_NAME,
            buf.as_mut_ptr() as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if r != 0 {
        return &[];
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(15);
    &buf[..n]
}

/// `CLOCK_MONOTONIC` in nanoseconds (a vDSO call: async-signal-safe).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(crate) fn sleep_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as _,
        tv_nsec: (ns % 1_000_000_000) as _,
    };
    // SAFETY: valid timespec; a null remainder.
    unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
}

/// Whether the process is dumpable (`PR_GET_DUMPABLE`), `None` on error.
pub(crate) fn dumpable() -> Option<bool> {
    // SAFETY: a plain system call with integer arguments.
    let r = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    (r >= 0).then_some(r != 0)
}

/// `PR_SET_DUMPABLE` (errors ignored).
pub(crate) fn set_dumpable(on: bool) {
    // SAFETY: a plain system call with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, on as libc::c_ulong, 0, 0, 0) };
}
