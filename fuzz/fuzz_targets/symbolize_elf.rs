//! The DWARF/ELF path of the symbolizer on arbitrary bytes: opening must
//! give an error or a symbolizer, and every lookup an answer, never a
//! panic.
//!
//! cd fuzz && cargo +nightly fuzz run symbolize_elf corpus/symbolize_elf
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::symbolize_elf(data);
});
