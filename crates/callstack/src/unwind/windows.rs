//! `capture_exact` on Windows x64: the one loop ([`Unwinder`]) over the
//! rules of the loaded images' `.pdata`/`.xdata` ([`super::pdata`],
//! compiled into the CFI path's x86-64 rules), from the naked entry of
//! `sys/windows/x86_64.rs`.
//!
//! A return address seen before takes its rule from a process-wide cache
//! (`RULES`: one word per address, the key and the architecture's packed
//! rule, lock-free). Otherwise the frame finds its module on the loader's
//! list (`sys/windows/loader.rs`, lock-free), the function in the image's
//! exception directory (a binary search), replays its unwind codes, and
//! caches the rule. No allocation, no lock, no system call, no
//! `RtlVirtualUnwind`. Stack reads stay inside the thread's stack as its
//! TEB gives it.
//!
//! Unloading: after [`prepare`], every unload of a module (the loader's DLL
//! notification) clears the cache and the code ranges of
//! `unwind/code.rs`. Without it, a rule cached for an address of a module
//! that was unloaded, its range then reused by another module, is still
//! taken: wrong frames at worst, never a fault (every stack read is
//! bounded, and the cache holds rules, not pointers). Not yet: the hot
//! loop of `arch/x86_64/exact.rs` (the generic loop takes every frame).

use core::sync::atomic::{AtomicU64, Ordering};

use crate::arch::x86_64::{UnwindRuleX86_64, X86_64};
use crate::arch::Arch;
use crate::stack::StackMemory;
use crate::types::{Memory, UnwindRegs};
use crate::unwind::pdata::{epilogue, frame_at, Image};
use crate::unwind::{Found, RuleSource, Unwinder};

crate::sys::windows::x86_64::define_entry!(exact_entry, exact_from_entry);

/// A loaded image, read in place.
struct Mapped {
    base: usize,
    size: usize,
}

impl Image for Mapped {
    fn bytes(&self, rva: u32, len: u32) -> Option<&[u8]> {
        let (rva, len) = (rva as usize, len as usize);
        if rva.checked_add(len)? > self.size {
            return None;
        }
        // SAFETY: `[base, base + size)` is an image on the loader's list,
        // mapped while listed (see `sys/windows/loader.rs`), and the range
        // lies inside it.
        Some(unsafe { core::slice::from_raw_parts((self.base + rva) as *const u8, len) })
    }
}

/// Slots of [`RULES`] (a power of two).
const SLOTS: usize = 8192;
/// The bits of a cache word that hold the key (a lookup address plus one).
const KEY_MASK: u64 = (1 << 48) - 1;

/// Rules found so far: `key | packed rule << 48`, one word per slot (a
/// reader never sees half of one), the slot a hash of the key; a new rule
/// replaces whatever its slot held. Rules that do not pack
/// ([`Arch::pack`] gives 0: frames of megabytes) are not kept.
static RULES: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

#[inline(always)]
fn slot(key: u64) -> &'static AtomicU64 {
    &RULES[((key ^ (key >> 13) ^ (key >> 26)) as usize) & (SLOTS - 1)]
}

/// Forgets every cached rule and code range: a module was unloaded.
fn forget_all() {
    for w in &RULES {
        w.store(0, Ordering::Relaxed);
    }
    crate::unwind::code::forget_all();
}

/// Makes the captures follow modules' unloading from now on: each unload
/// clears the rule cache and the code ranges (see the module docs). Once
/// per process; takes the loader's lock, so not for an exception handler.
pub(crate) fn prepare() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        crate::sys::windows::loader::on_unload(forget_all);
    });
}

/// The rules of the loaded images' unwind data.
struct Images;

impl RuleSource<X86_64> for Images {
    #[inline]
    fn rule(&self, addr: u64) -> Found<UnwindRuleX86_64> {
        let key = addr.wrapping_add(1);
        let w = slot(key).load(Ordering::Relaxed);
        if w & KEY_MASK == key && w >> 48 != 0 {
            return Found::Rule(X86_64::unpack((w >> 48) as u16));
        }
        let found = look_up(addr);
        if let Found::Rule(r) = found {
            let p = X86_64::pack(r);
            if p != 0 && X86_64::unpack(p) == r && key <= KEY_MASK {
                slot(key).store(key | u64::from(p) << 48, Ordering::Relaxed);
            }
        }
        found
    }

