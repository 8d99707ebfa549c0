//! The system calls behind [`super::process`]: ptrace, waitpid,
//! process_vm_readv, each wrapped into a safe function returning `io::Result`.

use std::io;

fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `PTRACE_SEIZE` without options: attaches without stopping the thread.
pub fn seize(tid: i32) -> io::Result<()> {
    // SAFETY: PTRACE_SEIZE takes no pointer arguments (addr 0, data 0 options).
    check(unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, 0usize) }).map(drop)
}

/// `PTRACE_INTERRUPT`: asks a seized thread to stop.
pub fn interrupt(tid: i32) -> io::Result<()> {
    // SAFETY: no pointer arguments.
    check(unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) }).map(drop)
}

/// `PTRACE_DETACH`, delivering `sig` (0 for none) as the thread resumes.
pub fn detach(tid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: the data argument is a signal number, not a pointer.
    check(unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, sig as usize) }).map(drop)
}

/// `waitpid(tid, __WALL | WNOHANG)`, retried on EINTR: the raw status if
/// `tid` has changed state, `None` if it has not (yet).
pub fn wait_nohang(tid: i32) -> io::Result<Option<i32>> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer for the duration of the call.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok((r != 0).then_some(status));
    }
}

/// `PTRACE_GETREGSET(NT_PRSTATUS)` into `buf`; returns the bytes written.
pub fn get_regset(tid: i32, buf: &mut [u8]) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: `iov` describes `buf`, writable for its length; the kernel
    // writes at most iov_len bytes and updates iov_len.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            libc::NT_PRSTATUS as usize,
            &mut iov as *mut libc::iovec,
        )
    })?;
    Ok(iov.iov_len)
}

/// The most ranges [`read_remote_each`] takes at once (`IOV_MAX`).
pub const MAX_IOV: usize = 1024;

/// One `process_vm_readv` of each `(addr, buf)` of `reqs` (at most
/// [`MAX_IOV`]) from process `pid`; returns how many bytes were read, in
/// order: the kernel stops at the first range it cannot read.
pub fn read_remote_each(pid: i32, reqs: &mut [(u64, &mut [u8])]) -> io::Result<usize> {
    let n = reqs.len().min(MAX_IOV);
    let reqs = &mut reqs[..n];
    let local: Vec<libc::iovec> = reqs
        .iter_mut()
        .map(|(_, buf)| libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        })
        .collect();
    let remote: Vec<libc::iovec> = reqs
        .iter()
        .map(|(addr, buf)| libc::iovec {
            iov_base: *addr as usize as *mut libc::c_void,
            iov_len: buf.len(),
        })
        .collect();
    // SAFETY: each local iovec describes one buffer of `reqs`, writable
    // for its length and not otherwise borrowed during the call; the
    // remote addresses are only interpreted by the kernel in the target's
    // address space.
    let r = unsafe {
        libc::process_vm_readv(
            pid,
            local.as_ptr(),
            local.len() as libc::c_ulong,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `process_vm_readv` of `buf.len()` bytes at `addr` of process `pid`;
/// returns how many bytes were read.
pub fn read_remote(pid: i32, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, writable for its length; the remote
    // address is only interpreted by the kernel in the target's address space.
    let r = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}
