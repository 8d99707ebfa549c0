//! Unwinding the threads of another process with the crate's unwinder
//! ([`crate::unwind::Unwinder`]: compiled CFI tables first, then the
//! frame-pointer rule), reading memory from the core or the live process.
//!
//! [`RemoteUnwinder`] is the one place that ties a [`Snapshot`] to the
//! unwinder: it compiles each module's CFI table the first time a frame
//! lands in that module (from the file on disk, or from the vDSO image read
//! out of the target), and maps the target's architecture to the
//! unwinder's.

use std::cell::OnceCell;

use super::{Arch, Frame, Method, Module, Registers, Snapshot, Thread};
use crate::arch::aarch64::Aarch64;
use crate::arch::x86_64::X86_64;
use crate::arch::Applied;
use crate::unwind::{
    self, Found, Memory, RuleSource, StopReason, UnwindError, UnwindRegs, UnwindTable, Unwinder,
};

/// The frames of one thread and why the walk ended early, if it did.
#[derive(Clone, Debug, Default)]
pub struct Unwound {
    /// Innermost first.
    pub frames: Vec<Frame>,
    /// Set when the walk stopped before the outermost frame: why.
    pub stop: Option<String>,
}

/// One module's place and, once needed, its compiled CFI.
struct LazyModule<A: crate::arch::Arch> {
    start: u64,
    end: u64,
    bias: u64,
    source: TableSource,
    table: OnceCell<UnwindTable<A>>,
}

enum TableSource {
    File(std::path::PathBuf),
    Image(std::sync::Arc<Vec<u8>>),
    /// No usable file: frames here are unwound by frame pointer.
    None,
}

/// The modules of a snapshot as a [`RuleSource`], compiling tables lazily.
struct LazySet<A: crate::arch::Arch> {
    modules: Vec<LazyModule<A>>,
}

impl<A: crate::arch::Arch> LazySet<A> {
    fn new(mods: &[Module]) -> Self {
        let mut modules: Vec<LazyModule<A>> = mods
            .iter()
            .map(|m| LazyModule {
                start: m.start,
                end: m.end,
                bias: m.bias,
                source: match (&m.image, &m.file) {
                    (Some(img), _) => TableSource::Image(img.clone()),
                    (None, Some(f)) => TableSource::File(f.clone()),
                    (None, None) => TableSource::None,
                },
                table: OnceCell::new(),
            })
            .collect();
        modules.sort_by_key(|m| m.start);
        LazySet { modules }
    }

    fn find(&self, addr: u64) -> Option<(u64, &UnwindTable<A>)> {
        let i = self.modules.partition_point(|m| m.start <= addr);
        let m = self.modules.get(i.checked_sub(1)?)?;
        if addr >= m.end {
            return None;
        }
        let table = m.table.get_or_init(|| {
            let t = match &m.source {
                TableSource::File(p) => match super::files::map_file(p) {
                    Ok(map) => UnwindTable::from_elf_bytes(&map),
                    Err(e) => Err(unwind::TableError::Io(e)),
                },
                TableSource::Image(img) => UnwindTable::from_elf_bytes(img),
                TableSource::None => UnwindTable::empty(),
            };
            // A file whose CFI cannot be read is unwound by frame pointer.
            t.or_else(|_| UnwindTable::empty())
                .expect("an empty unwind table always builds")
        });
        Some((m.bias, table))
    }
}

impl<A: crate::arch::Arch> RuleSource<A> for LazySet<A> {
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
        unwind::cfi::evaluate::<A, M>(&t.sections(), t.fde_for_evaluation(svma), svma, regs, mem)
    }
}

enum Tables {
    X86_64(LazySet<X86_64>),
    Aarch64(LazySet<Aarch64>),
    Unsupported(Arch),
}

/// Unwinds the threads of one [`Snapshot`], sharing compiled tables
/// between threads.
pub struct RemoteUnwinder<'s> {
    snap: &'s Snapshot,
    tables: Tables,
}

