//! Samples decoded and unwound without `perf_event_open`: records built
//! byte by byte, and AArch64 samples made of real AArch64 state (a qemu-user
//! core of a cross-compiled program: its registers in the arm64 perf
//! numbering and the stack above its sp), unwound through the recorder's
//! own path ([`Recording::handle`]) and checked against gdb-multiarch.
//! qemu-user cannot run perf events, so this is how the AArch64 sample path
//! is tested on any host.

use super::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `PERF_RECORD_MISC_USER`.
const MISC_USER: u16 = 2;

fn record(ty: u32, misc: u16, body: &[u8]) -> Vec<u8> {
    let size = u16::try_from(8 + body.len()).expect("record too long");
    let mut out = Vec::with_capacity(size as usize);
    out.extend_from_slice(&ty.to_le_bytes());
    out.extend_from_slice(&misc.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// A `PERF_RECORD_SAMPLE` as the recorder's event lays it out: ip, pid/tid,
/// time, the callchain (`Some` when asked for), the ABI and `regs`, the
/// stack copy (`stack`, padded to `stack_size`; its dynamic size is
/// `stack.len()`).
#[allow(clippy::too_many_arguments)] // one per field of the record
fn sample_record(
    ip: u64,
    pid: u32,
    tid: u32,
    callchain: Option<&[u64]>,
    abi: u64,
    regs: &[u64],
    stack: &[u8],
    stack_size: usize,
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&ip.to_le_bytes());
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend_from_slice(&tid.to_le_bytes());
    b.extend_from_slice(&1234u64.to_le_bytes());
    if let Some(cc) = callchain {
        b.extend_from_slice(&(cc.len() as u64).to_le_bytes());
        for a in cc {
            b.extend_from_slice(&a.to_le_bytes());
        }
    }
    b.extend_from_slice(&abi.to_le_bytes());
    for w in regs {
        b.extend_from_slice(&w.to_le_bytes());
    }
    assert!(stack.len() <= stack_size && stack_size % 8 == 0);
    b.extend_from_slice(&(stack_size as u64).to_le_bytes());
    b.extend_from_slice(stack);
    b.resize(b.len() + stack_size - stack.len(), 0);
    if stack_size > 0 {
        b.extend_from_slice(&(stack.len() as u64).to_le_bytes());
    }
    record(RECORD_SAMPLE, MISC_USER, &b)
}

/// A `PERF_RECORD_MMAP2` of an executable file mapping.
fn mmap2_record(pid: u32, start: u64, len: u64, pgoff: u64, path: &str) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend_from_slice(&start.to_le_bytes());
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&pgoff.to_le_bytes());
    b.extend_from_slice(&[0u8; 24]); // maj, min, ino, ino_generation
    b.extend_from_slice(&((libc::PROT_READ | libc::PROT_EXEC) as u32).to_le_bytes());
    b.extend_from_slice(&(libc::MAP_PRIVATE as u32).to_le_bytes());
    b.extend_from_slice(path.as_bytes());
    b.push(0);
    b.resize(b.len().next_multiple_of(8), 0);
    record(RECORD_MMAP2, MISC_USER, &b)
}

/// `rec` (a record without a `sample_id` trailer) with the trailer of
/// the recorder's events: pid, tid, `time`.
fn with_trailer(rec: &[u8], pid: u32, time: u64) -> Vec<u8> {
    let mut out = rec.to_vec();
    out.extend_from_slice(&pid.to_le_bytes());
    out.extend_from_slice(&pid.to_le_bytes());
    out.extend_from_slice(&time.to_le_bytes());
    let size = u16::try_from(out.len()).unwrap();
    out[6..8].copy_from_slice(&size.to_le_bytes());
    out
}

/// An x86-64 recording with `opts`, as the recorder makes one.
fn x86_64_recording(opts: &RecordOptions) -> Recording<'_> {
    Recording::new(
        opts,
        Machine::X86_64,
        Machine::X86_64.perf_regs_mask().unwrap(),
        Profile::cpu(999),
    )
}

/// A `PERF_RECORD_COMM` of an exec by process `pid`, at `time`.
fn exec_record(pid: u32, name: &str, time: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend_from_slice(name.as_bytes());
    b.push(0);
    b.resize(b.len().next_multiple_of(8), 0);
    with_trailer(
        &record(RECORD_COMM, MISC_USER | MISC_COMM_EXEC, &b),
        pid,
        time,
    )
}

