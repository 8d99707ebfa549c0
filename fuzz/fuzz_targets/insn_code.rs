//! Fuzzes the instruction analyzers of every architecture and the walks
//! built on them: the input is code at 0x1000 and, from its middle on, also
//! the stack. Any input gives a result or nothing, never a panic or a loop.
//!
//! cargo +nightly fuzz run insn_code fuzz/corpus/insn_code
#![no_main]

use callstack::unwind::insn::{aarch64, arm, mips, risc, x86_64, Method, SliceCode, UnwindRegs};
use libfuzzer_sys::fuzz_target;

mod common;
use common::Stack;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let pc = 0x1000 + (u16::from_le_bytes([data[0], data[1]]) as u64 % data.len() as u64);
    let mut c = SliceCode::new(0x1000, data);
    let _ = x86_64::epilogue::analyze(&mut c, pc, None);
    let _ = x86_64::prologue::analyze(&mut c, 0x1000, pc, None);
    let _ = aarch64::prologue::analyze(&mut c, pc & !3, None, true);
    let _ = mips::prologue::analyze(&mut c, pc & !3, None, false);
    let _ = arm::prologue::analyze(&mut c, pc | 1, None, false);
    let stack_bytes = &data[data.len() / 2..];
    let end = 0x7000_0000 + stack_bytes.len() as u64;
    let regs = UnwindRegs { pc, sp: 0x7000_0000, fp: 0x7000_0010, lr: pc };
    let mut out = [(0u64, Method::Context); 16];
    let _ = x86_64::unwinder::walk(regs, &mut Stack(stack_bytes), &mut c, end, &mut out);
    let _ = risc::walk::<aarch64::Arch, _, _>(regs, &mut Stack(stack_bytes), &mut c, end, &mut out);
    let _ = risc::walk::<mips::Arch, _, _>(regs, &mut Stack(stack_bytes), &mut c, end, &mut out);
});
