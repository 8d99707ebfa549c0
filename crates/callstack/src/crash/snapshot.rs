//! The module list as the signal handler reads it: a copy of
//! [`crate::modules::loaded_modules`] in static storage, taken at install
//! time (and by [`super::refresh_modules`] after a `dlopen`), plus a
//! `/proc/self/maps` reader for addresses outside it.
//!
//! Two static snapshots are kept; a refresh fills the one not in use and
//! publishes it with one atomic store, so the handler never sees a
//! half-written list and never takes a lock, calls `dl_iterate_phdr` or
//! allocates.

use super::sys::SyncCell;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

const MAX_MODULES: usize = 512;
const ARENA: usize = 96 * 1024;
const MAX_BUILD_ID: usize = 32;

#[derive(Clone, Copy)]
struct Entry {
    lo: usize,
    hi: usize,
    bias: usize,
    path_off: u32,
    path_len: u32,
    build_id: [u8; MAX_BUILD_ID],
    build_id_len: u8,
}

const EMPTY: Entry = Entry {
    lo: 0,
    hi: 0,
    bias: 0,
    path_off: 0,
    path_len: 0,
    build_id: [0; MAX_BUILD_ID],
    build_id_len: 0,
};

struct Snapshot {
    n: usize,
    entries: [Entry; MAX_MODULES],
    arena: [u8; ARENA],
}

static SNAPSHOTS: [SyncCell<Snapshot>; 2] = [
    SyncCell::new(Snapshot {
        n: 0,
        entries: [EMPTY; MAX_MODULES],
        arena: [0; ARENA],
    }),
    SyncCell::new(Snapshot {
        n: 0,
        entries: [EMPTY; MAX_MODULES],
        arena: [0; ARENA],
    }),
];
/// Index of the published snapshot, or `usize::MAX` before the first one.
static LIVE: AtomicUsize = AtomicUsize::new(usize::MAX);
static WRITER: Mutex<()> = Mutex::new(());

/// Copies the current module list into the snapshot not in use and
/// publishes it. Not async-signal-safe (it calls `dl_iterate_phdr`).
pub(crate) fn refresh() {
    let mods = crate::modules::loaded_modules();
    let _guard = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let live = LIVE.load(Ordering::Acquire);
    let next = if live == 0 { 1 } else { 0 };
    // SAFETY: only the holder of WRITER writes, and it writes the snapshot
    // that is not published; readers only read the published one.
    let snap = unsafe { &mut *SNAPSHOTS[next].get() };
    snap.n = 0;
    let mut used = 0usize;
    for m in &mods {
        if snap.n == MAX_MODULES {
            break;
        }
        let path = m.path.as_os_str().as_encoded_bytes();
        let take = path.len().min(ARENA - used);
        snap.arena[used..used + take].copy_from_slice(&path[..take]);
        let (lo, hi) = m.range();
        let mut e = Entry {
            lo,
            hi,
            bias: m.bias,
            path_off: used as u32,
            path_len: take as u32,
            ..EMPTY
        };
        used += take;
        if let Some(id) = &m.build_id {
            let k = id.len().min(MAX_BUILD_ID);
            e.build_id[..k].copy_from_slice(&id[..k]);
            e.build_id_len = k as u8;
        }
        snap.entries[snap.n] = e;
        snap.n += 1;
    }
    LIVE.store(next, Ordering::Release);
}

/// What the handler knows of the module holding an address.
pub(crate) struct Found<'a> {
    /// Path of the file (or `[vdso]`).
    pub path: &'a [u8],
    /// The address minus the load bias: the address in the ELF file.
    pub offset: usize,
    /// The GNU build-id, possibly empty.
    pub build_id: &'a [u8],
}

/// Scratch storage for a lookup through `/proc/self/maps`.
pub(crate) struct MapsScratch {
    path: [u8; 512],
    path_len: usize,
    build_id: [u8; MAX_BUILD_ID],
    build_id_len: usize,
}

impl MapsScratch {
    pub(crate) const fn new() -> Self {
        MapsScratch {
            path: [0; 512],
            path_len: 0,
            build_id: [0; MAX_BUILD_ID],
            build_id_len: 0,
        }
    }
}

