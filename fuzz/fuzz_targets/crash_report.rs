//! Fuzzes the raw crash-report reader (`callstack crash-report`, and the
//! helper a crashing process runs): any text must give reports or none,
//! never a panic. Symbolizing is exercised too, on the paths the input
//! names (usually missing files: module+offset frames).
//!
//! cargo +nightly fuzz run crash_report fuzz/corpus/crash_report
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let reports = callstack::crash::parse_raw_reports(&text);
    if reports.iter().map(|r| r.frames.len()).sum::<usize>() < 64 {
        let _ = callstack::crash::symbolize_report(&text);
    }
});