/// A shell that exec'd a program on another CPU: the program's exec and
/// mappings, drained first from that CPU's ring, stay; the shell's, drained
/// after them from its own CPU's ring, are stale. The profile's program,
/// mappings and name are the program's (a CI run's `sh -c "exec PROG"`
/// recording was named after dash).
#[test]
fn exec_drained_late_from_another_ring_is_stale() {
    let pid = 4242;
    let opts = RecordOptions::new(Target::Pid(pid));
    let mut rec = x86_64_recording(&opts);
    rec.root_pid = pid;
    rec.exe_pending = true;
    let kind = super::sys::EventKind::CpuClock;
    // The program's ring: its exec at 200, its program and loader after.
    rec.handle(&exec_record(pid, "prog", 200), kind);
    for (at, path, t) in [
        (0x40_0000, "/opt/prog", 201),
        (0x7f00_0000, "/lib/ld.so", 202),
    ] {
        rec.handle(
            &with_trailer(&mmap2_record(pid, at, 0x1000, 0, path), pid, t),
            kind,
        );
    }
    // The shell's ring: its exec at 100, its program at 101.
    rec.handle(&exec_record(pid, "sh", 100), kind);
    rec.handle(
        &with_trailer(
            &mmap2_record(pid, 0x50_0000, 0x1000, 0, "/bin/dash"),
            pid,
            101,
        ),
        kind,
    );
    assert_eq!(rec.main_exe.as_deref(), Some("/opt/prog"));
    let paths: Vec<&str> = rec.spaces[&pid]
        .mappings
        .iter()
        .map(|m| m.path.as_str())
        .collect();
    assert_eq!(paths, ["/opt/prog", "/lib/ld.so"]);
    assert_eq!(rec.spaces[&pid].comm.as_deref(), Some("prog"));
    assert_eq!(rec.spaces[&pid].exec_time, 200);
    // A later exec still applies.
    rec.handle(&exec_record(pid, "next", 300), kind);
    assert!(rec.spaces[&pid].mappings.is_empty());
    assert!(rec.exe_pending);
}

/// A `PERF_RECORD_FORK` or `PERF_RECORD_EXIT` (`ty`) of process `pid`
/// (parent `ppid`), at `time`.
fn task_record(ty: u32, pid: u32, ppid: u32, time: u64) -> Vec<u8> {
    let mut b = Vec::new();
    for v in [pid, ppid, pid, ppid] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&time.to_le_bytes());
    with_trailer(&record(ty, MISC_USER, &b), pid, time)
}

/// In a whole-host recording, a process's exit frees its space at the end
/// of the pass over the rings, not at once: its samples in other CPUs'
/// rings, drained after its exit's record, still unwind with it. An exit
/// record of an earlier process of the same pid, drained after the new
/// one's fork, frees nothing; a fork of the pid after its exit in the same
/// pass starts a new space.
#[test]
fn exited_process_space_kept_to_the_end_of_the_pass() {
    let opts = RecordOptions::new(Target::All);
    let mut rec = x86_64_recording(&opts);
    let kind = super::sys::EventKind::CpuClock;
    let map =
        |pid, path: &str, t| with_trailer(&mmap2_record(pid, 0x40_0000, 0x1000, 0, path), pid, t);
    rec.handle(&task_record(RECORD_FORK, 10, 1, 50), kind);
    rec.handle(&map(10, "/bin/true", 60), kind);
    rec.handle(&task_record(RECORD_EXIT, 10, 1, 100), kind);
    assert!(rec.spaces.contains_key(&10), "freed before the pass ended");
    rec.end_pass();
    assert!(!rec.spaces.contains_key(&10));

    // pid 10 again: exits, and is forked again, in one pass.
    rec.handle(&task_record(RECORD_FORK, 10, 1, 150), kind);
    rec.handle(&task_record(RECORD_EXIT, 10, 1, 160), kind);
    rec.handle(&task_record(RECORD_FORK, 10, 1, 170), kind);
    rec.handle(&map(10, "/bin/sleep", 180), kind);
    rec.end_pass();
    assert_eq!(rec.spaces[&10].born, 170);
    assert_eq!(rec.spaces[&10].mappings[0].path, "/bin/sleep");

    // The new one's fork drained before the old one's exit.
    rec.handle(&task_record(RECORD_FORK, 11, 1, 300), kind);
    rec.handle(&task_record(RECORD_EXIT, 11, 1, 250), kind);
    rec.end_pass();
    assert_eq!(
        rec.spaces[&11].born, 300,
        "freed by an older process's exit"
    );
}

