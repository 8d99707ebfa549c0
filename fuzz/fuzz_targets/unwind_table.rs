//! Fuzz the CFI table compiler and the direct CFI evaluation: any bytes,
//! as an ELF image and as raw `.eh_frame` / `.debug_frame` sections, must
//! give a table or an error, and lookups and evaluations must not panic.
//!
//! cd fuzz && cargo +nightly fuzz run unwind_table corpus/unwind_table
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let _ = common::unwind_table(data);
});
