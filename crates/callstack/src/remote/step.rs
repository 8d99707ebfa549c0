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
            Tables::X86_64(set) => walk(set, self.snap, start, mem, max),
            Tables::Aarch64(set) => walk(set, self.snap, start, mem, max),
            Tables::Unsupported(a) => insn_walk(*a, self.snap, regs, start, mem, max),
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

/// How far above the first stack pointer the machine-code fallback may scan
/// (reads stop earlier at the end of the readable stack).
const SCAN_LIMIT: u64 = 64 << 20;

/// 32-bit ARM and MIPS: no compiled CFI tables; the machine-code unwinder
/// (EHABI tables on ARM, prologue analysis, stack scanning).
fn insn_walk<M: Memory + ?Sized>(
    arch: Arch,
    snap: &Snapshot,
    regs: &Registers,
    start: UnwindRegs,
    mem: &mut M,
    max: usize,
) -> Unwound {
    use crate::unwind::insn;
    let mut code = super::code::SnapshotCode::new(snap);
    let mut buf = vec![(0u64, unwind::Method::Context); max.max(1)];
    let end = start.sp.saturating_add(SCAN_LIMIT);
    let n = match arch {
        Arch::Arm => {
            let mut r = [0u32; 16];
            for (i, x) in r.iter_mut().enumerate() {
                *x = regs.get(i as u16).unwrap_or(0) as u32;
            }
            if regs.get(16).unwrap_or(0) & insn::core_regs::arm::CPSR_T != 0 {
                r[15] |= 1;
            }
            insn::arm::unwinder::walk(r, mem, &mut code, end, &mut buf)
        }
        Arch::Mips => {
            insn::risc::walk::<insn::mips::Arch, M, _>(start, mem, &mut code, end, &mut buf)
        }
        Arch::Aarch64 => {
            insn::risc::walk::<insn::aarch64::Arch, M, _>(start, mem, &mut code, end, &mut buf)
        }
        Arch::X86_64 => insn::x86_64::unwinder::walk(start, mem, &mut code, end, &mut buf).0,
    };
    let frames = buf[..n]
        .iter()
        .enumerate()
        .map(|(i, &(pc, m))| {
            let exact = i == 0 || m == unwind::Method::SignalFrame;
            let pc = if arch == Arch::Arm { pc & !1 } else { pc };
            Frame {
                pc,
                lookup: if exact { pc } else { pc.wrapping_sub(1) },
                method: method_of(m),
            }
        })
        .collect();
    Unwound {
        frames,
        stop: (n == max).then(|| format!("stopped after {max} frames")),
    }
}

fn method_of(m: unwind::Method) -> Method {
    match m {
        unwind::Method::Context | unwind::Method::SignalFrame => Method::Context,
        unwind::Method::Cfi => Method::Cfi,
        unwind::Method::FramePointer => Method::Fp,
        unwind::Method::Insn => Method::Insn,
        unwind::Method::Scan => Method::Scan,
    }
}

fn walk<A: crate::arch::Arch, M: Memory + ?Sized>(
    set: &LazySet<A>,
    snap: &Snapshot,
    start: UnwindRegs,
    mem: &mut M,
    max: usize,
) -> Unwound
where
    for<'x> crate::unwind::insn::InsnFallback<super::code::SnapshotCode<'x>>:
        crate::unwind::Fallback<A>,
{
    let mut out = Unwound::default();
    // Frames without CFI: instruction analysis, validated frame pointer,
    // verified stack scanning (code loaded lazily, module by module).
    crate::unwind::insn::warm_up();
    let fallback = crate::unwind::insn::InsnFallback::new(
        super::code::SnapshotCode::new(snap),
        start.sp.saturating_add(SCAN_LIMIT),
    );
    // A core's or a stopped thread's pc is exact: it was interrupted there.
    let mut u = Unwinder::with_fallback(set, start, true, fallback);
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
