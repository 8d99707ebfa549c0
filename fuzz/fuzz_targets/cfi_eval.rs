//! The capture path's direct CFI evaluation on arbitrary sections:
//! `.eh_frame_hdr` search, the fast `.eh_frame` interpreter, gimli for the
//! rest, expressions and rule application, for x86-64 and AArch64. Any
//! bytes give registers or an error, never a panic or a loop; and the fast
//! interpreter's row is gimli's whenever it gives one.
//! `make_cfi_seed.py` turns an ELF file into a seed.
//!
//! cd fuzz && cargo +nightly fuzz run cfi_eval corpus/cfi_eval
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    common::cfi_eval(data);
});
