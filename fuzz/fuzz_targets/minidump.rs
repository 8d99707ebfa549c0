//! Fuzzes the minidump reader: header, stream directory, thread list and
//! contexts, exception stream, memory lists, module list, the Linux
//! streams, then unwinds every thread found through the dump's memory. Any
//! input must give a result or an error, never a panic or a huge allocation.
//!
//! cd fuzz && cargo +nightly fuzz run minidump corpus/minidump
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::minidump(data);
});
