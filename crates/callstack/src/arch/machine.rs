//! The one enum of the architectures callstack knows ([`Machine`]), the
//! registers of a thread of any of them ([`Registers`]) and the reading of
//! their kernel register blocks (`NT_PRSTATUS`, `PTRACE_GETREGSET`).
//!
//! Cores and live processes of every architecture are read on every host,
//! so this is compiled everywhere; each architecture's layout is in its
//! `arch/<name>/core_regs.rs`.

/// The architecture of a target, from its ELF `e_machine`.
///
/// Named after `e_machine` so as not to be confused with the
/// [`Arch`](super::Arch) trait (an architecture's compiled unwind rules):
/// this enum only says which register layout and word size a target has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    /// x86-64 (`EM_X86_64`).
    X86_64,
    /// AArch64 (`EM_AARCH64`).
    Aarch64,
    /// 32-bit ARM (`EM_ARM`).
    Arm,
    /// MIPS (`EM_MIPS`).
    Mips,
    /// RISC-V 64 (`EM_RISCV` with `ELFCLASS64`).
    Riscv64,
}

impl Machine {
    /// The architecture of an ELF `e_machine`, if we know it.
    pub fn from_e_machine(m: u16) -> Option<Machine> {
        match object::elf::Machine(m) {
            object::elf::EM_X86_64 => Some(Machine::X86_64),
            object::elf::EM_AARCH64 => Some(Machine::Aarch64),
            object::elf::EM_ARM => Some(Machine::Arm),
            object::elf::EM_MIPS => Some(Machine::Mips),
            _ => None,
        }
    }

    /// The architecture of an ELF `e_machine` and class (`is_64`:
    /// `ELFCLASS64`), if we know it: `EM_RISCV` names both RISC-V 32 and
    /// 64, and only the 64-bit one is known here.
    pub fn from_elf(m: u16, is_64: bool) -> Option<Machine> {
        match object::elf::Machine(m) {
            object::elf::EM_RISCV if is_64 => Some(Machine::Riscv64),
            _ => Machine::from_e_machine(m),
        }
    }

    /// The register slot of the program counter in [`Registers`].
    pub fn pc_reg(self) -> u16 {
        match self {
            Machine::X86_64 => super::x86_64::core_regs::DWARF_RIP,
            Machine::Aarch64 => super::aarch64::core_regs::DWARF_PC,
            Machine::Arm => super::arm::core_regs::PC as u16,
            Machine::Mips => super::mips::core_regs::PC_SLOT,
            Machine::Riscv64 => super::riscv64::core_regs::DWARF_PC,
        }
    }

    /// The register slot of the stack pointer.
    pub fn sp_reg(self) -> u16 {
        match self {
            Machine::X86_64 => super::x86_64::core_regs::DWARF_RSP,
            Machine::Aarch64 => super::aarch64::core_regs::DWARF_SP,
            Machine::Arm => super::arm::core_regs::SP as u16,
            Machine::Mips => super::mips::core_regs::DWARF_SP,
            Machine::Riscv64 => super::riscv64::core_regs::DWARF_SP,
        }
    }

    /// The register slot of the frame pointer.
    pub fn fp_reg(self) -> u16 {
        match self {
            Machine::X86_64 => super::x86_64::core_regs::DWARF_RBP,
            Machine::Aarch64 => super::aarch64::core_regs::DWARF_FP,
            Machine::Arm => super::arm::core_regs::R11 as u16,
            Machine::Mips => super::mips::core_regs::DWARF_FP,
            Machine::Riscv64 => super::riscv64::core_regs::DWARF_FP,
        }
    }

    /// The size of a pointer in bytes.
    pub fn word_size(self) -> u64 {
        match self {
            Machine::X86_64 | Machine::Aarch64 | Machine::Riscv64 => 8,
            Machine::Arm | Machine::Mips => 4,
        }
    }

    /// Reads a thread's registers from the kernel's register block of this
    /// architecture (`pr_reg` of `NT_PRSTATUS`, or `PTRACE_GETREGSET`).
    ///
    /// This is the one place per architecture that knows the layout; a new
    /// architecture adds its `arch/<arch>/core_regs.rs` and a line here.
    pub fn registers_from_user_regs(self, bytes: &[u8]) -> Option<Registers> {
        match self {
            Machine::X86_64 => super::x86_64::core_regs::from_user_regs(bytes),
            Machine::Aarch64 => super::aarch64::core_regs::from_user_regs(bytes),
            Machine::Arm => super::arm::core_regs::from_user_regs(bytes),
            Machine::Mips => super::mips::core_regs::from_user_regs(bytes),
            Machine::Riscv64 => super::riscv64::core_regs::from_user_regs(bytes),
        }
    }

    /// The `sample_regs_user` mask of a `perf_event` sample on this
    /// architecture (`arch/<arch>/perf_regs.rs`), or `None` where sampling
    /// is not implemented.
    pub fn perf_regs_mask(self) -> Option<u64> {
        match self {
            Machine::X86_64 => Some(super::x86_64::perf_regs::PERF_REGS_MASK),
            Machine::Aarch64 => Some(super::aarch64::perf_regs::PERF_REGS_MASK),
            Machine::Arm | Machine::Mips | Machine::Riscv64 => None,
        }
    }

