//! Per-thread alternate signal stacks, so that a stack overflow (a fault on
//! the guard page, with no stack left to run a handler on) is reported too.
//!
//! A signal stack belongs to a thread: `sigaltstack` must be called on each
//! thread that should survive an overflow. [`install_thread`] maps one
//! (`mmap`, with a `PROT_NONE` guard page below it) unless the thread
//! already has one of at least [`MIN_SIZE`] bytes, and frees it when the
//! thread exits (a thread-local destructor disables it first).

use core::cell::Cell;
use std::io;

/// A thread's existing alternate stack smaller than this is replaced
/// (Rust's standard library installs one of a few pages on every thread it
/// starts, too small for a full report).
pub const MIN_SIZE: usize = 32 * 1024;

/// Size of the alternate stacks we map (plus one guard page).
pub const SIZE: usize = 64 * 1024;

struct Owned {
    base: Cell<usize>, // start of the mapping (guard page), 0 if none
    len: Cell<usize>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        let base = self.base.get();
        if base == 0 {
            return;
        }
        let stack = base + page_size();
        // SAFETY: querying and (if it is ours) disabling this thread's
        // signal stack, then unmapping the memory we mapped for it.
        unsafe {
            let mut cur: libc::stack_t = core::mem::zeroed();
            if libc::sigaltstack(core::ptr::null(), &mut cur) == 0 && cur.ss_sp as usize == stack {
                let off = libc::stack_t {
                    ss_sp: core::ptr::null_mut(),
                    ss_flags: libc::SS_DISABLE,
                    ss_size: 0,
                };
                libc::sigaltstack(&off, core::ptr::null_mut());
            }
            libc::munmap(base as *mut libc::c_void, self.len.get());
        }
        self.base.set(0);
    }
}

thread_local! {
    static OWNED: Owned = const { Owned { base: Cell::new(0), len: Cell::new(0) } };
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Makes sure the calling thread has an alternate signal stack of at least
/// [`MIN_SIZE`] bytes. Idempotent; not for signal handlers (it may `mmap`).
pub fn install_thread() -> io::Result<()> {
    // SAFETY: querying the current signal stack into a zeroed stack_t.
    let mut cur: libc::stack_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sigaltstack(core::ptr::null(), &mut cur) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if cur.ss_flags & libc::SS_DISABLE == 0 && cur.ss_size >= MIN_SIZE {
        return Ok(());
    }
    if cur.ss_flags & libc::SS_ONSTACK != 0 {
        // Running on the current alternate stack: cannot change it now.
        return Ok(());
    }
    let page = page_size();
    let len = SIZE + page;
    // SAFETY: a fresh private anonymous mapping; no existing memory touched.
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the lowest page of our own mapping becomes the guard page.
    unsafe { libc::mprotect(base, page, libc::PROT_NONE) };
    let stack = libc::stack_t {
        ss_sp: (base as usize + page) as *mut libc::c_void,
        ss_flags: 0,
        ss_size: SIZE,
    };
    // SAFETY: `stack` describes memory we own for the thread's lifetime
    // (freed by the thread-local destructor after disabling it).
    if unsafe { libc::sigaltstack(&stack, core::ptr::null_mut()) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: unmapping the mapping made above, which nothing uses.
        unsafe { libc::munmap(base, len) };
        return Err(e);
    }
    let registered = OWNED.try_with(|o| {
        let old = o.base.replace(base as usize);
        let old_len = o.len.replace(len);
        if old != 0 {
            // SAFETY: a previous stack of ours on this thread, no longer
            // installed (replaced just above).
            unsafe { libc::munmap(old as *mut libc::c_void, old_len) };
        }
    });
    if registered.is_err() {
        // Thread is exiting: leave the stack installed, never freed.
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn installs_a_big_enough_stack_on_a_new_thread() {
        std::thread::spawn(|| {
            super::install_thread().unwrap();
            // SAFETY: querying into a zeroed stack_t.
            let mut cur: libc::stack_t = unsafe { core::mem::zeroed() };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::sigaltstack(core::ptr::null(), &mut cur) }, 0);
            assert_eq!(cur.ss_flags & libc::SS_DISABLE, 0);
            assert!(cur.ss_size >= super::MIN_SIZE);
            super::install_thread().unwrap(); // idempotent
        })
        .join()
        .unwrap();
    }
}
