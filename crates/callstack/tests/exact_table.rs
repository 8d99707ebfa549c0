//! Compiled unwind tables from files, and the generic unwinder over a
//! `ModuleSet` with a `Memory` of our own: the path a core-file or
//! other-process unwinder takes.

#[cfg(target_arch = "x86_64")]
use callstack::unwind::UnwindRuleX86_64;
use callstack::unwind::{
    Memory, ModuleSet, ReadError, StopReason, TableError, UnwindRegs, UnwindTable, Unwinder,
};
use callstack::unwind::{NativeArch, X86_64};
use callstack::{Frame, Method};
#[cfg(target_arch = "x86_64")]
use testsupport::{scratch_dir, Gcc};

#[cfg(target_arch = "x86_64")]
fn symbol(path: &std::path::Path, name: &str) -> u64 {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).unwrap();
    let f = object::File::parse(&*data).unwrap();
    f.symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap()
        .address()
}

// The rules it checks are x86-64's (the fixture is built by the test's
// compiler, a cross compiler under a qemu-user stage).
#[cfg(target_arch = "x86_64")]
#[test]
fn debug_frame_only_binary_compiles() {
    let dir = scratch_dir("exact-debug-frame");
    let exe = Gcc::new(&["exact_debug_frame.c"])
        .flags("-O2 -fomit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables")
        .build(&dir.join("exact_debug_frame"));
    let t: UnwindTable<X86_64> = UnwindTable::from_elf_file(&exe).unwrap();
    let framed = symbol(&exe, "framed");
    // At the first instruction the CFA is rsp + 8; inside, rsp + 8 + frame.
    assert_eq!(
        t.lookup(framed),
        UnwindRuleX86_64::Sp { cfa: 8, bp: 0 },
        "{:?}",
        t.stats()
    );
    let inside = t.lookup(framed + 12);
    assert!(
        matches!(inside, UnwindRuleX86_64::Sp { cfa, bp: 0 } if cfa > 8),
        "{inside:?}"
    );
}

#[test]
fn executable_table_is_smaller_than_its_eh_frame() {
    let t: UnwindTable<NativeArch> = UnwindTable::from_elf_file("/proc/self/exe").unwrap();
    let s = t.stats();
    eprintln!("{s:?}");
    assert!(s.rows > 1000 && s.fdes > 100, "{s:?}");
    assert!(s.table_bytes < s.cfi_bytes, "{s:?}");
    assert_eq!(s.bad_fdes, 0, "{s:?}");
}

#[test]
fn bad_input_gives_errors_not_panics() {
    assert!(matches!(
        UnwindTable::<X86_64>::from_elf_bytes(b"not an elf"),
        Err(TableError::Elf(_))
    ));
    assert!(matches!(
        UnwindTable::<X86_64>::from_elf_bytes(&[]),
        Err(TableError::Elf(_))
    ));
    assert!(matches!(
        UnwindTable::<X86_64>::from_elf_file("/nonexistent/x"),
        Err(TableError::Io(_))
    ));
    // Truncated or garbage CFI: compiles what it can, never panics.
    let real = std::fs::read("/proc/self/exe").unwrap();
    for cut in [16usize, 1000, 40_000] {
        let _ = UnwindTable::<X86_64>::from_elf_bytes(&real[..cut.min(real.len())]);
    }
    let mut seed = 0x1234_5678u64;
    for _ in 0..50 {
        let junk: Vec<u8> = (0..512)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 33) as u8
            })
            .collect();
        let secs = callstack::unwind::SectionsInput {
            eh_frame: Some((junk.clone(), 0x1000)),
            debug_frame: Some(junk),
            ..Default::default()
        };
        if let Ok(t) = UnwindTable::<X86_64>::from_sections(secs) {
            let _ = t.lookup(0x1010);
        }
    }
}

/// Reads this thread's stack, bounded: what a core-file reader would do
/// with the stack segment of a core.
struct OwnStack {
    lo: u64,
    hi: u64,
}

impl Memory for OwnStack {
    fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
        if addr < self.lo || addr + 8 > self.hi {
            return Err(ReadError::OutOfBounds(addr));
        }
        // SAFETY: inside this thread's stack.
        Ok(unsafe { (addr as *const u64).read_unaligned() })
    }
}

