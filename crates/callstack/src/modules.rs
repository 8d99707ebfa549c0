//! The objects loaded in this process: executable, shared libraries, vDSO.
//!
//! [`loaded_modules`] walks `dl_iterate_phdr` and describes each object from
//! its program headers: where it is loaded, its segments, its GNU build-id,
//! and where its `.eh_frame_hdr` is. It allocates and takes the loader's
//! lock, so it is for set-up paths (symbolizer, table building,
//! [`crate::prepare_thread`]-like calls), never for a capture in a signal
//! handler.
//!
//! On Windows the list is the loader's (the PEB's list of loaded modules,
//! `sys/windows/loader.rs`): each module's sections as segments, no
//! build-id, no `.eh_frame_hdr`.

#[cfg(not(windows))]
use std::ffi::CStr;
use std::path::PathBuf;

/// One loaded segment (`PT_LOAD`) of a module, at its runtime address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Runtime start address.
    pub start: usize,
    /// Size in memory.
    pub size: usize,
    /// Whether the segment is executable.
    pub executable: bool,
}

/// An object loaded in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// Path of the file (the main executable's from `/proc/self/exe`); the
    /// vDSO is named `[vdso]`.
    pub path: PathBuf,
    /// Load bias: runtime address minus the address in the file.
    pub bias: usize,
    /// The `PT_LOAD` segments at their runtime addresses.
    pub segments: Vec<Segment>,
    /// The GNU build-id (`NT_GNU_BUILD_ID`), if the object has one.
    pub build_id: Option<Vec<u8>>,
    /// Runtime address of `.eh_frame_hdr` (`PT_GNU_EH_FRAME`), if any.
    pub eh_frame_hdr: Option<usize>,
    /// Whether this is the main executable.
    pub is_main: bool,
    /// Whether this is the kernel's vDSO (no file on disk).
    pub is_vdso: bool,
}

impl Module {
    /// Whether `addr` lies in one of the module's segments.
    pub fn contains(&self, addr: usize) -> bool {
        self.segments
            .iter()
            .any(|s| s.start <= addr && addr - s.start < s.size)
    }

    /// Lowest and one-past-highest runtime address of the module's segments.
    pub fn range(&self) -> (usize, usize) {
        let lo = self.segments.iter().map(|s| s.start).min().unwrap_or(0);
        let hi = self
            .segments
            .iter()
            .map(|s| s.start + s.size)
            .max()
            .unwrap_or(0);
        (lo, hi)
    }

    /// The build-id as lowercase hex, if any.
    pub fn build_id_hex(&self) -> Option<String> {
        self.build_id
            .as_ref()
            .map(|b| b.iter().map(|x| format!("{x:02x}")).collect())
    }
}

/// Lists the objects loaded in this process, in the loader's order (the
/// main executable first).
///
/// Not async-signal-safe: allocates and takes the dynamic loader's lock.
#[cfg(not(windows))]
pub fn loaded_modules() -> Vec<Module> {
    let mut out: Vec<Module> = Vec::new();
    // SAFETY: the callback only reads the `dl_phdr_info` it is handed, for
    // the duration of the call, and pushes owned copies into `out`.
    unsafe {
        libc::dl_iterate_phdr(Some(collect), (&mut out as *mut Vec<Module>).cast());
    }
    out
}

/// Lists the modules loaded in this process, in the loader's order (the
/// main executable first).
///
/// Not async-signal-safe: allocates.
#[cfg(windows)]
pub fn loaded_modules() -> Vec<Module> {
    let images = crate::sys::windows::loader::images();
    images
        .into_iter()
        .enumerate()
        .map(|(i, m)| Module {
            path: m.path,
            bias: m.base.wrapping_sub(m.preferred_base.unwrap_or(m.base)),
            segments: m
                .sections
                .iter()
                .map(|&(start, size, executable)| Segment {
                    start,
                    size,
                    executable,
                })
                .collect(),
            build_id: None,
            eh_frame_hdr: None,
            is_main: i == 0,
            is_vdso: false,
        })
        .collect()
}

/// The module that contains `addr`, if any.
pub fn module_containing(addr: usize) -> Option<Module> {
    loaded_modules().into_iter().find(|m| m.contains(addr))
}

#[cfg(not(windows))]
unsafe extern "C" fn collect(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info for this call and our
    // `data` pointer, which is the `Vec<Module>` of `loaded_modules`.
    let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<Module>)) };
    let bias = info.dlpi_addr as usize;
    let phdrs: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() || info.dlpi_phnum == 0 {
        &[]
    } else {
        // SAFETY: the loader keeps `dlpi_phnum` program headers at `dlpi_phdr`.
        unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
    };
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    let is_main = out.is_empty() && name.is_empty();
    let is_vdso = name.starts_with("linux-vdso") || name.starts_with("linux-gate");
    let path = if is_main {
        std::fs::read_link("/proc/self/exe").unwrap_or_default()
    } else if is_vdso {
        PathBuf::from("[vdso]")
    } else {
        PathBuf::from(name)
    };
    let mut m = Module {
        path,
        bias,
        segments: Vec::new(),
        build_id: None,
        eh_frame_hdr: None,
        is_main,
        is_vdso,
    };
    for ph in phdrs {
        match ph.p_type {
            libc::PT_LOAD => m.segments.push(Segment {
                start: bias.wrapping_add(ph.p_vaddr as usize),
                size: ph.p_memsz as usize,
                executable: ph.p_flags & libc::PF_X != 0,
            }),
            libc::PT_GNU_EH_FRAME => m.eh_frame_hdr = Some(bias.wrapping_add(ph.p_vaddr as usize)),
            libc::PT_NOTE if m.build_id.is_none() => {
                // SAFETY: a PT_NOTE segment of a loaded object is mapped and
                // readable at its runtime address for its whole size.
                let notes = unsafe {
                    core::slice::from_raw_parts(
                        bias.wrapping_add(ph.p_vaddr as usize) as *const u8,
                        ph.p_memsz as usize,
                    )
                };
                m.build_id = gnu_build_id(notes);
            }
            _ => {}
        }
    }
    if !m.segments.is_empty() {
        out.push(m);
    }
    0
}

