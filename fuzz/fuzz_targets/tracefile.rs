//! The trace-file reader on arbitrary bytes: records or an error, never a
//! panic or an unbounded allocation.
//!
//! cd fuzz && cargo +nightly fuzz run tracefile corpus/tracefile
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::tracefile(data);
});
