//! Running a function on another stack (the crash handler's report stack).

/// Calls `f(arg)` with the stack pointer set to `stack_top`, then returns
/// on the original stack.
///
/// # Safety
/// `stack_top` must be the 16-byte-aligned top of writable memory large
/// enough for `f`, used by no one else during the call.
#[cfg(target_arch = "riscv64")]
#[unsafe(naked)]
pub unsafe extern "C" fn call_on_stack(
    arg: *mut core::ffi::c_void,
    f: unsafe extern "C" fn(*mut core::ffi::c_void),
    stack_top: usize,
) {
    // SAFETY: saves a frame record (s0, ra) on the old stack, keeps the old
    // CFA in s0, switches sp, calls f, restores sp and the record.
    core::arch::naked_asm!(
        ".cfi_startproc",
        "addi sp, sp, -16",
        ".cfi_def_cfa_offset 16",
        "sd ra, 8(sp)",
        "sd s0, 0(sp)",
        ".cfi_offset ra, -8",
        ".cfi_offset s0, -16",
        "addi s0, sp, 16",
        ".cfi_def_cfa s0, 0",
        "mv sp, a2",
        "jalr a1",
        "addi sp, s0, -16",
        ".cfi_def_cfa sp, 16",
        "ld ra, 8(sp)",
        "ld s0, 0(sp)",
        ".cfi_restore ra",
        ".cfi_restore s0",
        "addi sp, sp, 16",
        ".cfi_def_cfa_offset 0",
        "ret",
        ".cfi_endproc",
    )
}
