//! A CPython code object's line table as `pstack` and `core` decode it
//! (read from the target's memory, so any bytes): every format, every
//! offset, an answer or `None`, never a panic.
//!
//! cd fuzz && cargo +nightly fuzz run python_lines corpus/python_lines
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::python_lines(data);
});