/// Finds the module of `addr`: first in the snapshot, then (for code loaded
/// after it) in `/proc/self/maps`. Async-signal-safe, no allocation.
pub(crate) fn lookup<'a>(addr: usize, scratch: &'a mut MapsScratch) -> Option<Found<'a>> {
    let live = LIVE.load(Ordering::Acquire);
    if live < 2 {
        // SAFETY: a published snapshot is not written until it is unpublished
        // and a later refresh reuses it (see the module docs).
        let snap = unsafe { &*SNAPSHOTS[live].get() };
        for e in &snap.entries[..snap.n] {
            if e.lo <= addr && addr < e.hi {
                let p = e.path_off as usize;
                return Some(Found {
                    path: &snap.arena[p..p + e.path_len as usize],
                    offset: addr.wrapping_sub(e.bias),
                    build_id: &e.build_id[..e.build_id_len as usize],
                });
            }
        }
    }
    lookup_maps(addr, scratch)
}

/// The `/proc/self/maps` path: finds the file mapping that holds `addr`, then
/// the same file's mapping at offset 0, whose ELF header gives the load bias
/// and the build-id.
fn lookup_maps(addr: usize, s: &mut MapsScratch) -> Option<Found<'_>> {
    // The mapping at file offset 0 of the latest file seen, and whether the
    // mapping of `addr` was found.
    let mut base: Option<(usize, usize)> = None;
    let mut hit: Option<(usize, usize)> = None; // (start, file offset)
    let mut base_path = [0u8; 512];
    let mut base_len = 0usize;
    crate::sys::maps::for_each_line(|line| {
        let Some(f) = parse_maps_line(line) else {
            return true;
        };
        if f.path.is_empty() || f.path[0] != b'/' {
            if f.start <= addr && addr < f.end {
                return false; // anonymous or special: no module
            }
            return true;
        }
        if f.offset == 0 {
            let k = f.path.len().min(base_path.len());
            base_path[..k].copy_from_slice(&f.path[..k]);
            base_len = k;
            base = Some((f.start, f.end));
        }
        if f.start <= addr && addr < f.end {
            let k = f.path.len().min(s.path.len());
            s.path[..k].copy_from_slice(&f.path[..k]);
            s.path_len = k;
            hit = Some((f.start, f.offset));
            return false;
        }
        true
    });
    let (start, file_off) = hit?;
    s.build_id_len = 0;
    let mut offset = addr - start + file_off; // right when vaddr == file offset
    if let Some((b_lo, b_hi)) = base {
        if base_path[..base_len] == s.path[..s.path_len] {
            if let Some((bias, id)) = elf_in_memory(b_lo, b_hi) {
                offset = addr.wrapping_sub(bias);
                let k = id.len().min(MAX_BUILD_ID);
                s.build_id[..k].copy_from_slice(&id[..k]);
                s.build_id_len = k;
            }
        }
    }
    Some(Found {
        path: &s.path[..s.path_len],
        offset,
        build_id: &s.build_id[..s.build_id_len],
    })
}

struct MapsLine<'a> {
    start: usize,
    end: usize,
    offset: usize,
    path: &'a [u8],
}

/// [`parse_maps_line`]'s fields `(start, end, offset, path)`, for the fuzz
/// targets (through `crate::fuzzing`).
pub(crate) fn maps_line_fields(line: &[u8]) -> Option<(usize, usize, usize, &[u8])> {
    parse_maps_line(line).map(|l| (l.start, l.end, l.offset, l.path))
}

/// Parses `start-end perms offset dev inode   path`.
fn parse_maps_line(line: &[u8]) -> Option<MapsLine<'_>> {
    let mut fields = line.splitn(6, |&b| b == b' ');
    let range = fields.next()?;
    let _perms = fields.next()?;
    let offset = parse_hex(fields.next()?)?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next().unwrap_or(b"");
    let path = match path.iter().position(|&b| b != b' ') {
        Some(i) => &path[i..],
        None => &path[..0],
    };
    let dash = range.iter().position(|&b| b == b'-')?;
    Some(MapsLine {
        start: parse_hex(&range[..dash])?,
        end: parse_hex(&range[dash + 1..])?,
        offset,
        path,
    })
}

fn parse_hex(s: &[u8]) -> Option<usize> {
    crate::sys::maps::parse_hex(s).map(|v| v as usize)
}