/// Finds the `NT_GNU_BUILD_ID` descriptor in an ELF note area.
pub fn gnu_build_id(mut notes: &[u8]) -> Option<Vec<u8>> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let align4 = |n: usize| (n + 3) & !3;
    while notes.len() >= 12 {
        let word = |i: usize| u32::from_ne_bytes(notes[i..i + 4].try_into().unwrap());
        let (namesz, descsz, ty) = (word(0) as usize, word(4) as usize, word(8));
        let name_end = 12usize.checked_add(align4(namesz))?;
        let desc_end = name_end.checked_add(align4(descsz))?;
        if notes.len() < name_end || notes.len() < name_end + descsz {
            return None;
        }
        if ty == NT_GNU_BUILD_ID && namesz == 4 && &notes[12..16] == b"GNU\0" {
            return Some(notes[name_end..name_end + descsz].to_vec());
        }
        notes = notes.get(desc_end..)?;
    }
    None
}

/// The dynamic loader's counters of objects added and removed so far
/// (`dlpi_adds`, `dlpi_subs`: every `dlopen`/`dlclose` that maps or unmaps
/// an object moves them), `None` when the loader keeps none. One
/// `dl_iterate_phdr` call, which takes the loader's lock: not for a signal
/// handler. Shared by the capture's module snapshot and the symbolizer.
#[cfg(not(windows))]
pub(crate) fn loader_counters() -> Option<(u64, u64)> {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        let end = core::mem::offset_of!(libc::dl_phdr_info, dlpi_subs)
            + core::mem::size_of::<libc::c_ulonglong>();
        if size >= end {
            // SAFETY: `info` is valid for this call and, as `size` says,
            // holds the counters; `data` is the `Option` of the caller.
            unsafe {
                let info = &*info;
                *(data as *mut Option<(u64, u64)>) = Some((info.dlpi_adds, info.dlpi_subs));
            }
        }
        1 // the counters are the same in every entry: stop here
    }
    let mut out: Option<(u64, u64)> = None;
    // SAFETY: the callback only reads the `dl_phdr_info` it is handed, for
    // the duration of the call, and writes into `out`, which outlives it.
    unsafe {
        libc::dl_iterate_phdr(Some(first), (&mut out as *mut Option<(u64, u64)>).cast());
    }
    out
}

/// Windows' loader keeps no such counters: its DLL notifications count
/// loads and unloads from the first call on (`LdrRegisterDllNotification`,
/// registered then; takes the loader's lock that once).
#[cfg(windows)]
#[cfg_attr(not(feature = "symbolize"), allow(dead_code))]
pub(crate) fn loader_counters() -> Option<(u64, u64)> {
    crate::sys::windows::loader::counters()
}

/// A copy of this process's vDSO image (the whole `[vdso]` mapping: the
/// kernel maps the same image into every process), if it has one.
#[cfg(all(target_os = "linux", feature = "symbolize"))]
pub(crate) fn vdso_image() -> Option<Vec<u8>> {
    let mut range = None;
    crate::sys::maps::for_each_line(|line| {
        if line.ends_with(b"[vdso]") {
            range = crate::sys::maps::parse_range(line);
        }
        range.is_none()
    });
    let (s, e) = range.filter(|(s, e)| e > s)?;
    // SAFETY: the vDSO mapping of this process is readable for its whole
    // range and never unmapped.
    let bytes = unsafe { std::slice::from_raw_parts(s as *const u8, e - s) };
    Some(bytes.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(windows))]
    #[test]
    fn lists_the_executable_libc_and_vdso() {
        let mods = loaded_modules();
        assert!(mods[0].is_main, "{mods:#?}");
        assert!(mods[0].contains(lists_the_executable_libc_and_vdso as *const () as usize));
        assert!(mods
            .iter()
            .any(|m| m.path.to_string_lossy().contains("libc.so")));
        assert!(mods
            .iter()
            .all(|m| m.segments.iter().any(|s| s.executable) || m.is_vdso));
        let exe = &mods[0];
        assert!(exe.eh_frame_hdr.is_some());
    }

    #[test]
    #[cfg(all(target_os = "linux", feature = "symbolize"))]
    fn the_vdso_image_is_an_elf_object() {
        let Some(image) = super::vdso_image() else {
            // qemu-user (scripts/test-aarch64.sh) maps no vDSO for every
            // guest; Linux always does.
            assert!(
                std::env::var_os("CALLSTACK_TEST_QEMU").is_some(),
                "Linux maps a vDSO"
            );
            return;
        };
        assert_eq!(&image[..4], b"\x7fELF");
        assert_eq!(image.len() % 4096, 0, "whole pages");
    }

    #[test]
    fn truncated_notes_give_none() {
        assert_eq!(gnu_build_id(&[1, 0, 0]), None);
        assert_eq!(gnu_build_id(&[0xff; 40]), None);
    }
}
