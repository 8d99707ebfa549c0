//! What the dynamic loader says about the loaded objects, lock-free:
//! glibc's `_dl_find_object`, the main executable's image from its program
//! headers, an object's executable segments and CFI sections.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::unwind::cfi::{self, CfiSections};

/// glibc's `struct dl_find_object` (2.35+).
#[repr(C)]
struct DlFindObject {
    flags: u64,
    map_start: *mut libc::c_void,
    map_end: *mut libc::c_void,
    link_map: *mut libc::c_void,
    eh_frame: *mut libc::c_void,
    reserved: [u64; 7],
}

type DlFindObjectFn = unsafe extern "C" fn(*mut libc::c_void, *mut DlFindObject) -> libc::c_int;

/// Defines `__callstack_dl_find_object_ptr`: a weak reference to
/// `_dl_find_object`, resolved by the dynamic loader when glibc has it
/// (2.35+), null otherwise, without a hard version dependency and without
/// calling `dlsym` (which takes locks) from a capture. `$progbits` is the
/// section type as the target's assembler spells it (`%progbits`, which
/// every ELF assembler takes; `@` starts a comment on AArch64).
macro_rules! dl_find_object_ptr {
    ($progbits:literal) => {
        core::arch::global_asm!(
            ".weak _dl_find_object",
            concat!(
                ".pushsection .data.rel.ro.callstack_dlfo,\"aw\",",
                $progbits
            ),
            ".p2align 3",
            ".globl __callstack_dl_find_object_ptr",
            ".hidden __callstack_dl_find_object_ptr",
            "__callstack_dl_find_object_ptr:",
            ".quad _dl_find_object",
            ".popsection",
        );
    };
}
#[cfg(all(target_os = "linux", target_env = "gnu", callstack_native))]
dl_find_object_ptr!("%progbits");

#[cfg(all(target_os = "linux", target_env = "gnu", callstack_native))]
unsafe extern "C" {
    static __callstack_dl_find_object_ptr: Option<DlFindObjectFn>;
}

fn dl_find_object_fn() -> Option<DlFindObjectFn> {
    #[cfg(all(target_os = "linux", target_env = "gnu", callstack_native))]
    {
        // SAFETY: a pointer-sized word written once by the dynamic loader's
        // relocation before any Rust code runs.
        unsafe { core::ptr::read_volatile(&raw const __callstack_dl_find_object_ptr) }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu", callstack_native)))]
    {
        None
    }
}

/// Whether glibc's lock-free `_dl_find_object` is available (glibc 2.35+):
/// then the first capture needs no [`prepare`](crate::prepare).
pub fn has_dl_find_object() -> bool {
    dl_find_object_fn().is_some()
}

/// A loaded object as `_dl_find_object` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DlModule {
    /// Start of the object's first mapping.
    pub(crate) start: u64,
    /// End of the object's last mapping.
    pub(crate) end: u64,
    /// Its `.eh_frame_hdr`, or 0.
    pub(crate) eh_frame_hdr: u64,
}

/// The loaded object holding `pc`, by glibc's lock-free, async-signal-safe
/// `_dl_find_object`; `None` when no object holds it or glibc lacks it.
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) fn dl_find(pc: u64) -> Option<DlModule> {
    let f = dl_find_object_fn()?;
    let mut r = DlFindObject {
        flags: 0,
        map_start: core::ptr::null_mut(),
        map_end: core::ptr::null_mut(),
        link_map: core::ptr::null_mut(),
        eh_frame: core::ptr::null_mut(),
        reserved: [0; 7],
    };
    // SAFETY: `_dl_find_object` fills `r` and is async-signal-safe.
    // A module without `.eh_frame_hdr` is still a known module: its frames
    // are unwound with the frame-pointer rule.
    if unsafe { f(pc as *mut libc::c_void, &mut r) } != 0 {
        return None;
    }
    let m = DlModule {
        start: r.map_start as u64,
        end: r.map_end as u64,
        eh_frame_hdr: r.eh_frame as u64,
    };
    if m.eh_frame_hdr == 0 {
        // A static program's `_dl_find_object` gives its text alone and no
        // `.eh_frame_hdr`: take the executable's image from its own program
        // headers when the pc lies in it.
        if let Some(exe) = main_executable().filter(|e| e.start <= pc && pc < e.end) {
            return Some(exe);
        }
    }
    Some(m)
}

/// The main executable's image as its program headers describe it (found
/// through the auxiliary vector): from its first to its last `PT_LOAD`,
/// with its `PT_GNU_EH_FRAME`. Computed once; async-signal-safe (the
/// auxiliary vector and the headers are plain memory).
fn main_executable() -> Option<DlModule> {
    use core::sync::atomic::AtomicU8;
    // 0: not yet computed, 1: computed, 2: none.
    static STATE: AtomicU8 = AtomicU8::new(0);
    static IMAGE: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
    match STATE.load(Ordering::Acquire) {
        1 => {
            return Some(DlModule {
                start: IMAGE[0].load(Ordering::Relaxed),
                end: IMAGE[1].load(Ordering::Relaxed),
                eh_frame_hdr: IMAGE[2].load(Ordering::Relaxed),
            })
        }
        2 => return None,
        _ => {}
    }
    let found = exe_from_auxv();
    if let Some(m) = found {
        IMAGE[0].store(m.start, Ordering::Relaxed);
        IMAGE[1].store(m.end, Ordering::Relaxed);
        IMAGE[2].store(m.eh_frame_hdr, Ordering::Relaxed);
    }
    STATE.store(if found.is_some() { 1 } else { 2 }, Ordering::Release);
    found
}

