//! Fuzzes the ELF core reader: headers, notes (NT_PRSTATUS, NT_PRPSINFO,
//! NT_AUXV, NT_FILE), PT_LOAD segments, then unwinds every thread found
//! through the core's memory. Any input must give a result or an error,
//! never a panic.
//!
//! cd fuzz && cargo +nightly fuzz run core_file corpus/core_file
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::core_file(data);
});
