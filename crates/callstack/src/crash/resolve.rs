//! Frames of a raw report to functions, files and lines: the one place the
//! crash reports call the symbolizer ([`crate::symbolize::Symbolizer`],
//! used offline from the module list the report carries: path, build-id,
//! load bias).

use super::report::RawFrame;
use crate::symbolize::{Address, ErrorKind, ModuleInfo, Symbolizer};
use std::path::PathBuf;

/// One resolved frame (an address can give several: inlined ones first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SymFrame {
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// Whether this frame was inlined into the next one.
    pub inlined: bool,
}

/// What [`Resolver::resolve`] says about one frame.
#[derive(Clone, Debug, Default)]
pub(crate) struct Resolved {
    /// Frames at the address, innermost (inlined) first; empty if unknown.
    pub frames: Vec<SymFrame>,
    /// The file on disk has another build-id than the report's (and no
    /// debug file with the report's build-id was found).
    pub build_id_mismatch: bool,
    /// The module file could not be read.
    pub unreadable: bool,
}

/// The `ImageBase` of the PE32+ file at `path` (`None` for any other file).
fn pe_image_base(path: &std::path::Path) -> Option<usize> {
    use std::io::Read;
    let mut h = [0u8; 1024];
    let mut f = std::fs::File::open(path).ok()?;
    let n = f.read(&mut h).ok()?;
    let h = &h[..n];
    let u32_at = |o: usize| Some(u32::from_le_bytes(h.get(o..o + 4)?.try_into().ok()?));
    if h.get(..2)? != b"MZ" {
        return None;
    }
    let pe = u32_at(0x3c)? as usize;
    if h.get(pe..pe + 4)? != b"PE\0\0" {
        return None;
    }
    let opt = pe + 24;
    if h.get(opt..opt + 2)? != [0x0b, 0x02] {
        return None;
    }
    Some(u64::from_le_bytes(h.get(opt + 24..opt + 32)?.try_into().ok()?) as usize)
}

/// A symbolizer over the modules named by one report's frames.
pub(crate) struct Resolver {
    sym: Symbolizer,
}

impl Resolver {
    /// Builds the module list from the frames: each (path, load bias) pair
    /// is a module spanning the frames' addresses.
    pub(crate) fn for_frames(frames: &[RawFrame]) -> Resolver {
        let mut mods: Vec<ModuleInfo> = Vec::new();
        for f in frames {
            let Some((path, offset, bid)) = &f.module else {
                continue;
            };
            let addr = f.address as usize;
            // A PE's offset is its RVA, and its symbols and DWARF are at
            // link-time addresses (`ImageBase` + RVA).
            let image_base = match mods.iter().find(|m| m.path == *path) {
                Some(m) => m
                    .bias
                    .map_or(0, |b| addr.wrapping_sub(*offset as usize).wrapping_sub(b)),
                None => pe_image_base(path).unwrap_or(0),
            };
            let bias = addr.wrapping_sub(*offset as usize).wrapping_sub(image_base);
            let lo = addr.saturating_sub(1);
            let hi = addr.saturating_add(1);
            match mods
                .iter_mut()
                .find(|m| m.path == *path && m.bias == Some(bias))
            {
                Some(m) => {
                    m.start = m.start.min(lo);
                    m.end = m.end.max(hi);
                }
                None => mods.push(ModuleInfo {
                    path: path.clone(),
                    build_id: bid.clone().filter(|b| !b.is_empty()),
                    start: lo,
                    end: hi,
                    bias: Some(bias),
                }),
            }
        }
        let mut sym = Symbolizer::from_modules(mods);
        // A crash report never waits on the network.
        sym.set_debuginfod(None);
        Resolver { sym }
    }

    /// Resolves one frame: a return address is looked up at `addr - 1`, the
    /// interrupted pc of a signal as is.
    pub(crate) fn resolve(&mut self, f: &RawFrame) -> Resolved {
        let addr = if f.is_return_address {
            Address::Return(f.address as usize)
        } else {
            Address::Exact(f.address as usize)
        };
        let s = self.sym.symbolize(addr);
        let frames = s
            .frames
            .iter()
            .map(|fr| SymFrame {
                function: fr.function.as_deref().map(str::to_string),
                file: fr.file.as_deref().map(str::to_string),
                line: fr.line,
                column: fr.column,
                inlined: fr.inlined,
            })
            .collect();
        let path: Option<PathBuf> = f.module.as_ref().map(|m| m.0.clone());
        let mut out = Resolved {
            frames,
            ..Default::default()
        };
        for e in self.sym.module_errors() {
            if Some(&e.path) == path.as_ref() {
                match e.kind {
                    ErrorKind::BuildIdMismatch => out.build_id_mismatch = true,
                    _ => out.unreadable = true,
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::pe_image_base;

    #[test]
    fn a_pe32_plus_gives_its_image_base_anything_else_none() {
        let dir = std::env::temp_dir().join(format!("callstack-pe-base-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        // DOS header pointing at "PE\0\0" at 0x40, a COFF header, then a
        // PE32+ optional header whose ImageBase is 0x140000000.
        let mut pe = vec![0u8; 0x40 + 24 + 32];
        pe[..2].copy_from_slice(b"MZ");
        pe[0x3c] = 0x40;
        pe[0x40..0x44].copy_from_slice(b"PE\0\0");
        pe[0x58..0x5a].copy_from_slice(&0x20bu16.to_le_bytes());
        pe[0x58 + 24..0x58 + 32].copy_from_slice(&0x1_4000_0000u64.to_le_bytes());
        assert_eq!(pe_image_base(&write("pe", &pe)), Some(0x1_4000_0000));
        // Every truncation, a PE32 (not +), an ELF file, a missing file:
        // none, never a panic.
        for cut in 0..pe.len() {
            assert_eq!(pe_image_base(&write("cut", &pe[..cut])), None, "{cut}");
        }
        let mut pe32 = pe.clone();
        pe32[0x58] = 0x0b;
        pe32[0x59] = 0x01;
        assert_eq!(pe_image_base(&write("pe32", &pe32)), None);
        assert_eq!(pe_image_base(&write("elf", b"\x7fELF\x02\x01\x01")), None);
        assert_eq!(pe_image_base(&dir.join("missing")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
