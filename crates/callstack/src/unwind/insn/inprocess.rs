//! Machine-code unwinding of the current process.
//!
//! [`InProcess::new`] takes a snapshot of the executable mappings and of the
//! function symbols of every loaded module (this allocates and reads files:
//! do it up front, outside signal handlers). [`InProcess::capture`] then
//! walks the stack by instruction analysis alone (no CFI, no frame-pointer
//! chain needed), allocating nothing and taking no lock: safe in a signal
//! handler, as long as no module in the snapshot has been unloaded since
//! (`dlclose`); take a new snapshot after loading or unloading code.
//!
//! On x86-64 the rules found at each pc are kept in
//! [`in_process_cache`](super::cache::in_process_cache), so a warm frame is
//! a lookup and its stack loads; [`InProcess::new`] clears the caches
//! (code may have changed since the last snapshot). On AArch64 and RISC-V
//! 64 each frame's prologue is analysed again (a few dozen instructions
//! read back from its pc); their `capture_exact` keeps those rules in the
//! rule cache instead.

#[cfg(any(callstack_insn, callstack_risc_insn))]
use super::UnwindRegs;
use super::{lookup_function, CodeMemory, Method};

/// A snapshot of executable mappings and function bounds of this process.
#[derive(Debug, Clone, Default)]
pub struct InProcess {
    exec: Vec<(u64, u64)>,
    functions: Vec<(u64, u64)>,
    cold: Vec<(u64, u64, u64)>,
}

impl InProcess {
    /// Takes the snapshot: `/proc/self/maps` for the executable mappings, and
    /// the `.symtab`/`.dynsym` function symbols (with sizes) of each loaded
    /// module, read from its file. Stripped modules contribute their
    /// `.dynsym` only, or nothing. Clears this process's analysis caches
    /// ([`super::cache::invalidate`]).
    pub fn new() -> InProcess {
        let mut exec: Vec<(u64, u64)> = crate::sys::executable_mappings()
            .into_iter()
            .map(|(a, b)| (a as u64, b as u64))
            .collect();
        exec.sort_unstable();
        let mut functions = Vec::new();
        let mut cold = Vec::new();
        for m in crate::modules::loaded_modules() {
            if m.is_vdso || m.path.as_os_str().is_empty() {
                continue;
            }
            if let Ok(data) = std::fs::read(&m.path) {
                function_symbols_split(&data, m.bias as u64, &mut functions, &mut cold);
            }
        }
        functions.sort_unstable();
        functions.dedup_by_key(|f| f.0);
        cold.sort_unstable();
        super::warm_up();
        super::cache::invalidate();
        InProcess {
            exec,
            functions,
            cold,
        }
    }

    /// Captures the current call stack by instruction analysis: `out[0]` is
    /// the return address into the caller of `capture`, as for
    /// [`crate::capture_fast`]; `skip` drops that many more. Returns how many
    /// entries were written.
    ///
    /// Async-signal-safe: no allocation, no lock, no system call (except the
    /// one-time stack-bounds lookup of a thread).
    #[inline(never)]
    pub fn capture(&self, skip: usize, out: &mut [usize]) -> usize {
        let mut frames = [(0u64, Method::Context); 256];
        let n = self.capture_with_methods(&mut frames);
        // frames[0] is inside this function.
        let mut w = 0;
        for f in frames[..n].iter().skip(1 + skip) {
            if w == out.len() {
                break;
            }
            out[w] = f.0 as usize;
            w += 1;
        }
        w
    }

