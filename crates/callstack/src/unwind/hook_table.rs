//! The table of hooked frames (see [`crate::exit_hook`], which installs and
//! runs the hooks), as the unwinders read it: a frame whose return address
//! is the trampoline returns, in truth, to the address its entry holds.
//! Lock-free; every function here is async-signal-safe.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub(crate) use crate::arch::{hash, PROBES, SLOTS};

/// One table slot, read by the trampoline's assembly and CFI as two words:
/// the key (the hooked frame's CFA) and the original return address.
#[repr(C)]
pub(crate) struct Slot {
    pub(crate) key: AtomicU64,
    pub(crate) orig: AtomicU64,
}

/// A slot never used.
pub(crate) const EMPTY: u64 = 0;
/// A slot freed (probes go on past it).
pub(crate) const FREE: u64 = 1;
/// A slot being claimed.
pub(crate) const CLAIMED: u64 = 2;

/// The process-wide table of hooked frames, keyed by CFA. The trampoline
/// and its CFI expression find it by symbol.
#[allow(clippy::declare_interior_mutable_const)]
pub(crate) static TABLE: [Slot; SLOTS + PROBES] = {
    const S: Slot = Slot {
        key: AtomicU64::new(EMPTY),
        orig: AtomicU64::new(0),
    };
    [S; SLOTS + PROBES]
};

/// The address of each entry's patched return-address slot (beside
/// [`TABLE`], whose two-word layout the trampolines' assembly and CFI
/// read), for walks that know a frame record rather than its frame's CFA
/// ([`resolve_record`]). Written before the entry's key is published.
#[allow(clippy::declare_interior_mutable_const)]
pub(crate) static SLOT_ADDRS: [AtomicU64; SLOTS + PROBES] =
    [const { AtomicU64::new(0) }; SLOTS + PROBES];

/// Whether a hook was ever installed in this process: captures look for the
/// trampoline only then. Sticky (set once, never cleared), so installs and
/// returns pay no locked counter. It sits with the capture's other flags
/// (`unwind::local::FLAGS`), on a page a capture touches anyway.
#[inline(always)]
pub(crate) fn ever() -> &'static AtomicBool {
    &super::local::FLAGS.exit_hooks
}
/// The slot holding `key`, if any. Async-signal-safe (atomics only).
#[inline]
pub(crate) fn find(key: u64) -> Option<usize> {
    let h = hash(key);
    (h..h + PROBES).find(|&i| TABLE[i].key.load(Ordering::Acquire) == key)
}

/// The address hooked frames return to, on targets with exit hooks.
#[inline(always)]
pub(crate) fn trampoline() -> Option<u64> {
    #[cfg(all(callstack_exit_hooks, target_os = "linux"))]
    {
        Some(crate::arch::native::exit_hook::trampoline())
    }
    #[cfg(not(all(callstack_exit_hooks, target_os = "linux")))]
    {
        None
    }
}

/// The return address an unwinder should report for a frame whose return
/// address read from the stack is `ra`, with `cfa` the CFA of the frame it
/// was read from (the caller's stack pointer): the original address when
/// `ra` is the trampoline, `ra` otherwise (0 when the hook's entry is gone:
/// the walk ends). Async-signal-safe.
#[inline]
pub(crate) fn resolve(ra: u64, cfa: u64) -> u64 {
    if !ever().load(Ordering::Relaxed) || Some(ra) != trampoline() {
        return ra;
    }
    resolve_slow(cfa)
}

#[cold]
#[inline(never)]
fn resolve_slow(cfa: u64) -> u64 {
    match find(cfa) {
        Some(i) => TABLE[i].orig.load(Ordering::Acquire),
        None => 0,
    }
}

