//! Fuzzes the raw crash-report reader (`callstack crash-report`, and the
//! helper a crashing process runs): any text must give reports or none,
//! never a panic. Symbolizing is exercised too, on the paths the input
//! names (usually missing files: module+offset frames).
//!
//! cd fuzz && cargo +nightly fuzz run crash_report corpus/crash_report
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::crash_report(data);
});
