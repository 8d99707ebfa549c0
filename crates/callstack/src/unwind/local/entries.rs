//! The entries of exact capture in this process: the naked entries (defined
//! here by the architecture's macros, beside the functions they jump to),
//! the warm path of `capture_exact`, and the requests of
//! `capture_exact_with_info` and of the exit hooks' frame lookup.

use super::cache::cache_go_live;
use super::hot::{hot_loop, hot_skip, Hot};
use super::walk::{walk_frames, walk_pcs, walk_pcs_after, warm_stack_end};
use crate::unwind::{FastEnd, Frame, StopReason, UnwindRegs};

#[cfg(callstack_native)]
crate::arch::native::exact::define_exact_entry!();
#[cfg(callstack_native)]
crate::arch::native::exact::request_entry!(
    /// The naked entry of `capture_exact_with_info` ([`info_from_entry`]).
    info_entry(*mut InfoRequest) -> usize => info_from_entry
);
#[cfg(callstack_exit_hooks)]
crate::arch::native::exact::request_entry!(
    /// The naked entry of the exit hooks' frame lookup ([`frame_from_entry`]).
    frame_entry(*mut FrameRequest) => frame_from_entry
);

/// Called by the architecture's naked `exact_entry` with the registers of
/// the caller of the capture: `pc` is the return address into it.
///
/// # Safety
/// `out` must be valid for `max` writes (or null, or `max == 0`).
#[cfg(callstack_native)]
// The functions of the first (cold) capture share the section
// `.text.callstack_unwind`, so that they sit together in the binary and the
// first capture faults in fewer pages of code (each one costs microseconds).
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) unsafe extern "C" fn exact_from_entry(
    skip: u32,
    max: u32,
    out: *mut usize,
    pc: usize,
    sp: usize,
    fp: usize,
) -> u32 {
    if out.is_null() || max == 0 {
        return 0;
    }
    cache_go_live();
    let mut hot = Hot::at(pc, sp, fp);
    // The warm path. `pc` is a return address, so never 0.
    if let Some(hi) = warm_stack_end(hot.sp) {
        let max = max as usize;
        let mut skip = skip as usize;
        let mut n = 0;
        if skip == 0 {
            // SAFETY: `max >= 1` slots at `out`.
            unsafe { *out = pc };
            n = 1;
        } else {
            skip -= 1;
        }
        let (left, mut why) = hot_skip(&mut hot, hi, skip);
        skip = left;
        if why == FastEnd::Full && n < max {
            // SAFETY: the `max - n` slots after the first `n` of `out`.
            let (k, e) = unsafe { hot_loop(&mut hot, hi, out.add(n), max - n) };
            n += k;
            why = e;
        }
        return match why {
            FastEnd::Full | FastEnd::Outermost => n as u32,
            // SAFETY: as for this function.
            FastEnd::Slow => unsafe { exact_slow_rest(hot, skip, n, out, max) },
        };
    }
    // SAFETY: the caller promises `max` writable slots at `out`.
    let out = unsafe { core::slice::from_raw_parts_mut(out, max as usize) };
    let regs = UnwindRegs {
        pc: hot.pc,
        sp: hot.sp,
        fp: hot.fp,
        lr: 0,
    };
    walk_pcs(regs, false, skip as usize, out).0 as u32
}

/// The warm path's way out when a frame is not in the rule cache: the rest
/// of the walk with the generic unwinder, from `hot` (written or skipped).
///
/// # Safety
/// `out` must be valid for `max` writes.
#[cold]
#[inline(never)]
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
unsafe fn exact_slow_rest(hot: Hot, skip: usize, n: usize, out: *mut usize, max: usize) -> u32 {
    // SAFETY: the caller promises `max` writable slots at `out`.
    let out = unsafe { core::slice::from_raw_parts_mut(out, max) };
    walk_pcs_after(hot, skip, n, out) as u32
}

/// The arguments of [`info_from_entry`], passed by pointer so that the
/// naked entry only adds the registers.
#[repr(C)]
pub(crate) struct InfoRequest {
    pub(crate) skip: usize,
    pub(crate) out: *mut Frame,
    pub(crate) max: usize,
    pub(crate) stop: StopReason,
}