/// [`resolve`] for a walk of frame records, where `record_sp` is the end of
/// the frame record the return address `ra` was read from (the record's
/// address plus 16): the CFA of its frame when the record tops the frame
/// (always on x86-64), not otherwise (AArch64 code puts the record at the
/// bottom of the frame, under the locals or the other saved registers).
/// The entry is then found by the address of its patched slot, which is
/// `record_sp - 8` on every architecture (a scan of the table: the cold
/// path of a hooked frame's record, async-signal-safe).
#[inline]
pub(crate) fn resolve_record(ra: u64, record_sp: u64) -> u64 {
    if !ever().load(Ordering::Relaxed) || Some(ra) != trampoline() {
        return ra;
    }
    resolve_record_slow(record_sp)
}

#[cold]
#[inline(never)]
fn resolve_record_slow(record_sp: u64) -> u64 {
    if let Some(i) = find(record_sp) {
        return TABLE[i].orig.load(Ordering::Acquire);
    }
    let slot = record_sp.wrapping_sub(8);
    for (i, e) in TABLE.iter().enumerate() {
        let k = e.key.load(Ordering::Acquire);
        if k > CLAIMED && SLOT_ADDRS[i].load(Ordering::Relaxed) == slot {
            let orig = e.orig.load(Ordering::Acquire);
            // Still this entry (not freed and claimed again meanwhile).
            if e.key.load(Ordering::Acquire) == k {
                return orig;
            }
        }
    }
    0
}

/// For an exact pc `pc` with registers `regs`, where the trampoline's
/// frame holds nothing of the original return address at or above `sp`:
/// the original return address (0 if it cannot be had), the caller's stack
/// pointer being `sp` itself. That is before the trampoline stores the
/// original address (it is then only in the table) and at its final jump
/// (x86-64: it is then at `sp - 8`, below the stack pointer, which a walk's
/// memory may not reach: the bounds of the main thread's stack start at
/// the walk's first `sp`; AArch64: in `x30`, `regs.lr`). Everywhere else in the trampoline its CFI, which
/// reads the stack above `sp`, gives the caller. `None` when `pc` is not in
/// those windows. Async-signal-safe.
#[inline]
pub(crate) fn in_trampoline<M: crate::types::Memory + ?Sized>(
    pc: u64,
    regs: &crate::types::UnwindRegs,
    mem: &mut M,
) -> Option<u64> {
    if !ever().load(Ordering::Relaxed) {
        return None;
    }
    #[cfg(all(callstack_exit_hooks, target_os = "linux"))]
    match crate::arch::native::exit_hook::window(pc) {
        Some(crate::arch::HookWindow::Table) => return Some(resolve_slow(regs.sp)),
        Some(crate::arch::HookWindow::BelowSp) => return Some(below_sp(regs.sp, mem)),
        Some(crate::arch::HookWindow::Lr) => return Some(regs.lr),
        None => {}
    }
    let _ = (pc, regs, mem);
    None
}

/// The word at `sp - 8` of a frame stopped at the trampoline's final jump:
/// through `mem`, or when `mem`'s bounds start at `sp`, directly if it lies
/// on the page of `sp` (which `mem` can read: the page is mapped). 0 when
/// neither reaches it.
#[cold]
#[cfg_attr(not(all(callstack_exit_hooks, target_os = "linux")), allow(dead_code))]
fn below_sp<M: crate::types::Memory + ?Sized>(sp: u64, mem: &mut M) -> u64 {
    let at = sp.wrapping_sub(8);
    if let Ok(v) = mem.read_u64(at) {
        return v;
    }
    if at / 4096 == sp / 4096 && at % 8 == 0 && mem.read_u64(sp).is_ok() {
        // SAFETY: `at` is aligned and on the same page as `sp`, which `mem`
        // just read: the page is mapped and readable.
        return unsafe { core::ptr::read_volatile(at as *const u64) };
    }
    0
}

/// Whether a hook was ever installed (captures then check for the
/// trampoline).
#[inline(always)]
pub(crate) fn any_live() -> bool {
    ever().load(Ordering::Relaxed)
}
