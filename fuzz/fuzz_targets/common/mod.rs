//! What each fuzz target runs on one input, shared by the targets (one
//! `fuzz_target!` line each) and by the library's test
//! `crates/callstack/tests/fuzz_corpus.rs`, which replays the regression
//! corpus through these same functions on every `cargo test`.
//!
//! Each function must give an answer or an error on any input, never a
//! panic, an overflow, a hang or a huge allocation.
#![allow(dead_code)]

use callstack::unwind::{Memory, ReadError};

/// Where the fuzz targets place their stack bytes.
pub const STACK_BASE: u64 = 0x7000_0000;

/// Fuzz input read as a stack at [`STACK_BASE`]; reads outside it fail.
pub struct Stack<'a>(pub &'a [u8]);

impl Memory for Stack<'_> {
    fn read_u64(&mut self, a: u64) -> Result<u64, ReadError> {
        let o = a.checked_sub(STACK_BASE).ok_or(ReadError::OutOfBounds(a))? as usize;
        self.0
            .get(o..o.checked_add(8).ok_or(ReadError::OutOfBounds(a))?)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .ok_or(ReadError::OutOfBounds(a))
    }
}

/// Memory that answers every read with a value made from the address,
/// except the last word of each page.
pub struct Wild;

impl Memory for Wild {
    fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
        if addr & 0xfff == 0xff8 {
            Err(ReadError::OutOfBounds(addr))
        } else {
            Ok(addr.rotate_left(7))
        }
    }
}

/// `symbolize_elf`: `Symbolizer::for_bytes` and lookups. Returns how many
/// lookups named a function (the corpus test checks the intact files do).
pub fn symbolize_elf(data: &[u8]) -> Option<usize> {
    use callstack::symbolize::{Address, Symbolizer};
    let mut s = Symbolizer::for_bytes(data.to_vec()).ok()?;
    let mut named = 0;
    // Addresses: sweeps of the usual text ranges, plus values taken from
    // the input itself (often section addresses of a mutated real file).
    for a in (0x1000..0x1400usize)
        .step_by(5)
        .chain((0x400000..0x400400).step_by(3))
    {
        if s.symbolize(Address::Exact(a)).function().is_some() {
            named += 1;
        }
    }
    for w in data.chunks_exact(8).take(64) {
        let a = u64::from_le_bytes(w.try_into().unwrap()) as usize;
        let _ = s.symbolize(Address::Return(a));
    }
    // Tail-call chains from every return address of a small text range
    // to every 16-byte-aligned callee there (the call-site DIEs, their
    // targets and the search over them).
    for caller in 0x1001..0x1100usize {
        for callee in (0x1000..0x1100usize).step_by(16) {
            let _ = s.tail_calls(caller, Address::Exact(callee + 1));
        }
    }
    Some(named)
}

/// `tracefile`: the trace-file reader.
pub fn tracefile(data: &[u8]) -> Option<callstack::tracefile::Trace> {
    callstack::tracefile::read_all(data).ok()
}

/// `core_file`: the ELF core reader (headers, notes, `PT_LOAD`s), then an
/// unwind of every thread through the core's memory. No executable and an
/// empty sysroot: only the bytes are exercised. Returns the thread count.
pub fn core_file(data: &[u8]) -> Option<usize> {
    use callstack::remote::corefile::{parse, CoreFile};
    use callstack::remote::{unwind_thread, Lookup};
    let _ = parse(data);
    let lookup = Lookup {
        sysroot: Some("/nonexistent-fuzz-sysroot".into()),
        debug_dirs: Vec::new(),
        debuginfod: None,
    };
    let core = CoreFile::from_vec(data.to_vec(), None, &lookup).ok()?;
    let mut mem = core.memory();
    for t in &core.snapshot().threads {
        let _ = unwind_thread(core.snapshot(), &mut mem, t, 64);
    }
    Some(core.snapshot().threads.len())
}

/// `minidump`: the minidump reader (header, directory, every stream it
/// reads, memory ranges), then an unwind of every thread through the
/// dump's memory. An empty sysroot: only the bytes are exercised. Returns
/// the thread count.
pub fn minidump(data: &[u8]) -> Option<usize> {
    use callstack::remote::minidump::{parse, Minidump};
    use callstack::remote::{unwind_thread, Lookup};
    let _ = parse(data);
    let lookup = Lookup {
        sysroot: Some("/nonexistent-fuzz-sysroot".into()),
        debug_dirs: Vec::new(),
        debuginfod: None,
    };
    let dump = Minidump::from_vec(data.to_vec(), &lookup).ok()?;
    let mut mem = dump.memory();
    for t in &dump.snapshot().threads {
        let _ = unwind_thread(dump.snapshot(), &mut mem, t, 64);
    }
    Some(dump.snapshot().threads.len())
}

