//! Cross-architecture cores, read offline: aarch64, arm (armhf, Thumb-2),
//! mips (mipsel o32) and riscv64 (rv64gc) programs built statically by Debian's cross
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
use callstack::unwind::insn::{unwind_prstatus, Method};
use callstack::unwind::Machine;
use common::cores;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arch {
    Aarch64,
    Arm,
    Mips,
    Riscv64,
}

impl Arch {
    fn gcc(self) -> &'static str {
        match self {
            Arch::Aarch64 => "aarch64-linux-gnu-gcc",
            Arch::Arm => "arm-linux-gnueabihf-gcc",
            Arch::Mips => "mipsel-linux-gnu-gcc",
            Arch::Riscv64 => "riscv64-linux-gnu-gcc",
        }
    }
    fn qemu(self) -> &'static str {
        match self {
            Arch::Aarch64 => "qemu-aarch64",
            Arch::Arm => "qemu-arm",
            Arch::Mips => "qemu-mipsel",
            Arch::Riscv64 => "qemu-riscv64",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Arch::Aarch64 => "aarch64",
            Arch::Arm => "arm",
            Arch::Mips => "mips",
            Arch::Riscv64 => "riscv64",
        }
    }
    /// Flags that turn unwind tables on (the defaults differ per target).
    fn cfi_flags(self) -> &'static [&'static str] {
        match self {
            Arch::Aarch64 => &["-fasynchronous-unwind-tables"],
            Arch::Arm => &["-funwind-tables"],
            Arch::Mips | Arch::Riscv64 => &["-fasynchronous-unwind-tables"],
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
    // On CI `scripts/install-test-deps.sh` ran: a missing tool is a
    // failure there, not a skip.
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "{}: cross gcc, qemu-user or gdb-multiarch missing on CI (scripts/install-test-deps.sh installs them)",
        a.name()
    );
    if !ok {
        eprintln!("skipping {}: cross gcc, qemu-user or gdb-multiarch missing (run scripts/install-test-deps.sh)", a.name());
    }
    ok
}

fn build(dir: &Path, a: Arch, cfi: bool, opt: &str, strip: bool) -> PathBuf {
    build_src(dir, a, cfi, opt, strip, "insn_cross.c")
}

fn build_src(dir: &Path, a: Arch, cfi: bool, opt: &str, strip: bool, src: &str) -> PathBuf {
    build_with(dir, a, cfi, opt, strip, src, "")
}

