//! The table of hooked frames (see [`crate::exit_hook`], which installs and
//! runs the hooks), as the unwinders read it: a frame whose return address
//! is the trampoline returns, in truth, to the address its entry holds.
//! Lock-free; every function here is async-signal-safe.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(target_arch = "x86_64")]
pub(crate) use crate::arch::x86_64::exit_hook::{hash, PROBES, SLOTS};
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const SLOTS: usize = 1024;
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const PROBES: usize = 8;
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn hash(key: u64) -> usize {
    (((key >> 4) ^ (key >> 14) ^ (key >> 24)) as usize) & (SLOTS - 1)
}

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
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        Some(crate::arch::x86_64::exit_hook::trampoline())
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
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

/// For an exact pc `pc` with stack pointer `sp`: when `pc` lies in the
/// trampoline's first instructions (before it saved the original return
/// address on its frame), the original return address (0 if the entry is
/// gone). Async-signal-safe.
#[inline]
pub(crate) fn in_lookup(pc: u64, sp: u64) -> Option<u64> {
    if !ever().load(Ordering::Relaxed) {
        return None;
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let (lo, hi) = crate::arch::x86_64::exit_hook::lookup_window();
        if pc >= lo && pc < hi {
            return Some(resolve_slow(sp));
        }
    }
    let _ = (pc, sp);
    None
}

/// Whether a hook was ever installed (captures then check for the
/// trampoline).
#[inline(always)]
pub(crate) fn any_live() -> bool {
    ever().load(Ordering::Relaxed)
}
