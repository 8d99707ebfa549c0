//! PDB files: the debug info of Windows code built by MSVC, or by clang-cl
//! or clang with lld (`-gcodeview`). Functions, files, lines and inlined
//! frames of an address, read with the `pdb-addr2line` crate, on any host
//! (a Windows program's trace symbolized on Linux, as on Windows itself).
//!
//! An image names its PDB in the CodeView record (`RSDS`) of its debug
//! directory: a path, as the linker wrote it, and a GUID that the PDB
//! carries too. [`PdbModule::find`] looks for the file at that path, then
//! beside the image (the PDB's file name, then the image's own name with
//! `.pdb`), then in each debug directory, by name and in a symbol store's
//! layout (`NAME/GUIDAGE/NAME`, as `symstore` and symbol servers keep
//! them). A file whose GUID is not the image's is another build: it is
//! skipped, and said so.
//!
//! The one `unsafe` block here ties the context's borrow of its data to
//! the struct that owns both (see [`PdbModule`]).

use super::mapped::Mapped;
use super::{Error, ErrorKind};
use pdb_addr2line::pdb;
use pdb_addr2line::{Context, ContextPdbData, TypeFormatterFlags};
use std::io::Cursor;
use std::path::{Path, PathBuf};

type Data = ContextPdbData<'static, 'static, Cursor<&'static [u8]>>;

/// A matched PDB, ready for lookups. Field order matters: `context`
/// borrows `data`, which reads `map`'s bytes; they are dropped in that
/// order.
pub(crate) struct PdbModule {
    context: Context<'static, 'static>,
    _data: Box<Data>,
    _map: Mapped,
    /// The image's preferred base: the symbolizer's addresses in the image
    /// are `base + RVA`, the PDB's are RVAs.
    base: u64,
    /// Where the PDB was found.
    pub(crate) path: PathBuf,
}

/// One frame of a PDB lookup, innermost first.
pub(crate) struct PdbFrame {
    pub(crate) function: Option<String>,
    pub(crate) file: Option<String>,
    pub(crate) line: Option<u32>,
}

impl PdbModule {
    /// The PDB of the PE image `obj` (at `image`), looked for as the
    /// [module documentation](self) says. `Ok(None)`: the image names no
    /// PDB, or none was found. Candidates that exist but do not match (or
    /// do not parse) are pushed to `skipped`.
    pub(crate) fn find(
        image: &Path,
        obj: &object::File<'static>,
        debug_dirs: &[PathBuf],
        skipped: &mut Vec<Error>,
    ) -> Option<PdbModule> {
        use object::Object;
        let cv = obj.pdb_info().ok().flatten()?;
        let guid = cv.guid();
        let recorded = String::from_utf8_lossy(cv.path()).into_owned();
        for cand in candidates(image, &recorded, guid, cv.age(), debug_dirs) {
            if !cand.is_file() {
                continue;
            }
            match PdbModule::open(&cand, guid, obj.relative_address_base()) {
                Ok(m) => return Some(m),
                Err(e) => skipped.push(e),
            }
        }
        None
    }

