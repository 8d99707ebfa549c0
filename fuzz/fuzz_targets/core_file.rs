//! Fuzzes the ELF core reader: headers, notes (NT_PRSTATUS, NT_PRPSINFO,
//! NT_AUXV, NT_FILE), PT_LOAD segments, then unwinds every thread found
//! through the core's memory. Any input must give a result or an error,
//! never a panic.
//!
//! cargo +nightly fuzz run core_file fuzz/corpus/core_file
#![no_main]

use callstack::remote::corefile::{parse, CoreFile};
use callstack::remote::{unwind_thread, Lookup};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse(data);
    // No executable and an empty sysroot: only the bytes are exercised.
    let lookup = Lookup {
        sysroot: Some("/nonexistent-fuzz-sysroot".into()),
        debug_dirs: Vec::new(),
    };
    if let Ok(core) = CoreFile::from_vec(data.to_vec(), None, &lookup) {
        let mut mem = core.memory();
        for t in &core.snapshot().threads {
            let _ = unwind_thread(core.snapshot(), &mut mem, t, 64);
        }
    }
});