/// [`build_src`] with extra compiler flags `extra` (`-DNAME`), named after them.
fn build_with(
    dir: &Path,
    a: Arch,
    cfi: bool,
    opt: &str,
    strip: bool,
    src: &str,
    extra: &str,
) -> PathBuf {
    let out = dir.join(format!(
        "{}{}-{}-{}-{}{}",
        src.trim_end_matches(".c"),
        extra.replace(['-', ' ', '='], ""),
        a.name(),
        opt.trim_start_matches('-'),
        if cfi { "cfi" } else { "nocfi" },
        if strip { "-s" } else { "" }
    ));
    let mut cmd = Command::new(a.gcc());
    cmd.arg(opt).arg("-static").args(extra.split_whitespace());
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
    if a == Arch::Riscv64 {
        return gdb_made_core(a, exe, &[], "run", None);
    }
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
    let machine = match a {
        Arch::Aarch64 => Machine::Aarch64,
        Arch::Arm => Machine::Arm,
        Arch::Mips => Machine::Mips,
        Arch::Riscv64 => Machine::Riscv64,
    };
    assert_eq!(core.snapshot().arch, machine, "the core's machine");
    let mut out = [(0u64, Method::Context); 64];
    let n = unwind_prstatus(
        machine,
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

/// gdb-multiarch's frame pcs past `main` (to `_start`).
fn gdb_pcs_past_main(exe: &Path, core: &Path) -> Vec<u64> {
    let gdb = [
        "timeout",
        "60",
        "gdb-multiarch",
        "-ex",
        "set backtrace past-main on",
    ];
    testsupport::fold_repeats(testsupport::gdb_core_pcs(&gdb, exe, core))
}

/// AArch64 `main` that allocates more stack after its prologue (a
/// variable-length array, `alloca`), built without unwind tables and
/// without frame pointers at -O2: the whole chain, past `main` to
/// `_start`, must equal gdb-multiarch's on the build with tables. Without
/// symbols (a stripped build; before issue 24 any core, whose code reader
/// had none), prologue analysis once started
/// at the `sub sp, sp, xN` nearest the pc, found no saved x30, and the frame
/// record's guess gave `__libc_start_call_main` a wrong stack pointer
/// (issue 24).
#[test]
fn aarch64_o2_main_with_dynamic_allocation() {
    let a = Arch::Aarch64;
    if !tools_present(a) {
        return;
    }
    let dir = testsupport::scratch_dir("insn-cross-aarch64-dynalloc");
    for extra in ["-DVLA_MAIN", "-DALLOCA_MAIN"] {
        for strip in [false, true] {
            let src = "insn_cross_vla.c";
            let opt = "-O2";
            let truth_exe = build_with(&dir, a, true, opt, false, src, extra);
            let exe = build_with(&dir, a, false, opt, false, src, extra);
            let test_exe = if strip {
                build_with(&dir, a, false, opt, true, src, extra)
            } else {
                exe.clone()
            };
            let truth_core = qemu_core(a, &truth_exe);
            let core = qemu_core(a, &test_exe);
            let truth = by_symbol(&truth_exe, &gdb_pcs_past_main(&truth_exe, &truth_core));
            let names = |v: &[(String, u64)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
            let tn = names(&truth);
            let at = tn.iter().position(|n| n == "g").expect("g in gdb's chain");
            assert_eq!(
                &tn[at..at + 4],
                ["g", "f", "main", "__libc_start_call_main"],
                "{extra}: gdb-multiarch's chain {tn:?}"
            );
            let ours_raw = our_chain(a, &test_exe, &core);
            let pcs: Vec<u64> = ours_raw.iter().map(|f| f.0).collect();
            let ours = by_symbol(&exe, &pcs);
            assert!(
                ours.len() >= truth.len() && ours[..truth.len()] == truth[..],
                "{extra} strip={strip}: chain differs\n truth: {tn:?}\n  ours: {:?}\n methods: {ours_raw:x?}",
                names(&ours)
            );
            let (_, cli_pcs) =
                cores::cli_core_json(&["--past-main", "--methods"], &test_exe, &core);
            let cli = by_symbol(&exe, &cli_pcs);
            assert!(
                cli.len() >= truth.len() && cli[..truth.len()] == truth[..],
                "{extra} strip={strip}: callstack core differs\n truth: {tn:?}\n   cli: {:?}",
                names(&cli)
            );
        }
    }
}

#[test]
fn riscv64_o2() {
    check(Arch::Riscv64, "-O2", false);
}

#[test]
fn riscv64_o2_stripped() {
    check(Arch::Riscv64, "-O2", true);
}

#[test]
fn riscv64_o0() {
    check(Arch::Riscv64, "-O0", false);
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

#[test]
fn signal_frame_riscv64() {
    check_signal(Arch::Riscv64);
}

// ---------------------------------------------------------------------------
// Signal handlers that abort or fault, and frames over 32 KiB
// (`xarch_signal.c`), read with `callstack core --json`.
//
// The oracle is gdb-multiarch on a `-g` build of the same flags (gcc emits
// the same code with and without `-g`; the `.debug_frame` lets gdb unwind
// code without unwind tables), in two parts:
// - the handler's side of the chain, up to gdb's `<signal handler called>`,
//   from gdb-multiarch on the core of that build;
// - the interrupted side, from gdb-multiarch attached to qemu-user's gdb
//   stub, stopped when the first signal arrives (before the handler runs):
//   there the interrupted code is the innermost frame, at its exact pc,
//   and no signal frame is involved.
// gdb-multiarch on the core alone is not usable past the signal frame:
// under qemu-user it hangs at aarch64's trampoline, prints garbage after
// arm's old-style (no SA_SIGINFO) frame, and on the others agrees with the
// live chain (checked below where it gets there).

/// One frame as gdb prints it: its pc, or the signal-frame marker.
#[derive(Clone, Debug, PartialEq, Eq)]
enum GFrame {
    Pc(u64),
    Marker,
}

/// The frames of the last `bt` in gdb's output (lines `#N  0x... in f`,
/// `#N  <signal handler called>`).
fn parse_bt(text: &str) -> Vec<GFrame> {
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    let from = lines
        .iter()
        .rposition(|l| l.starts_with("#0 "))
        .unwrap_or(0);
    lines[from..]
        .iter()
        .filter_map(|l| {
            let rest = l.split_once(' ')?.1.trim_start();
            if rest.starts_with("<signal handler called>") {
                return Some(GFrame::Marker);
            }
            let hex = rest.strip_prefix("0x")?.split(' ').next()?;
            u64::from_str_radix(hex, 16).ok().map(GFrame::Pc)
        })
        .collect()
}

const GDB_FRAME_SETTINGS: [&str; 4] = [
    "-ex",
    "set print frame-arguments none",
    "-ex",
    "set print frame-info location-and-address",
];

/// gdb-multiarch's `bt` of a core (10 s: it hangs on aarch64's qemu-user
/// signal frames, after printing the frames up to the handler).
fn gdb_core_bt(exe: &Path, core: &Path) -> Vec<GFrame> {
    let o = Command::new("timeout")
        .args(["10", "gdb-multiarch"])
        .args(testsupport::GDB_BATCH_ARGS)
        .args(GDB_FRAME_SETTINGS)
        .args(["-ex", "bt 100"])
        .arg(exe)
        .arg(core)
        .output()
        .unwrap();
    parse_bt(&String::from_utf8_lossy(&o.stdout))
}

/// Whether something listens on TCP `port` (qemu's gdb stub is up).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 3 && format!("{} ", c[1]).ends_with(&want) && c[3] == "0A"
            })
        })
    })
}

