//! Per-architecture helpers of the tests that craft frame chains and
//! contexts (`adversarial`, `stale_stack`): a call into a capture with a
//! chosen frame-pointer register, the registers of a `ucontext_t`, and the
//! place of a frame record relative to the frame pointer. Everything else
//! in those tests is the same on every architecture.
//!
//! Included with `#[path]` by each test that uses it.
#![allow(dead_code)]

// getcontext, makecontext and swapcontext: the libc crate declares them
// except on RISC-V 64, where glibc has them too.
#[cfg(not(target_arch = "riscv64"))]
pub use libc::{getcontext, makecontext, swapcontext};

#[cfg(target_arch = "riscv64")]
unsafe extern "C" {
    /// glibc's `getcontext`.
    pub fn getcontext(ucp: *mut libc::ucontext_t) -> libc::c_int;
    /// glibc's `makecontext`.
    pub fn makecontext(ucp: *mut libc::ucontext_t, func: extern "C" fn(), argc: libc::c_int, ...);
    /// glibc's `swapcontext`.
    pub fn swapcontext(oucp: *mut libc::ucontext_t, ucp: *const libc::ucontext_t) -> libc::c_int;
}

// glibc's riscv64 `ucontext_t` is 960 bytes, its `uc_mcontext` at 176:
// the libc crate's must hold as much (getcontext writes all of it).
#[cfg(target_arch = "riscv64")]
const _: () = assert!(
    core::mem::size_of::<libc::ucontext_t>() >= 960
        && core::mem::offset_of!(libc::ucontext_t, uc_mcontext) == 176
);

/// A capture entry: `(skip, max, out) -> frames written`.
pub type RawCapture = unsafe extern "C" fn(u32, u32, *mut usize) -> u32;

/// Bytes from a frame record (`[saved frame pointer, return address]`) up
/// to the frame-pointer value that designates it: 0 where the frame
/// pointer points at the record (x86-64 `rbp`, AArch64 `x29`), 16 where it
/// points just above it (RISC-V `s0`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub const RECORD_BELOW: usize = 0;
/// See the other architectures'.
#[cfg(target_arch = "riscv64")]
pub const RECORD_BELOW: usize = 16;

/// The frame-pointer value that designates the record at `record`.
pub fn fp_of_record(record: *const usize) -> usize {
    record as usize + RECORD_BELOW
}

// ------------------------------------------------------------ x86-64

/// Calls `capture(0, max, out)` with the frame-pointer register (`rbp`) set
/// to `fp`; the capture's first frame is the return address into this
/// function, a few bytes after its start.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn capture_with_fp(
    fp: usize,
    max: u32,
    out: *mut usize,
    capture: RawCapture,
) -> u32 {
    // SAFETY: saves rbp, loads the crafted one, calls `capture` (rcx)
    // with skip = 0 (edi), max (esi) and out (rdx) as passed, restores
    // rbp. rsp is 16-byte aligned at the call.
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rdi",
        "xor edi, edi",
        "call rcx",
        "pop rbp",
        "ret",
    )
}

/// The program counter of a context.
#[cfg(target_arch = "x86_64")]
pub fn pc(uc: &libc::ucontext_t) -> usize {
    uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize
}

/// The stack pointer of a context.
#[cfg(target_arch = "x86_64")]
pub fn sp(uc: &libc::ucontext_t) -> usize {
    uc.uc_mcontext.gregs[libc::REG_RSP as usize] as usize
}

/// Sets a context's program counter.
#[cfg(target_arch = "x86_64")]
pub fn set_pc(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.gregs[libc::REG_RIP as usize] = v as i64;
}

/// Sets a context's stack pointer.
#[cfg(target_arch = "x86_64")]
pub fn set_sp(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.gregs[libc::REG_RSP as usize] = v as i64;
}

/// Sets a context's frame pointer.
#[cfg(target_arch = "x86_64")]
pub fn set_fp(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.gregs[libc::REG_RBP as usize] = v as i64;
}

