//! `/proc/<pid>/maps` text as the readers see it: every line through the
//! signal-safe range parser (stack bounds) and the crash handler's line
//! parser. Any bytes give a mapping or nothing, never a panic.
//!
//! cd fuzz && cargo +nightly fuzz run proc_maps corpus/proc_maps
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::proc_maps(data);
});