/// Context switches as each kind of event reports them: a task's own event
/// (`PERF_RECORD_SWITCH`, `record --off-cpu -- PROG`) and a whole CPU's
/// (`PERF_RECORD_SWITCH_CPU_WIDE`, `record -a --off-cpu`, which names the
/// other task first). Both give the switching thread, time and direction;
/// the idle task's switches are dropped.
#[test]
fn switch_records_of_a_task_and_of_a_whole_cpu() {
    let opts = RecordOptions::new(Target::All);
    let mut rec = x86_64_recording(&opts);
    let kind = super::sys::EventKind::Switches;
    // Out (preempted), then in, of thread 42 of process 42.
    rec.handle(
        &with_trailer(
            &record(
                RECORD_SWITCH,
                MISC_SWITCH_OUT | MISC_SWITCH_OUT_PREEMPT,
                &[],
            ),
            42,
            100,
        ),
        kind,
    );
    // The other task: pid 7, tid 7.
    let other = [7u32.to_le_bytes(), 7u32.to_le_bytes()].concat();
    rec.handle(
        &with_trailer(&record(RECORD_SWITCH_CPU_WIDE, 0, &other), 42, 200),
        kind,
    );
    rec.handle(
        &with_trailer(
            &record(RECORD_SWITCH_CPU_WIDE, MISC_SWITCH_OUT, &other),
            42,
            300,
        ),
        kind,
    );
    // The idle task's.
    rec.handle(
        &with_trailer(&record(RECORD_SWITCH_CPU_WIDE, 0, &other), 0, 400),
        kind,
    );
    let got: Vec<(u64, u32, bool, bool)> = rec
        .off_events
        .iter()
        .map(|e| match e {
            OffEvent::Switch {
                time,
                tid,
                out,
                preempt,
            } => (*time, *tid, *out, *preempt),
            OffEvent::Sample { .. } => panic!("a sample from a switch record"),
        })
        .collect();
    assert_eq!(
        got,
        [
            (100, 42, true, true),
            (200, 42, false, false),
            (300, 42, true, false)
        ]
    );
    assert_eq!(rec.latest, 400);
}

/// The AArch64 sample's register words, value `0x1000 + n` for perf
/// register `n` (x0-x30, sp, pc).
fn numbered_aarch64_words() -> Vec<u64> {
    (0..33).map(|n| 0x1000 + n).collect()
}

