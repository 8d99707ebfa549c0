//! One entry point for a thread of a core (or a stopped process) of any
//! architecture the analyzers know, from its `NT_PRSTATUS` registers.

use super::core_regs;
use super::{Method, ModuleCode, PrstatusError};
use crate::arch::Machine;
use crate::unwind::Memory;

/// Unwinds the thread whose `NT_PRSTATUS` descriptor is `prstatus` by
/// machine code (and EHABI tables on ARM), reading the stack through `mem`
/// (up to `stack_end`) and code through `code`. Writes `(pc, method)` per
/// frame (ARM pcs keep their Thumb bit) and returns how many.
pub fn unwind_prstatus<M: Memory + ?Sized>(
    arch: Machine,
    prstatus: &[u8],
    mem: &mut M,
    code: &mut ModuleCode,
    stack_end: u64,
    out: &mut [(u64, Method)],
) -> Result<usize, PrstatusError> {
    Ok(match arch {
        Machine::X86_64 => {
            let regs = core_regs::x86_64::unwind_regs(prstatus)?;
            super::walk::x86_64(regs, mem, code, stack_end, out).0
        }
        Machine::Aarch64 => {
            let regs = core_regs::aarch64::unwind_regs(prstatus)?;
            super::walk::risc::<super::aarch64::Arch, M, ModuleCode>(
                regs, mem, code, stack_end, out,
            )
        }
        Machine::Mips => {
            let regs = core_regs::mips::unwind_regs(prstatus)?;
            super::walk::risc::<super::mips::Arch, M, ModuleCode>(regs, mem, code, stack_end, out)
        }
        Machine::Riscv64 => {
            let regs = core_regs::riscv64::unwind_regs(prstatus)?;
            super::walk::risc::<super::riscv64::Arch, M, ModuleCode>(
                regs, mem, code, stack_end, out,
            )
        }
        Machine::Arm => {
            let r = core_regs::arm::all_regs(prstatus)?;
            let mut regs = [0u32; 16];
            regs.copy_from_slice(&r[..16]);
            if r[core_regs::arm::CPSR] as u64 & core_regs::arm::CPSR_T != 0 {
                regs[15] |= 1;
            }
            super::walk::arm(regs, mem, code, stack_end, out)
        }
    })
}