    /// Captures `(address, method)` per frame; `out[0]` is inside the
    /// caller of this function. Returns how many entries were written.
    #[inline(never)]
    pub fn capture_with_methods(&self, out: &mut [(u64, Method)]) -> usize {
        #[cfg(any(callstack_insn, callstack_risc_insn))]
        {
            let mut frames = [(0u64, Method::Context); 256];
            // SAFETY: `walk_entry` receives `self`, a buffer of 256 frames and
            // its length, as `regs_entry` passes them through.
            let n = unsafe {
                regs_entry(
                    (self as *const InProcess).cast(),
                    frames.as_mut_ptr().cast(),
                    frames.len(),
                    walk_entry,
                )
            };
            // frames[0] is inside this function: drop it.
            let n = n.min(frames.len());
            let mut w = 0;
            for f in frames[..n].iter().skip(1) {
                if w == out.len() {
                    break;
                }
                out[w] = *f;
                w += 1;
            }
            if let Some(first) = out.first_mut().filter(|_| w > 0) {
                first.1 = Method::Context;
            }
            w
        }
        #[cfg(not(any(callstack_insn, callstack_risc_insn)))]
        {
            let _ = out;
            0
        }
    }

    /// The code reader of this snapshot (for tools that drive the analyzers
    /// themselves).
    pub fn code(&self) -> impl CodeMemory + '_ {
        Code { snap: self }
    }
}

/// iced-x86 builds its decoder tables lazily, with allocations, on first
/// use: pay that here, outside any capture.
pub(crate) fn warm_up_decoder() {
    // 55 push rbp; e8 00000000 call; ff d0 call rax; 74 00 je; c3 ret
    let code = [0x55u8, 0xe8, 0, 0, 0, 0, 0xff, 0xd0, 0x74, 0x00, 0xc3];
    let mut c = super::SliceCode::new(0x1000, &code);
    let _ = super::x86_64::epilogue::analyze(&mut c, 0x1000, None);
    let _ = super::x86_64::unwinder::call_before(&mut c, 0x1008);
}

/// Function symbols (`STT_FUNC` with a size) of an ELF image, relocated by
/// `bias`, appended to `out` as `[start, end)`. The cold parts gcc splits
/// off a function (`f.cold`) are not listed in `out` but in `cold`, as
/// `(start, end, start of f)`: they are entered by a jump from `f`, with
/// `f`'s frame already set up.
pub fn function_symbols_split(
    data: &[u8],
    bias: u64,
    out: &mut Vec<(u64, u64)>,
    cold: &mut Vec<(u64, u64, u64)>,
) {
    use object::{Object, ObjectSymbol, SymbolKind};
    let Ok(file) = object::File::parse(data) else {
        return;
    };
    // On 32-bit ARM a symbol's bit 0 marks Thumb code, not its address.
    let mask = if file.architecture() == object::Architecture::Arm {
        !1u64
    } else {
        !0u64
    };
    let functions = || {
        file.symbols()
            .chain(file.dynamic_symbols())
            .filter(|sym| sym.kind() == SymbolKind::Text && sym.size() > 0 && sym.is_definition())
            .map(|sym| {
                let s = (sym.address() & mask).wrapping_add(bias);
                (s, s + sym.size(), sym.name().unwrap_or(""))
            })
    };
    // Cold parts by their parent's name; the names borrowed from `data`
    // (this runs for every module a recording meets: no copy, no hash).
    let mut colds: Vec<(&str, u64, u64)> = Vec::new();
    for (s, e, name) in functions() {
        match name.strip_suffix(".cold") {
            Some(parent) => colds.push((parent, s, e)),
            None => out.push((s, e)),
        }
    }
    if colds.is_empty() {
        return;
    }
    colds.sort_unstable();
    for (s, _, name) in functions() {
        let i = colds.partition_point(|c| c.0 < name);
        for &(_, cs, ce) in colds[i..].iter().take_while(|c| c.0 == name) {
            cold.push((cs, ce, s));
        }
    }
    // (A name in both `.symtab` and `.dynsym` was met twice.)
    cold.sort_unstable();
    cold.dedup();
}

/// [`function_symbols_split`] without the cold parts.
pub fn function_symbols(data: &[u8], bias: u64, out: &mut Vec<(u64, u64)>) {
    let mut cold = Vec::new();
    function_symbols_split(data, bias, out, &mut cold);
}