/// The register block of an AArch64 sample: the mask's registers in bit
/// order, each at its perf number (x29 is 29, sp 31, pc 32), read from the
/// DWARF-numbered `regs`.
#[test]
fn aarch64_sample_registers_in_mask_order() {
    let mask = Machine::Aarch64.perf_regs_mask().unwrap();
    assert_eq!(mask, (1 << 33) - 1, "x0-x30, sp, pc");
    let stack: Vec<u8> = (0..40u8).collect();
    let rec = sample_record(
        0x40_1234,
        7,
        8,
        None,
        REGS_ABI_64,
        &numbered_aarch64_words(),
        &stack,
        64,
    );
    let s = parse_sample(&rec[8..], false, Machine::Aarch64, mask).expect("parsed");
    assert_eq!((s.ip, s.pid, s.tid), (0x40_1234, 7, 8));
    assert!(s.callchain.is_empty());
    let regs = s.regs.expect("64-bit registers");
    assert_eq!(regs.arch, Machine::Aarch64);
    for x in 0..=30u16 {
        assert_eq!(regs.get(x), Some(0x1000 + u64::from(x)), "x{x}");
    }
    assert_eq!(regs.fp(), Some(0x1000 + 29));
    assert_eq!(regs.sp(), Some(0x1000 + 31));
    assert_eq!(regs.pc(), Some(0x1000 + 32));
    // The copy's valid part only (its dynamic size).
    assert_eq!(s.stack, &stack[..]);

    // With a kernel callchain before the registers.
    let cc = [0xffff_ffff_ffff_fe00, 0xffff_8000_1000_0000];
    let rec = sample_record(
        1,
        7,
        8,
        Some(&cc),
        REGS_ABI_64,
        &numbered_aarch64_words(),
        &[],
        0,
    );
    let s = parse_sample(&rec[8..], true, Machine::Aarch64, mask).expect("parsed");
    assert_eq!(s.callchain.len(), 16);
    assert_eq!(s.regs.and_then(|r| r.pc()), Some(0x1000 + 32));
    assert!(s.stack.is_empty());

    // A 32-bit task's registers (ABI 1) are skipped, the rest still read.
    let rec = sample_record(1, 7, 8, None, 1, &numbered_aarch64_words(), &stack, 64);
    let s = parse_sample(&rec[8..], false, Machine::Aarch64, mask).expect("parsed");
    assert!(s.regs.is_none());
    assert_eq!(s.stack, &stack[..]);

    // Every truncation is refused, never a panic.
    let rec = sample_record(
        1,
        7,
        8,
        Some(&cc),
        REGS_ABI_64,
        &numbered_aarch64_words(),
        &stack,
        64,
    );
    for len in 8..rec.len() {
        assert!(
            parse_sample(&rec[8..len], true, Machine::Aarch64, mask).is_none(),
            "cut at {len}"
        );
    }
}

/// The x86-64 sample block in its numbering (AX BX CX DX SI DI BP SP IP,
/// R8-R15), unchanged by the AArch64 work.
#[test]
fn x86_64_sample_registers_in_mask_order() {
    let mask = Machine::X86_64.perf_regs_mask().unwrap();
    let words: Vec<u64> = (0..17).map(|n| 0x2000 + n).collect();
    let rec = sample_record(1, 7, 8, None, REGS_ABI_64, &words, &[], 0);
    let regs = parse_sample(&rec[8..], false, Machine::X86_64, mask)
        .and_then(|s| s.regs)
        .unwrap();
    assert_eq!(regs.fp(), Some(0x2006));
    assert_eq!(regs.sp(), Some(0x2007));
    assert_eq!(regs.pc(), Some(0x2008));
    assert_eq!(regs.get(15), Some(0x2010)); // R15
}

/// A recording of AArch64 samples as `record` makes it on an AArch64 host,
/// its process's maps taken from the records fed to it only.
fn aarch64_recording(opts: &RecordOptions, pid: u32) -> Recording<'_> {
    let machine = Machine::Aarch64;
    let mut rec = Recording::new(
        opts,
        machine,
        machine.perf_regs_mask().unwrap(),
        Profile::cpu(999),
    );
    rec.spaces.insert(
        pid,
        Space {
            maps_read: true,
            ..Space::default()
        },
    );
    rec
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether the cross tools are here (skipped with a message when not, and
/// under qemu-user itself, `CALLSTACK_TEST_QEMU`: the test is offline and
/// runs on the host).
fn cross_tools() -> bool {
    if std::env::var_os("CALLSTACK_TEST_QEMU").is_some() {
        return false;
    }
    let ok = ["aarch64-linux-gnu-gcc", "qemu-aarch64", "gdb-multiarch"]
        .iter()
        .all(|t| have(t));
    if !ok {
        eprintln!("skipping: aarch64-linux-gnu-gcc, qemu-aarch64 or gdb-multiarch missing (scripts/install-test-deps.sh installs them)");
    }
    ok
}

/// Builds fixture `src` statically for AArch64 with `flags`.
fn build(dir: &Path, src: &str, tag: &str, flags: &[&str]) -> PathBuf {
    let out = dir.join(format!("{}-{tag}", src.trim_end_matches(".c")));
    let o = Command::new("aarch64-linux-gnu-gcc")
        .args(["-static", "-fno-reorder-functions"])
        .args(flags)
        .arg(testsupport::c_fixtures().join(src))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// Runs `exe` under qemu-aarch64 until it dies of a signal; qemu's core.
fn qemu_core(exe: &Path) -> PathBuf {
    let dir = exe.with_extension("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new("sh")
        .current_dir(&dir)
        .arg("-c")
        .arg(format!(
            "ulimit -c unlimited; exec qemu-aarch64 {}",
            exe.display()
        ))
        .output()
        .unwrap();
    // qemu's own host core, if any, is not the guest's.
    let _ = std::fs::remove_file(dir.join("core"));
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "core"))
        .unwrap_or_else(|| panic!("no qemu core for {}: {o:?}", exe.display()))
}

/// The function of each pc by `exe`'s symbols; return addresses (all but
/// the first) are looked up at pc - 1.
fn names(exe: &Path, pcs: &[u64]) -> Vec<String> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let data = std::fs::read(exe).unwrap();
    let f = object::File::parse(&*data).unwrap();
    let syms: Vec<(u64, u64, String)> = f
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .map(|s| (s.address(), s.size(), s.name().unwrap_or("?").to_string()))
        .collect();
    pcs.iter()
        .enumerate()
        .map(|(i, &pc)| {
            let look = if i == 0 { pc } else { pc.wrapping_sub(1) };
            syms.iter()
                .find(|s| s.0 <= look && look < s.0 + s.1)
                .map_or_else(|| format!("?? {pc:#x}"), |s| s.2.clone())
        })
        .collect()
}

