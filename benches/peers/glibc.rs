//! glibc's `backtrace()` (execinfo.h): libgcc's DWARF unwinder behind a lock,
//! loaded through `dlopen` on first use.

extern "C" {
    fn backtrace(buffer: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int;
}

/// `backtrace(out, len)`.
#[inline(never)]
pub fn backtrace_glibc(out: &mut [usize]) -> usize {
    let len = out.len().min(libc::c_int::MAX as usize) as libc::c_int;
    // SAFETY: `out` has `len` slots of pointer size.
    unsafe { backtrace(out.as_mut_ptr().cast(), len) as usize }
}
