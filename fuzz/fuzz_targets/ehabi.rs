//! Fuzzes the ARM EHABI parser and interpreter: the first 64 bytes are an
//! `.ARM.exidx` table at 0x8000, the rest `.ARM.extab` words at 0x9000 and
//! a stack at 0x7000_0000. Any input gives a result or an error, never a
//! panic or a loop.
//!
//! cargo +nightly fuzz run ehabi fuzz/corpus/ehabi
#![no_main]

use callstack::unwind::insn::arm::ehabi::{execute, opcodes, ExidxTable, MAX_OPCODES};
use libfuzzer_sys::fuzz_target;

mod common;
use common::Stack;

fuzz_target!(|data: &[u8]| {
    let (table, rest) = data.split_at(data.len().min(64));
    let t = ExidxTable { data: table, addr: 0x8000 };
    let read = |a: u64| -> Option<u32> {
        let o = a.checked_sub(0x9000)? as usize;
        rest.get(o..o + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let mut buf = [0u8; MAX_OPCODES];
    for i in 0..t.len() {
        let Some(start) = t.function_start(i) else { continue };
        if let Ok((_, e)) = t.lookup(start) {
            if let Ok(n) = opcodes(e, read, &mut buf) {
                let mut regs = [0x7000_0000u32; 16];
                let _ = execute(&buf[..n], &mut regs, &mut Stack(rest));
            }
        }
    }
});
