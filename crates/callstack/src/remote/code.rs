//! The code of a [`Snapshot`]'s modules for the machine-code unwinder
//! (`unwind::insn`): each module's ELF file (or in-memory image) is loaded
//! into a [`ModuleCode`] the first time a frame without CFI lands in it.

use super::{Module, Snapshot};
use crate::unwind::insn::arm::ehabi::ExidxTable;
use crate::unwind::insn::arm::unwinder::ArmTables;
use crate::unwind::insn::{CodeMemory, ModuleCode};

/// Lazily loaded code of a snapshot's modules.
pub(crate) struct SnapshotCode<'s> {
    modules: &'s [Module],
    loaded: Vec<bool>,
    code: ModuleCode,
}

impl<'s> SnapshotCode<'s> {
    pub(crate) fn new(snap: &'s Snapshot) -> Self {
        SnapshotCode {
            modules: &snap.modules,
            loaded: vec![false; snap.modules.len()],
            code: ModuleCode::new(),
        }
    }

    fn ensure(&mut self, addr: u64) {
        let Some(i) = self
            .modules
            .iter()
            .position(|m| m.start <= addr && addr < m.end)
        else {
            return;
        };
        if self.loaded[i] {
            return;
        }
        self.loaded[i] = true;
        let m = &self.modules[i];
        // A module that cannot be read simply has no code to analyze.
        if let Some(img) = &m.image {
            let _ = self.code.add_elf(img, m.bias);
        } else if let Some(f) = &m.file {
            if let Ok(map) = super::files::map_file(f) {
                let _ = self.code.add_elf(&map, m.bias);
            }
        }
    }
}

impl CodeMemory for SnapshotCode<'_> {
    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        self.ensure(addr);
        self.code.read_code(addr, buf)
    }

    fn function_bounds(&mut self, addr: u64) -> Option<(u64, u64)> {
        self.ensure(addr);
        self.code.function_bounds(addr)
    }

    fn function_entry(&mut self, addr: u64) -> Option<(u64, Option<(u64, u64)>)> {
        self.ensure(addr);
        self.code.function_entry(addr)
    }
}

impl ArmTables for SnapshotCode<'_> {
    fn exidx_for(&mut self, pc: u64) -> Option<ExidxTable<'_>> {
        self.ensure(pc);
        self.code.exidx_for(pc)
    }

    fn read_word(&mut self, addr: u64) -> Option<u32> {
        self.ensure(addr);
        self.code.read_word(addr)
    }
}