/// Called by the naked `info_entry` (see [`crate::capture_exact_with_info`])
/// with the caller's registers.
///
/// # Safety
/// `req` must be valid, its `out` valid for `max` writes of `Frame`.
#[cfg(callstack_native)]
pub(crate) unsafe extern "C" fn info_from_entry(
    req: *mut InfoRequest,
    pc: usize,
    sp: usize,
    fp: usize,
) -> usize {
    // SAFETY: the caller promises a valid request.
    let req = unsafe { &mut *req };
    // SAFETY: the caller promises `max` writable frames at `out`.
    let out = unsafe { core::slice::from_raw_parts_mut(req.out, req.max) };
    let regs = UnwindRegs {
        pc: pc as u64,
        sp: sp as u64,
        fp: fp as u64,
        lr: 0,
    };
    let (n, s) = walk_frames(regs, false, req.skip, out);
    req.stop = s;
    n
}

/// The arguments and result of [`frame_from_entry`].
#[cfg(callstack_exit_hooks)]
#[repr(C)]
pub(crate) struct FrameRequest {
    /// Which frame: 0 is the caller of the entry, 1 its caller...
    pub(crate) up: usize,
    /// The stack pointer of the caller of the entry.
    pub(crate) here_sp: u64,
    /// The frame found (`pc` a return address), if `found`.
    pub(crate) frame: Frame,
    /// Where the return address `frame.pc` is saved, in the frame below it
    /// (the hooked one): 0 when it is not in memory (in a register) or the
    /// rule of that frame does not say.
    pub(crate) slot: u64,
    pub(crate) found: bool,
}

/// Called by the naked `frame_entry` with the caller's registers: finds the
/// frame `req.up` callers up, with its stack pointer (what an exit hook
/// needs to find a return address slot). Warm, through the rule cache's
/// hot loop; else through the generic walk.
///
/// # Safety
/// `req` must be valid.
#[cfg(callstack_exit_hooks)]
pub(crate) unsafe extern "C" fn frame_from_entry(
    req: *mut FrameRequest,
    pc: usize,
    sp: usize,
    fp: usize,
) {
    // SAFETY: the caller promises a valid request.
    let req = unsafe { &mut *req };
    req.here_sp = sp as u64;
    req.found = false;
    req.slot = 0;
    cache_go_live();
    if crate::arch::native::exit_hook::SLOT_FROM_RULE {
        frame_and_slot(req, pc, sp, fp);
        return;
    }
    let mut hot = Hot::at(pc, sp, fp);
    if let Some(hi) = warm_stack_end(hot.sp) {
        if hot_skip(&mut hot, hi, req.up).0 == 0 {
            req.frame = Frame {
                pc: hot.pc,
                sp: hot.sp,
                fp: hot.fp,
                method: crate::unwind::Method::Cfi,
            };
            req.slot = hot.sp.wrapping_sub(8);
            req.found = true;
            return;
        }
    }
    let regs = UnwindRegs {
        pc: pc as u64,
        sp: sp as u64,
        fp: fp as u64,
        lr: 0,
    };
    let mut one = [req.frame];
    if walk_frames(regs, false, req.up, &mut one).0 == 1 {
        req.frame = one[0];
        // Where `call` pushed it (a signal frame's "return" is refused by
        // the caller).
        req.slot = one[0].sp.wrapping_sub(8);
        req.found = true;
    }
}

/// [`frame_from_entry`] where a return address may be saved anywhere in
/// its frame, or stay in a register (AArch64): the frame `req.up` and the
/// one below it (the hooked frame, `req.up >= 1`) by the generic walk, and
/// the slot the hooked frame's CFI rule reads the return address from,
/// which must give the caller's stack pointer as its CFA. A frame found
/// any other way (frame records, instruction analysis, a signal frame)
/// gets no slot.
#[cfg(callstack_exit_hooks)]
#[cold]
#[inline(never)]
fn frame_and_slot(req: &mut FrameRequest, pc: usize, sp: usize, fp: usize) {
    use crate::arch::Arch;
    use crate::unwind::{Found, Method, RuleSource};
    let regs = UnwindRegs {
        pc: pc as u64,
        sp: sp as u64,
        fp: fp as u64,
        lr: 0,
    };
    let Some(below) = req.up.checked_sub(1) else {
        return;
    };
    #[cfg(test)]
    let cold = tests::FORCE_COLD.load(core::sync::atomic::Ordering::Relaxed);
    #[cfg(not(test))]
    let cold = false;
    if !cold && frame_and_slot_warm(req, pc, sp, fp, below) {
        #[cfg(test)]
        tests::WARM_HITS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        return;
    }
    let mut two = [req.frame; 2];
    let n = walk_frames(regs, false, below, &mut two).0;
    let [hooked, frame] = two;
    let returns = matches!(
        hooked.method,
        Method::Cfi | Method::FramePointer | Method::Insn
    );
    let source = super::source::LocalSource::new((0, 0));
    let rule = match source.rule(hooked.pc.wrapping_sub(1)) {
        Found::Rule(rule) if returns => Some(rule),
        _ => None,
    };
    if n == 1 {
        // The hooked frame, but not its caller: when its CFI has a rule
        // the compiled forms do not take (AArch64: `x30` kept in another
        // register, which the walk does not track), the frame is there but
        // cannot be hooked (`found`, no slot); else there is no such frame.
        if rule == Some(super::A::EVALUATE) {
            req.frame = hooked;
            req.found = true;
        }
        return;
    }
    if n != 2 {
        return;
    }
    req.frame = frame;
    req.found = true;
    let Some(rule) = rule else {
        return;
    };
    if frame.method != Method::Cfi {
        return;
    }
    let at = UnwindRegs {
        pc: hooked.pc,
        sp: hooked.sp,
        fp: hooked.fp,
        lr: 0,
    };
    if let Some((cfa, slot)) = super::A::saved_ra(rule, &at) {
        if cfa == frame.sp && slot >= hooked.sp && slot < cfa && slot % 8 == 0 {
            req.slot = slot;
        }
    }
}