/// Unwinds `core`'s crashed thread as an AArch64 perf sample: its
/// registers as the arm64 register block, `stack_bytes` of stack from its
/// sp (less where the stack ends), the executable's mappings as mmap2
/// records; the pcs of the one stack recorded.
fn sample_of_core(exe: &Path, core_path: &Path, stack_bytes: usize) -> Vec<u64> {
    let core = crate::remote::corefile::CoreFile::open(core_path, Some(exe), &Lookup::default())
        .expect("open core");
    let snap = core.snapshot();
    assert_eq!(snap.arch, Machine::Aarch64);
    let t = &snap.threads[0];
    let r = &t.registers;
    let mut words: Vec<u64> = (0..=30u16).map(|x| r.get(x).expect("x register")).collect();
    let sp = r.sp().unwrap();
    words.push(sp);
    words.push(r.pc().unwrap());
    let end = t.stack_end.expect("stack end");
    let len = (stack_bytes as u64).min(end - sp) as usize & !7;
    let mut stack = vec![0u8; len];
    assert!(core.read_bytes(sp, &mut stack), "stack in the core");

    let pid = 4242;
    let opts = RecordOptions::new(Target::Pid(pid));
    let mut rec = aarch64_recording(&opts, pid);
    let mut mapped = 0;
    for m in snap.modules.iter().flat_map(|m| &m.mappings) {
        if m.executable != Some(false) && m.path.starts_with('/') {
            rec.handle(
                &mmap2_record(pid, m.start, m.end - m.start, m.file_offset, &m.path),
                super::sys::EventKind::CpuClock,
            );
            mapped += 1;
        }
    }
    assert!(mapped > 0, "no executable mapping in {:?}", snap.modules);
    rec.handle(
        &sample_record(
            words[32],
            pid,
            pid,
            None,
            REGS_ABI_64,
            &words,
            &stack,
            stack_bytes,
        ),
        super::sys::EventKind::CpuClock,
    );
    assert_eq!(rec.samples, 1, "the sample was not kept");
    let s = &rec.profile.stacks[0];
    assert!(s.first_is_exact);
    s.frames.iter().map(|&a| a as u64).collect()
}

/// gdb-multiarch's chain of `core`, by name.
fn gdb_chain(exe: &Path, core: &Path) -> Vec<String> {
    let gdb = ["timeout", "60", "gdb-multiarch"];
    let pcs = testsupport::fold_repeats(testsupport::gdb_core_pcs(&gdb, exe, core));
    names(exe, &pcs)
}

/// Whether `ours` is gdb's chain `truth`: the same functions, and no
/// more unless gdb stopped at `main` (it does not go past it by default).
fn same_chain(ours: &[String], truth: &[String]) -> bool {
    ours.len() >= truth.len()
        && ours[..truth.len()] == *truth
        && (ours.len() == truth.len() || truth.last().is_some_and(|f| f == "main"))
}

