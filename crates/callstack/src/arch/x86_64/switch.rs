//! Running a function on another stack (the crash handler's report stack).

/// Calls `f(arg)` with the stack pointer set to `stack_top`, then returns
/// on the original stack.
///
/// # Safety
/// `stack_top` must be the 16-byte-aligned top of writable memory large
/// enough for `f`, used by no one else during the call.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn call_on_stack(
    arg: *mut core::ffi::c_void,
    f: unsafe extern "C" fn(*mut core::ffi::c_void),
    stack_top: usize,
) {
    // SAFETY: saves rbp and the old rsp in rbp (a standard frame record, so
    // an unwinder can cross back to the original stack), switches rsp,
    // calls f (rsp is 16-aligned at the call), restores both.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "push rbp",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset rbp, -16",
        "mov rbp, rsp",
        ".cfi_def_cfa_register rbp",
        "mov rsp, rdx",
        "call rsi",
        "mov rsp, rbp",
        "pop rbp",
        ".cfi_def_cfa rsp, 8",
        ".cfi_same_value rbp",
        "ret",
        ".cfi_endproc",
    )
}
