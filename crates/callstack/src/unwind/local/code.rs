//! This process's code as the instruction-analysis fallback reads it: the
//! executable segments of loaded objects only.

use super::loader::{dl_exec_segment, dl_find};
use super::snapshot::{published, unloaded, Snapshot};
use crate::stack::StackMemory;

/// This process's code for the instruction-analysis fallback: only the
/// executable segments of loaded objects (so nothing unmapped or unreadable
/// is ever touched): those of the published snapshot, and for an address
/// outside them (no `prepare()` yet, or a library loaded since) the
/// executable segment `_dl_find_object` and the object's program headers
/// give. Lock-free.
#[derive(Clone, Copy)]
pub(crate) struct LocalCode {
    snap: Option<&'static Snapshot>,
}

impl LocalCode {
    pub(crate) fn new() -> Self {
        LocalCode { snap: published() }
    }
}

impl crate::unwind::insn::CodeMemory for LocalCode {
    fn is_return_trampoline(&mut self, addr: u64) -> bool {
        crate::unwind::hook_table::any_live()
            && crate::unwind::hook_table::trampoline() == Some(addr)
    }

    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        let g = self.snap.and_then(|s| {
            let i = s.segments.partition_point(|g| g.0 <= addr);
            let g = *i.checked_sub(1).and_then(|i| s.segments.get(i))?;
            (addr < g.1).then_some((s, g))
        });
        let Some((s, g)) = g else {
            let Some((_, end)) = dl_exec_segment(addr) else {
                return 0;
            };
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
        let n = ((g.1 - addr) as usize).min(buf.len());
        // SAFETY: `[addr, addr + n)` lies inside an executable segment of a
        // module loaded when the snapshot was taken and, by
        // `_dl_find_object`, still loaded now (without it, modules are only
        // unloaded by `dlclose`, after which `prepare` must run again).
        unsafe { core::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), n) };
        n
    }
}

#[inline]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(super) fn insn_fallback(mem: &StackMemory) -> crate::unwind::insn::InsnFallback<LocalCode> {
    crate::unwind::insn::InsnFallback::new(LocalCode::new(), mem.hi())
        .with_cache(crate::unwind::insn::cache::fallback_cache())
}
