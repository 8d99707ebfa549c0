//! The demangler on arbitrary names (symbol names come from the files being
//! symbolized): Rust legacy and v0, C++ Itanium. Any name gives a string,
//! never a panic, a stack overflow or a runaway output.
//!
//! cd fuzz && cargo +nightly fuzz run demangle corpus/demangle
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::demangle(data);
});