/// `crash_report`: the raw crash-report reader, and symbolizing on the
/// paths the input names when they are missing files (module+offset
/// frames). A report naming a real file (libc) is parsed only: opening it
/// on every input would make the target a hundred times slower.
pub fn crash_report(data: &[u8]) -> usize {
    let text = String::from_utf8_lossy(data);
    let reports = callstack::crash::parse_raw_reports(&text);
    let frames = reports.iter().map(|r| r.frames.len()).sum::<usize>();
    let names_a_file = reports
        .iter()
        .flat_map(|r| &r.frames)
        .filter_map(|f| f.module.as_ref())
        .any(|m| m.0.exists());
    if frames < 64 && !names_a_file {
        let _ = callstack::crash::symbolize_report(&text);
    }
    reports.len()
}

/// `ehabi`: the ARM EHABI parser and interpreter. The first 64 bytes are
/// an `.ARM.exidx` table at 0x8000, the rest `.ARM.extab` words at 0x9000
/// and a stack at [`STACK_BASE`].
pub fn ehabi(data: &[u8]) {
    use callstack::unwind::insn::arm::ehabi::{execute, opcodes, ExidxTable, MAX_OPCODES};
    let (table, rest) = data.split_at(data.len().min(64));
    let t = ExidxTable {
        data: table,
        addr: 0x8000,
    };
    let read = |a: u64| -> Option<u32> {
        let o = a.checked_sub(0x9000)? as usize;
        rest.get(o..o.checked_add(4)?)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let mut buf = [0u8; MAX_OPCODES];
    for i in 0..t.len() {
        let Some(start) = t.function_start(i) else {
            continue;
        };
        if let Ok((_, e)) = t.lookup(start) {
            if let Ok(n) = opcodes(e, read, &mut buf) {
                let mut regs = [STACK_BASE as u32; 16];
                let _ = execute(&buf[..n], &mut regs, &mut Stack(rest));
            }
        }
    }
}

/// `insn_code`: the instruction analyzers of every architecture and the
/// walks built on them. The input is code at 0x1000 and, from its middle
/// on, also the stack.
pub fn insn_code(data: &[u8]) {
    use callstack::unwind::insn::{
        aarch64, arm, mips, walk, x86_64, Method, SliceCode, UnwindRegs,
    };
    if data.len() < 8 {
        return;
    }
    let pc = 0x1000 + (u16::from_le_bytes([data[0], data[1]]) as u64 % data.len() as u64);
    let mut c = SliceCode::new(0x1000, data);
    let _ = x86_64::epilogue::analyze(&mut c, pc, None);
    let _ = x86_64::prologue::analyze(&mut c, 0x1000, pc, None);
    let _ = aarch64::prologue::analyze(&mut c, pc & !3, None, true);
    let _ = mips::prologue::analyze(&mut c, pc & !3, None, false);
    let _ = arm::prologue::analyze(&mut c, pc | 1, None, false);
    let stack_bytes = &data[data.len() / 2..];
    let end = STACK_BASE + stack_bytes.len() as u64;
    let regs = UnwindRegs {
        pc,
        sp: STACK_BASE,
        fp: STACK_BASE + 0x10,
        lr: pc,
    };
    let mut out = [(0u64, Method::Context); 16];
    let _ = walk::x86_64(regs, &mut Stack(stack_bytes), &mut c, end, &mut out);
    let _ = walk::risc::<aarch64::Arch, _, _>(regs, &mut Stack(stack_bytes), &mut c, end, &mut out);
    let _ = walk::risc::<mips::Arch, _, _>(regs, &mut Stack(stack_bytes), &mut c, end, &mut out);
}

/// `unwind_table`: the CFI table compiler (the input as an ELF image and
/// as raw `.eh_frame` / `.debug_frame`), lookups, and the unwinder over the
/// compiled tables.
pub fn unwind_table(data: &[u8]) {
    use callstack::unwind::X86_64;
    use callstack::unwind::{ModuleSet, SectionsInput, UnwindRegs, UnwindTable, Unwinder};
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
        for a in [
            lo,
            lo.saturating_add(1),
            lo / 2 + hi / 2,
            hi.saturating_sub(1),
            hi,
        ] {
            let _ = t.lookup(a);
        }
        let mut set: ModuleSet<X86_64> = ModuleSet::new();
        set.add(lo, hi.max(lo.saturating_add(1)), 0, t);
        let regs = UnwindRegs {
            pc: lo.saturating_add(1),
            sp: STACK_BASE,
            fp: STACK_BASE + 0x100,
            lr: 0,
        };
        let mut u = Unwinder::new(&set, regs, true);
        let mut n = 0;
        while u.next(&mut Wild).is_some() && n < 64 {
            n += 1;
        }
    }
}