/// gdb-multiarch's `bt` at the two signals of `exe` (run with `mode`
/// under qemu-user's gdb stub): when the first one arrives (the
/// interrupted chain), and at the fatal one inside the handler (the
/// handler's side, up to where gdb errs at the signal frame).
fn gdb_live_bt_at_signals(a: Arch, exe: &Path, mode: &str) -> (Vec<GFrame>, Vec<GFrame>) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut qemu = Command::new(a.qemu())
        .arg("-g")
        .arg(port.to_string())
        .arg(exe)
        .arg(mode)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if listening(port) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let o = Command::new("timeout")
        .args(["60", "gdb-multiarch"])
        .args(testsupport::GDB_BATCH_ARGS)
        .args(GDB_FRAME_SETTINGS)
        .args(["-ex", &format!("target remote 127.0.0.1:{port}")])
        .args([
            "-ex", "continue", "-ex", "bt 100", "-ex", "continue", "-ex", "bt 100",
        ])
        .args(["-ex", "kill"])
        .arg(exe)
        .output()
        .unwrap();
    let _ = qemu.kill();
    let _ = qemu.wait();
    let text = String::from_utf8_lossy(&o.stdout);
    let parts: Vec<&str> = text.split("Program received signal").collect();
    assert!(
        parts.len() == 3,
        "not two signals under the gdb stub: {text}"
    );
    (parse_bt(parts[1]), parse_bt(parts[2]))
}

