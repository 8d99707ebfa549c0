//! A minimal, test-only view of an ELF core file (any class, little-endian):
//! memory from `PT_LOAD`, threads' `NT_PRSTATUS`, `NT_FILE` mappings, and
//! code and symbols from the mapped files (or from an executable given by
//! the test when the core has no `NT_FILE`, as qemu-user's cores).
//!
//! This exists only so the machine-code analyzers can be tested on real
//! cores before the core reader of `callstack core` (branch `remote`) lands;
//! it is not part of the library and is to be replaced by that reader.
#![allow(dead_code)]

use callstack::unwind::insn::{CodeMemory, ModuleCode};
use callstack::unwind::{Memory, ReadError};
use object::read::elf::{FileHeader, ProgramHeader};
use object::{elf, Endianness};
use std::path::{Path, PathBuf};

pub struct Core {
    pub segments: Vec<(u64, Vec<u8>)>,
    /// Executable PT_LOAD segments with data (anonymous code: qemu's signal
    /// trampolines, the vDSO).
    pub exec_segments: Vec<(u64, Vec<u8>)>,
    pub prstatus: Vec<Vec<u8>>,
    pub files: Vec<(u64, u64, u64, PathBuf)>,
    pub machine: u32,
    pub is64: bool,
}

fn parse<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Core {
    let h = Elf::parse(data).expect("core ELF header");
    let e = h.endian().unwrap();
    let mut core = Core {
        segments: vec![],
        exec_segments: vec![],
        prstatus: vec![],
        files: vec![],
        machine: h.e_machine(e).0 as u32,
        is64: h.is_class_64(),
    };
    for ph in h.program_headers(e, data).unwrap() {
        if ph.p_type(e) == elf::PT_LOAD {
            let d = ph.data(e, data).unwrap_or(&[]);
            core.segments.push((ph.p_vaddr(e).into(), d.to_vec()));
            if ph.p_flags(e).0 & elf::PF_X.0 != 0 && !d.is_empty() {
                core.exec_segments.push((ph.p_vaddr(e).into(), d.to_vec()));
            }
        }
        if let Ok(Some(mut notes)) = ph.notes(e, data) {
            while let Ok(Some(n)) = notes.next() {
                let desc = n.desc();
                match n.n_type(e) {
                    elf::NT_PRSTATUS => core.prstatus.push(desc.to_vec()),
                    elf::NT_FILE => core.files = parse_nt_file(desc, core.is64),
                    _ => {}
                }
            }
        }
    }
    core
}

fn parse_nt_file(d: &[u8], is64: bool) -> Vec<(u64, u64, u64, PathBuf)> {
    let w = if is64 { 8 } else { 4 };
    let rd = |o: usize| -> u64 {
        if is64 {
            u64::from_le_bytes(d[o..o + 8].try_into().unwrap())
        } else {
            u32::from_le_bytes(d[o..o + 4].try_into().unwrap()) as u64
        }
    };
    let count = rd(0) as usize;
    let page = rd(w);
    let mut names = d[2 * w + count * 3 * w..].split(|&b| b == 0);
    (0..count)
        .map(|i| {
            let o = 2 * w + i * 3 * w;
            let name = names.next().unwrap_or(&[]);
            (
                rd(o),
                rd(o + w),
                rd(o + 2 * w) * page,
                PathBuf::from(String::from_utf8_lossy(name).into_owned()),
            )
        })
        .collect()
}

impl Core {
    pub fn open(path: &Path) -> Core {
        let data = std::fs::read(path).expect("read core");
        if data.get(4) == Some(&2) {
            parse::<elf::FileHeader64<Endianness>>(&data)
        } else {
            parse::<elf::FileHeader32<Endianness>>(&data)
        }
    }

    /// The stack mapping (the PT_LOAD segment) holding `sp`: `[start, end)`.
    pub fn segment_of(&self, addr: u64) -> Option<(u64, u64)> {
        self.segments
            .iter()
            .find(|(s, d)| *s <= addr && addr < s + d.len() as u64)
            .map(|(s, d)| (*s, s + d.len() as u64))
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        for (s, d) in &self.segments {
            if *s <= addr && addr < s + d.len() as u64 {
                let o = (addr - s) as usize;
                let n = buf.len().min(d.len() - o);
                buf[..n].copy_from_slice(&d[o..o + n]);
                return n;
            }
        }
        0
    }
}

