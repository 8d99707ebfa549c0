//! The 32-bit ARM unwind step: EHABI tables first (method `cfi`), then
//! prologue analysis (`insn`), the frame record (`fp`: r7 in Thumb code, r11
//! in ARM code) and stack scanning (`scan`).

use super::ehabi::{self, ExidxTable, MAX_OPCODES};
use super::instruction_analysis::{call_before, prologue};
use crate::arch::scan::{self, CallBefore};
use crate::types::Memory;
use crate::types::{CodeMemory, Method};

/// The unwind tables of the modules, for EHABI.
pub trait ArmTables {
    /// The `.ARM.exidx` of the module holding `pc`.
    fn exidx_for(&mut self, pc: u64) -> Option<ExidxTable<'_>>;
    /// A 32-bit word of a module's image (for `.ARM.extab`).
    fn read_word(&mut self, addr: u64) -> Option<u32>;
}

/// Code without tables: prologue analysis only.
#[derive(Debug, Clone)]
pub struct NoTables<C>(pub C);

impl<C: CodeMemory> CodeMemory for NoTables<C> {
    fn read_code(&mut self, addr: u64, buf: &mut [u8]) -> usize {
        self.0.read_code(addr, buf)
    }
    fn is_executable(&mut self, addr: u64) -> bool {
        self.0.is_executable(addr)
    }
    fn function_bounds(&mut self, addr: u64) -> Option<(u64, u64)> {
        self.0.function_bounds(addr)
    }
    fn function_entry(&mut self, addr: u64) -> Option<(u64, Option<(u64, u64)>)> {
        self.0.function_entry(addr)
    }
    fn is_unread_code(&mut self, addr: u64) -> bool {
        self.0.is_unread_code(addr)
    }
}

impl<C> ArmTables for NoTables<C> {
    fn exidx_for(&mut self, _pc: u64) -> Option<ExidxTable<'_>> {
        None
    }
    fn read_word(&mut self, _addr: u64) -> Option<u32> {
        None
    }
}

/// The core registers r0..r15; r15's bit 0 says Thumb.
pub type ArmRegs = [u32; 16];

fn after_call<C: CodeMemory + ?Sized>(code: &mut C, ra: u32) -> bool {
    ra > 4096
        && (call_before(code, ra as u64).is_some()
            || super::signal::is_trampoline(code, ra as u64).is_some())
}

fn read<M: Memory + ?Sized>(mem: &mut M, a: i64) -> Option<u32> {
    if !(0..=u32::MAX as i64).contains(&a) {
        return None;
    }
    mem.read_u32(a as u64).ok()
}

/// Unwinds one frame. `first`: `regs[15]` is an exact pc. `code` reads the
/// code and gives the EHABI tables (wrap a plain reader in [`NoTables`]).
pub fn step<M, C>(
    regs: &ArmRegs,
    mem: &mut M,
    code: &mut C,
    first: bool,
    stack_end: u64,
) -> Option<(ArmRegs, Method)>
where
    M: Memory + ?Sized,
    C: CodeMemory + ArmTables + ?Sized,
{
    let pc = regs[15] as u64;
    // A signal frame: the handler returned to the trampoline; below is the
    // interrupted code at its exact pc.
    if let Some(rt) = super::signal::is_trampoline(code, pc) {
        if let Some(r) = super::signal::restore(regs[13], mem, rt) {
            return Some((r, Method::SignalFrame));
        }
    }
    let addr = pc & !1;
    let lookup = if first { addr } else { addr.wrapping_sub(1) };
    let sp = regs[13] as u64;
    let ok = |n: &ArmRegs, code: &mut C| -> bool {
        (n[13] as u64) >= sp && (n[13] as u64) <= stack_end && after_call(code, n[15])
    };

    // 1. EHABI.
    let mut ops = [0u8; MAX_OPCODES];
    let entry = code.exidx_for(lookup).and_then(|t| t.lookup(lookup).ok());
    if let Some((_, e)) = entry {
        if let Ok(n) = ehabi::opcodes(e, |a| code.read_word(a), &mut ops) {
            let mut r = *regs;
            if ehabi::execute(&ops[..n], &mut r, mem).is_ok()
                && ok(&r, code)
                && (r[13] as u64 > sp || first)
            {
                return Some((r, Method::Cfi));
            }
        }
    }

    // 2. Prologue analysis.
    let fn_entry = code.function_entry(lookup).map(|e| e.0);
    if let Some(rule) = prologue::analyze(code, pc, fn_entry, first) {
        let cfa = match rule.cfa_from_fp {
            None => sp as i64 + rule.cfa_offset as i64,
            Some((r, off)) => regs[r as usize] as i64 + off as i64,
        };
        let mut n = *regs;
        let lr = match rule.lr_at {
            Some(o) => read(mem, cfa + o as i64),
            None => Some(regs[14]),
        };
        if let Some(lr) = lr {
            n[15] = lr;
            n[14] = lr;
            n[13] = cfa as u32;
            if let Some(o) = rule.r7_at {
                n[7] = read(mem, cfa + o as i64).unwrap_or(n[7]);
            }
            if let Some(o) = rule.r11_at {
                n[11] = read(mem, cfa + o as i64).unwrap_or(n[11]);
            }
            let moved = n[13] as u64 > sp || (first && rule.lr_at.is_none());
            if moved && ok(&n, code) {
                return Some((n, Method::Insn));
            }
        }
    }

    // 3. The frame record: Thumb r7 -> {r7, lr}; ARM r11 -> {.., fp, lr} with fp at lr.
    let thumb = pc & 1 != 0;
    let rec = if thumb {
        let f = regs[7] as i64;
        (f > sp as i64)
            .then(|| Some((read(mem, f)?, read(mem, f + 4)?, f + 8)))
            .flatten()
    } else {
        let f = regs[11] as i64;
        (f > sp as i64)
            .then(|| Some((read(mem, f - 4)?, read(mem, f)?, f + 4)))
            .flatten()
    };
    if let Some((prev, lr, new_sp)) = rec {
        let mut n = *regs;
        if thumb {
            n[7] = prev;
        } else {
            n[11] = prev;
        }
        n[15] = lr;
        n[14] = lr;
        n[13] = new_sp as u32;
        if ok(&n, code) && n[13] as u64 > sp {
            return Some((n, Method::FramePointer));
        }
    }

    // 4. Scan, verified by prologue analysis from the call's target.
    let mut verify = |code: &mut C, target: u64, slot: u64| -> bool {
        match prologue::analyze(code, pc, Some(target), false) {
            Some(rule) if rule.cfa_from_fp.is_none() => rule
                .lr_at
                .is_some_and(|o| sp as i64 + rule.cfa_offset as i64 + o as i64 == slot as i64),
            _ => false,
        }
    };
    let hit = scan::scan(
        mem,
        code,
        addr,
        sp,
        stack_end,
        4,
        call_before_t::<C>,
        Some(&mut verify),
    )?;
    let mut n = *regs;
    n[15] = hit.ra as u32;
    n[14] = hit.ra as u32;
    n[13] = (hit.slot + 4) as u32;
    Some((n, Method::Scan))
}

fn call_before_t<C: CodeMemory + ?Sized>(code: &mut C, ra: u64) -> Option<CallBefore> {
    call_before(code, ra)
}
