//! Fuzzes the ARM EHABI parser and interpreter: the first 64 bytes are an
//! `.ARM.exidx` table at 0x8000, the rest `.ARM.extab` words at 0x9000 and
//! a stack at 0x7000_0000. Any input gives a result or an error, never a
//! panic or a loop.
//!
//! cd fuzz && cargo +nightly fuzz run ehabi corpus/ehabi
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::ehabi(data);
});