// ------------------------------------------------------------ AArch64

/// Calls `capture(0, max, out)` with the frame-pointer register (`x29`) set
/// to `fp`; the capture's first frame is the return address into this
/// function, a few bytes after its start.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
pub unsafe extern "C" fn capture_with_fp(
    fp: usize,
    max: u32,
    out: *mut usize,
    capture: RawCapture,
) -> u32 {
    // SAFETY: saves x29 and x30 in a 16-byte slot (sp stays 16-aligned),
    // loads the crafted x29, calls `capture` (x3) with skip = 0 (w0), max
    // (w1) and out (x2) as passed, restores x29 and x30.
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-16]!",
        "mov x29, x0",
        "mov w0, wzr",
        "blr x3",
        "ldp x29, x30, [sp], #16",
        "ret",
    )
}

/// The program counter of a context.
#[cfg(target_arch = "aarch64")]
pub fn pc(uc: &libc::ucontext_t) -> usize {
    uc.uc_mcontext.pc as usize
}

/// The stack pointer of a context.
#[cfg(target_arch = "aarch64")]
pub fn sp(uc: &libc::ucontext_t) -> usize {
    uc.uc_mcontext.sp as usize
}

/// Sets a context's program counter.
#[cfg(target_arch = "aarch64")]
pub fn set_pc(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.pc = v as u64;
}

/// Sets a context's stack pointer.
#[cfg(target_arch = "aarch64")]
pub fn set_sp(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.sp = v as u64;
}

/// Sets a context's frame pointer (`x29`).
#[cfg(target_arch = "aarch64")]
pub fn set_fp(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.regs[29] = v as u64;
}

/// Sets a context's link register (`x30`).
#[cfg(target_arch = "aarch64")]
pub fn set_lr(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.regs[30] = v as u64;
}

// ------------------------------------------------------------ RISC-V 64

/// Calls `capture(0, max, out)` with the frame-pointer register (`s0`) set
/// to `fp`; the capture's first frame is the return address into this
/// function, a few bytes after its start.
#[cfg(target_arch = "riscv64")]
#[unsafe(naked)]
pub unsafe extern "C" fn capture_with_fp(
    fp: usize,
    max: u32,
    out: *mut usize,
    capture: RawCapture,
) -> u32 {
    // SAFETY: saves ra and s0 in a 16-byte slot (sp stays 16-aligned),
    // loads the crafted s0, calls `capture` (a3) with skip = 0 (a0), max
    // (a1) and out (a2) as passed, restores s0 and ra.
    core::arch::naked_asm!(
        "addi sp, sp, -16",
        "sd ra, 8(sp)",
        "sd s0, 0(sp)",
        "mv s0, a0",
        "li a0, 0",
        "jalr a3",
        "ld s0, 0(sp)",
        "ld ra, 8(sp)",
        "addi sp, sp, 16",
        "ret",
    )
}

/// The program counter of a context.
#[cfg(target_arch = "riscv64")]
pub fn pc(uc: &libc::ucontext_t) -> usize {
    uc.uc_mcontext.__gregs[0] as usize
}

/// The stack pointer of a context.
#[cfg(target_arch = "riscv64")]
pub fn sp(uc: &libc::ucontext_t) -> usize {
    uc.uc_mcontext.__gregs[2] as usize
}

/// Sets a context's program counter.
#[cfg(target_arch = "riscv64")]
pub fn set_pc(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.__gregs[0] = v as u64;
}

/// Sets a context's stack pointer.
#[cfg(target_arch = "riscv64")]
pub fn set_sp(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.__gregs[2] = v as u64;
}

/// Sets a context's frame pointer (`s0`).
#[cfg(target_arch = "riscv64")]
pub fn set_fp(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.__gregs[8] = v as u64;
}

/// Sets a context's link register (`ra`).
#[cfg(target_arch = "riscv64")]
pub fn set_lr(uc: &mut libc::ucontext_t, v: usize) {
    uc.uc_mcontext.__gregs[1] = v as u64;
}
