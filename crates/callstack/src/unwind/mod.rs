//! Exact unwinding: DWARF CFI compiled into tables, frame-pointer fallback.
//!
//! Memory is read only through [`Memory`], so the same unwinder serves this
//! process, a core file and another process.
//!
//! # The pieces
//! - [`UnwindTable`]: the CFI of one module (`.eh_frame`, `.debug_frame`)
//!   compiled ahead into a sorted array of small `Copy` rules, one per
//!   address range ([`crate::arch::x86_64::UnwindRuleX86_64`]). Built from
//!   section bytes ([`UnwindTable::from_sections`]) or an ELF file
//!   ([`UnwindTable::from_elf_file`]). Rows the compiled form cannot express
//!   are evaluated directly from the CFI ([`cfi::evaluate`]), with storage on
//!   the stack.
//! - [`RuleSource`]: where the rules of an address come from. [`ModuleSet`]
//!   holds tables of modules at their load bias (a core file's or another
//!   process's libraries); the in-process source of
//!   [`crate::capture_exact`] adds a lock-free cache and the cold path.
//! - [`Unwinder`]: the walk. Starts from [`UnwindRegs`], yields [`Frame`]s
//!   with the [`Method`] that found each, stops with a [`StopReason`].
//! - [`Fallback`]: the hook for frames with neither CFI nor a valid frame
//!   pointer (instruction analysis, stack scanning).
//!
//! # Unwinding another process or a core
//! ```no_run
//! use callstack::unwind::{Memory, ModuleSet, ReadError, UnwindRegs, UnwindTable, Unwinder};
//! struct CoreStack { /* PT_LOAD segments */ }
//! impl Memory for CoreStack {
//!     fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
//!         Err(ReadError::Unreadable(addr)) // look the address up in the core
//!     }
//! }
//! let mut modules: ModuleSet = ModuleSet::new();
//! let table = UnwindTable::from_elf_file("/usr/lib/x86_64-linux-gnu/libc.so.6")?;
//! // The module's code is mapped at [start, end) with load bias `bias`.
//! let (start, end, bias) = (0x7f00_0000_0000u64, 0x7f00_0020_0000u64, 0x7f00_0000_0000u64);
//! modules.add(start, end, bias, table);
//! let regs = UnwindRegs { pc: 0x7f00_0001_2345, sp: 0x7ffc_0000_1000, fp: 0, lr: 0 };
//! let mut mem = CoreStack {};
//! let mut unwinder = Unwinder::new(&modules, regs, true);
//! while let Some(frame) = unwinder.next(&mut mem) {
//!     println!("{:#x} {:?}", frame.pc, frame.method);
//! }
//! println!("stopped: {:?}", unwinder.stop_reason());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cfi;
mod cfi_fast;
pub(crate) mod code;
#[cfg(not(windows))]
pub(crate) mod hook_table;
pub(crate) use cfi_fast::check_against_gimli;
pub mod insn;
// The in-process CFI capture (the ELF loader, the rule cache): not on
// Windows, whose capture is `capture_fast` alone for now.
#[cfg(not(windows))]
pub(crate) mod local;
// Windows x64 unwind data; read in process on Windows (`windows`), kept
// compiled and tested on every host (PE images are read offline too).
#[cfg_attr(not(windows), allow(dead_code))]
mod pdata;
mod table;
mod unwinder;
#[cfg(all(windows, callstack_fast))]
pub(crate) mod windows;

pub use crate::types::memory;
pub use crate::types::{Frame, Memory, Method, ReadError, StopReason, UnwindError, UnwindRegs};
pub use table::{SectionsInput, TableError, TableStats, UnwindTable};
pub use unwinder::{
    frame_pointer_step, Fallback, FastEnd, Found, NoFallback, RuleSource, Unwinder,
};

pub use crate::arch::aarch64::{Aarch64, UnwindRuleAarch64};
pub use crate::arch::riscv64::{Riscv64, UnwindRuleRiscv64};
pub use crate::arch::x86_64::{UnwindRuleX86_64, X86_64};
pub use crate::arch::{Applied, Arch, Machine, NativeArch};

