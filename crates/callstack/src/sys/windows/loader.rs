//! The modules loaded in this process, from the loader's own list: the
//! PEB's `Ldr->InLoadOrderModuleList` (the main executable first, then
//! `ntdll.dll`, `kernel32.dll`, ...), each module's PE headers read where
//! they are mapped.
//!
//! [`exec_range`] is the capture's "is this a return address?" lookup: it
//! walks the list without the loader's lock (a capture may run in an
//! exception handler that interrupted the loader itself), allocates
//! nothing and makes no system call. The list is only ever read: a module
//! loaded concurrently is seen or not, and a walk gives up after
//! [`MAX_MODULES`] entries, so a list caught mid-update cannot make it
//! loop. The one window, as on Linux between `_dl_find_object` and the
//! program headers: a module unloaded by another thread between the read
//! of its entry and the read of its headers.
//!
//! x64 layouts (winternl.h and the loader's documented prefix):
//!
//! ```text
//!   PEB + 0x18                 Ldr (PEB_LDR_DATA*)
//!   PEB_LDR_DATA + 0x10        InLoadOrderModuleList (LIST_ENTRY head)
//!   LDR_DATA_TABLE_ENTRY + 0x00  InLoadOrderLinks (Flink first)
//!   LDR_DATA_TABLE_ENTRY + 0x30  DllBase
//!   LDR_DATA_TABLE_ENTRY + 0x40  SizeOfImage (u32)
//!   LDR_DATA_TABLE_ENTRY + 0x48  FullDllName (UNICODE_STRING: u16 length
//!                                in bytes, u16 capacity, then the buffer
//!                                pointer at + 8)
//! ```

use std::path::PathBuf;

pub(crate) const PEB_LDR: usize = 0x18;
pub(crate) const LDR_IN_LOAD_ORDER: usize = 0x10;
pub(crate) const ENTRY_DLL_BASE: usize = 0x30;
pub(crate) const ENTRY_SIZE_OF_IMAGE: usize = 0x40;
pub(crate) const ENTRY_FULL_NAME: usize = 0x48;
/// Entries a walk reads at most: far more than any process loads.
pub const MAX_MODULES: usize = 4096;
/// `IMAGE_SCN_MEM_EXECUTE`.
const SCN_EXECUTE: u32 = 0x2000_0000;

/// Reads a word of the loader's data.
///
/// # Safety
/// `addr` must be readable for 8 bytes.
#[inline]
unsafe fn word(addr: usize) -> usize {
    // SAFETY: as promised by the caller.
    unsafe { core::ptr::read_volatile(addr as *const usize) }
}

/// Calls `f(base, size, entry)` for each module of the loader's list, in
/// load order, while it returns `true`. Nothing on a target whose layout
/// this module does not know (32-bit).
fn for_each(mut f: impl FnMut(usize, usize, usize) -> bool) {
    if cfg!(not(target_pointer_width = "64")) {
        return;
    }
    let peb = super::teb::peb();
    if peb == 0 {
        return;
    }
    // SAFETY: the PEB and the loader data it points at live as long as the
    // process; the entries are the loader's, mapped while listed (see the
    // module docs for a module unloaded meanwhile).
    unsafe {
        let ldr = word(peb + PEB_LDR);
        if ldr == 0 {
            return;
        }
        let head = ldr + LDR_IN_LOAD_ORDER;
        let mut e = word(head);
        for _ in 0..MAX_MODULES {
            if e == head || e == 0 {
                return;
            }
            let base = word(e + ENTRY_DLL_BASE);
            let size = core::ptr::read_volatile((e + ENTRY_SIZE_OF_IMAGE) as *const u32) as usize;
            if base != 0 && size != 0 && !f(base, size, e) {
                return;
            }
            e = word(e);
        }
    }
}

/// One section header of a mapped image: its address relative to the
/// image (`VirtualAddress`), its size in memory, its characteristics.
#[derive(Clone, Copy, Debug)]
struct Section {
    rva: usize,
    size: usize,
    flags: u32,
}

/// Where the headers of the image mapped at `base` (`size` bytes) are:
/// the PE header's offset, checked to lie inside the image with its
/// section table.
///
/// # Safety
/// `[base, base + size)` must be a mapped image whose first page is
/// readable.
unsafe fn pe_header(base: usize, size: usize) -> Option<(usize, usize, usize)> {
    let u16_at = |o: usize| {
        // SAFETY: callers check `o + 2 <= size` first (below).
        unsafe { core::ptr::read_unaligned((base + o) as *const u16) }
    };
    let u32_at = |o: usize| {
        // SAFETY: as above, `o + 4 <= size`.
        unsafe { core::ptr::read_unaligned((base + o) as *const u32) }
    };
    if size < 0x40 || u16_at(0) != 0x5a4d {
        return None; // no "MZ"
    }
    let pe = u32_at(0x3c) as usize;
    if pe.checked_add(24)? > size.min(0x1000) || u32_at(pe) != 0x4550 {
        return None; // no "PE\0\0" in the first page
    }
    let sections = u16_at(pe + 6) as usize;
    let optional = u16_at(pe + 20) as usize;
    let table = pe + 24 + optional;
    if table.checked_add(sections.checked_mul(40)?)? > size.min(0x1000) {
        return None;
    }
    Some((pe, table, sections))
}