/// The entry of the function holding `addr`: its symbol's start, or for a
/// cold part its parent's start (searched without bounds).
pub fn function_entry_in(
    functions: &[(u64, u64)],
    cold: &[(u64, u64, u64)],
    addr: u64,
) -> Option<(u64, Option<(u64, u64)>)> {
    let i = cold.partition_point(|c| c.0 <= addr);
    if i > 0 && addr < cold[i - 1].1 {
        return Some((cold[i - 1].2, None));
    }
    lookup_function(functions, addr).map(|b| (b.0, Some(b)))
}

#[cfg(callstack_risc_insn)]
use crate::arch::native::exact::regs_entry;
/// The naked entry that hands `capture_with_methods`'s registers to
/// [`walk_entry`].
#[cfg(callstack_insn)]
use crate::arch::native::regs_entry;

/// Called by `regs_entry` with the snapshot, the frame buffer and the
/// registers of `capture_with_methods` after the entry returns.
#[cfg(any(callstack_insn, callstack_risc_insn))]
unsafe extern "C" fn walk_entry(
    snap: *const u8,
    out: *mut u8,
    len: usize,
    regs: *const u64,
) -> usize {
    // SAFETY: the pointers come from `capture_with_methods`: a live
    // `InProcess`, a buffer of `len` frames, and three words on the entry's
    // stack.
    let (snap, out, r) = unsafe {
        (
            &*(snap as *const InProcess),
            core::slice::from_raw_parts_mut(out as *mut (u64, Method), len),
            core::slice::from_raw_parts(regs, 3),
        )
    };
    let (pc, sp, fp) = (r[0], r[1], r[2]);
    // The stack reader of every in-process capture: reads stay inside this
    // thread's stacks.
    let Some(mut mem) = crate::stack::StackMemory::for_sp(sp) else {
        return 0;
    };
    let stack_end = mem.hi();
    let mut code = Code { snap };
    // `pc` is a return address (looked up at pc - 1), except below a
    // signal frame, where it is the exact interrupted pc.
    #[cfg(callstack_insn)]
    return super::walk::x86_64_from(
        UnwindRegs { pc, sp, fp, lr: 0 },
        false,
        &mut mem,
        &mut code,
        stack_end,
        Some(super::cache::in_process_cache()),
        out,
    )
    .0;
    // Prologue analysis, the frame record, scanning (no per-pc cache: the
    // analysis of a frame is a few dozen instructions read back from it).
    #[cfg(callstack_risc_insn)]
    {
        let mut n = 0;
        if out.is_empty() {
            return 0;
        }
        super::walk::risc_each_from::<crate::arch::native::instruction_analysis::Arch, _, _>(
            UnwindRegs { pc, sp, fp, lr: 0 },
            false,
            &mut mem,
            &mut code,
            stack_end,
            |f| {
                out[n] = (f.pc, f.method);
                n += 1;
                n < out.len()
            },
        );
        n
    }
}

struct Code<'a> {
    snap: &'a InProcess,
}

impl CodeMemory for Code<'_> {
    #[cfg(target_os = "linux")]
    fn is_return_trampoline(&mut self, addr: u64) -> bool {
        crate::unwind::hook_table::any_live()
            && crate::unwind::hook_table::trampoline() == Some(addr)
    }

    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        let Some((_, end)) = lookup_function(&self.snap.exec, addr) else {
            return 0;
        };
        let n = ((end - addr) as usize).min(buf.len());
        // SAFETY: `[addr, addr + n)` lies inside an executable (hence
        // readable) mapping of this process, as listed when the snapshot was
        // taken; the snapshot's contract is that no module was unloaded since.
        unsafe { core::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), n) };
        n
    }

    fn is_executable(&mut self, addr: u64) -> bool {
        lookup_function(&self.snap.exec, addr).is_some()
    }

    fn function_bounds(&mut self, addr: u64) -> Option<(u64, u64)> {
        lookup_function(&self.snap.functions, addr)
    }

    fn function_entry(&mut self, addr: u64) -> Option<(u64, Option<(u64, u64)>)> {
        function_entry_in(&self.snap.functions, &self.snap.cold, addr)
    }
}
