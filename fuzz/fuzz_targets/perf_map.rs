//! A JIT runtime's perf map (`/tmp/perf-PID.map`) as `pstack` and `core`
//! read it: any bytes give a map or an error naming the line, never a
//! panic, and lookups anywhere answer.
//!
//! cd fuzz && cargo +nightly fuzz run perf_map corpus/perf_map
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::perf_map(data);
});