/// Calls `f` with each section of the image at `base`.
///
/// # Safety
/// As [`pe_header`].
unsafe fn sections(base: usize, size: usize, mut f: impl FnMut(Section) -> bool) {
    // SAFETY: as promised by the caller.
    let Some((_, table, n)) = (unsafe { pe_header(base, size) }) else {
        return;
    };
    for i in 0..n {
        let h = base + table + 40 * i;
        // SAFETY: `pe_header` checked the whole table lies in the image's
        // first page.
        let s = unsafe {
            Section {
                size: core::ptr::read_unaligned((h + 8) as *const u32) as usize,
                rva: core::ptr::read_unaligned((h + 12) as *const u32) as usize,
                flags: core::ptr::read_unaligned((h + 36) as *const u32),
            }
        };
        if !f(s) {
            return;
        }
    }
}

/// The executable section of a loaded module that holds `addr`, as
/// `[lo, hi)`; `None` when `addr` is in no module's code. No lock, no
/// allocation, no system call.
pub fn exec_range(addr: usize) -> Option<(usize, usize)> {
    let mut found = None;
    for_each(|base, size, _| {
        if addr.wrapping_sub(base) >= size {
            return true;
        }
        // SAFETY: a listed module is mapped at `[base, base + size)` with
        // its headers (see the module docs).
        unsafe {
            sections(base, size, |s| {
                let lo = base + s.rva;
                if s.flags & SCN_EXECUTE != 0 && addr.wrapping_sub(lo) < s.size {
                    found = Some((lo, lo + s.size));
                    return false;
                }
                true
            });
        }
        false
    });
    found
}

/// `LdrRegisterDllNotification`'s callback: `reason` 1 loaded, 2 unloaded.
type Notification =
    unsafe extern "system" fn(u32, *const core::ffi::c_void, *mut core::ffi::c_void);

#[link(name = "ntdll")]
unsafe extern "system" {
    fn LdrRegisterDllNotification(
        flags: u32,
        callback: Notification,
        context: *mut core::ffi::c_void,
        cookie: *mut *mut core::ffi::c_void,
    ) -> i32;
}

/// The function [`on_unload`] was given (0: none).
static HOOK: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
/// Modules loaded and unloaded since [`watch`] registered the loader's
/// notifications.
static LOADS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
static UNLOADS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

unsafe extern "system" fn notified(
    reason: u32,
    _data: *const core::ffi::c_void,
    _context: *mut core::ffi::c_void,
) {
    use core::sync::atomic::Ordering;
    match reason {
        1 => {
            LOADS.fetch_add(1, Ordering::AcqRel);
        }
        2 => {
            UNLOADS.fetch_add(1, Ordering::AcqRel);
            let f = HOOK.load(Ordering::Acquire);
            if f != 0 {
                // SAFETY: `HOOK` holds only values stored from a `fn()` by
                // `on_unload`.
                let f: fn() = unsafe { core::mem::transmute::<usize, fn()>(f) };
                f();
            }
        }
        _ => {}
    }
}

/// Registers, once per process, for the loader's DLL notifications (which
/// count loads and unloads, and call [`on_unload`]'s function). Whether
/// the registration succeeded. Takes the loader's lock the first time: not
/// for a signal or exception handler.
pub fn watch() -> bool {
    static ONCE: std::sync::Once = std::sync::Once::new();
    static OK: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
    ONCE.call_once(|| {
        let mut cookie = core::ptr::null_mut();
        // SAFETY: a documented ntdll export; the callback lives as long as
        // the program (a plain function), the cookie is written once.
        let ok = unsafe {
            LdrRegisterDllNotification(0, notified, core::ptr::null_mut(), &mut cookie) >= 0
        };
        OK.store(ok, core::sync::atomic::Ordering::Release);
    });
    OK.load(core::sync::atomic::Ordering::Acquire)
}

/// Calls `f` after every module unload from now on (the loader's DLL
/// notifications; `f` runs under the loader's lock, so it must not load
/// anything). Whether the registration succeeded. Not for a signal or
/// exception handler: it takes the loader's lock.
pub fn on_unload(f: fn()) -> bool {
    HOOK.store(f as usize, core::sync::atomic::Ordering::Release);
    watch()
}

