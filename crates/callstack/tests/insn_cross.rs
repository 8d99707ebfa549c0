//! Cross-architecture cores, read offline: aarch64, arm (armhf, Thumb-2)
//! and mips (mipsel o32) programs built statically by Debian's cross
//! compilers, with and without unwind tables (and stripped), crashed under
//! qemu-user to get a core. Our chain, by prologue analysis (and, on arm,
//! the EHABI tables where the binary has them), must equal gdb-multiarch's
//! on the build with tables, frame by frame, as function+offset.
//!
//! Skipped (with a message) when the cross compiler, qemu-user or
//! gdb-multiarch is missing: `scripts/install-test-deps.sh` installs them.
// The cores are read through `callstack::remote`.
#![cfg(feature = "remote")]

mod common;
use callstack::unwind::insn::{unwind_prstatus, Method, TargetArch};
use common::cores;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arch {
    Aarch64,
    Arm,
    Mips,
}

impl Arch {
    fn gcc(self) -> &'static str {
        match self {
            Arch::Aarch64 => "aarch64-linux-gnu-gcc",
            Arch::Arm => "arm-linux-gnueabihf-gcc",
            Arch::Mips => "mipsel-linux-gnu-gcc",
        }
    }
    fn qemu(self) -> &'static str {
        match self {
            Arch::Aarch64 => "qemu-aarch64",
            Arch::Arm => "qemu-arm",
            Arch::Mips => "qemu-mipsel",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Arch::Aarch64 => "aarch64",
            Arch::Arm => "arm",
            Arch::Mips => "mips",
        }
    }
    /// Flags that turn unwind tables on (the defaults differ per target).
    fn cfi_flags(self) -> &'static [&'static str] {
        match self {
            Arch::Aarch64 => &["-fasynchronous-unwind-tables"],
            Arch::Arm => &["-funwind-tables"],
            Arch::Mips => &["-fasynchronous-unwind-tables"],
        }
    }
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

fn tools_present(a: Arch) -> bool {
    let ok = have(a.gcc()) && have(a.qemu()) && have("gdb-multiarch");
    if !ok {
        eprintln!("skipping {}: cross gcc, qemu-user or gdb-multiarch missing (run scripts/install-test-deps.sh)", a.name());
    }
    ok
}

fn build(dir: &Path, a: Arch, cfi: bool, opt: &str, strip: bool) -> PathBuf {
    build_src(dir, a, cfi, opt, strip, "insn_cross.c")
}

fn build_src(dir: &Path, a: Arch, cfi: bool, opt: &str, strip: bool, src: &str) -> PathBuf {
    let out = dir.join(format!(
        "{}-{}-{}-{}{}",
        src.trim_end_matches(".c"),
        a.name(),
        opt.trim_start_matches('-'),
        if cfi { "cfi" } else { "nocfi" },
        if strip { "-s" } else { "" }
    ));
    let mut cmd = Command::new(a.gcc());
    cmd.arg(opt).arg("-static");
    if cfi {
        cmd.args(a.cfi_flags());
    } else {
        cmd.args(["-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]);
    }
    cmd.arg(testsupport::c_fixtures().join(src))
        .arg("-o")
        .arg(&out);
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    if strip {
        let strip_tool = a.gcc().replace("-gcc", "-strip");
        assert!(Command::new(strip_tool)
            .arg(&out)
            .status()
            .unwrap()
            .success());
    }
    out
}

/// Runs `exe` under qemu-user until it aborts; returns qemu's core.
fn qemu_core(a: Arch, exe: &Path) -> PathBuf {
    let dir = exe.with_extension("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new("sh")
        .current_dir(&dir)
        .arg("-c")
        .arg(format!(
            "ulimit -c unlimited; exec {} {}",
            a.qemu(),
            exe.display()
        ))
        .output()
        .unwrap();
    // qemu dies of the signal after writing the guest core, leaving a host
    // core of itself: not needed.
    let _ = std::fs::remove_file(dir.join("core"));
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "core"))
        .unwrap_or_else(|| panic!("no qemu core for {}: {o:?}", exe.display()))
}

/// gdb-multiarch's frame pcs; it is given 60 s (it hangs on some signal
/// frames of qemu-user cores), after which what it printed is used.
fn gdb_pcs(exe: &Path, core: &Path) -> Vec<u64> {
    let gdb = ["timeout", "60", "gdb-multiarch"];
    testsupport::fold_repeats(testsupport::gdb_core_pcs(&gdb, exe, core))
}

/// (function, offset) of each pc by the symbols of `exe`; return addresses
/// (all but the first) are looked up at pc - 1 (a call may end a function).
fn by_symbol(exe: &Path, pcs: &[u64]) -> Vec<(String, u64)> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let data = std::fs::read(exe).unwrap();
    let f = object::File::parse(&*data).unwrap();
    let mut syms: Vec<(u64, u64, String)> = f
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .map(|s| {
            (
                s.address() & !1,
                s.size(),
                s.name().unwrap_or("?").to_string(),
            )
        })
        .collect();
    syms.sort();
    pcs.iter()
        .enumerate()
        .map(|(i, &pc)| {
            let pc = pc & !1;
            let look = if i == 0 { pc } else { pc.wrapping_sub(1) };
            match syms.iter().rev().find(|s| s.0 <= look && look < s.0 + s.1) {
                Some(s) => (s.2.clone(), pc - s.0),
                None => ("??".to_string(), pc),
            }
        })
        .collect()
}

