//! Windows x64: the TEB through `gs`, and `capture_fast`'s naked entry in
//! the Win64 calling convention (arguments in `rcx`, `rdx`, `r8`, `r9`,
//! then on the stack above 32 bytes of shadow space the caller reserves).

/// The running thread's TEB: its self pointer at `gs:[0x30]`.
#[inline(always)]
pub(crate) fn teb() -> usize {
    let t: usize;
    // SAFETY: on Windows x64 `gs` holds the running thread's TEB, whose
    // `NT_TIB.Self` field is at 0x30; a load, nothing else.
    unsafe {
        core::arch::asm!(
            "mov {t}, gs:[0x30]",
            t = out(reg) t,
            options(nostack, readonly, preserves_flags)
        );
    }
    t
}

/// The registers a walk starts from, in a `CONTEXT` (winnt.h's x64
/// layout): `Rip` at 0xf8, `Rsp` at 0x98, `Rbp` at 0xa0. `(pc, sp, fp)`.
///
/// # Safety
/// `ctx` must point at a readable x64 `CONTEXT` (1232 bytes).
pub(crate) unsafe fn context_regs(ctx: *const u8) -> (u64, u64, u64) {
    // SAFETY: as promised by the caller; unaligned reads, whatever the
    // record's alignment.
    unsafe {
        (
            core::ptr::read_unaligned(ctx.add(0xf8) as *const u64),
            core::ptr::read_unaligned(ctx.add(0x98) as *const u64),
            core::ptr::read_unaligned(ctx.add(0xa0) as *const u64),
        )
    }
}

/// Defines a naked capture entry `$name` (`capture_fast`'s, `fast_entry`;
/// `capture_exact`'s, `exact_entry`) in the module that invokes it, beside
/// the `$walk` it calls with the entry's own frame record.
macro_rules! define_entry {
    ($name:ident, $walk:ident) => {
        /// A naked capture entry (of `capture_fast` or `capture_exact`, and
        /// of their C functions), in the Win64 ABI.
        ///
        /// It pushes an exact frame record whatever flags the crate was
        /// built with, so `[rbp + 8]` is always the return address into the
        /// caller, then calls the walk with its first three arguments
        /// untouched (`ecx`, `edx`, `r8`), the frame pointer as the fourth
        /// (`r9`) and the same address as the fifth, the lowest address the
        /// walk may read (on the stack above the shadow space).
        ///
        /// # Safety
        /// `out` must be valid for `max` writes of `usize` (or `max` must be 0).
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name(skip: u32, max: u32, out: *mut usize) -> u32 {
            // SAFETY: builds a standard frame record (push rbp, then rbp
            // at it), reserves 48 bytes below it (32 of shadow space, the
            // fifth argument, 8 of padding: rsp stays 16-byte aligned at
            // the call), passes rbp in r9 and at [rsp + 32], calls the walk,
            // and restores rsp and rbp before `ret`. The SEH directives
            // describe that prologue to Windows' unwinder.
            core::arch::naked_asm!(
                ".seh_proc {name}",
                "push rbp",
                ".seh_pushreg rbp",
                "sub rsp, 48",
                ".seh_stackalloc 48",
                "lea rbp, [rsp + 48]",
                ".seh_setframe rbp, 48",
                ".seh_endprologue",
                "mov r9, rbp",
                "mov [rsp + 32], rbp",
                "call {walk}",
                "mov rsp, rbp",
                "pop rbp",
                "ret",
                ".seh_endproc",
                name = sym $name,
                walk = sym $walk,
            )
        }
    };
}
pub(crate) use define_entry;