/// `demangle`: the demangler on arbitrary names (symbol names come from
/// the files being symbolized), bare and with the usual prefixes.
pub fn demangle(data: &[u8]) {
    let name = String::from_utf8_lossy(data);
    let _ = callstack::symbolize::demangle(&name);
    for prefix in ["_Z", "_ZN", "_R"] {
        if !name.starts_with(prefix) {
            let _ = callstack::symbolize::demangle(&format!("{prefix}{name}"));
        }
    }
}

/// `proc_maps`: `/proc/<pid>/maps` text, every line through the
/// signal-safe range parser (stack bounds) and the crash handler's line
/// parser. Returns how many lines parsed.
pub fn proc_maps(data: &[u8]) -> usize {
    let mut n = 0;
    for line in data.split(|&b| b == b'\n') {
        let r = callstack::fuzzing::maps::parse_range(line);
        let c = callstack::fuzzing::maps::parse_crash_line(line);
        n += (r.is_some() || c.is_some()) as usize;
    }
    n
}

/// `perf_map`: a JIT runtime's `/tmp/perf-PID.map`, parsed and looked up
/// at every address its lines name, at their ends and at 0. Returns how
/// many functions it names (`None` when the text is rejected).
pub fn perf_map(data: &[u8]) -> Option<usize> {
    let map = callstack::symbolize::perfmap::PerfMap::parse(&String::from_utf8_lossy(data)).ok()?;
    let _ = map.lookup(0);
    for line in data.split(|&b| b == b'\n') {
        let word = line.split(|&b| b == b' ').next().unwrap_or(&[]);
        let text = String::from_utf8_lossy(word);
        if let Ok(a) = u64::from_str_radix(text.trim_start_matches("0x"), 16) {
            let _ = map.lookup(a);
            let _ = map.lookup(a.wrapping_sub(1));
            let _ = map.lookup(a.wrapping_add(1));
        }
    }
    Some(map.len())
}

/// `jitdump`: a JIT runtime's `jit-PID.dump`, parsed and looked up at
/// every 8-byte-aligned value it holds and at 0. Returns how many functions
/// it names (`None` when the file is rejected).
pub fn jitdump(data: &[u8]) -> Option<usize> {
    let dump = callstack::symbolize::jitdump::JitDump::parse(data).ok()?;
    let _ = dump.lookup(0);
    for w in data.chunks_exact(8).take(4096) {
        let a = u64::from_le_bytes(w.try_into().unwrap());
        let _ = dump.lookup(a);
        let _ = dump.lookup(a.wrapping_add(4));
    }
    Some(dump.len())
}

/// `remote_image`: an in-memory ELF image of another process (the vDSO
/// read from a core or a live process), as `callstack::remote` reads it:
/// build-id, load segments and bias, then symbols and DWARF through the
/// Symbolizer of the image. Returns how many lookups named something.
pub fn remote_image(data: &[u8]) -> usize {
    use callstack::fuzzing::remote as files;
    use callstack::remote::Mapping;
    let _ = files::build_id(data);
    let _ = files::load_segments(data);
    let _ = callstack::modules::gnu_build_id(data);
    let _ = callstack::fuzzing::notes::build_id_in_notes(data);
    let segs = files::exec_segments(data);
    let mapping = Mapping {
        start: 0x7fff_0000_0000,
        end: 0x7fff_0000_2000,
        file_offset: 0,
        path: "[vdso]".into(),
        executable: Some(true),
    };
    let bias = files::load_bias(data, std::slice::from_ref(&mapping)).unwrap_or(0);
    let start = mapping.start;
    // In-memory images are named by the crate's one Symbolizer, over the
    // image at its link-time addresses (as `callstack core` does).
    let Ok(mut s) = callstack::symbolize::Symbolizer::for_bytes(data.to_vec()) else {
        return 0;
    };
    s.set_symbol_extent(callstack::symbolize::SymbolExtent::Sized);
    // Addresses in and around the executable segments, and a sweep.
    let mut addrs: Vec<u64> = segs
        .iter()
        .take(4)
        .flat_map(|&(v, _, sz)| [v, v.wrapping_add(sz / 2), v.wrapping_add(sz)])
        .map(|v| v.wrapping_add(bias))
        .collect();
    addrs.extend((0..0x2000u64).step_by(0x40).map(|o| start + o));
    let addr = |a: u64| callstack::symbolize::Address::Exact(a.wrapping_sub(bias) as usize);
    addrs
        .into_iter()
        .filter(|&a| !s.symbolize(addr(a)).frames.is_empty())
        .count()
}

