//! This process's code as the instruction-analysis fallback reads it (the
//! executable segments of loaded objects only), and the fallback of walks
//! in this process ([`LocalFallback`]), which puts the rules machine-code
//! analysis settles into the rule cache.

#[cfg(any(callstack_insn, callstack_risc_insn))]
use super::cache::{cache_get, cache_put, insn_words_current};
use super::loader::{dl_exec_segment, dl_find};
use super::snapshot::{published, unloaded, Snapshot};
use super::A;
use crate::stack::StackMemory;
use crate::unwind::insn::InsnFallback;
use crate::unwind::{Fallback, Memory, Method, UnwindRegs};

/// Segment lookups of [`LocalCode`] so far, in this process (reads that did
/// not find their segment remembered by the walk).
static LOOKUPS: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// How many times the machine-code fallback of an in-process walk has
/// looked up the loaded segment of the code it reads. For tests.
pub fn lookups() -> usize {
    LOOKUPS.load(core::sync::atomic::Ordering::Relaxed)
}

/// This process's code for the instruction-analysis fallback: only the
/// executable segments of loaded objects (so nothing unmapped or unreadable
/// is ever touched): those of the published snapshot, and for an address
/// outside them (no `prepare()` yet, or a library loaded since) the
/// executable segment `_dl_find_object` and the object's program headers
/// give. Lock-free.
///
/// One walk's reader (made for each walk): the last segment it found loaded
/// is remembered for the rest of the walk, so that instruction analysis,
/// which reads code two or four bytes at a time (hundreds of reads when it
/// looks back for a function's start), looks the segment up once rather
/// than on every read. That widens a window the reader already had (an
/// object unloaded by another thread while a walk reads it, the caller's to
/// avoid: see `prepare`) from one read to the rest of the walk, as reading
/// an object's CFI through a walk already does.
#[derive(Clone, Copy)]
pub(crate) struct LocalCode {
    snap: Option<&'static Snapshot>,
    /// `[start, end)` of the executable segment last found loaded by this
    /// walk (empty at first).
    last: (u64, u64),
}

impl LocalCode {
    pub(crate) fn new() -> Self {
        LocalCode {
            snap: published(),
            last: (0, 0),
        }
    }
}

impl crate::unwind::insn::CodeMemory for LocalCode {
    fn is_return_trampoline(&mut self, addr: u64) -> bool {
        crate::unwind::hook_table::any_live()
            && crate::unwind::hook_table::trampoline() == Some(addr)
    }

    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        if self.last.0 <= addr && addr < self.last.1 {
            let n = ((self.last.1 - addr) as usize).min(buf.len());
            // SAFETY: `[addr, addr + n)` lies inside the executable segment
            // this walk found loaded (below); an unload by another thread
            // since is the caller's race to avoid (see the type's comment).
            unsafe { core::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), n) };
            return n;
        }
        LOOKUPS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        let g = self.snap.and_then(|s| {
            let i = s.segments.partition_point(|g| g.0 <= addr);
            let g = *i.checked_sub(1).and_then(|i| s.segments.get(i))?;
            (addr < g.1).then_some((s, g))
        });
        let Some((s, g)) = g else {
            let Some((start, end)) = dl_exec_segment(addr) else {
                return 0;
            };
            self.last = (start, end);
            let n = ((end - addr) as usize).min(buf.len());
            // SAFETY: `[addr, addr + n)` lies inside an executable segment
            // of an object `_dl_find_object` just found loaded (as with the
            // snapshot, an object unloaded by another thread in between is
            // the caller's race to avoid: see `prepare`).
            unsafe { core::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), n) };
            return n;
        };
        if !s.modules[g.2].still_loaded(addr, dl_find) {
            unloaded(s);
            return 0;
        }
        self.last = (g.0, g.1);
        let n = ((g.1 - addr) as usize).min(buf.len());
        // SAFETY: `[addr, addr + n)` lies inside an executable segment of a
        // module loaded when the snapshot was taken and, by
        // `_dl_find_object`, still loaded now (without it, modules are only
        // unloaded by `dlclose`, after which `prepare` must run again).
        unsafe { core::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), n) };
        n
    }
}

/// The fallback of walks in this process: instruction analysis over
/// [`LocalCode`] with the process's analysis cache, which also notes in the
/// rule cache the frames whose rule the code alone settles (x86-64, see
/// [`settle`]), so that warm walks take them without the generic step.
pub(crate) struct LocalFallback(InsnFallback<LocalCode>);