fn our_chain(a: Arch, exe: &Path, core_path: &Path) -> Vec<(u64, Method)> {
    let core = cores::open(core_path, exe);
    let mut code = cores::code(&core);
    let (desc, stack_end) = cores::first_thread(&core);
    use callstack::remote::Machine;
    let (target, machine) = match a {
        Arch::Aarch64 => (TargetArch::Aarch64, Machine::Aarch64),
        Arch::Arm => (TargetArch::Arm, Machine::Arm),
        Arch::Mips => (TargetArch::Mips, Machine::Mips),
    };
    assert_eq!(core.snapshot().arch, machine, "the core's machine");
    let mut out = [(0u64, Method::Context); 64];
    let n = unwind_prstatus(
        target,
        &desc,
        &mut core.memory(),
        &mut code,
        stack_end,
        &mut out,
    )
    .unwrap();
    out[..n].to_vec()
}

fn check(a: Arch, opt: &str, strip: bool) {
    if !tools_present(a) {
        return;
    }
    let dir = testsupport::scratch_dir(&format!(
        "insn-cross-{}-{}-{strip}",
        a.name(),
        opt.trim_start_matches('-')
    ));
    let truth_exe = build(&dir, a, true, opt, false);
    let exe = build(&dir, a, false, opt, false);
    let test_exe = if strip {
        build(&dir, a, false, opt, true)
    } else {
        exe.clone()
    };
    let truth_core = qemu_core(a, &truth_exe);
    let core = qemu_core(a, &test_exe);
    let truth = by_symbol(&truth_exe, &gdb_pcs(&truth_exe, &truth_core));
    assert!(
        truth.len() >= 9,
        "gdb-multiarch's chain is short: {truth:?}"
    );
    let ours_raw = our_chain(a, &test_exe, &core);
    let pcs: Vec<u64> = ours_raw.iter().map(|f| f.0).collect();
    let ours = by_symbol(&exe, &pcs);
    let names = |v: &[(String, u64)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert!(
        ours.len() >= truth.len() && ours[..truth.len()] == truth[..],
        "{} {opt} strip={strip}: chain differs\n truth: {:?}\n  ours: {:?}\n truth: {truth:x?}\n  ours: {ours:x?}\n methods: {ours_raw:x?}",
        a.name(),
        names(&truth),
        names(&ours)
    );
    let methods: Vec<&str> = ours_raw[..truth.len()]
        .iter()
        .map(|f| f.1.as_str())
        .collect();
    eprintln!(
        "{} {opt} strip={strip}: {:?}",
        a.name(),
        names(&ours).iter().zip(&methods).collect::<Vec<_>>()
    );
    if !strip {
        // With symbols, every frame is found by analysis (or tables), not by scanning.
        assert!(!methods.contains(&"scan"), "scanned: {methods:?}");
    }
    // The integrated tool gives the same chain: `callstack core --json`
    // (past main, to compare whole chains).
    let (_, cli_pcs) = cores::cli_core_json(&["--past-main", "--methods"], &test_exe, &core);
    let cli_chain = by_symbol(&exe, &cli_pcs);
    assert!(
        cli_chain.len() >= truth.len() && cli_chain[..truth.len()] == truth[..],
        "{} {opt} strip={strip}: callstack core differs\n truth: {truth:x?}\n   cli: {cli_chain:x?}",
        a.name()
    );
    // The build with tables gives the same chain through our unwinder too.
    let ours_cfi = our_chain(a, &truth_exe, &truth_core);
    let pcs: Vec<u64> = ours_cfi.iter().map(|f| f.0).collect();
    let ours_cfi = by_symbol(&truth_exe, &pcs);
    assert!(
        ours_cfi.len() >= truth.len() && ours_cfi[..truth.len()] == truth[..],
        "{} {opt}: chain on the build with tables differs\n truth: {truth:x?}\n  ours: {ours_cfi:x?}",
        a.name()
    );
}

#[test]
fn aarch64_o2() {
    check(Arch::Aarch64, "-O2", false);
}

#[test]
fn aarch64_o2_stripped() {
    check(Arch::Aarch64, "-O2", true);
}

#[test]
fn aarch64_o0() {
    check(Arch::Aarch64, "-O0", false);
}

#[test]
fn mips_o2() {
    check(Arch::Mips, "-O2", false);
}

#[test]
fn mips_o2_stripped() {
    check(Arch::Mips, "-O2", true);
}

#[test]
fn mips_o0() {
    check(Arch::Mips, "-O0", false);
}

#[test]
fn arm_o2() {
    check(Arch::Arm, "-O2", false);
}

#[test]
fn arm_o2_stripped() {
    check(Arch::Arm, "-O2", true);
}

#[test]
fn arm_o0() {
    check(Arch::Arm, "-O0", false);
}

/// The accuracy report for cross-architecture cores without unwind tables:
/// frames right (every frame up to it right, from frame 1 to the outermost
/// frame gdb-multiarch finds on the build with tables), ours against
/// gdb-multiarch's on the same no-table core. `--nocapture` shows the table.
#[test]
fn cross_accuracy_table() {
    let mut rows = Vec::new();
    for a in [Arch::Aarch64, Arch::Arm, Arch::Mips] {
        if !tools_present(a) {
            continue;
        }
        for (opt, strip) in [("-O0", false), ("-O2", false), ("-O2", true)] {
            let dir = testsupport::scratch_dir(&format!(
                "insn-xacc-{}-{}-{strip}",
                a.name(),
                opt.trim_start_matches('-')
            ));
            let truth_exe = build(&dir, a, true, opt, false);
            let exe = build(&dir, a, false, opt, false);
            let test_exe = if strip {
                build(&dir, a, false, opt, true)
            } else {
                exe.clone()
            };
            let truth = by_symbol(&truth_exe, &gdb_pcs(&truth_exe, &qemu_core(a, &truth_exe)));
            let core = qemu_core(a, &test_exe);
            let ours: Vec<u64> = our_chain(a, &test_exe, &core).iter().map(|f| f.0).collect();
            let ours = by_symbol(&exe, &ours);
            let gdb = by_symbol(&exe, &gdb_pcs(&test_exe, &core));
            let right = |got: &[(String, u64)]| {
                truth
                    .iter()
                    .zip(got)
                    .skip(1)
                    .take_while(|(t, g)| t == g)
                    .count()
            };
            let gdb_frames = gdb.len().saturating_sub(1);
            rows.push((
                format!(
                    "{} {}{}",
                    a.name(),
                    opt,
                    if strip { " stripped" } else { "" }
                ),
                truth.len() - 1,
                right(&ours),
                right(&gdb),
                gdb_frames,
            ));
        }
    }
    println!("\n| no unwind tables | frames | ours right | gdb-multiarch right | gdb-multiarch frames shown |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        println!("| {} | {} | {} | {} | {} |", r.0, r.1, r.2, r.3, r.4);
    }
    for r in &rows {
        assert_eq!(r.1, r.2, "{}: ours not all right", r.0);
    }
}

/// Old-style (no `SA_SIGINFO`) signal frames on arm and mips, the rt frame
/// on aarch64: the chain goes from the handler through the signal frame
/// back into the interrupted `raise`, then `b` and `a`. (gdb-multiarch ends
/// or runs into garbage at this frame on arm and aarch64 under qemu-user.)
fn check_signal(a: Arch) {
    if !tools_present(a) {
        return;
    }
    let dir = testsupport::scratch_dir(&format!("insn-sig-{}", a.name()));
    let exe = build_src(&dir, a, false, "-O2", false, "insn_signal.c");
    let core = qemu_core(a, &exe);
    let ours_raw = our_chain(a, &exe, &core);
    let pcs: Vec<u64> = ours_raw.iter().map(|f| f.0).collect();
    let names: Vec<String> = by_symbol(&exe, &pcs).into_iter().map(|x| x.0).collect();
    // gdb-multiarch on these cores (see BENCHMARKS.md): garbage frames after
    // the handler on arm, stops before it on mips, hangs on aarch64. Set
    // INSN_SIGNAL_GDB=1 to print its chain (60 s timeout).
    let gdb: Vec<String> = if std::env::var_os("INSN_SIGNAL_GDB").is_some() {
        by_symbol(&exe, &gdb_pcs(&exe, &core))
            .into_iter()
            .map(|x| x.0)
            .collect()
    } else {
        Vec::new()
    };
    eprintln!(
        "{}: ours {:?}\n  methods {:?}\n  gdb-multiarch {:?}",
        a.name(),
        names,
        ours_raw.iter().map(|f| f.1.as_str()).collect::<Vec<_>>(),
        gdb
    );
    let h = names
        .iter()
        .position(|n| n == "handler")
        .expect("handler in chain");
    assert_eq!(&names[h - 2..=h], ["abort", "c", "handler"], "{names:?}");
    // handler's return address is the trampoline (a frame of its own, like
    // gdb's "<signal handler called>"), then the interrupted code.
    assert_eq!(ours_raw[h + 2].1, Method::SignalFrame, "{ours_raw:x?}");
    let b = names[h + 1..]
        .iter()
        .position(|n| n == "b")
        .map(|i| i + h + 1)
        .expect("b after the signal frame");
    assert!(b <= h + 6, "b too far below the signal frame: {names:?}");
    assert_eq!(names[b + 1], "a", "{names:?}");
}

#[test]
fn signal_frame_arm() {
    check_signal(Arch::Arm);
}

#[test]
fn signal_frame_mips() {
    check_signal(Arch::Mips);
}

#[test]
fn signal_frame_aarch64() {
    check_signal(Arch::Aarch64);
}
