//! The `backtrace` crate (what `std::backtrace` is built on), without its lock.

/// `backtrace::trace_unsynchronized`, storing each frame's ip.
#[inline(never)]
pub fn trace_unsynchronized(out: &mut [usize]) -> usize {
    let mut n = 0;
    // SAFETY: no other thread unwinds concurrently in this benchmark.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            if n >= out.len() {
                return false;
            }
            out[n] = frame.ip() as usize;
            n += 1;
            true
        })
    };
    n
}