impl Fallback<A> for LocalFallback
where
    InsnFallback<LocalCode>: Fallback<A>,
{
    // Out of line: only frames without CFI come here, and its body (the
    // machine-code step, `settle`) would otherwise weigh on the inlining
    // of the walk loops that call it (under qemu-aarch64, inlined, it cost
    // the warm CFI walk 60% per frame).
    #[inline(never)]
    fn unwind_frame<M: Memory + ?Sized>(
        &mut self,
        regs: &UnwindRegs,
        pc_is_exact: bool,
        known_module: bool,
        mem: &mut M,
    ) -> Option<(UnwindRegs, Method)> {
        let r = <InsnFallback<LocalCode> as Fallback<A>>::unwind_frame(
            &mut self.0,
            regs,
            pc_is_exact,
            known_module,
            mem,
        );
        #[cfg(any(callstack_insn, callstack_risc_insn))]
        if matches!(r, Some((_, Method::Insn))) && !pc_is_exact && known_module {
            settle(regs.pc);
        }
        r
    }

    fn before_frame_pointer(&self) -> bool {
        <InsnFallback<LocalCode> as Fallback<A>>::before_frame_pointer(&self.0)
    }
}

#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(super) fn insn_fallback(mem: &StackMemory) -> LocalFallback {
    LocalFallback(
        InsnFallback::new(LocalCode::new(), mem.hi())
            .with_cache(crate::unwind::insn::cache::fallback_cache()),
    )
}

/// The packed `NoCfi` rule: what the rule cache holds for an address no
/// CFI covers until [`settle`] puts a machine-code rule there.
#[cfg(any(callstack_insn, callstack_risc_insn))]
pub(super) const PACKED_NO_CFI: u16 = 3 << 14 | 2;

/// Notes in the rule cache the rule machine-code analysis settles for the
/// frame at the return address `pc` (without CFI: its word holds the packed
/// `NoCfi`), as [`settled_word`] gives it. The word is marked as a
/// machine-code rule: the CFI reads it as `NoCfi`, the hot loop leaves it
/// to `LocalSource::fast_walk`, which checks what depends on the stack
/// (`insn_caller`). Nothing stack-dependent is stored.
///
/// Under the analysis cache's generation: when that cache is cleared
/// meanwhile (the code may have changed), the word goes back to `NoCfi`; a
/// clear after that drops it at the next use (`cache::insn_words_current`).
#[cfg(any(callstack_insn, callstack_risc_insn))]
#[cold]
#[inline(never)]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
fn settle(pc: u64) {
    // Before the cache is live (the first capture) its `NoCfi` words wait
    // on the flags page, and its own pages are not read yet.
    if !super::flags::FLAGS
        .cache_live
        .load(core::sync::atomic::Ordering::Relaxed)
    {
        return;
    }
    let addr = pc.wrapping_sub(1);
    if cache_get(addr) != PACKED_NO_CFI {
        return;
    }
    let analyses = crate::unwind::insn::cache::fallback_cache();
    let g = analyses.generation();
    if !insn_words_current(g) {
        return;
    }
    let Some(p) = settled_word(pc) else {
        return;
    };
    cache_put(addr, p);
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
    if analyses.generation() != g {
        cache_put(addr, PACKED_NO_CFI);
    }
}

/// x86-64: the analysis cache's entry for `pc` (just filled by the step
/// that called [`settle`]), when the code alone settles its rule
/// (`settled_rule`: the first epilogue candidate, which the unwind step
/// takes whenever the return address it gives follows a call into this
/// function) and the CFI rule type has its form (`from_insn`,
/// `exact::pack_insn`).
#[cfg(callstack_insn)]
#[inline]
fn settled_word(pc: u64) -> Option<u16> {
    use crate::arch::native::exact::pack_insn;
    use crate::arch::native::from_insn;
    use crate::arch::native::instruction_analysis::unwinder::settled_rule;
    let a = crate::unwind::insn::cache::fallback_cache().get_frame(pc, false)?;
    settled_rule(&a)
        .and_then(|r| from_insn(&r))
        .and_then(pack_insn)
}

/// AArch64, RISC-V 64: prologue analysis's rule for the return address
/// `pc` when it has one of the packed shapes, else a marked word that says
/// there is none, so that the next walk does not analyse the code a second
/// time to find that out (`arch::risc::settle_insn`); the warm path applies it
/// through the machine-code step's own checks (`source::insn_caller`).
#[cfg(callstack_risc_insn)]
#[inline]
fn settled_word(pc: u64) -> Option<u16> {
    Some(crate::arch::risc::settle_insn::<
        crate::arch::native::instruction_analysis::Arch,
        _,
    >(&mut LocalCode::new(), pc))
}
