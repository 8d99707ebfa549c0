//! The trace-file reader on arbitrary bytes: records or an error, never a
//! panic or an unbounded allocation. `cargo fuzz run tracefile`
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = callstack::tracefile::read_all(data);
});