fn own_stack() -> OwnStack {
    // SAFETY: querying the current thread's stack attributes.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_getattr_np(libc::pthread_self(), &mut attr);
        let mut addr = std::ptr::null_mut();
        let mut size = 0;
        libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        OwnStack {
            lo: addr as u64,
            hi: addr as u64 + size as u64,
        }
    }
}

#[inline(never)]
fn unwind_with_module_set(depth: usize) {
    if depth > 0 {
        unwind_with_module_set(depth - 1);
        std::hint::black_box(depth);
        return;
    }
    // The reference: the in-process capture, with registers.
    let mut frames = [Frame {
        pc: 0,
        sp: 0,
        fp: 0,
        method: Method::Cfi,
    }; 128];
    let (n, stop) = callstack::capture_exact_with_info(0, &mut frames);
    assert_eq!(stop, StopReason::Outermost);
    // The same walk from files: tables read from each module's ELF file,
    // placed at the module's load bias.
    let mut set: ModuleSet<NativeArch> = ModuleSet::new();
    for m in callstack::modules::loaded_modules() {
        if m.is_vdso {
            continue;
        }
        let table = UnwindTable::from_elf_file(&m.path).unwrap();
        let (lo, hi) = m.range();
        set.add(lo as u64, hi as u64, m.bias as u64, table);
    }
    let start = UnwindRegs {
        pc: frames[0].pc,
        sp: frames[0].sp,
        fp: frames[0].fp,
        lr: 0,
    };
    let mut mem = own_stack();
    let mut u = Unwinder::new(&set, start, false);
    let mut got = Vec::new();
    while let Some(f) = u.next(&mut mem) {
        got.push(f);
    }
    assert_eq!(u.stop_reason(), StopReason::Outermost);
    let want = &frames[..n];
    assert_eq!(got.len(), want.len(), "{got:#x?}\n{want:#x?}");
    for (g, w) in got.iter().zip(want).skip(1) {
        assert_eq!((g.pc, g.sp), (w.pc, w.sp), "{got:#x?}\n{want:#x?}");
    }
}

#[test]
fn module_set_from_files_unwinds_like_the_in_process_capture() {
    unwind_with_module_set(10);
}

/// What `fuzz/fuzz_targets/unwind_table.rs` does, on its regression corpus
/// and on every truncation and some bit flips of it.
#[test]
fn fuzz_corpus_runs_without_panics() {
    struct Wild;
    impl Memory for Wild {
        fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
            if addr & 0xfff == 0xff8 {
                Err(ReadError::OutOfBounds(addr))
            } else {
                Ok(addr.rotate_left(7))
            }
        }
    }
    let run = |data: &[u8]| {
        let mut tables = Vec::new();
        if let Ok(t) = UnwindTable::<X86_64>::from_elf_bytes(data) {
            tables.push(t);
        }
        let secs = callstack::unwind::SectionsInput {
            eh_frame: Some((data.to_vec(), 0x1000)),
            debug_frame: Some(data.to_vec()),
            ..Default::default()
        };
        if let Ok(t) = UnwindTable::<X86_64>::from_sections(secs) {
            tables.push(t);
        }
        for t in tables {
            let (lo, hi) = t.range();
            let mut set: ModuleSet<X86_64> = ModuleSet::new();
            set.add(lo, hi.max(lo + 1), 0, t);
            let regs = UnwindRegs {
                pc: lo + 1,
                sp: 0x7000_0000,
                fp: 0x7000_0100,
                lr: 0,
            };
            let mut u = Unwinder::new(&set, regs, true);
            let mut n = 0;
            while u.next(&mut Wild).is_some() && n < 64 {
                n += 1;
            }
        }
    };
    let dir = testsupport::workspace_root().join("fuzz/corpus/unwind_table");
    let mut seen = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        seen += 1;
        run(&data);
        for cut in (0..data.len()).step_by(97) {
            run(&data[..cut]);
        }
        let mut flipped = data.clone();
        for i in (0..flipped.len()).step_by(13) {
            flipped[i] ^= 0x5a;
        }
        run(&flipped);
    }
    assert!(seen >= 2);
}
