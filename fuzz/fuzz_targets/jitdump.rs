//! A JIT runtime's jitdump file (`jit-PID.dump`) as `pstack` and `core`
//! read it: any bytes give the functions of the records before the first
//! bad one, or an error, never a panic.
//!
//! cd fuzz && cargo +nightly fuzz run jitdump corpus/jitdump
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::jitdump(data);
});