    /// Opens the PDB at `path`, checking that its GUID is `guid` (the
    /// image's CodeView GUID, as stored: little-endian fields).
    fn open(path: &Path, guid: [u8; 16], base: u64) -> Result<PdbModule, Error> {
        let err = |kind, msg: String| Error::new(kind, path, msg);
        let map = Mapped::open(path).map_err(|e| err(ErrorKind::Io, e.to_string()))?;
        let mut pdb = pdb::PDB::open(Cursor::new(map.bytes()))
            .map_err(|e| err(ErrorKind::BadObject, format!("not a PDB: {e}")))?;
        let info = pdb
            .pdb_information()
            .map_err(|e| err(ErrorKind::BadObject, format!("PDB information stream: {e}")))?;
        if info.guid.to_bytes_le() != guid {
            return Err(err(
                ErrorKind::BuildIdMismatch,
                format!(
                    "PDB GUID {} is not the image's {}",
                    info.guid.simple(),
                    guid_text(guid)
                ),
            ));
        }
        let data = Box::new(
            Data::try_from_pdb(pdb)
                .map_err(|e| err(ErrorKind::BadObject, format!("PDB streams: {e}")))?,
        );
        // SAFETY: `data` is boxed (its address stays put when the box
        // moves into the struct) and is dropped after `context`, the only
        // holder of this reference (field order of `PdbModule`).
        let data_ref: &'static Data = unsafe { &*(&*data as *const Data) };
        // Names as the DWARF reader and binutils give them:
        // `ns::Class::method(int, long)`, no return type.
        let context = data_ref
            .make_context_with_formatter_flags(
                TypeFormatterFlags::NO_FUNCTION_RETURN
                    | TypeFormatterFlags::NO_MEMBER_FUNCTION_STATIC
                    | TypeFormatterFlags::NAME_ONLY
                    | TypeFormatterFlags::SPACE_AFTER_COMMA,
            )
            .map_err(|e| err(ErrorKind::BadObject, format!("PDB context: {e}")))?;
        Ok(PdbModule {
            context,
            _data: data,
            _map: map,
            base,
            path: path.to_path_buf(),
        })
    }

    /// The frames at `addr` (an address of the image at its preferred
    /// base), innermost first; empty when the PDB knows no function there.
    pub(crate) fn frames(&self, addr: u64) -> Vec<PdbFrame> {
        let Some(rva) = addr
            .checked_sub(self.base)
            .and_then(|r| u32::try_from(r).ok())
        else {
            return Vec::new();
        };
        match self.context.find_frames(rva) {
            Ok(Some(ff)) => ff
                .frames
                .into_iter()
                .map(|f| PdbFrame {
                    function: f.function,
                    file: f.file.map(|s| s.into_owned()),
                    line: f.line,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// The GUID as symbol stores spell it: its fields as numbers, in upper-case
/// hex, without dashes.
fn guid_text(g: [u8; 16]) -> String {
    let d1 = u32::from_le_bytes([g[0], g[1], g[2], g[3]]);
    let d2 = u16::from_le_bytes([g[4], g[5]]);
    let d3 = u16::from_le_bytes([g[6], g[7]]);
    let mut s = format!("{d1:08X}{d2:04X}{d3:04X}");
    for b in &g[8..] {
        s.push_str(&format!("{b:02X}"));
    }
    s
}

/// Where to look for the PDB an image records as `recorded`, in order.
fn candidates(
    image: &Path,
    recorded: &str,
    guid: [u8; 16],
    age: u32,
    debug_dirs: &[PathBuf],
) -> Vec<PathBuf> {
    // The recorded path is the linker's: a Windows path when linked there.
    let name = recorded
        .rsplit(['/', '\\'])
        .next()
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    let mut out = vec![PathBuf::from(recorded)];
    let dir = image.parent().unwrap_or(Path::new("."));
    if let Some(n) = &name {
        out.push(dir.join(n));
    }
    out.push(image.with_extension("pdb"));
    let key = format!("{}{age:X}", guid_text(guid));
    for d in debug_dirs {
        if let Some(n) = &name {
            out.push(d.join(n));
            out.push(d.join(n).join(&key).join(n));
        }
    }
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_spelled_as_symbol_stores_do() {
        let g = [
            0x78, 0x56, 0x34, 0x12, 0xbc, 0x9a, 0xf0, 0xde, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        assert_eq!(guid_text(g), "123456789ABCDEF00102030405060708");
    }

    #[test]
    fn candidates_take_the_file_name_of_a_windows_path() {
        let c = candidates(
            Path::new("/x/app.exe"),
            r"C:\build\out\app.pdb",
            [0; 16],
            2,
            &[PathBuf::from("/sym")],
        );
        let want: Vec<PathBuf> = [
            r"C:\build\out\app.pdb",
            "/x/app.pdb",
            "/sym/app.pdb",
            "/sym/app.pdb/000000000000000000000000000000002/app.pdb",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(c, want);
    }
}