impl<'s> RemoteUnwinder<'s> {
    /// An unwinder for the threads of `snap`. Nothing is compiled yet.
    pub fn new(snap: &'s Snapshot) -> Self {
        let tables = match snap.arch {
            Arch::X86_64 => Tables::X86_64(LazySet::new(&snap.modules)),
            Arch::Aarch64 => Tables::Aarch64(LazySet::new(&snap.modules)),
            a => Tables::Unsupported(a),
        };
        RemoteUnwinder { snap, tables }
    }

    /// Unwinds thread `t`, reading memory through `mem`, at most `max` frames.
    pub fn unwind<M: Memory + ?Sized>(&self, mem: &mut M, t: &Thread, max: usize) -> Unwound {
        let regs = &t.registers;
        let Some(pc) = regs.pc() else {
            return Unwound {
                frames: Vec::new(),
                stop: Some("no program counter in the thread's registers".into()),
            };
        };
        let start = UnwindRegs {
            pc,
            sp: regs.sp().unwrap_or(0),
            fp: regs.fp().unwrap_or(0),
            lr: lr_of(regs),
        };
        match &self.tables {
            Tables::X86_64(set) => walk(set, start, mem, max),
            Tables::Aarch64(set) => walk(set, start, mem, max),
            Tables::Unsupported(a) => Unwound {
                frames: vec![Frame {
                    pc,
                    lookup: pc,
                    method: Method::Context,
                }],
                stop: Some(format!("no unwinder for {a:?} yet")),
            },
        }
    }

    /// The snapshot being unwound.
    pub fn snapshot(&self) -> &Snapshot {
        self.snap
    }
}

fn lr_of(regs: &Registers) -> u64 {
    match regs.arch {
        Arch::Aarch64 => regs.get(30).unwrap_or(0),
        Arch::Arm => regs.get(14).unwrap_or(0),
        Arch::Mips => regs.get(31).unwrap_or(0),
        Arch::X86_64 => 0,
    }
}

fn walk<A: crate::arch::Arch, M: Memory + ?Sized>(
    set: &LazySet<A>,
    start: UnwindRegs,
    mem: &mut M,
    max: usize,
) -> Unwound {
    let mut out = Unwound::default();
    // A core's or a stopped thread's pc is exact: it was interrupted there.
    let mut u: Unwinder<'_, A, LazySet<A>> = Unwinder::new(set, start, true);
    while out.frames.len() < max {
        let Some(f) = u.next(mem) else { break };
        out.frames.push(Frame {
            pc: f.pc,
            lookup: f.lookup_address(),
            method: match f.method {
                unwind::Method::Context | unwind::Method::SignalFrame => Method::Context,
                unwind::Method::Cfi => Method::Cfi,
                unwind::Method::FramePointer => Method::Fp,
                unwind::Method::Insn => Method::Insn,
                unwind::Method::Scan => Method::Scan,
            },
        });
    }
    out.stop = match u.stop_reason() {
        StopReason::Running if out.frames.len() >= max => {
            Some(format!("stopped after {max} frames"))
        }
        StopReason::Running | StopReason::Outermost => None,
        StopReason::UnknownModule(pc) => Some(format!("{pc:#x} is in no known module")),
        StopReason::NoRule(pc) => Some(format!(
            "no CFI and no frame pointer to unwind the frame at {pc:#x}"
        )),
        StopReason::Error(e) => Some(e.to_string()),
        StopReason::BufferFull => Some(format!("stopped after {max} frames")),
    };
    out
}

/// Unwinds thread `t` of `snap` (a one-off [`RemoteUnwinder`]; use one
/// [`RemoteUnwinder`] for all threads of a snapshot to share its tables).
pub fn unwind_thread<M: Memory + ?Sized>(
    snap: &Snapshot,
    mem: &mut M,
    t: &Thread,
    max: usize,
) -> Unwound {
    RemoteUnwinder::new(snap).unwind(mem, t, max)
}
