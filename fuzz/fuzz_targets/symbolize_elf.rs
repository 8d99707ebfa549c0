//! The DWARF/ELF path of the symbolizer on arbitrary bytes: opening must
//! give an error or a symbolizer, and every lookup an answer, never a
//! panic. `cargo fuzz run symbolize_elf fuzz/corpus/symbolize_elf`
#![no_main]

use callstack::symbolize::{Address, Symbolizer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut s) = Symbolizer::for_bytes(data.to_vec()) else {
        return;
    };
    // Addresses: a sweep of the usual text range, plus values taken from
    // the input itself (often section addresses of a mutated real file).
    for a in (0x1000..0x1400usize).step_by(5) {
        let _ = s.symbolize(Address::Exact(a));
    }
    for w in data.chunks_exact(8).take(64) {
        let a = u64::from_le_bytes(w.try_into().unwrap()) as usize;
        let _ = s.symbolize(Address::Return(a));
    }
});
