//! Finding the target's modules on disk: paths under a sysroot, separate
//! debug files by build-id, the build-id check, and the load bias.

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};
use object::{Endianness, FileKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::symbolize::debuginfod::{Artifact, Debuginfod};

use super::{Mapping, Module};

pub use crate::elf_headers::{build_id, load_segments};

/// Where to look for the target's files.
#[derive(Clone, Debug, Default)]
pub struct Lookup {
    /// Look up every path of the target under this directory instead of
    /// the root (`--sysroot`), like gdb's `set sysroot`.
    pub sysroot: Option<PathBuf>,
    /// Directories holding separate debug files as `.build-id/xx/rest.debug`
    /// (`--debug-dir`); `/usr/lib/debug` is always tried last.
    pub debug_dirs: Vec<PathBuf>,
    /// The debuginfod client that fetches, by build-id, the objects not on
    /// this machine and the debug files of those without any here (all
    /// the modules' at once, when a core or process is opened). `None`: none. Pass the
    /// same client to the symbolizer of the modules
    /// ([`crate::symbolize::Symbolizer::set_debuginfod`]) so that what
    /// was fetched, or failed, is not asked for again.
    pub debuginfod: Option<Arc<Debuginfod>>,
}

impl Lookup {
    /// Candidate paths on this machine for a path of the target.
    pub fn candidates(&self, path: &str) -> Vec<PathBuf> {
        let mut out = Vec::new();
        match &self.sysroot {
            Some(root) => out.push(root.join(path.trim_start_matches('/'))),
            None => out.push(PathBuf::from(path)),
        }
        out
    }

    /// The separate debug file of a build-id, if one exists.
    pub fn debug_file(&self, build_id: &[u8]) -> Option<PathBuf> {
        if build_id.len() < 2 {
            return None;
        }
        let hex = hex(build_id);
        let rel = format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..]);
        self.debug_dirs
            .iter()
            .map(PathBuf::from)
            .chain([PathBuf::from("/usr/lib/debug")])
            .map(|d| d.join(&rel))
            .find(|p| p.is_file())
    }
}

/// Lower-case hex of a byte string.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `(p_vaddr, p_offset, p_filesz)` of a `PT_LOAD`.
pub type FileSegment = (u64, u64, u64);

/// `(p_vaddr, p_offset, p_filesz)` of every executable `PT_LOAD` (`PF_X`).
pub fn exec_segments(data: &[u8]) -> Vec<FileSegment> {
    fn of<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Option<Vec<FileSegment>> {
        let hdr = Elf::parse(data).ok()?;
        let endian = hdr.endian().ok()?;
        Some(
            hdr.program_headers(endian, data)
                .ok()?
                .iter()
                .filter(|ph| {
                    ph.p_type(endian) == elf::PT_LOAD && ph.p_flags(endian).0 & elf::PF_X.0 != 0
                })
                .map(|ph| {
                    (
                        ph.p_vaddr(endian).into(),
                        ph.p_offset(endian).into(),
                        ph.p_filesz(endian).into(),
                    )
                })
                .collect(),
        )
    }
    match FileKind::parse(data) {
        Ok(FileKind::Elf64) => of::<elf::FileHeader64<Endianness>>(data),
        Ok(FileKind::Elf32) => of::<elf::FileHeader32<Endianness>>(data),
        _ => None,
    }
    .unwrap_or_default()
}

/// The load bias of an ELF file mapped by `mappings` (runtime address minus
/// file address), from the `PT_LOAD` that covers the lowest mapped offset.
pub fn load_bias(data: &[u8], mappings: &[Mapping]) -> Option<u64> {
    let (_, segs) = load_segments(data)?;
    let m = mappings.iter().min_by_key(|m| m.file_offset)?;
    let page = 4096u64;
    for (vaddr, off, filesz, _) in &segs {
        let lo = off & !(page - 1);
        if m.file_offset >= lo && m.file_offset < off + filesz.max(&1) {
            return Some(
                m.start
                    .wrapping_sub(vaddr.wrapping_sub(*off).wrapping_add(m.file_offset)),
            );
        }
    }
    None
}

/// The parts of `[range.0, range.1)` that none of `covers` (`[start, end)`
/// each) overlaps, in order.
pub(crate) fn uncovered(
    range: (u64, u64),
    covers: impl IntoIterator<Item = (u64, u64)>,
) -> Vec<(u64, u64)> {
    let mut gaps = vec![range];
    for (s, e) in covers {
        gaps = gaps
            .into_iter()
            .flat_map(|(a, b)| {
                if e <= a || s >= b {
                    vec![(a, b)]
                } else {
                    [(a, s.min(b)), (e.max(a), b)]
                        .into_iter()
                        .filter(|(x, y)| x < y)
                        .collect()
                }
            })
            .collect();
    }
    gaps
}