/// The core of `exe args` run under qemu-user until it dies, written by
/// `tests/fixtures/gdb/qemu_user_core.py` from gdb-multiarch attached to
/// qemu's gdb stub: qemu-user writes no guest core for RISC-V (its
/// `elfload.c` has no core dump support for that target, up to at least
/// 10.x). The script writes what the kernel would: each thread's
/// `NT_PRSTATUS` (the signalled one first), `NT_FILE`, and the guest's
/// mappings as qemu logs them (`-d page`: stacks, data, the signal
/// trampoline page). With `sysroot`, the program runs on that sysroot's
/// libraries (`qemu -L`), which the core names at the paths the guest saw.
fn gdb_made_core(a: Arch, exe: &Path, args: &[&str], tag: &str, sysroot: Option<&str>) -> PathBuf {
    let dir = exe.with_extension(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (map, core) = (dir.join("qemu-pages.log"), dir.join("guest.core"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut qemu = Command::new(a.qemu())
        .args(sysroot.map(|r| ["-L", r]).iter().flatten())
        .args(["-d", "page", "-g", &port.to_string()])
        .arg(exe)
        .args(args)
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&map).unwrap())
        .spawn()
        .unwrap();
    for _ in 0..400 {
        if listening(port) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let o = Command::new("timeout")
        .args(["120", "gdb-multiarch"])
        .args(testsupport::GDB_BATCH_ARGS)
        .args(["-ex", &format!("set sysroot {}", sysroot.unwrap_or(""))])
        .args(["-ex", &format!("target remote 127.0.0.1:{port}")])
        .arg("-x")
        .arg(testsupport::workspace_root().join("tests/fixtures/gdb/qemu_user_core.py"))
        .arg(exe)
        .env("CORE_OUT", &core)
        .env("CORE_EXE", exe)
        .env("CORE_MAP", &map)
        .env("CORE_SYSROOT", sysroot.unwrap_or(""))
        .output()
        .unwrap();
    let _ = qemu.kill();
    let _ = qemu.wait();
    assert!(
        core.exists(),
        "no core for {} {args:?}: {}\n{}",
        exe.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    core
}

/// Runs `exe mode` under qemu-user until it dies; returns qemu's core.
fn qemu_core_args(a: Arch, exe: &Path, mode: &str) -> PathBuf {
    if a == Arch::Riscv64 {
        return gdb_made_core(a, exe, &[mode], &format!("run-{mode}"), None);
    }
    let dir = exe.with_extension(format!("run-{mode}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new("sh")
        .current_dir(&dir)
        .arg("-c")
        .arg(format!(
            "ulimit -c unlimited; exec {} {} {mode}",
            a.qemu(),
            exe.display()
        ))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(dir.join("core"));
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "core"))
        .unwrap_or_else(|| panic!("no qemu core for {} {mode}: {o:?}", exe.display()))
}

/// `function+offset` of a frame (`exact`: its pc is where it stopped, not
/// a return address, so it is looked up as is), or the marker.
/// AArch64, -O2, no unwind tables, no frame pointer: the fault is in a
/// leaf with no stack frame placed right after a function that saves x30
/// and ends in a tail call. A core's code reader once had no function
/// symbols, so prologue analysis guessed the leaf's start by searching
/// backwards, landed in the previous function's `stp x19, x30`, and the
/// chain went from the leaf straight to `__libc_start_main_impl`, skipping
/// `main` (issue 24). The chain of `callstack core` (and of the library's
/// own core walk) must equal gdb-multiarch's on the build with tables.
#[test]
fn aarch64_o2_frameless_leaf_after_tail_call() {
    let a = Arch::Aarch64;
    if !tools_present(a) {
        return;
    }
    let dir = testsupport::scratch_dir("insn-cross-aarch64-leaf");
    let (src, opt, extra) = (
        "insn_cross_leaf.c",
        "-O2",
        "-fomit-frame-pointer -fno-reorder-functions",
    );
    let truth_exe = build_with(&dir, a, true, opt, false, src, extra);
    let exe = build_with(&dir, a, false, opt, false, src, extra);
    // The layout the test is about: leaf is the next function after
    // before_leaf, which has no `ret`.
    let data = std::fs::read(&exe).unwrap();
    let f = object::File::parse(&*data).unwrap();
    let sym = |name: &str| {
        use object::{Object, ObjectSymbol};
        let s = f.symbols().find(|s| s.name() == Ok(name)).unwrap();
        (s.address(), s.size())
    };
    let (bl, bl_size) = sym("before_leaf");
    let (leaf, _) = sym("leaf");
    assert!(
        leaf >= bl + bl_size && leaf - (bl + bl_size) < 16,
        "layout: before_leaf {bl:#x}+{bl_size:#x}, leaf {leaf:#x}"
    );
    let truth_core = qemu_core(a, &truth_exe);
    let core = qemu_core(a, &exe);
    let truth = by_symbol(&truth_exe, &gdb_pcs_past_main(&truth_exe, &truth_core));
    let names = |v: &[(String, u64)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    let tn = names(&truth);
    assert_eq!(
        &tn[..3],
        ["leaf", "main", "__libc_start_call_main"],
        "gdb-multiarch's chain {tn:?}"
    );
    let ours_raw = our_chain(a, &exe, &core);
    let pcs: Vec<u64> = ours_raw.iter().map(|f| f.0).collect();
    let ours = by_symbol(&exe, &pcs);
    assert!(
        ours.len() >= truth.len() && ours[..truth.len()] == truth[..],
        "chain differs\n truth: {tn:?}\n  ours: {:?}\n methods: {ours_raw:x?}",
        names(&ours)
    );
    let (_, cli_pcs) = cores::cli_core_json(&["--past-main", "--methods"], &exe, &core);
    let cli = by_symbol(&exe, &cli_pcs);
    assert!(
        cli.len() >= truth.len() && cli[..truth.len()] == truth[..],
        "callstack core differs\n truth: {tn:?}\n   cli: {:?}",
        names(&cli)
    );
}

fn named(exe: &Path, f: &GFrame, exact: bool) -> String {
    match f {
        GFrame::Marker => "<signal handler called>".to_string(),
        GFrame::Pc(pc) => {
            // by_symbol looks its first pc up as is, the others at pc - 1.
            let pcs = if exact { vec![*pc] } else { vec![0, *pc] };
            let (f, off) = by_symbol(exe, &pcs).pop().unwrap();
            format!("{f}+{off:#x}")
        }
    }
}

fn named_chain(exe: &Path, chain: &[GFrame]) -> Vec<String> {
    chain
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let exact = i == 0 || chain[i - 1] == GFrame::Marker;
            named(exe, f, exact)
        })
        .collect()
}

fn build_xarch(dir: &Path, a: Arch, opt: &str, fp: bool, g: bool) -> PathBuf {
    let out = dir.join(format!(
        "xarch_signal-{}-{}-{}{}",
        a.name(),
        opt.trim_start_matches('-'),
        if fp { "fp" } else { "nofp" },
        if g { "-g" } else { "" }
    ));
    let mut cmd = Command::new(a.gcc());
    cmd.arg(opt)
        .arg("-static")
        .args(["-fno-asynchronous-unwind-tables", "-fno-unwind-tables"])
        .arg(if fp {
            "-fno-omit-frame-pointer"
        } else {
            "-fomit-frame-pointer"
        });
    if g {
        cmd.arg("-g");
    }
    let o = cmd
        .arg(testsupport::c_fixtures().join("xarch_signal.c"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// Our chain of `callstack core --json EXE CORE` (ending at main, as gdb).
fn cli_chain(exe: &Path, core: &Path) -> Vec<GFrame> {
    let (report, _) = cores::cli_core_json(&[], exe, core);
    report["threads"][0]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["inlined"] != true)
        .map(|f| {
            if f["signal_handler_called"] == true {
                GFrame::Marker
            } else {
                let pc = f["pc"].as_str().unwrap().trim_start_matches("0x");
                GFrame::Pc(u64::from_str_radix(pc, 16).unwrap())
            }
        })
        .collect()
}

/// The modes of `xarch_signal.c` each build runs: a fault interrupted by a
/// SA_SIGINFO handler that aborts, a raise() interrupted by a plain handler
/// that faults, and no signal (the big frame alone).
const XARCH_MODES: [&str; 3] = ["sai", "rfp", "n"];

fn check_xarch(a: Arch, opt: &str) {
    if !tools_present(a) {
        return;
    }
    let dir = testsupport::scratch_dir(&format!(
        "xarch-signal-{}-{}",
        a.name(),
        opt.trim_start_matches('-')
    ));
    let mut failures = Vec::new();
    for fp in [true, false] {
        let exe = build_xarch(&dir, a, opt, fp, false);
        let oracle = build_xarch(&dir, a, opt, fp, true);
        for mode in XARCH_MODES {
            let what = format!("{} {opt} fp={fp} {mode}", a.name());
            let core_gdb = gdb_core_bt(&oracle, &qemu_core_args(a, &oracle, mode));
            let truth: Vec<GFrame> = if mode == "n" {
                core_gdb.clone()
            } else {
                let (live, live_fatal) = gdb_live_bt_at_signals(a, &oracle, mode);
                let cut = core_gdb
                    .iter()
                    .position(|f| *f == GFrame::Marker)
                    .unwrap_or(core_gdb.len());
                // The handler's side: gdb-multiarch on the core, or, where
                // it hangs before the handler (aarch64), live at the fatal
                // signal; the two agree as far as the core's goes.
                let live_cut = live_fatal
                    .iter()
                    .position(|f| *f == GFrame::Marker)
                    .unwrap_or(live_fatal.len());
                let live_upper = &live_fatal[..live_cut];
                let upper = if cut > 0
                    && named(&oracle, &core_gdb[cut - 1], cut == 1).contains("handler+")
                {
                    &core_gdb[..cut]
                } else {
                    live_upper
                };
                assert!(
                    upper.len() >= cut && upper[..cut] == core_gdb[..cut],
                    "{what}: gdb-multiarch's core and live chains differ: {:?} vs {:?}",
                    named_chain(&oracle, &core_gdb),
                    named_chain(&oracle, &live_fatal)
                );
                let cut = upper.len();
                // gdb-multiarch got the handler's side up to the handler.
                let last = named(&oracle, upper.last().unwrap(), cut == 1);
                assert!(
                    last.starts_with("handler+") || last.starts_with("info_handler+"),
                    "{what}: gdb-multiarch's chain in the core ends before the handler: {:?}",
                    named_chain(&oracle, &core_gdb)
                );
                let mut t = upper.to_vec();
                t.push(GFrame::Marker);
                t.extend(live.iter().cloned());
                // Where gdb-multiarch passed the signal frame in the core
                // and its chain is sane, it is the live one.
                if cut < core_gdb.len() && a == Arch::Mips {
                    assert_eq!(
                        named_chain(&oracle, &core_gdb),
                        named_chain(&oracle, &t),
                        "{what}: gdb-multiarch's core chain and its live chain differ"
                    );
                }
                t
            };
            let truth = named_chain(&oracle, &truth);
            assert!(
                truth.last().is_some_and(|f| f.starts_with("main+")),
                "{what}: the oracle's chain does not reach main: {truth:?}"
            );
            let ours = named_chain(&exe, &cli_chain(&exe, &qemu_core_args(a, &exe, mode)));
            eprintln!("{what}: {ours:?}");
            if ours != truth {
                failures.push(format!("{what}:\n  gdb:  {truth:?}\n  ours: {ours:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn xarch_signal_aarch64_o0() {
    check_xarch(Arch::Aarch64, "-O0");
}

#[test]
fn xarch_signal_aarch64_o2() {
    check_xarch(Arch::Aarch64, "-O2");
}

#[test]
fn xarch_signal_arm_o0() {
    check_xarch(Arch::Arm, "-O0");
}

#[test]
fn xarch_signal_arm_o2() {
    check_xarch(Arch::Arm, "-O2");
}

#[test]
fn xarch_signal_mips_o0() {
    check_xarch(Arch::Mips, "-O0");
}

#[test]
fn xarch_signal_mips_o2() {
    check_xarch(Arch::Mips, "-O2");
}

#[test]
fn xarch_signal_riscv64_o0() {
    check_xarch(Arch::Riscv64, "-O0");
}

#[test]
fn xarch_signal_riscv64_o2() {
    check_xarch(Arch::Riscv64, "-O2");
}

/// gdb-multiarch's `thread apply all bt` of a core: each thread's LWP and
/// frames.
fn gdb_all_threads(exe: &Path, core: &Path) -> Vec<(u64, Vec<GFrame>)> {
    let o = Command::new("timeout")
        .args(["60", "gdb-multiarch"])
        .args(testsupport::GDB_BATCH_ARGS)
        .args(GDB_FRAME_SETTINGS)
        .args(["-ex", "thread apply all bt 100"])
        .arg(exe)
        .arg(core)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    text.split("\nThread ")
        .skip(1)
        .filter_map(|block| {
            let lwp = block.split("(LWP ").nth(1)?.split(')').next()?;
            Some((lwp.trim().parse().ok()?, parse_bt(block)))
        })
        .collect()
}

/// Two threads (`threads_crash.c`: a second thread faults while main waits
/// in `pthread_join`), built with and without unwind tables: `callstack core`
/// walks both threads of the riscv64 core, each chain equal to
/// gdb-multiarch's `thread apply all bt` on the core of the build with
/// tables (the code is the same; only the tables differ).
#[test]
fn riscv64_two_threads() {
    let a = Arch::Riscv64;
    if !tools_present(a) {
        return;
    }
    let dir = testsupport::scratch_dir("insn-cross-riscv64-threads");
    let truth_exe = build_src(&dir, a, true, "-O2", false, "threads_crash.c");
    let exe = build_src(&dir, a, false, "-O2", false, "threads_crash.c");
    let truth_core = qemu_core(a, &truth_exe);
    let mut gdb = gdb_all_threads(&truth_exe, &truth_core);
    assert_eq!(gdb.len(), 2, "gdb-multiarch's threads: {gdb:?}");
    // The signalled thread first, as the core's notes and our report have it.
    let (signalled, _) = cores::cli_core_json(&[], &truth_exe, &truth_core);
    let first_tid = signalled["threads"][0]["tid"].as_u64().unwrap();
    gdb.sort_by_key(|(tid, _)| *tid != first_tid);
    let truth: Vec<Vec<String>> = gdb
        .iter()
        .map(|(_, bt)| named_chain(&truth_exe, bt))
        .collect();
    assert!(
        truth[0]
            .iter()
            .take(4)
            .map(|f| f.split('+').next().unwrap())
            .eq(["w3", "w2", "w1", "worker"]),
        "gdb-multiarch's chain of the faulting thread: {truth:?}"
    );
    assert!(
        truth[1].iter().any(|f| f.starts_with("wait_here+"))
            && truth[1].iter().any(|f| f.starts_with("main+")),
        "gdb-multiarch's chain of main's thread: {truth:?}"
    );
    for (e, c, what) in [
        (&truth_exe, &truth_core, "with tables"),
        (&exe, &qemu_core(a, &exe), "without tables"),
    ] {
        let (report, _) = cores::cli_core_json(&[], e, c);
        let threads = report["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 2, "{what}: {report}");
        for (i, t) in threads.iter().enumerate() {
            let frames: Vec<GFrame> = t["frames"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["inlined"] != true)
                .map(|f| {
                    let pc = f["pc"].as_str().unwrap().trim_start_matches("0x");
                    GFrame::Pc(u64::from_str_radix(pc, 16).unwrap())
                })
                .collect();
            let ours = named_chain(e, &frames);
            assert_eq!(ours, truth[i], "{what}, thread {i}");
        }
    }
}

/// The sysroot of Debian's riscv64 cross toolchain (`libc6-riscv64-cross`).
const RISCV64_SYSROOT: &str = "/usr/riscv64-linux-gnu";

/// A dynamically linked (PIE) riscv64 program run on the cross sysroot
/// (`qemu-riscv64 -L`), at -O0 and -O2, with and without unwind tables:
/// `callstack core --sysroot` finds its libraries at the paths the guest
/// saw under the sysroot, and its chain (past main) equals gdb-multiarch's
/// (`set sysroot`) on the core of the build with tables, pc for pc, each
/// frame of `insn_cross.c` named.
#[test]
fn riscv64_dynamic_on_a_sysroot() {
    let a = Arch::Riscv64;
    if !tools_present(a) {
        return;
    }
    let dir = testsupport::scratch_dir("insn-cross-riscv64-dynamic");
    let gdb = [
        "gdb-multiarch",
        "-ex",
        &format!("set sysroot {RISCV64_SYSROOT}"),
    ];
    for opt in ["-O0", "-O2"] {
        let build = |cfi: bool| {
            let out = dir.join(format!(
                "dyn-{}-{}",
                opt.trim_start_matches('-'),
                if cfi { "cfi" } else { "nocfi" }
            ));
            let mut cmd = Command::new(a.gcc());
            cmd.arg(opt);
            if cfi {
                cmd.args(a.cfi_flags());
            } else {
                cmd.args(["-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]);
            }
            let o = cmd
                .arg(testsupport::c_fixtures().join("insn_cross.c"))
                .arg("-o")
                .arg(&out)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            out
        };
        let (truth_exe, exe) = (build(true), build(false));
        let core_of = |e: &Path| gdb_made_core(a, e, &[], "run", Some(RISCV64_SYSROOT));
        let truth = gdb_pcs_with(&gdb, &truth_exe, &core_of(&truth_exe));
        assert!(
            truth.len() >= 9,
            "{opt}: gdb-multiarch's chain is short: {truth:x?}"
        );
        let core = core_of(&exe);
        let (report, pcs) =
            cores::cli_core_json(&["--past-main", "--sysroot", RISCV64_SYSROOT], &exe, &core);
        assert!(
            pcs.len() >= truth.len() && pcs[..truth.len()] == truth[..],
            "{opt}: chain differs\n truth: {truth:x?}\n  ours: {pcs:x?}\n{report:#}"
        );
        let names: Vec<&str> = report["threads"][0]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["function"].as_str())
            .collect();
        let at = names
            .iter()
            .position(|n| *n == "crash")
            .expect("crash named");
        assert_eq!(
            &names[at..at + 5],
            ["crash", "d", "c", "b", "a"],
            "{opt}: {names:?}"
        );
        assert!(
            names[..at].contains(&"abort"),
            "{opt}: libc's frames unnamed: {names:?}"
        );
    }
}

/// [`gdb_pcs`] with gdb given as `gdb` (its program and first arguments).
fn gdb_pcs_with(gdb: &[&str], exe: &Path, core: &Path) -> Vec<u64> {
    let mut cmd = vec!["timeout", "60"];
    cmd.extend_from_slice(gdb);
    testsupport::fold_repeats(testsupport::gdb_core_pcs(&cmd, exe, core))
}