    /// A thread's registers from a `perf_event` sample's user register
    /// block: `words` hold the registers of [`Machine::perf_regs_mask`] in
    /// increasing bit order. `None` when their number is wrong or the
    /// architecture has no mask.
    pub fn registers_from_perf(self, words: &[u64]) -> Option<Registers> {
        match self {
            Machine::X86_64 => super::x86_64::perf_regs::from_perf_regs(words),
            Machine::Aarch64 => super::aarch64::perf_regs::from_perf_regs(words),
            Machine::Arm | Machine::Mips | Machine::Riscv64 => None,
        }
    }

    /// Where `pr_pid` and `pr_reg` sit in this architecture's
    /// `struct elf_prstatus` (the note is laid out per architecture).
    pub fn prstatus_layout(self) -> Option<PrstatusLayout> {
        match self {
            Machine::X86_64 => Some(PrstatusLayout {
                pid_offset: super::x86_64::core_regs::PR_PID_OFFSET,
                regs_offset: super::x86_64::core_regs::PR_REG_OFFSET,
            }),
            Machine::Aarch64 => Some(PrstatusLayout {
                pid_offset: super::aarch64::core_regs::PR_PID_OFFSET,
                regs_offset: super::aarch64::core_regs::PR_REG_OFFSET,
            }),
            Machine::Arm => Some(PrstatusLayout {
                pid_offset: super::arm::core_regs::PR_PID_OFFSET,
                regs_offset: super::arm::core_regs::PR_REG_OFFSET,
            }),
            Machine::Mips => Some(PrstatusLayout {
                pid_offset: super::mips::core_regs::PR_PID_OFFSET,
                regs_offset: super::mips::core_regs::PR_REG_OFFSET,
            }),
            Machine::Riscv64 => Some(PrstatusLayout {
                pid_offset: super::riscv64::core_regs::PR_PID_OFFSET,
                regs_offset: super::riscv64::core_regs::PR_REG_OFFSET,
            }),
        }
    }
}

/// Offsets inside an `NT_PRSTATUS` descriptor.
#[derive(Clone, Copy, Debug)]
pub struct PrstatusLayout {
    /// Offset of `pr_pid` (the thread id, 32 bits).
    pub pid_offset: usize,
    /// Offset of `pr_reg` (the register block).
    pub regs_offset: usize,
}

/// Number of register slots in [`Registers`].
pub const MAX_REGS: usize = 64;

/// A thread's registers, indexed by DWARF register number (plus an
/// architecture-chosen slot for the pc where DWARF has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registers {
    /// The architecture the numbers refer to.
    pub arch: Machine,
    values: [u64; MAX_REGS],
    valid: u64,
}

impl Registers {
    /// No register known.
    pub fn new(arch: Machine) -> Registers {
        Registers {
            arch,
            values: [0; MAX_REGS],
            valid: 0,
        }
    }
    /// The value of register `r`, if known.
    pub fn get(&self, r: u16) -> Option<u64> {
        let r = r as usize;
        (r < MAX_REGS && self.valid & (1 << r) != 0).then(|| self.values[r])
    }
    /// Sets register `r` (ignored beyond [`MAX_REGS`]).
    pub fn set(&mut self, r: u16, v: u64) {
        let r = r as usize;
        if r < MAX_REGS {
            self.values[r] = v;
            self.valid |= 1 << r;
        }
    }
    /// Forgets register `r`.
    pub fn clear(&mut self, r: u16) {
        if (r as usize) < MAX_REGS {
            self.valid &= !(1 << r);
        }
    }
    /// The program counter.
    pub fn pc(&self) -> Option<u64> {
        self.get(self.arch.pc_reg())
    }
    /// The stack pointer.
    pub fn sp(&self) -> Option<u64> {
        self.get(self.arch.sp_reg())
    }
    /// The frame pointer.
    pub fn fp(&self) -> Option<u64> {
        self.get(self.arch.fp_reg())
    }
}

/// Why registers could not be read from an `NT_PRSTATUS` note.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrstatusError {
    /// The descriptor is shorter than the architecture's `elf_prstatus`.
    TooShort {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
}

impl core::fmt::Display for PrstatusError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PrstatusError::TooShort { need, have } => {
                write!(f, "NT_PRSTATUS note too short: {have} bytes, need {need}")
            }
        }
    }
}

impl std::error::Error for PrstatusError {}

/// Word `i` of `pr_reg` (little-endian, `size` 4 or 8 bytes) in an
/// `NT_PRSTATUS` descriptor whose `pr_reg` starts at `offset` and holds
/// `nregs` words.
pub fn prstatus_word(
    desc: &[u8],
    offset: usize,
    nregs: usize,
    size: usize,
    i: usize,
) -> Result<u64, PrstatusError> {
    let need = offset + nregs * size;
    if desc.len() < need || i >= nregs {
        return Err(PrstatusError::TooShort {
            need,
            have: desc.len(),
        });
    }
    let s = &desc[offset + i * size..offset + (i + 1) * size];
    Ok(if size == 4 {
        u32::from_le_bytes(s.try_into().unwrap()) as u64
    } else {
        u64::from_le_bytes(s.try_into().unwrap())
    })
}
