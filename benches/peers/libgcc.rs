//! libgcc's `_Unwind_Backtrace`: the DWARF CFI unwinder C++ exceptions use.
use core::ffi::c_void;

#[repr(C)]
struct Sink {
    out: *mut usize,
    len: usize,
    n: usize,
}

#[link(name = "gcc_s")]
extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(ctx: *mut c_void, arg: *mut c_void) -> libc::c_int,
        arg: *mut c_void,
    ) -> libc::c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

const URC_NO_REASON: libc::c_int = 0;
const URC_END_OF_STACK: libc::c_int = 5;

extern "C" fn on_frame(ctx: *mut c_void, arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Sink` passed below, alive for the whole walk;
    // `ctx` is libgcc's context for this frame.
    unsafe {
        let sink = &mut *(arg as *mut Sink);
        if sink.n >= sink.len {
            return URC_END_OF_STACK;
        }
        *sink.out.add(sink.n) = _Unwind_GetIP(ctx);
        sink.n += 1;
    }
    URC_NO_REASON
}

/// `_Unwind_Backtrace` with a callback storing `_Unwind_GetIP`.
#[inline(never)]
pub fn unwind_backtrace(out: &mut [usize]) -> usize {
    let mut sink = Sink {
        out: out.as_mut_ptr(),
        len: out.len(),
        n: 0,
    };
    // SAFETY: the callback only writes inside `out` through `sink`.
    unsafe { _Unwind_Backtrace(on_frame, (&mut sink as *mut Sink).cast()) };
    sink.n
}
