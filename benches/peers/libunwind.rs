//! nongnu libunwind's `unw_backtrace`, loaded with `dlopen` (RTLD_LOCAL, so
//! that it does not take over the process's `_Unwind_*`).
use std::sync::OnceLock;
type Bt = unsafe extern "C" fn(*mut *mut libc::c_void, libc::c_int) -> libc::c_int;
fn sym() -> Option<Bt> {
    static S: OnceLock<Option<usize>> = OnceLock::new();
    let p = *S.get_or_init(|| {
        // SAFETY: dlopen/dlsym with NUL-terminated names; RTLD_LOCAL keeps
        // libunwind's `_Unwind_*` out of the global namespace.
        unsafe {
            let h = libc::dlopen(
                c"libunwind.so.8".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            );
            if h.is_null() {
                return None;
            }
            let s = libc::dlsym(h, c"unw_backtrace".as_ptr());
            (!s.is_null()).then_some(s as usize)
        }
    });
    // SAFETY: `unw_backtrace(void**, int)`.
    p.map(|p| unsafe { std::mem::transmute::<usize, Bt>(p) })
}
pub fn available() -> bool {
    sym().is_some()
}
#[inline(never)]
pub fn capture(out: &mut [usize]) -> usize {
    match sym() {
        // SAFETY: `out` has room for `out.len()` pointers.
        Some(f) => unsafe {
            f(
                out.as_mut_ptr().cast(),
                out.len().min(i32::MAX as usize) as i32,
            ) as usize
        },
        None => 0,
    }
}