/// [`frame_and_slot`]'s warm path: the rule cache's hot loop up to the
/// hooked frame (`below` frames up), then its cached rule, which says
/// where the return address is saved and gives the caller's frame. False
/// when any of it is not at hand (a frame without a cached rule, the
/// thread's first captures): the generic walk then does it all.
#[cfg(callstack_exit_hooks)]
#[inline(always)]
fn frame_and_slot_warm(
    req: &mut FrameRequest,
    pc: usize,
    sp: usize,
    fp: usize,
    below: usize,
) -> bool {
    use crate::arch::{Applied, Arch};
    use crate::unwind::{Method, RuleSource};
    let mut hot = Hot::at(pc, sp, fp);
    let Some(hi) = warm_stack_end(hot.sp) else {
        return false;
    };
    if hot_skip(&mut hot, hi, below).0 != 0 {
        return false;
    }
    // `hot.pc` is a return address into the hooked function.
    let p = super::cache::cache_get(hot.pc.wrapping_sub(1));
    if p == 0 {
        return false;
    }
    let rule = super::cache::unpack_cached(p);
    let at = UnwindRegs {
        pc: hot.pc,
        sp: hot.sp,
        fp: hot.fp,
        lr: 0,
    };
    let Some((cfa, slot)) = super::A::saved_ra(rule, &at) else {
        return false;
    };
    if cfa <= hot.sp || cfa >= hi || slot < hot.sp || slot >= cfa || slot % 8 != 0 {
        return false;
    }
    let Some(mut mem) = crate::stack::StackMemory::for_sp(hot.sp) else {
        return false;
    };
    let Ok(Applied::Caller {
        regs: r,
        signal: false,
    }) = super::A::apply(rule, &at, &mut mem)
    else {
        return false;
    };
    let source = super::source::LocalSource::new((0, 0));
    let ret = source.return_address(r.pc, r.sp);
    if ret < 4096 || !source.is_code(ret) {
        return false;
    }
    req.frame = Frame {
        pc: ret,
        sp: r.sp,
        fp: r.fp,
        method: Method::Cfi,
    };
    req.slot = slot;
    req.found = true;
    true
}

