//! Running a function on another stack (the crash handler's report stack).

/// Calls `f(arg)` with the stack pointer set to `stack_top`, then returns
/// on the original stack.
///
/// # Safety
/// `stack_top` must be the 16-byte-aligned top of writable memory large
/// enough for `f`, used by no one else during the call.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
pub unsafe extern "C" fn call_on_stack(
    arg: *mut core::ffi::c_void,
    f: unsafe extern "C" fn(*mut core::ffi::c_void),
    stack_top: usize,
) {
    // SAFETY: saves the frame record (x29, x30) on the old stack, keeps the
    // old sp in x29, switches sp, calls f, restores sp and the record.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "stp x29, x30, [sp, #-16]!",
        ".cfi_def_cfa_offset 16",
        ".cfi_offset x29, -16",
        ".cfi_offset x30, -8",
        "mov x29, sp",
        ".cfi_def_cfa x29, 16",
        "mov sp, x2",
        "blr x1",
        "mov sp, x29",
        ".cfi_def_cfa sp, 16",
        "ldp x29, x30, [sp], #16",
        ".cfi_def_cfa_offset 0",
        ".cfi_restore x29",
        ".cfi_restore x30",
        "ret",
        ".cfi_endproc",
    )
}
