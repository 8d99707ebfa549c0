//! What an ELF file's first pages say: its build-id and its `PT_LOAD`
//! segments, found through the program headers, so that the start of a
//! file (or the first page of a mapped object, as a core dumps it) is
//! enough. Used by `remote` (modules of other processes) and `profile`
//! (pprof's file offsets).

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};
use object::{Endianness, FileKind};

/// The GNU build-id of an ELF image, found through its program headers, so
/// that the first page of a mapped object (as dumped in a core) is enough.
pub fn build_id(data: &[u8]) -> Option<Vec<u8>> {
    match FileKind::parse(data).ok()? {
        FileKind::Elf64 => build_id_of::<elf::FileHeader64<Endianness>>(data),
        FileKind::Elf32 => build_id_of::<elf::FileHeader32<Endianness>>(data),
        _ => None,
    }
}

fn build_id_of<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Option<Vec<u8>> {
    let hdr = Elf::parse(data).ok()?;
    let endian = hdr.endian().ok()?;
    for ph in hdr.program_headers(endian, data).ok()? {
        if ph.p_type(endian) != elf::PT_NOTE {
            continue;
        }
        let Ok(Some(mut notes)) = ph.notes(endian, data) else {
            continue;
        };
        while let Ok(Some(n)) = notes.next() {
            if n.name() == elf::ELF_NOTE_GNU && n.n_type(endian) == elf::NT_GNU_BUILD_ID {
                return Some(n.desc().to_vec());
            }
        }
    }
    None
}

/// `(p_vaddr, p_offset, p_filesz, p_align)` of a `PT_LOAD`.
pub type LoadSegment = (u64, u64, u64, u64);

/// Every `PT_LOAD`, and `e_machine`.
pub fn load_segments(data: &[u8]) -> Option<(u16, Vec<LoadSegment>)> {
    fn of<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Option<(u16, Vec<LoadSegment>)> {
        let hdr = Elf::parse(data).ok()?;
        let endian = hdr.endian().ok()?;
        let segs = hdr
            .program_headers(endian, data)
            .ok()?
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
            .map(|ph| {
                (
                    ph.p_vaddr(endian).into(),
                    ph.p_offset(endian).into(),
                    ph.p_filesz(endian).into(),
                    ph.p_align(endian).into(),
                )
            })
            .collect();
        Some((hdr.e_machine(endian).0, segs))
    }
    match FileKind::parse(data).ok()? {
        FileKind::Elf64 => of::<elf::FileHeader64<Endianness>>(data),
        FileKind::Elf32 => of::<elf::FileHeader32<Endianness>>(data),
        _ => None,
    }
}