#[cfg(all(
    test,
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod tests {
    use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
    use object::{Object, ObjectSection};
    #[cfg(target_arch = "aarch64")]
    use std::sync::atomic::Ordering;
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    /// Makes the exit hooks' frame lookup skip its warm path.
    pub(super) static FORCE_COLD: AtomicBool = AtomicBool::new(false);
    /// How many lookups the warm path answered.
    pub(super) static WARM_HITS: AtomicUsize = AtomicUsize::new(0);

    /// The frame `up` callers above `probe`'s caller's caller, and where
    /// its return address is saved, by the warm path (when it answers)
    /// and by the generic walk.
    #[cfg(target_arch = "aarch64")]
    #[inline(never)]
    fn probe(up: usize, cold: bool) -> (u64, u64, u64, bool) {
        let blank = crate::unwind::Frame {
            pc: 0,
            sp: 0,
            fp: 0,
            method: crate::unwind::Method::Cfi,
        };
        let mut req = super::FrameRequest {
            up,
            here_sp: 0,
            frame: blank,
            slot: 0,
            found: false,
        };
        FORCE_COLD.store(cold, Ordering::Relaxed);
        // SAFETY: a valid request.
        unsafe { super::frame_entry(&mut req) };
        FORCE_COLD.store(false, Ordering::Relaxed);
        std::hint::black_box((req.frame.pc, req.frame.sp, req.slot, req.found))
    }

    #[cfg(target_arch = "aarch64")]
    #[inline(never)]
    fn nest(n: usize, out: &mut Vec<[(u64, u64, u64, bool); 2]>) {
        if n > 0 {
            nest(n - 1, out);
            std::hint::black_box(());
            return;
        }
        // Warm the rule cache over this chain.
        let mut pcs = [0usize; 64];
        crate::capture_exact(0, &mut pcs);
        crate::capture_exact(0, &mut pcs);
        // Frame 0 is `probe`, frame 1 this function; frame `up` is the one
        // the frame `up - 1` returns to. Both lookups from one call site.
        for up in 2..10 {
            let mut pair = [(0, 0, 0, false); 2];
            for (k, cold) in [false, true].into_iter().enumerate() {
                pair[k] = probe(up, cold);
            }
            out.push(pair);
        }
    }

    /// AArch64's exit-hook frame lookup answers from the rule cache when
    /// warm, and then exactly as the generic walk does: the same frame, the
    /// same slot of its return address (which holds that address).
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn the_warm_frame_lookup_agrees_with_the_generic_walk() {
        let before = WARM_HITS.load(Ordering::Relaxed);
        let mut got = Vec::new();
        nest(10, &mut got);
        for (i, [warm, cold]) in got.iter().enumerate() {
            let up = i + 2;
            assert_eq!(warm, cold, "up {up}");
            assert!(cold.3 && cold.2 != 0, "up {up}: {cold:x?}");
            // SAFETY: a slot in the frame of `nest`'s innermost call or of
            // one of its callers, all still live, in the stack.
            let saved = unsafe { (cold.2 as *const u64).read() };
            // The slot holds the return address the walk gave.
            assert_eq!(saved, cold.0, "up {up}");
        }
        assert!(WARM_HITS.load(Ordering::Relaxed) - before >= 6);
    }

    /// The file address of `f` in this test binary.
    fn file_address(f: usize) -> u64 {
        // SAFETY: `dladdr` only reads its first argument as an address and
        // fills the zeroed struct.
        let base = unsafe {
            let mut info: libc::Dl_info = core::mem::zeroed();
            assert_ne!(libc::dladdr(f as *const libc::c_void, &mut info), 0);
            info.dli_fbase as usize
        };
        (f - base) as u64
    }

    /// The naked entries (which the compiler gives no CFI of their own)
    /// carry hand-written CFI: a signal that stops a thread inside one is
    /// unwound by CFI, by us, libgcc, gdb and perf alike, not by
    /// instruction analysis of the function it jumps to.
    #[test]
    fn every_naked_entry_has_cfi() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let obj = object::File::parse(&*exe).unwrap();
        let sec = obj.section_by_name(".eh_frame").unwrap();
        let data = sec.data().unwrap();
        let eh = EhFrame::new(data, LittleEndian);
        let bases = BaseAddresses::default().set_eh_frame(sec.address());
        let mut covered = Vec::new();
        let mut entries = eh.entries(&bases);
        while let Some(e) = entries.next().unwrap() {
            if let CieOrFde::Fde(p) = e {
                let fde = p.parse(EhFrame::cie_from_offset).unwrap();
                covered.push((fde.initial_address(), fde.end_address()));
            }
        }
        let entries = [
            ("exact_entry", super::exact_entry as *const () as usize),
            ("info_entry", super::info_entry as *const () as usize),
            (
                "fast_entry",
                crate::__capture_fast_raw as *const () as usize,
            ),
            (
                "call_on_stack",
                crate::arch::native::switch::call_on_stack as *const () as usize,
            ),
            #[cfg(callstack_exit_hooks)]
            ("frame_entry", super::frame_entry as *const () as usize),
            #[cfg(target_arch = "x86_64")]
            (
                "regs_entry",
                crate::arch::x86_64::regs_entry as *const () as usize,
            ),
            #[cfg(callstack_risc_insn)]
            (
                "regs_entry",
                crate::arch::native::exact::regs_entry as *const () as usize,
            ),
        ];
        for (name, f) in entries {
            let a = file_address(f);
            assert!(
                covered.iter().any(|&(lo, hi)| lo <= a && a < hi),
                "{name} at {a:#x} has no FDE"
            );
        }
    }
}