/// Adds to `m.mappings` the segments of its file (`data`, loaded at
/// `m.bias`) that no mapping covers: a source that lists only some of a
/// module's mappings (a minidump whose `MD_LINUX_MAPS` was rebuilt from a
/// core, which leaves out the file-backed segments it did not dump, the
/// code among them) still gets every address of the module mapped to its
/// file. Only within the module's `[start, end)` (the range the target
/// reported); returns how many were added.
pub(crate) fn complete_mappings(m: &mut Module, data: &[u8]) -> usize {
    let Some((_, segs)) = load_segments(data) else {
        return 0;
    };
    let exec: Vec<FileSegment> = exec_segments(data);
    let page = 4096u64;
    let mut added = 0;
    for (vaddr, off, filesz, _) in segs {
        if filesz == 0 {
            continue;
        }
        let start = m.bias.wrapping_add(vaddr & !(page - 1));
        let end = m
            .bias
            .wrapping_add(vaddr.saturating_add(filesz))
            .saturating_add(page - 1)
            & !(page - 1);
        // Clip to what the target said the module spans.
        let (start, end) = (start.max(m.start), end.min(m.end));
        if start >= end {
            continue;
        }
        // The uncovered part of [start, end): this segment's bytes where no
        // listed mapping is (listed mappings win: they are what was mapped).
        let gaps = uncovered((start, end), m.mappings.iter().map(|x| (x.start, x.end)));
        let seg_lo = m.bias.wrapping_add(vaddr & !(page - 1));
        let executable = exec.iter().any(|e| e.0 == vaddr && e.1 == off);
        for (a, b) in gaps {
            m.mappings.push(Mapping {
                start: a,
                end: b,
                file_offset: (off & !(page - 1)) + (a - seg_lo),
                path: m.name.clone(),
                executable: Some(executable),
            });
            added += 1;
        }
    }
    m.mappings.sort_by_key(|x| x.start);
    added
}

/// The module of an ELF image read from the target's memory rather than
/// from a file (the vDSO), mapped at `mapping`: its bias comes from the
/// image's first `PT_LOAD` (the mapping's start when it has none).
pub(crate) fn image_module(mapping: Mapping, image: std::sync::Arc<Vec<u8>>) -> Module {
    let start = mapping.start;
    let bias = load_segments(&image)
        .and_then(|(_, s)| s.first().map(|s| start.wrapping_sub(s.0.wrapping_sub(s.1))))
        .unwrap_or(start);
    Module {
        name: mapping.path.clone(),
        file: None,
        debug_file: None,
        start,
        end: mapping.end,
        bias,
        build_id: build_id(&image),
        image: Some(image),
        mappings: vec![mapping],
    }
}

/// Maps a whole file read-only (the build-id check, the bias, unwind
/// tables, code bytes), or hands out the mapping a recent call made of the
/// same file ([`mapped`]).
pub(crate) fn map_file(path: &Path) -> std::io::Result<Arc<memmap2::Mmap>> {
    mapped::get(path)
}

/// The files mapped lately, kept for the next look at the same file.
///
/// A whole-host recording meets the same programs again and again (a
/// shell loop's `gzip` and `sleep` every second, each with libc and the
/// loader): without this, every new process opened, mapped and parsed each
/// of its files, and unmapped them at its exit (a tenth of `record -a`'s
/// own CPU on a host running such loops). A file is known by its device,
/// inode, size and modification time (one `statx`), so a file replaced on
/// disk is mapped afresh. At most [`MAX`] files are kept, the least
/// recently used let go first; a mapping is only address space and the
/// page cache's pages, shared with every process that runs the file.
mod mapped {
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use memmap2::Mmap;

    /// Files kept.
    pub(super) const MAX: usize = 64;

    type Key = (u64, u64, u64, i64, i64);

    struct Entry {
        key: Key,
        map: Arc<Mmap>,
        used: u64,
    }

    static KEPT: Mutex<(Vec<Entry>, u64)> = Mutex::new((Vec::new(), 0));