impl Memory for Core {
    fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
        let mut b = [0u8; 8];
        if self.read(addr, &mut b) == 8 {
            Ok(u64::from_le_bytes(b))
        } else {
            Err(ReadError::Unreadable(addr))
        }
    }

    fn read_u32(&mut self, addr: u64) -> Result<u32, ReadError> {
        let mut b = [0u8; 4];
        if self.read(addr, &mut b) == 4 {
            Ok(u32::from_le_bytes(b))
        } else {
            Err(ReadError::Unreadable(addr))
        }
    }
}

/// Code of the mapped files, through the library's `ModuleCode`: each file
/// placed where the core says (NT_FILE) or, for an executable without
/// NT_FILE entries, at its own addresses (static, non-PIE).
pub struct FileCode {
    pub code: ModuleCode,
    /// Files and their load bias and range, for symbolization in tests.
    pub modules: Vec<(PathBuf, u64, u64, u64)>,
}

impl FileCode {
    pub fn new(core: &Core, exe: &Path) -> FileCode {
        let mut fc = FileCode {
            code: ModuleCode::new(),
            modules: vec![],
        };
        let mut paths: Vec<PathBuf> = core.files.iter().map(|f| f.3.clone()).collect();
        paths.dedup();
        let exe_abs = exe.canonicalize().unwrap();
        if !paths
            .iter()
            .any(|p| p.canonicalize().ok().as_ref() == Some(&exe_abs))
        {
            paths.insert(0, exe.to_path_buf());
        }
        for path in paths {
            let Ok(data) = std::fs::read(&path) else {
                continue;
            };
            let segs = load_segments(&data);
            if segs.is_empty() {
                continue;
            }
            // Bias: where the mapping at file offset 0 starts, minus the
            // lowest segment address (0 for PIE and libraries).
            let min_vaddr = segs.iter().map(|s| s.0).min().unwrap_or(0) & !0xfff;
            let bias = core
                .files
                .iter()
                .find(|f| f.3.canonicalize().ok() == path.canonicalize().ok() && f.2 == 0)
                .map(|f| f.0 - min_vaddr)
                .unwrap_or(0);
            let lo = segs
                .iter()
                .filter(|s| s.1)
                .map(|s| s.0 + bias)
                .min()
                .unwrap_or(0);
            let hi = segs
                .iter()
                .filter(|s| s.1)
                .map(|s| s.0 + bias + s.2.len() as u64)
                .max()
                .unwrap_or(0);
            fc.code.add_elf(&data, bias).unwrap();
            fc.modules.push((path.clone(), bias, lo, hi));
        }
        for (start, bytes) in &core.exec_segments {
            fc.code.add_region(*start, bytes.clone());
        }
        fc
    }

    /// `(path, pc - bias)` of `pc`.
    pub fn module_offset(&self, pc: u64) -> Option<(PathBuf, u64)> {
        self.modules
            .iter()
            .find(|m| m.2 <= pc && pc < m.3)
            .map(|m| (m.0.clone(), pc - m.1))
    }
}

impl CodeMemory for FileCode {
    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        self.code.read_code(addr, buf)
    }

    fn function_bounds(&mut self, addr: u64) -> Option<(u64, u64)> {
        self.code.function_bounds(addr)
    }

    fn function_entry(&mut self, addr: u64) -> Option<(u64, Option<(u64, u64)>)> {
        self.code.function_entry(addr)
    }
}

/// `(p_vaddr, executable, file bytes)` of each `PT_LOAD` of an ELF file.
pub fn load_segments(data: &[u8]) -> Vec<(u64, bool, Vec<u8>)> {
    fn go<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Vec<(u64, bool, Vec<u8>)> {
        let Ok(h) = Elf::parse(data) else {
            return vec![];
        };
        let Ok(e) = h.endian() else { return vec![] };
        let Ok(phs) = h.program_headers(e, data) else {
            return vec![];
        };
        phs.iter()
            .filter(|ph| ph.p_type(e) == elf::PT_LOAD)
            .map(|ph| {
                (
                    ph.p_vaddr(e).into(),
                    ph.p_flags(e).0 & elf::PF_X.0 != 0,
                    ph.data(e, data).unwrap_or(&[]).to_vec(),
                )
            })
            .collect()
    }
    if data.get(4) == Some(&2) {
        go::<elf::FileHeader64<Endianness>>(data)
    } else {
        go::<elf::FileHeader32<Endianness>>(data)
    }
}