/// The modules loaded and unloaded since the first call (of this, or of
/// [`on_unload`]): as `dl_iterate_phdr`'s `dlpi_adds`/`dlpi_subs`, they
/// move with every `LoadLibrary`/`FreeLibrary` that maps or unmaps an
/// image. `None` when the loader refused the notifications.
pub fn counters() -> Option<(u64, u64)> {
    use core::sync::atomic::Ordering;
    watch().then(|| {
        (
            LOADS.load(Ordering::Acquire),
            UNLOADS.load(Ordering::Acquire),
        )
    })
}

/// The loaded module holding `addr`: `(base, size)` of its image. No
/// lock, no allocation, no system call.
pub fn module_of(addr: usize) -> Option<(usize, usize)> {
    let mut found = None;
    for_each(|base, size, _| {
        if addr.wrapping_sub(base) < size {
            found = Some((base, size));
            return false;
        }
        true
    });
    found
}

/// The loaded module holding `addr`: `(base, size)` of its image and its
/// `FullDllName` as the loader keeps it (UTF-16, borrowed from the
/// loader's entry: valid while the module stays loaded). No lock, no
/// allocation, no system call: for the crash handler.
pub fn module_and_name_of(addr: usize) -> Option<(usize, usize, &'static [u16])> {
    let mut found = None;
    for_each(|base, size, entry| {
        if addr.wrapping_sub(base) >= size {
            return true;
        }
        // SAFETY: `entry` is a listed `LDR_DATA_TABLE_ENTRY` (see the module
        // docs); its `FullDllName` is a `UNICODE_STRING` whose buffer holds
        // `len` bytes while the module is loaded.
        let name: &'static [u16] = unsafe {
            let len = core::ptr::read_volatile((entry + ENTRY_FULL_NAME) as *const u16) as usize;
            let buf = word(entry + ENTRY_FULL_NAME + 8);
            if buf == 0 || buf % 2 != 0 {
                &[]
            } else {
                core::slice::from_raw_parts(buf as *const u16, len / 2)
            }
        };
        found = Some((base, size, name));
        false
    });
    found
}

/// A loaded image as the loader lists it.
#[derive(Clone, Debug)]
pub struct Image {
    /// The path the loader has (`FullDllName`).
    pub path: PathBuf,
    /// Where it is mapped (`DllBase`).
    pub base: usize,
    /// The address it was linked for (`ImageBase` of its PE32+ optional
    /// header), if the headers say.
    pub preferred_base: Option<usize>,
    /// Its sections at their runtime addresses: start, size in memory,
    /// whether executable.
    pub sections: Vec<(usize, usize, bool)>,
}

/// The executable sections of the loaded modules, `(start, end)`.
/// Allocates.
pub fn executable_mappings() -> Vec<(usize, usize)> {
    images()
        .iter()
        .flat_map(|m| m.sections.iter().filter(|s| s.2))
        .map(|&(start, size, _)| (start, start + size))
        .collect()
}

/// The loaded images, in load order (the main executable first), for
/// `crate::modules::loaded_modules`. Allocates.
pub fn images() -> Vec<Image> {
    let mut out = Vec::new();
    for_each(|base, size, entry| {
        // SAFETY: a listed module's entry and headers are mapped (see the
        // module docs); the name's buffer holds `len` bytes.
        let (path, preferred_base) = unsafe {
            let len = core::ptr::read_volatile((entry + ENTRY_FULL_NAME) as *const u16) as usize;
            let buf = word(entry + ENTRY_FULL_NAME + 8);
            let path = if buf == 0 {
                PathBuf::new()
            } else {
                let units = core::slice::from_raw_parts(buf as *const u16, len / 2);
                PathBuf::from(String::from_utf16_lossy(units))
            };
            // The preferred address: 8 bytes at 24 into a PE32+ optional
            // header.
            let preferred = pe_header(base, size).and_then(|(pe, table, _)| {
                let opt = pe + 24;
                if table < opt + 32 {
                    return None;
                }
                let magic = core::ptr::read_unaligned((base + opt) as *const u16);
                (magic == 0x20b)
                    .then(|| core::ptr::read_unaligned((base + opt + 24) as *const u64) as usize)
            });
            (path, preferred)
        };
        let mut sections_of = Vec::new();
        // SAFETY: as above.
        unsafe {
            sections(base, size, |s| {
                sections_of.push((base + s.rva, s.size, s.flags & SCN_EXECUTE != 0));
                true
            });
        }
        out.push(Image {
            path,
            base,
            preferred_base,
            sections: sections_of,
        });
        true
    });
    out
}