/// `cfi_eval`: the direct CFI evaluation of the capture path
/// (`unwind::cfi::evaluate`: `.eh_frame_hdr` search, the fast `.eh_frame`
/// interpreter, gimli for the rest, DWARF expressions, row application)
/// for x86-64 and AArch64. Layout: `u16` header length, `u32` address of
/// `.eh_frame_hdr`, `u32` address of `.eh_frame`, the header bytes, then
/// `.eh_frame` (also read as `.debug_frame`).
pub fn cfi_eval(data: &[u8]) {
    use callstack::unwind::cfi::{evaluate, CfiSections, FdeAt};
    use callstack::unwind::UnwindRegs;
    use callstack::unwind::{Aarch64, X86_64};
    if data.len() < 10 {
        return;
    }
    let word = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap()) as u64;
    let hdr_len = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 10);
    let (hdr_addr, eh_addr) = (word(&data[2..6]), word(&data[6..10]));
    let (hdr, eh) = data[10..].split_at(hdr_len);
    let secs = CfiSections {
        eh_frame_hdr: Some((hdr, hdr_addr)),
        eh_frame: Some((eh, eh_addr)),
        debug_frame: Some(eh),
        text: 0x1000,
        got: 0x4000,
    };
    // Where to look: the header's table entries, and each record of
    // `.eh_frame` with the pc its (pcrel sdata4) initial location names.
    let mut wheres: Vec<(FdeAt, u64)> = Vec::new();
    for i in 0..16 {
        let Some(b) = hdr.get(12 + 8 * i..16 + 8 * i) else {
            break;
        };
        let pc = hdr_addr.wrapping_add(i32::from_le_bytes(b.try_into().unwrap()) as i64 as u64);
        wheres.push((FdeAt::Search, pc));
        wheres.push((FdeAt::Search, pc.wrapping_add(5)));
    }
    let mut off = 0usize;
    while wheres.len() < 64 {
        let Some(len) = eh.get(off..off + 4).map(word) else {
            break;
        };
        let pc = eh
            .get(off + 8..off + 12)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64 as u64)
            .map_or(0, |d| eh_addr.wrapping_add(off as u64 + 8).wrapping_add(d));
        for a in [pc, pc.wrapping_add(4), pc.wrapping_add(17)] {
            wheres.push((FdeAt::EhFrame(off), a));
            wheres.push((FdeAt::DebugFrame(off), a));
        }
        if len == 0 || len == 0xffff_ffff {
            break;
        }
        off = off.saturating_add(4).saturating_add(len as usize);
    }
    let regs = UnwindRegs {
        pc: 0,
        sp: STACK_BASE,
        fp: STACK_BASE + 0x40,
        lr: 0x1234,
    };
    for (at, pc) in wheres {
        // The fast interpreter gives gimli's row or declines.
        if let FdeAt::EhFrame(off) = at {
            if let Err(e) = callstack::fuzzing::cfi::fast_vs_gimli(eh, eh_addr, off, pc) {
                panic!("cfi_fast disagrees with gimli at .eh_frame+{off:#x}: {e}");
            }
        }
        let regs = UnwindRegs { pc, ..regs };
        let _ = evaluate::<X86_64, _>(&secs, at, pc, &regs, &mut Wild);
        let _ = evaluate::<Aarch64, _>(&secs, at, pc, &regs, &mut Wild);
    }
}

/// `python_lines`: a CPython code object's line table, decoded at every
/// instruction offset. The first byte picks the format (`co_lnotab`, 3.10's
/// `co_linetable`, 3.11+'s location table), the next two are the first
/// line (little-endian `i16`), the rest is the table. Returns how many
/// offsets have a line (`None` when the input is too short).
pub fn python_lines(data: &[u8]) -> Option<usize> {
    use callstack::python::lines::{line_for, Format};
    let (&which, rest) = data.split_first()?;
    let first = rest.get(..2)?;
    let table = &rest[2..];
    let format = match which % 3 {
        0 => Format::Lnotab,
        1 => Format::Linetable310,
        _ => Format::Locations,
    };
    let first_line = i64::from(i16::from_le_bytes([first[0], first[1]]));
    let end = (table.len() as i64) * 8 + 4;
    Some(
        (-2..end)
            .filter(|&o| line_for(format, table, first_line, o).is_some())
            .count(),
    )
}