/// Compiled tables of modules at their load addresses: the [`RuleSource`]
/// for unwinding a core file or another process.
///
/// A table is either given compiled ([`ModuleSet::add`]) or compiled the
/// first time an address of its module is looked up
/// ([`ModuleSet::add_lazy`]: a process maps hundreds of libraries, a stack
/// touches a few).
pub struct ModuleSet<A: Arch = NativeArch> {
    modules: Vec<SetEntry<A>>,
}

/// Makes a module's table on first use.
type Compile<A> = Box<dyn Fn() -> std::sync::Arc<UnwindTable<A>> + Send + Sync>;

struct SetEntry<A: Arch> {
    start: u64,
    end: u64,
    bias: u64,
    table: std::sync::OnceLock<std::sync::Arc<UnwindTable<A>>>,
    compile: Option<Compile<A>>,
}

impl<A: Arch> Default for ModuleSet<A> {
    fn default() -> Self {
        ModuleSet {
            modules: Vec::new(),
        }
    }
}

impl<A: Arch> ModuleSet<A> {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a module whose code occupies `[start, end)` at runtime, loaded
    /// with `bias` (runtime address minus file address).
    pub fn add(&mut self, start: u64, end: u64, bias: u64, table: UnwindTable<A>) {
        self.insert(SetEntry {
            start,
            end,
            bias,
            table: std::sync::OnceLock::from(std::sync::Arc::new(table)),
            compile: None,
        });
    }

    /// Adds a module as [`ModuleSet::add`] does, its table made by
    /// `compile` the first time an address in `[start, end)` is looked up
    /// (at most once).
    pub fn add_lazy(
        &mut self,
        start: u64,
        end: u64,
        bias: u64,
        compile: impl Fn() -> UnwindTable<A> + Send + Sync + 'static,
    ) {
        self.add_shared(start, end, bias, move || std::sync::Arc::new(compile()));
    }

    /// [`ModuleSet::add_lazy`] with a table that may be shared with other
    /// sets (the same file mapped by several processes: compiled once).
    pub fn add_shared(
        &mut self,
        start: u64,
        end: u64,
        bias: u64,
        compile: impl Fn() -> std::sync::Arc<UnwindTable<A>> + Send + Sync + 'static,
    ) {
        self.insert(SetEntry {
            start,
            end,
            bias,
            table: std::sync::OnceLock::new(),
            compile: Some(Box::new(compile)),
        });
    }

    /// Drops the table of the lazily added module that starts at `start`
    /// (compiled again at its next use); `false` when there is no such
    /// module or its table was given at [`ModuleSet::add`].
    pub fn forget(&mut self, start: u64) -> bool {
        let mut any = false;
        for m in &mut self.modules {
            if m.start == start && m.compile.is_some() && m.table.get().is_some() {
                m.table = std::sync::OnceLock::new();
                any = true;
            }
        }
        any
    }

    fn insert(&mut self, e: SetEntry<A>) {
        let i = self.modules.partition_point(|m| m.start <= e.start);
        self.modules.insert(i, e);
    }

    /// The module containing runtime address `addr`: its bias and table
    /// (compiled now if it was added lazily and not yet needed).
    pub fn find(&self, addr: u64) -> Option<(u64, &UnwindTable<A>)> {
        let i = self.modules.partition_point(|m| m.start <= addr);
        let m = self.modules.get(i.checked_sub(1)?)?;
        if addr >= m.end {
            return None;
        }
        let table = m.table.get_or_init(|| match &m.compile {
            Some(compile) => compile(),
            // Unreachable: an eager entry's table is set at `add`.
            None => std::sync::Arc::new(
                UnwindTable::empty().expect("an empty unwind table always builds"),
            ),
        });
        Some((m.bias, &**table))
    }
}

impl<A: Arch> RuleSource<A> for ModuleSet<A> {
    fn rule(&self, addr: u64) -> Found<A::Rule> {
        match self.find(addr) {
            Some((bias, t)) => Found::Rule(t.lookup(addr.wrapping_sub(bias))),
            None => Found::Unknown,
        }
    }

    fn evaluate<M: Memory + ?Sized>(
        &self,
        addr: u64,
        regs: &UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, UnwindError> {
        let Some((bias, t)) = self.find(addr) else {
            return Ok(Applied::NoCfi);
        };
        let svma = addr.wrapping_sub(bias);
        cfi::evaluate::<A, M>(&t.sections(), t.fde_for_evaluation(svma), svma, regs, mem)
    }
}
