//! Fuzzes the instruction analyzers of every architecture and the walks
//! built on them: the input is code at 0x1000 and, from its middle on, also
//! the stack. Any input gives a result or nothing, never a panic or a loop.
//!
//! cd fuzz && cargo +nightly fuzz run insn_code corpus/insn_code
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::insn_code(data);
});