    fn key(path: &Path) -> std::io::Result<Key> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
    }

    pub(super) fn get(path: &Path) -> std::io::Result<Arc<Mmap>> {
        let k = key(path)?;
        {
            let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
            kept.1 += 1;
            let tick = kept.1;
            if let Some(e) = kept.0.iter_mut().find(|e| e.key == k) {
                e.used = tick;
                return Ok(e.map.clone());
            }
        }
        let f = std::fs::File::open(path)?;
        // SAFETY: the file is mapped read-only; like every debugger we
        // accept that a file truncated under us could fault, and we never
        // write it.
        let map = Arc::new(unsafe { Mmap::map(&f) }?);
        let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
        kept.1 += 1;
        let tick = kept.1;
        if kept.0.len() >= MAX {
            if let Some(old) = (0..kept.0.len()).min_by_key(|&i| kept.0[i].used) {
                kept.0.swap_remove(old);
            }
        }
        kept.0.push(Entry {
            key: k,
            map: map.clone(),
            used: tick,
        });
        Ok(map)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The same file gives the same mapping; a file rewritten (new
        /// size and time) a new one with its new bytes.
        #[test]
        fn same_file_same_mapping_until_it_changes() {
            let dir = std::env::temp_dir().join(format!("cs-mapped-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let p = dir.join("f");
            std::fs::write(&p, b"one").unwrap();
            let a = get(&p).unwrap();
            let b = get(&p).unwrap();
            assert!(Arc::ptr_eq(&a, &b));
            assert_eq!(&a[..], b"one");
            std::fs::write(&p, b"second").unwrap();
            let c = get(&p).unwrap();
            assert_eq!(&c[..], b"second");
            assert!(!Arc::ptr_eq(&a, &c));
            assert!(get(&dir.join("missing")).is_err());
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// Groups file mappings into modules (one per path) and sorts them.
pub fn group_mappings(mappings: &[Mapping]) -> Vec<Module> {
    let mut mods: Vec<Module> = Vec::new();
    for m in mappings {
        if m.path.is_empty() || m.path.starts_with('[') && m.path != "[vdso]" {
            continue;
        }
        match mods.iter_mut().find(|x| x.name == m.path) {
            Some(x) => {
                x.start = x.start.min(m.start);
                x.end = x.end.max(m.end);
                x.mappings.push(m.clone());
            }
            None => mods.push(Module {
                name: m.path.clone(),
                file: None,
                debug_file: None,
                start: m.start,
                end: m.end,
                bias: 0,
                build_id: None,
                image: None,
                mappings: vec![m.clone()],
            }),
        }
    }
    mods.sort_by_key(|m| m.start);
    mods
}

/// Finds each module's file on disk and checks it against the build-id the
/// target carries. `exe` (from the command line) stands for the module named
/// `exe_name` (the target's executable). Problems go to `warnings`.
pub fn resolve_files(
    mods: &mut [Module],
    lookup: &Lookup,
    exe: Option<(&Path, &str)>,
    warnings: &mut Vec<String>,
) {
    // Per module, what to say if its file stays missing.
    let mut missing: Vec<Option<String>> = vec![None; mods.len()];
    for (m, missing) in mods.iter_mut().zip(missing.iter_mut()) {
        if m.image.is_some() {
            continue;
        }
        let candidates: Vec<PathBuf> = match exe {
            Some((p, name)) if name == m.name => vec![p.to_path_buf()],
            _ => lookup.candidates(&m.name),
        };
        let mut found = None;
        let mut mismatch = None;
        let mut not_elf = false;
        for c in candidates {
            let Ok(data) = map_file(&c) else { continue };
            if load_segments(&data).is_none() {
                // A data file (locale archive, gconv cache, font...):
                // nothing to name, nothing to warn about.
                not_elf = true;
                continue;
            }
            let file_id = build_id(&data);
            if let (Some(want), Some(have)) = (&m.build_id, &file_id) {
                if want != have {
                    mismatch = Some((c.clone(), hex(have)));
                    continue;
                }
            }
            if m.build_id.is_none() {
                m.build_id = file_id;
            }
            m.bias = load_bias(&data, &m.mappings).unwrap_or(m.start);
            found = Some(c);
            break;
        }
        // Only what changes the answer is worth a warning: a file mapped
        // without execute permission holds no frames (a core does not
        // record permissions: there, every file counts).
        let may_hold_code = m.mappings.iter().any(|x| x.executable != Some(false));
        *missing = match (&found, mismatch) {
            (None, _) if !may_hold_code => None,
            // Not ELF: nothing could name its frames, whatever the user
            // did; and it exists, so "not found" would be wrong.
            (None, None) if not_elf => None,
            (None, Some((p, have))) => Some(format!(
                "{}: build-id {} does not match the target's {} (another build of {}?): ignoring it, its frames are unnamed",
                p.display(),
                have,
                hex(m.build_id.as_deref().unwrap_or(&[])),
                m.name
            )),
            (None, None) => Some(format!(
                "{}: not found{}: its frames are unnamed",
                m.name,
                if lookup.sysroot.is_some() { " under --sysroot" } else { "" }
            )),
            _ => None,
        };
        m.file = found;
        if let Some(id) = &m.build_id {
            m.debug_file = lookup.debug_file(id);
        }
    }
    if let Some(client) = &lookup.debuginfod {
        fetch_missing(mods, client, lookup, &mut missing);
        warnings.extend(missing.into_iter().flatten());
        warnings.extend(client.take_warnings());
    } else {
        warnings.extend(missing.into_iter().flatten());
    }
}

/// Fetches from `client`, all at once, the objects of `mods` not found
/// here (`missing` says which: their warning is dropped when the fetch
/// succeeds) and the debug files of those without debug info here.
fn fetch_missing(
    mods: &mut [Module],
    client: &Debuginfod,
    lookup: &Lookup,
    missing: &mut [Option<String>],
) {
    let mut wants: Vec<(Vec<u8>, Artifact)> = Vec::new();
    for (m, miss) in mods.iter().zip(missing.iter()) {
        let Some(id) = m.build_id.clone().filter(|id| id.len() >= 2) else {
            continue;
        };
        if m.image.is_some() {
            continue;
        }
        let need_debug = match &m.file {
            None if miss.is_some() => {
                wants.push((id.clone(), Artifact::Executable));
                true
            }
            None => false,
            Some(f) => m.debug_file.is_none() && !has_local_debug_info(f, lookup),
        };
        if need_debug
            && !wants
                .iter()
                .any(|w| w.0 == id && w.1 == Artifact::Debuginfo)
        {
            wants.push((id, Artifact::Debuginfo));
        }
    }
    let got = client.fetch_all(&wants);
    for ((id, kind), path) in wants.iter().zip(got) {
        let Some(path) = path else { continue };
        for (m, miss) in mods.iter_mut().zip(missing.iter_mut()) {
            if m.build_id.as_deref() != Some(id.as_slice()) || m.image.is_some() {
                continue;
            }
            match kind {
                Artifact::Executable if m.file.is_none() => {
                    let Ok(data) = map_file(&path) else { continue };
                    m.bias = load_bias(&data, &m.mappings).unwrap_or(m.start);
                    m.file = Some(path.clone());
                    *miss = None;
                }
                Artifact::Debuginfo if m.debug_file.is_none() => {
                    m.debug_file = Some(path.clone());
                }
                _ => {}
            }
        }
    }
}

/// Whether the object at `path` has its DWARF in itself or in a debug file
/// that `.gnu_debuglink` names in one of the places the symbolizer looks
/// (beside it, in its `.debug/`, under the debug dirs): then there is
/// nothing to fetch for it.
fn has_local_debug_info(path: &Path, lookup: &Lookup) -> bool {
    use object::{Object, ObjectSection};
    let Ok(data) = map_file(path) else {
        return true;
    };
    let Ok(obj) = object::File::parse(&data[..]) else {
        return true;
    };
    if obj
        .section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0)
    {
        return true;
    }
    let Some(name) = obj
        .gnu_debuglink()
        .ok()
        .flatten()
        .and_then(|(n, _)| std::str::from_utf8(n).ok())
    else {
        return false;
    };
    let Some(dir) = path.parent() else {
        return false;
    };
    let rel = dir.strip_prefix("/").unwrap_or(dir);
    let mut places = vec![dir.join(name), dir.join(".debug").join(name)];
    for root in lookup
        .debug_dirs
        .iter()
        .cloned()
        .chain([PathBuf::from("/usr/lib/debug")])
    {
        places.push(root.join(rel).join(name));
        places.push(root.join(name));
    }
    places.iter().any(|p| p.is_file() && p != path)
}

#[cfg(test)]
mod uncovered_tests {
    use super::uncovered;

    #[test]
    fn the_parts_no_range_covers() {
        assert_eq!(uncovered((0, 100), []), vec![(0, 100)]);
        assert_eq!(uncovered((0, 100), [(0, 100)]), vec![]);
        assert_eq!(
            uncovered((0, 100), [(10, 20), (50, 60)]),
            vec![(0, 10), (20, 50), (60, 100)]
        );
        assert_eq!(uncovered((10, 20), [(0, 15), (18, 30)]), vec![(15, 18)]);
        assert_eq!(uncovered((10, 20), [(20, 30), (0, 10)]), vec![(10, 20)]);
    }
}