/// Reads the ELF header and program headers mapped at `[lo, hi)` (a file's
/// mapping at offset 0) and returns the load bias and the build-id. Every
/// read stays inside `[lo, hi)`.
fn elf_in_memory(lo: usize, hi: usize) -> Option<(usize, &'static [u8])> {
    let ehdr_size = core::mem::size_of::<libc::Elf64_Ehdr>();
    if hi - lo < ehdr_size {
        return None;
    }
    // SAFETY: `[lo, hi)` is a mapping of the file at offset 0 that the
    // loader maps readable (the ELF header segment); we read inside it.
    let ehdr = unsafe { &*(lo as *const libc::Elf64_Ehdr) };
    if ehdr.e_ident[..4] != *b"\x7fELF" || ehdr.e_ident[4] != 2 {
        return None;
    }
    let phoff = ehdr.e_phoff as usize;
    let phnum = ehdr.e_phnum as usize;
    let phsize = core::mem::size_of::<libc::Elf64_Phdr>();
    if ehdr.e_phentsize as usize != phsize || phoff.checked_add(phnum * phsize)? > hi - lo {
        return None;
    }
    // SAFETY: the program headers lie inside the mapping (checked above).
    let phdrs =
        unsafe { core::slice::from_raw_parts((lo + phoff) as *const libc::Elf64_Phdr, phnum) };
    let first_load = phdrs.iter().find(|p| p.p_type == libc::PT_LOAD)?;
    let bias = lo.wrapping_sub((first_load.p_vaddr & !(first_load.p_align.max(1) - 1)) as usize);
    let mut id: &'static [u8] = &[];
    for p in phdrs.iter().filter(|p| p.p_type == libc::PT_NOTE) {
        let start = bias.wrapping_add(p.p_vaddr as usize);
        let Some(end) = start.checked_add(p.p_memsz as usize) else {
            continue;
        };
        if start < lo || end > hi {
            continue;
        }
        // SAFETY: the note segment lies inside the readable mapping.
        let notes = unsafe { core::slice::from_raw_parts(start as *const u8, end - start) };
        if let Some(b) = build_id_in_notes(notes) {
            id = b;
            break;
        }
    }
    Some((bias, id))
}

/// The `NT_GNU_BUILD_ID` descriptor of an ELF note area, without allocating.
pub(crate) fn build_id_in_notes(mut notes: &[u8]) -> Option<&[u8]> {
    let align4 = |n: usize| (n + 3) & !3;
    while notes.len() >= 12 {
        let word =
            |i: usize| u32::from_ne_bytes([notes[i], notes[i + 1], notes[i + 2], notes[i + 3]]);
        let (namesz, descsz, ty) = (word(0) as usize, word(4) as usize, word(8));
        let name_end = 12usize.checked_add(align4(namesz))?;
        let desc_end = name_end.checked_add(descsz)?;
        if notes.len() < desc_end {
            return None;
        }
        if ty == 3 && namesz == 4 && &notes[12..16] == b"GNU\0" {
            return Some(&notes[name_end..desc_end]);
        }
        notes = notes.get(name_end.checked_add(align4(descsz))?..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let l = parse_maps_line(
            b"7f1c2a000000-7f1c2a028000 r--p 00028000 08:01 1234      /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        assert_eq!(
            (l.start, l.end, l.offset),
            (0x7f1c2a000000, 0x7f1c2a028000, 0x28000)
        );
        assert_eq!(l.path, b"/usr/lib/x86_64-linux-gnu/libc.so.6");
        let l = parse_maps_line(b"7ffd-7ffe rw-p 00000000 00:00 0").unwrap();
        assert_eq!(l.path, b"");
        assert!(parse_maps_line(b"garbage").is_none());
    }

    #[test]
    fn finds_this_function_through_maps_and_snapshot() {
        let addr = finds_this_function_through_maps_and_snapshot as *const () as usize;
        let mut s = MapsScratch::new();
        let via_maps =
            lookup_maps(addr, &mut s).map(|f| (f.path.to_vec(), f.offset, f.build_id.to_vec()));
        refresh();
        let mut s2 = MapsScratch::new();
        let via_snap =
            lookup(addr, &mut s2).map(|f| (f.path.to_vec(), f.offset, f.build_id.to_vec()));
        assert!(via_snap.is_some());
        assert_eq!(via_maps, via_snap);
    }
}