fn exe_from_auxv() -> Option<DlModule> {
    const PT_LOAD: u32 = 1;
    const PT_PHDR: u32 = 6;
    const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
    // SAFETY: getauxval reads the process's auxiliary vector: no lock, no
    // allocation.
    let (phdr, phnum) = unsafe {
        (
            libc::getauxval(libc::AT_PHDR),
            libc::getauxval(libc::AT_PHNUM),
        )
    };
    if phdr == 0 || phnum == 0 || phnum > 256 {
        return None;
    }
    // SAFETY: AT_PHDR points at the executable's program headers, mapped
    // for the life of the process; `phnum` entries of 56 bytes.
    let ph = unsafe { core::slice::from_raw_parts(phdr as *const u8, phnum as usize * 56) };
    let u32_at = |o: usize| u32::from_le_bytes(ph[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(ph[o..o + 8].try_into().unwrap());
    let entries = || (0..phnum as usize).map(|i| i * 56);
    // The load bias: from PT_PHDR, else (a static program without it) the
    // headers' place in the PT_LOAD at file offset 0.
    let bias = match entries().find(|&o| u32_at(o) == PT_PHDR) {
        Some(o) => phdr.wrapping_sub(u64_at(o + 0x10)),
        None => {
            let o = entries().find(|&o| u32_at(o) == PT_LOAD && u64_at(o + 8) == 0)?;
            phdr.wrapping_sub(u64_at(o + 0x10) + 64)
        }
    };
    let loads = entries().filter(|&o| u32_at(o) == PT_LOAD);
    let start = loads.clone().map(|o| u64_at(o + 0x10)).min()? & !0xfff;
    let end = loads.map(|o| u64_at(o + 0x10) + u64_at(o + 0x28)).max()?;
    let eh = entries()
        .find(|&o| u32_at(o) == PT_GNU_EH_FRAME)
        .map_or(0, |o| bias.wrapping_add(u64_at(o + 0x10)));
    Some(DlModule {
        start: bias.wrapping_add(start),
        end: bias.wrapping_add(end),
        eh_frame_hdr: eh,
    })
}

/// The executable `PT_LOAD` segment `[start, end)` of the loaded object
/// holding `addr`, at runtime addresses, when `addr` lies in one: found
/// lock-free by `_dl_find_object` and the object's program headers, read in
/// its first page (nothing cached: the answer is for the object loaded now).
/// Async-signal-safe; no snapshot needed, so code loaded after `prepare()`
/// (or without it) is found too.
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(super) fn dl_exec_segment(addr: u64) -> Option<(u64, u64)> {
    exec_segment_in(dl_find(addr)?, addr).flatten()
}

/// The executable segment of module `d` holding `addr`, from the program
/// headers in the module's first page: `Some(None)` when `addr` is in none,
/// `None` when the headers are not there to read.
#[cfg_attr(target_os = "linux", link_section = ".text.callstack_unwind")]
pub(crate) fn exec_segment_in(d: DlModule, addr: u64) -> Option<Option<(u64, u64)>> {
    if d.start >= d.end {
        return Some(None);
    }
    // SAFETY: the first page of a loaded object (its first PT_LOAD, from
    // file offset 0) is mapped and readable while it is loaded, and no
    // further than the object's end is read.
    let header = unsafe {
        core::slice::from_raw_parts(d.start as *const u8, (d.end - d.start).min(4096) as usize)
    };
    let (lo, hi) = crate::unwind::code::elf_exec_segment(header, d.start as usize, addr as usize)?;
    let (lo, hi) = (lo as u64, hi as u64);
    Some((lo <= addr && addr < hi && d.start <= lo && hi <= d.end).then_some((lo, hi)))
}

/// The CFI sections of a loaded module, at runtime addresses, from its
/// `.eh_frame_hdr`. The slices run to the end of the module's mapping;
/// gimli reads only what the headers and FDEs say.
pub(crate) fn sections_from_hdr(hdr: u64, end: u64) -> Option<CfiSections<'static>> {
    if hdr == 0 || hdr >= end {
        return None;
    }
    // SAFETY: `.eh_frame_hdr` of a loaded module is mapped read-only for the
    // life of the module, and so is `.eh_frame`; both lie below the end of
    // its mapping. Only the bytes the CFI describes are read.
    let hdr_bytes = unsafe { core::slice::from_raw_parts(hdr as *const u8, (end - hdr) as usize) };
    let eh_frame = match cfi::hdr_eh_frame_ptr(hdr_bytes, hdr) {
        Some(p) => p,
        None => {
            let bases = gimli::BaseAddresses::default().set_eh_frame_hdr(hdr);
            let parsed = gimli::EhFrameHdr::new(hdr_bytes, gimli::LittleEndian)
                .parse(&bases, 8)
                .ok()?;
            match parsed.eh_frame_ptr() {
                gimli::Pointer::Direct(p) => p,
                gimli::Pointer::Indirect(_) => return None,
            }
        }
    };
    if eh_frame >= end {
        return None;
    }
    // SAFETY: as above.
    let eh_bytes =
        unsafe { core::slice::from_raw_parts(eh_frame as *const u8, (end - eh_frame) as usize) };
    Some(CfiSections {
        eh_frame_hdr: Some((hdr_bytes, hdr)),
        eh_frame: Some((eh_bytes, eh_frame)),
        debug_frame: None,
        text: 0,
        got: 0,
    })
}
