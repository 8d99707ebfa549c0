//! Fuzz the CFI table compiler and the direct CFI evaluation: any bytes,
//! as an ELF image and as raw `.eh_frame` / `.debug_frame` sections, must
//! give a table or an error, and lookups and evaluations must not panic.
#![no_main]
use callstack::arch::x86_64::X86_64;
use callstack::unwind::{Memory, ModuleSet, ReadError, SectionsInput, UnwindRegs, UnwindTable, Unwinder};
use libfuzzer_sys::fuzz_target;

struct Zeros;
impl Memory for Zeros {
    fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
        if addr & 0xfff == 0xff8 {
            Err(ReadError::OutOfBounds(addr))
        } else {
            Ok(addr.rotate_left(7))
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut tables = Vec::new();
    if let Ok(t) = UnwindTable::<X86_64>::from_elf_bytes(data) {
        tables.push(t);
    }
    let secs = SectionsInput {
        eh_frame: Some((data.to_vec(), 0x1000)),
        debug_frame: Some(data.to_vec()),
        ..Default::default()
    };
    if let Ok(t) = UnwindTable::<X86_64>::from_sections(secs) {
        tables.push(t);
    }
    for t in tables {
        let (lo, hi) = t.range();
        for a in [lo, lo + 1, (lo + hi) / 2, hi.saturating_sub(1), hi] {
            let _ = t.lookup(a);
        }
        let mut set: ModuleSet<X86_64> = ModuleSet::new();
        set.add(lo, hi.max(lo + 1), 0, t);
        let regs = UnwindRegs { pc: lo + 1, sp: 0x7000_0000, fp: 0x7000_0100, lr: 0 };
        let mut u = Unwinder::new(&set, regs, true);
        let mut n = 0;
        while u.next(&mut Zeros).is_some() && n < 64 {
            n += 1;
        }
    }
});