    /// An interrupted pc may stand in an epilogue, which the unwind data
    /// does not describe: its code says (not cached: the cache's rules are
    /// the unwind data's).
    fn rule_exact(&self, pc: u64) -> Found<UnwindRuleX86_64> {
        if let Some((base, size)) = crate::sys::windows::loader::module_of(pc as usize) {
            let rva = pc as usize - base;
            let img = Mapped { base, size };
            let len = (size - rva).min(16) as u32;
            if let Some(f) = img.bytes(rva as u32, len).and_then(epilogue) {
                return Found::Rule(X86_64::compile_row(&f.row(), false));
            }
        }
        self.rule(pc)
    }

    fn is_code(&self, ra: u64) -> bool {
        crate::unwind::code::code_range(ra as usize).is_some()
    }
}

/// The rule of `addr` from its image's unwind data.
#[cold]
#[inline(never)]
fn look_up(addr: u64) -> Found<UnwindRuleX86_64> {
    let addr = addr as usize;
    let Some((base, size)) = crate::sys::windows::loader::module_of(addr) else {
        return Found::Unknown;
    };
    let img = Mapped { base, size };
    match u32::try_from(addr - base)
        .ok()
        .and_then(|rva| frame_at(&img, rva))
    {
        Some(f) => Found::Rule(X86_64::compile_row(&f.row(), false)),
        None => Found::Rule(X86_64::NO_CFI),
    }
}

/// `capture_from_context` on Windows: the walk from the registers of a
/// `CONTEXT` (an exception's), its pc exact, into `out`. Reads only the
/// running thread's stack, from the context's stack pointer up; a context
/// whose stack pointer is not on it gives the pc alone.
///
/// # Safety
/// `ctx` must point at a readable x64 `CONTEXT`.
pub(crate) unsafe fn walk_context(ctx: *const u8, out: &mut [usize]) -> usize {
    if out.is_empty() {
        return 0;
    }
    // SAFETY: as promised by the caller.
    let (pc, sp, fp) = unsafe { crate::sys::windows::x86_64::context_regs(ctx) };
    let hi = crate::stack::stack_end(sp as usize);
    if hi == 0 {
        out[0] = pc as usize;
        return 1;
    }
    let mut mem = StackMemory::with_bounds(sp as usize, hi);
    let start = UnwindRegs { pc, sp, fp, lr: 0 };
    Unwinder::new(&Images, start, true)
        .run_pcs(&mut mem, 0, out)
        .0
}

/// [`walk_context`] for a `CONTEXT` of another thread of this process,
/// whose stack is `[lo, hi)` (its TEB's `StackLimit` and `StackBase`): the
/// crash handler's thread walks the crashed thread's stack this way. Reads
/// only inside `[max(sp, lo), hi)`: after a stack overflow the stack
/// pointer may stand below the committed stack.
///
/// # Safety
/// `ctx` must point at a readable x64 `CONTEXT`, and `[lo, hi)` must be
/// readable memory (a thread's committed stack) for the whole walk.
pub(crate) unsafe fn walk_context_on(
    ctx: *const u8,
    lo: usize,
    hi: usize,
    out: &mut [usize],
) -> usize {
    if out.is_empty() {
        return 0;
    }
    // SAFETY: as promised by the caller.
    let (pc, sp, fp) = unsafe { crate::sys::windows::x86_64::context_regs(ctx) };
    if sp as usize >= hi || lo >= hi {
        out[0] = pc as usize;
        return 1;
    }
    let mut mem = StackMemory::with_bounds((sp as usize).max(lo), hi);
    let start = UnwindRegs { pc, sp, fp, lr: 0 };
    Unwinder::new(&Images, start, true)
        .run_pcs(&mut mem, 0, out)
        .0
}

/// Called by the naked `exact_entry` with its own frame record (`fp`,
/// whose return address is inside the caller of the capture) and the
/// lowest address the walk may read (`sp`).
///
/// # Safety
/// `out` must be valid for `max` writes (or null, or `max == 0`).
unsafe extern "C" fn exact_from_entry(
    skip: u32,
    max: u32,
    out: *mut usize,
    fp: usize,
    sp: usize,
) -> u32 {
    if out.is_null() || max == 0 {
        return 0;
    }
    let hi = crate::stack::stack_end(sp);
    if hi == 0 {
        return 0;
    }
    // SAFETY: the caller promises `out` holds `max` writable slots.
    let out = unsafe { core::slice::from_raw_parts_mut(out, max as usize) };
    let mut mem = StackMemory::with_bounds(sp, hi);
    let (Ok(next), Ok(ra)) = (mem.read_u64(fp as u64), mem.read_u64(fp as u64 + 8)) else {
        return 0;
    };
    let start = UnwindRegs {
        pc: ra,
        sp: fp as u64 + 16,
        fp: next,
        lr: 0,
    };
    Unwinder::new(&Images, start, false)
        .run_pcs(&mut mem, skip as usize, out)
        .0 as u32
}
