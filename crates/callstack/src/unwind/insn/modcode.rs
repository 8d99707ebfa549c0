//! Code of another process or a core, for the analyzers: the executable
//! segments of its modules' ELF files, placed at their load bias, with the
//! function symbols and, for 32-bit ARM, the EHABI tables.
//!
//! ```no_run
//! use callstack::unwind::insn::ModuleCode;
//! let mut code = ModuleCode::new();
//! let elf = std::fs::read("/usr/lib/x86_64-linux-gnu/libc.so.6")?;
//! code.add_elf(&elf, 0x7f00_0000_0000)?; // where the core says it is loaded
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::arm::ehabi::ExidxTable;
use super::arm::unwinder::ArmTables;
use super::inprocess::{function_entry_in, function_symbols_split};
use super::{lookup_function, CodeMemory};
use object::read::elf::{FileHeader, ProgramHeader};
use object::{elf, Endianness};

/// Why an ELF image could not be added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleCodeError {
    /// Not an ELF file object can parse; the text says why.
    BadElf(String),
}

impl core::fmt::Display for ModuleCodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ModuleCodeError::BadElf(s) => write!(f, "not a usable ELF image: {s}"),
        }
    }
}

impl std::error::Error for ModuleCodeError {}

struct Image {
    /// (runtime start, bytes, executable) of each PT_LOAD with file data.
    segments: Vec<(u64, Vec<u8>, bool)>,
    /// `.ARM.exidx` (runtime address, bytes).
    exidx: Option<(u64, Vec<u8>)>,
    lo: u64,
    hi: u64,
    /// From an ELF file (searched before the extra regions).
    file: bool,
}

/// The code of a set of modules (see the module docs).
#[derive(Default)]
pub struct ModuleCode {
    images: Vec<Image>,
    functions: Vec<(u64, u64)>,
    cold: Vec<(u64, u64, u64)>,
}

impl core::fmt::Debug for ModuleCode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ModuleCode")
            .field("modules", &self.images.len())
            .field("functions", &self.functions.len())
            .finish()
    }
}

fn segments<Elf: FileHeader<Endian = Endianness>>(
    data: &[u8],
    bias: u64,
) -> Result<Vec<(u64, Vec<u8>, bool)>, ModuleCodeError> {
    let h = Elf::parse(data).map_err(|e| ModuleCodeError::BadElf(e.to_string()))?;
    let e = h
        .endian()
        .map_err(|e| ModuleCodeError::BadElf(e.to_string()))?;
    let phs = h
        .program_headers(e, data)
        .map_err(|e| ModuleCodeError::BadElf(e.to_string()))?;
    let mut out = Vec::new();
    for ph in phs {
        if ph.p_type(e) != elf::PT_LOAD {
            continue;
        }
        let Ok(d) = ph.data(e, data) else { continue };
        let vaddr: u64 = ph.p_vaddr(e).into();
        out.push((
            vaddr.wrapping_add(bias),
            d.to_vec(),
            ph.p_flags(e).0 & elf::PF_X.0 != 0,
        ));
    }
    Ok(out)
}

impl ModuleCode {
    /// No modules yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the module whose ELF file is `data`, loaded with `bias`
    /// (runtime address minus file address; 0 for a non-PIE executable).
    /// Copies its loaded segments, reads its function symbols and, on ARM,
    /// its `.ARM.exidx`.
    pub fn add_elf(&mut self, data: &[u8], bias: u64) -> Result<(), ModuleCodeError> {
        let segs = match data.get(4) {
            Some(2) => segments::<elf::FileHeader64<Endianness>>(data, bias)?,
            Some(1) => segments::<elf::FileHeader32<Endianness>>(data, bias)?,
            _ => return Err(ModuleCodeError::BadElf("no ELF class byte".into())),
        };
        let exidx = {
            use object::{Object, ObjectSection};
            object::File::parse(data).ok().and_then(|f| {
                let s = f.section_by_name(".ARM.exidx")?;
                Some((s.address().wrapping_add(bias), s.data().ok()?.to_vec()))
            })
        };
        let lo = segs.iter().map(|s| s.0).min().unwrap_or(0);
        let hi = segs
            .iter()
            .map(|s| s.0 + s.1.len() as u64)
            .max()
            .unwrap_or(0);
        function_symbols_split(data, bias, &mut self.functions, &mut self.cold);
        self.functions.sort_unstable();
        self.functions.dedup_by_key(|f| f.0);
        self.cold.sort_unstable();
        self.images.push(Image {
            segments: segs,
            exidx,
            lo,
            hi,
            file: true,
        });
        self.images.sort_by_key(|i| i.lo);
        Ok(())
    }

    /// Adds code that no ELF file holds, at `start`: a core's anonymous
    /// executable pages (qemu-user's signal trampolines, the vDSO image).
    /// Files added with [`ModuleCode::add_elf`] take precedence.
    pub fn add_region(&mut self, start: u64, bytes: Vec<u8>) {
        let hi = start + bytes.len() as u64;
        self.images.push(Image {
            segments: vec![(start, bytes, true)],
            exidx: None,
            lo: start,
            hi,
            file: false,
        });
        self.images.sort_by_key(|i| i.lo);
    }

    fn image(&self, addr: u64) -> Option<&Image> {
        self.images
            .iter()
            .find(|i| i.lo <= addr && addr < i.hi && i.file)
            .or_else(|| self.images.iter().find(|i| i.lo <= addr && addr < i.hi))
    }

    fn read(&self, addr: u64, buf: &mut [u8], exec_only: bool) -> usize {
        let files = self.images.iter().filter(|i| i.file);
        let regions = self.images.iter().filter(|i| !i.file);
        for img in files.chain(regions).filter(|i| i.lo <= addr && addr < i.hi) {
            for (s, d, x) in &img.segments {
                if (*x || !exec_only) && *s <= addr && addr < s + d.len() as u64 {
                    let o = (addr - s) as usize;
                    let n = buf.len().min(d.len() - o);
                    buf[..n].copy_from_slice(&d[o..o + n]);
                    return n;
                }
            }
        }
        0
    }
}

impl CodeMemory for ModuleCode {
    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        self.read(addr, buf, true)
    }

    fn function_bounds(&mut self, addr: u64) -> Option<(u64, u64)> {
        lookup_function(&self.functions, addr)
    }

    fn function_entry(&mut self, addr: u64) -> Option<(u64, Option<(u64, u64)>)> {
        function_entry_in(&self.functions, &self.cold, addr)
    }
}

impl ArmTables for ModuleCode {
    fn exidx_for(&mut self, pc: u64) -> Option<ExidxTable<'_>> {
        let (addr, data) = self.image(pc)?.exidx.as_ref()?;
        Some(ExidxTable { data, addr: *addr })
    }

    fn read_word(&mut self, addr: u64) -> Option<u32> {
        let mut b = [0u8; 4];
        (self.read(addr, &mut b, false) == 4).then(|| u32::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_an_error() {
        let mut c = ModuleCode::new();
        assert!(c.add_elf(b"not an elf", 0).is_err());
        assert!(c.add_elf(&[], 0).is_err());
        let mut b = [0u8; 4];
        assert_eq!(c.read_code(0x1000, &mut b), 0);
    }

    #[test]
    fn reads_own_executable() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let mut c = ModuleCode::new();
        c.add_elf(&exe, 0).unwrap();
        assert!(!c.functions.is_empty());
        let (s, _) = c.functions[c.functions.len() / 2];
        let mut b = [0u8; 4];
        assert_eq!(c.read_code(s, &mut b), 4);
    }
}