/// Builds `src` with `flags`, crashes it under qemu, and checks that the
/// sample made of its core unwinds to gdb-multiarch's chain, function by
/// function. The truth is gdb's chain of the build with `oracle_flags`
/// when given (the same program where gdb can unwind it), else of this
/// build; `expect` must appear in it, in order from its first element (so
/// that the test checks the program died where it should).
fn check(src: &str, tag: &str, flags: &[&str], oracle_flags: Option<&[&str]>, expect: &[&str]) {
    if !cross_tools() {
        return;
    }
    let dir = testsupport::scratch_dir(&format!("perf-sample-aarch64-{tag}"));
    let exe = build(&dir, src, tag, flags);
    let core = qemu_core(&exe);
    let truth = match oracle_flags {
        Some(f) => {
            let oracle = build(&dir, src, &format!("{tag}-oracle"), f);
            gdb_chain(&oracle, &qemu_core(&oracle))
        }
        None => gdb_chain(&exe, &core),
    };
    let at = truth.iter().position(|f| f == expect[0]);
    assert!(
        at.is_some_and(|i| truth[i..].len() >= expect.len()
            && truth[i..].iter().zip(expect).all(|(a, b)| a == b)),
        "{tag}: gdb-multiarch's chain is not the fixture's: {truth:?}"
    );
    let pcs = sample_of_core(&exe, &core, 16384);
    let ours = names(&exe, &pcs);
    assert!(
        same_chain(&ours, &truth),
        "{tag}: the sample's chain differs from gdb-multiarch's\n  ours: {ours:?}\n truth: {truth:?}\n pcs: {pcs:x?}"
    );
    // The core reader's own unwinding (the whole core as memory) agrees.
    let cf = crate::remote::corefile::CoreFile::open(&core, Some(&exe), &Lookup::default())
        .expect("open core");
    let unwinder = RemoteUnwinder::new(cf.snapshot());
    let core_pcs: Vec<u64> = unwinder
        .unwind(&mut cf.memory(), &cf.snapshot().threads[0], 256)
        .frames
        .iter()
        .map(|f| f.pc)
        .collect();
    let core_chain = names(&exe, &core_pcs);
    assert!(
        same_chain(&core_chain, &truth),
        "{tag}: the core reader's chain differs from gdb-multiarch's\n  core: {core_chain:?}\n truth: {truth:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// main -> a (an 8 KiB frame) -> b -> c -> d -> (through a pointer) crash
/// -> abort, under libc's frames to the signal (`main`'s call of `a` is a
/// tail call at -O2).
const ABORT_CHAIN: &[&str] = &["crash", "d", "c", "b", "a"];

#[test]
fn aarch64_sample_o2_frame_pointers() {
    check(
        "insn_cross.c",
        "o2-fp",
        &["-O2", "-fno-omit-frame-pointer"],
        None,
        ABORT_CHAIN,
    );
}

#[test]
fn aarch64_sample_o2_no_frame_pointers() {
    check(
        "insn_cross.c",
        "o2-nofp",
        &["-O2", "-fomit-frame-pointer"],
        None,
        ABORT_CHAIN,
    );
}

#[test]
fn aarch64_sample_o0() {
    check(
        "insn_cross.c",
        "o0",
        &["-O0"],
        None,
        &["crash", "d", "c", "b", "a", "main"],
    );
}

/// Return addresses signed (`pac-ret`; qemu's default cpu has pointer
/// authentication), so the saved ones carry a code in their top bits and
/// the CFI says `DW_CFA_AARCH64_negate_ra_state` after each `paciasp`.
/// gdb-multiarch stops at the first signed one in a qemu core (no PAC mask
/// note), so the truth is its chain of the same build without `pac-ret`.
#[test]
fn aarch64_sample_o2_pac_ret() {
    check(
        "insn_cross.c",
        "o2-pac",
        &["-O2", "-fomit-frame-pointer", "-mbranch-protection=pac-ret"],
        Some(&["-O2", "-fomit-frame-pointer"]),
        ABORT_CHAIN,
    );
}

/// A crash in a leaf with no frame: its caller is in x30 only.
#[test]
fn aarch64_sample_frameless_leaf() {
    check(
        "insn_cross_leaf.c",
        "leaf-o2",
        &["-O2"],
        None,
        &["leaf", "main"],
    );
}
