//! An in-memory ELF image of another process (the vDSO read from a core or
//! a live process), as `callstack::remote` reads it: build-id, load
//! segments and bias, then symbols and DWARF through the remote
//! symbolizer. Any bytes give an answer or nothing, never a panic.
//!
//! cd fuzz && cargo +nightly fuzz run remote_image corpus/remote_image
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::remote_image(data);
});
