//! The C API on Windows x86-64: `callstack_capture_fast` and
//! `callstack_capture_exact` in C programs
//! built by mingw-w64 and run under wine, named on this side from the PE
//! (its COFF symbols and the DWARF mingw's gcc writes into it).
//!
//! `tests/fixtures/c/win_chain.c` captures in `leaf` through
//! main -> alpha -> beta -> leaf, with skip 1, and on a thread of
//! `CreateThread` through thread_main -> alpha -> beta -> leaf, linked to
//! the `libcallstack.a` built for `x86_64-pc-windows-gnu`. Every chain
//! must be exactly the designed one, each frame's function, file and call
//! line:
//! - `callstack_capture_fast` at -O0 and -O2 with `-fno-omit-frame-pointer`:
//!   past the designed chain only start-up frames (the C runtime's in the
//!   executable, or frames of other modules);
//! - `callstack_capture_exact` (the images' `.pdata`/`.xdata`) at -O0 and
//!   -O2 with and without frame pointers: the whole chain down to the
//!   thread's first frame, the C runtime's `__tmainCRTStartup` and
//!   `mainCRTStartup` (main thread), then kernel32 and ntdll;
//! - `callstack_capture_from_context` in a vectored exception handler, from
//!   the `CONTEXT` of an `int3` in `leaf` (-O0, and -O2 without frame
//!   pointers): leaf's exact pc, then the same whole chain; and at every
//!   instruction single-stepped from there through leaf's epilogue and
//!   `ret` (-O0, -O2 with and without frame pointers), which the unwind
//!   data does not describe.
//!
//! `callstack addr2line` names the executable's frames of the exact
//! captures as mingw-w64's binutils `addr2line` does (the oracle).
//!
//! Run by `scripts/test-windows.sh` (ignored otherwise), which builds the
//! library and says where it and wine are: `CALLSTACK_WINDOWS_LIB` (the
//! directory of that `libcallstack.a`), `CALLSTACK_WINE` (the wine
//! loader), `WINEPREFIX`.
use std::path::{Path, PathBuf};
use std::process::Command;

use callstack::symbolize::{Address, Symbolizer};
use testsupport::{c_fixtures, mingw_build_with_callstack, mingw_gcc, run_under_wine, scratch_dir};

/// The C runtime's start-up frames, which the walk may reach past `main`
/// where they kept a frame record.
const CRT: &[&str] = &["__tmainCRTStartup", "mainCRTStartup", "WinMainCRTStartup"];

/// Builds the fixture with `flags` by mingw-w64's gcc, into a file of its
/// own per test.
fn build(mode: &str, flags: &str) -> PathBuf {
    let tag: String = flags.split_whitespace().collect();
    let out = scratch_dir("windows_c").join(format!("win_chain-{mode}{tag}.exe"));
    let f: Vec<&str> = flags.split_whitespace().collect();
    mingw_build_with_callstack("win_chain.c", &f, &out);
    out
}

/// Runs `exe` under wine with `arg`; its standard output.
fn run(exe: &Path, arg: &str) -> String {
    run_under_wine(exe, &[arg])
}

#[derive(Debug)]
struct Frame {
    ra: u64,
    base: u64,
    module: String,
}

/// The frames of capture `label` in the fixture's output.
fn capture(text: &str, label: &str) -> Vec<Frame> {
    let head = format!("capture {label} ");
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&head));
    let n: usize = lines
        .next()
        .unwrap_or_else(|| panic!("no capture {label} in:\n{text}"))[head.len()..]
        .parse()
        .unwrap();
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let frames: Vec<Frame> = lines
        .take(n)
        .map(|l| {
            let mut it = l
                .strip_prefix("frame ")
                .expect("a frame line")
                .splitn(3, ' ');
            Frame {
                ra: hex(it.next().unwrap()),
                base: hex(it.next().unwrap()),
                module: it.next().unwrap().to_string(),
            }
        })
        .collect();
    assert_eq!(frames.len(), n, "capture {label}:\n{text}");
    frames
}

/// The PE's preferred load address (`ImageBase` of its PE32+ optional
/// header): the link-time addresses its symbols and DWARF use.
fn image_base(exe: &Path) -> u64 {
    let b = std::fs::read(exe).unwrap();
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    let pe = u32_at(0x3c);
    assert_eq!(&b[pe..pe + 4], b"PE\0\0");
    let opt = pe + 24;
    assert_eq!(u16::from_le_bytes([b[opt], b[opt + 1]]), 0x20b, "PE32+");
    u64::from_le_bytes(b[opt + 24..opt + 32].try_into().unwrap())
}

/// A frame as named on this side: function, file name, line; frames of
/// other modules by their module's file name alone.
#[derive(Debug, PartialEq, Eq)]
enum Named {
    Own(String, String, u32),
    Other(String),
}

fn name(sym: &mut Symbolizer, exe: &Path, bias: u64, f: &Frame, exact: bool) -> Named {
    let exe_name = exe.file_name().unwrap().to_str().unwrap();
    // wine names the executable by its DOS path (Z:\...\win_chain-O0.exe).
    let module = f
        .module
        .rsplit(['\\', '/'])
        .next()
        .unwrap_or("")
        .to_string();
    if !module.eq_ignore_ascii_case(exe_name) {
        assert_ne!(module, "?", "{:#x} is in no module", f.ra);
        return Named::Other(module);
    }
    let linked = (f.ra - f.base + bias) as usize;
    let s = sym.symbolize(if exact {
        Address::Exact(linked)
    } else {
        Address::Return(linked)
    });
    let fr = s
        .frames
        .last()
        .unwrap_or_else(|| panic!("{:#x} unnamed", f.ra));
    let file = fr
        .file
        .as_deref()
        .map(|p| p.rsplit(['\\', '/']).next().unwrap_or("").to_string())
        .unwrap_or_default();
    Named::Own(
        fr.function.as_deref().unwrap_or("??").to_string(),
        file,
        fr.line.unwrap_or(0),
    )
}

/// The line of the fixture holding `needle` (the first one at or after the
/// line holding `after`).
fn line_of(after: &str, needle: &str) -> u32 {
    testsupport::line_of(&c_fixtures().join("win_chain.c"), after, needle)
}

/// A frame the test expects.
#[derive(Clone, Debug)]
enum Want {
    /// The fixture's function, and the line of its call.
    Own(&'static str, u32),
    /// A C runtime start-up function of the executable.
    Crt(&'static str),
    /// A frame in another module (its file name, lowercase).
    Module(&'static str),
}

impl Want {
    fn matches(&self, n: &Named) -> bool {
        match (self, n) {
            (Want::Own(f, l), Named::Own(g, file, m)) => f == g && file == "win_chain.c" && l == m,
            (Want::Crt(f), Named::Own(g, _, _)) => f == g,
            (Want::Module(m), Named::Other(o)) => o.eq_ignore_ascii_case(m),
            _ => false,
        }
    }
}

/// `capture_fast`: exactly `want` first, then start-up frames only (the C
/// runtime's, built without frame pointers, may end the chain anywhere).
fn check_prefix(label: &str, named: &[Named], want: &[Want]) {
    assert!(
        named.len() >= want.len() && want.iter().zip(named).all(|(w, n)| w.matches(n)),
        "capture {label}: got {named:#?}\nwant {want:#?} first"
    );
    for n in &named[want.len()..] {
        match n {
            Named::Own(f, _, _) => assert!(
                CRT.contains(&f.as_str()),
                "capture {label}: {f} past the designed chain: {named:#?}"
            ),
            Named::Other(_) => {}
        }
    }
}

/// `capture_exact`: exactly `want`, down to the thread's first frame.
fn check_all(label: &str, named: &[Named], want: &[Want]) {
    assert!(
        named.len() == want.len() && want.iter().zip(named).all(|(w, n)| w.matches(n)),
        "capture {label}: got {named:#?}\nwant {want:#?}"
    );
}

/// `callstack addr2line -f -e EXE` on the PE gives what mingw-w64's
/// binutils `addr2line` gives (function, file:line) for each of the
/// executable's frames of capture `label` (at `ra - 1`: return addresses).
fn addr2line_agrees(exe: &Path, text: &str, label: &str, bias: u64) {
    let exe_name = exe
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    let addrs: Vec<String> = capture(text, label)
        .iter()
        .filter(|f| f.module.to_ascii_lowercase().ends_with(&exe_name))
        .map(|f| format!("{:x}", f.ra - 1 - f.base + bias))
        .collect();
    assert!(addrs.len() >= 4, "{text}");
    let output = |mut cmd: Command| {
        cmd.args(["-f", "-e"]).arg(exe).args(&addrs);
        let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        assert!(o.status.success(), "{cmd:?}: {}", o.status);
        String::from_utf8(o.stdout).unwrap()
    };
    // The release CLI scripts/test.sh built; built here when missing.
    let built = testsupport::target_dir().join("release/callstack");
    let cli = if built.exists() {
        built
    } else {
        testsupport::release_artifacts().cli.clone()
    };
    let mut ours = Command::new(cli);
    ours.arg("addr2line");
    let ours = output(ours);
    let binutils = output(Command::new("x86_64-w64-mingw32-addr2line"));
    assert_eq!(ours, binutils, "{addrs:?}");
}

fn chains(mode: &str, flags: &str) {
    let exe = build(mode, flags);
    let text = run(&exe, mode);
    let bias = image_base(&exe);
    let mut sym = Symbolizer::for_file(&exe).expect("open the PE");
    let mut names = |label: &str| -> Vec<Named> {
        capture(&text, label)
            .iter()
            .enumerate()
            .map(|(i, f)| name(&mut sym, &exe, bias, f, i == 0 && mode == "context"))
            .collect()
    };
    use Want::*;
    let leaf = Own("leaf", line_of("void leaf(void)", "capture(skip"));
    let beta = || Own("beta", line_of("void beta(void)", "leaf();"));
    let alpha = || Own("alpha", line_of("void alpha(void)", "beta();"));
    let main = Own("main", line_of("int main(int", "alpha();"));
    let main2 = Own("main", line_of("skip = 1;", "alpha();"));
    let thread = Own("thread_main", line_of("thread_main(LPVOID", "alpha();"));
    let (m, s, t) = (names("main"), names("skip1"), names("thread"));
    if mode == "context" {
        // From the breakpoint's context: leaf's exact pc (the int3), then
        // the whole chain, skip dropping return addresses only.
        let trap = || Own("leaf", line_of("void leaf(void)", "int3"));
        let start = || [Crt("__tmainCRTStartup"), Crt("mainCRTStartup")];
        let system = || [Module("kernel32.dll"), Module("ntdll.dll")];
        let mut want = vec![trap(), beta(), alpha(), main];
        want.extend(start());
        want.extend(system());
        check_all("main", &m, &want);
        let mut want = vec![trap(), alpha(), main2];
        want.extend(start());
        want.extend(system());
        check_all("skip1", &s, &want);
        let mut want = vec![trap(), beta(), alpha(), thread];
        want.extend(system());
        check_all("thread", &t, &want);
        return;
    }
    if mode == "fast" {
        check_prefix("main", &m, &[leaf.clone(), beta(), alpha(), main]);
        check_prefix("skip1", &s, &[beta(), alpha(), main2]);
        check_prefix("thread", &t, &[leaf, beta(), alpha(), thread]);
    } else {
        // Down to the thread's start: the C runtime's start-up, then
        // kernel32's BaseThreadInitThunk and ntdll's RtlUserThreadStart.
        let start = || [Crt("__tmainCRTStartup"), Crt("mainCRTStartup")];
        let system = || [Module("kernel32.dll"), Module("ntdll.dll")];
        let mut want = vec![leaf.clone(), beta(), alpha(), main];
        want.extend(start());
        want.extend(system());
        check_all("main", &m, &want);
        let mut want = vec![beta(), alpha(), main2];
        want.extend(start());
        want.extend(system());
        check_all("skip1", &s, &want);
        let mut want = vec![leaf, beta(), alpha(), thread];
        want.extend(system());
        check_all("thread", &t, &want);
    }
    assert!(text.contains("null 0 zero 0"), "{text}");
    if mode == "exact" {
        addr2line_agrees(&exe, &text, "main", bias);
    }
}

/// `callstack_capture_from_context` at every instruction single-stepped
/// from the int3 in `leaf` through its epilogue and `ret` into `beta`:
/// every capture the int3's chain, the pc moved (the fixture compares).
fn single_step(flags: &str) {
    let exe = build("step", flags);
    let text = run(&exe, "step");
    let line = text
        .lines()
        .find(|l| l.starts_with("step "))
        .unwrap_or_else(|| panic!("{text}"));
    let n: Vec<u32> = line[5..].split(' ').map(|w| w.parse().unwrap()).collect();
    assert_eq!(n[1], 0, "{flags}: wrong captures while stepping:\n{text}");
    // At least the epilogue's `ret` and the return into beta.
    assert!(n[0] >= 2, "{flags}: {text}");
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn capture_from_context_through_epilogues_single_stepped() {
    for flags in [
        "-O0",
        "-O2 -fno-omit-frame-pointer",
        "-O2 -fomit-frame-pointer",
    ] {
        single_step(flags);
    }
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn capture_from_context_in_a_vectored_handler_at_o0() {
    chains("context", "-O0");
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn capture_from_context_in_a_vectored_handler_at_o2_without_frame_pointers() {
    chains("context", "-O2 -fomit-frame-pointer");
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn capture_fast_chains_at_o0() {
    chains("fast", "-O0 -fno-omit-frame-pointer");
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn capture_fast_chains_at_o2() {
    chains("fast", "-O2 -fno-omit-frame-pointer");
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn capture_exact_chains_at_o0() {
    chains("exact", "-O0");
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn capture_exact_chains_at_o2_with_frame_pointers() {
    chains("exact", "-O2 -fno-omit-frame-pointer");
}

#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn capture_exact_chains_at_o2_without_frame_pointers() {
    chains("exact", "-O2 -fomit-frame-pointer");
}

/// A module unloaded and another loaded at its addresses, with a different
/// unwind rule at the same return address (`win_unload.c`): after
/// `callstack_prepare`, the second capture through it is its own chain,
/// the same frames as the first's (without `callstack_prepare`, the rule
/// cached from the first module breaks it).
#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn capture_exact_forgets_an_unloaded_modules_rules_after_prepare() {
    let dir = scratch_dir("windows_unload");
    let dll_src = c_fixtures().join("win_unload_dll.c");
    for (name, pad) in [("a", "1000"), ("b", "2000")] {
        mingw_gcc(
            &[
                "-O2",
                &format!("-DPAD={pad}"),
                "-shared",
                "-Wl,--image-base=0x6f000000",
                dll_src.to_str().unwrap(),
            ],
            &dir.join(format!("win_unload_{name}.dll")),
        );
    }
    mingw_build_with_callstack("win_unload.c", &["-O2"], &dir.join("win_unload.exe"));
    let text = run(&dir.join("win_unload.exe"), "prepare");
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(
        matches!(words.as_slice(), ["a", _, "b", _, "same", x, y] if x == y),
        "{text}"
    );
}

/// `callstack_called_from` by name under wine: the C fixture of
/// tests/called_from_c.rs (`called_from.c`), built by mingw-w64 at -O0 and
/// -O2 with and without frame pointers, names its own frames in process
/// (the PE's DWARF), cold and then warm, with the same answers as on Linux.
#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn called_from_by_name() {
    let want: Vec<&str> = (0..3)
        .flat_map(|_| {
            [
                "middle outer=1 middle=1 other=0 main=1 none=0 any=1 null=-1",
                "other outer=0 middle=0 other=1 main=1 none=0 any=0 null=-1",
            ]
        })
        .collect();
    let dir = scratch_dir("windows_called_from");
    for flags in [
        &["-O0", "-g"][..],
        &["-O2", "-g", "-fno-omit-frame-pointer"],
        &["-O2", "-g", "-fomit-frame-pointer"],
    ] {
        let tag: String = flags.concat();
        let exe = dir.join(format!("called_from{tag}.exe"));
        mingw_build_with_callstack("called_from.c", flags, &exe);
        let text = run_under_wine(&exe, &[]);
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(lines, want, "{flags:?}");
    }
}

/// C++ under wine (`win_cpp.cpp`, mingw-w64's g++ at -O0 and -O2 with and
/// without frame pointers): `callstack_capture_exact` through member
/// functions, a static member, a template and a recursion, named in process
/// by `callstack_symbolize` (the PE's DWARF, Itanium names demangled); then
/// again after a C++ exception thrown from the deepest frame was caught
/// three frames up (the exception's unwinding and the capture read the
/// same `.pdata`), and after the calls returned.
#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn cpp_chains_through_exceptions() {
    let want = [
        "capture deep",
        "frame shapes::Widget::run(int)",
        "frame shapes::Widget::run(int)",
        "frame shapes::Widget::run(int)",
        "frame shapes::Widget::make(int)",
        "frame long shapes::twice<long>(long)",
        "frame main",
        "capture caught",
        "frame shapes::Widget::make(int)",
        "frame long shapes::twice<long>(long)",
        "frame main",
        "exception unwound",
        "capture after",
        "frame main",
        "result -6",
    ];
    let dir = scratch_dir("windows_cpp");
    for flags in [
        &["-O0"][..],
        &["-O2", "-fno-omit-frame-pointer"],
        &["-O2", "-fomit-frame-pointer"],
    ] {
        let exe = dir.join(format!("win_cpp{}.exe", flags.concat()));
        mingw_build_with_callstack("win_cpp.cpp", flags, &exe);
        let text = run_under_wine(&exe, &[]);
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(lines, want, "{flags:?}");
    }
}

/// The CLI built for Windows (`callstack.exe`, the stage's
/// `CALLSTACK_WINDOWS_CLI`), run under wine: `addr2line -f -i` on a
/// mingw-built image (its DWARF) answers as mingw-w64's binutils
/// `addr2line` does, and on an image with a PDB (clang and lld,
/// `pdb_chain.c`) as the Linux CLI does (which tests/symbolize_pdb.rs holds
/// to llvm-symbolizer), inlined frames included.
#[test]
#[ignore = "the Windows stage: scripts/test-windows.sh"]
fn cli_addr2line_under_wine() {
    let cli = testsupport::windows_stage_path("CALLSTACK_WINDOWS_CLI");
    let dir = scratch_dir("windows_cli");
    let exe = dir.join("win_chain.exe");
    mingw_build_with_callstack("win_chain.c", &["-O2"], &exe);
    // Each fixture function's first instructions.
    let nm = Command::new("x86_64-w64-mingw32-nm")
        .arg(&exe)
        .output()
        .unwrap();
    let mut addrs: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (a, kind, name) = (w.next()?, w.next()?, w.next()?);
            (["alpha", "beta", "leaf", "main"].contains(&name) && kind.eq_ignore_ascii_case("t"))
                .then(|| u64::from_str_radix(a, 16).ok())
                .flatten()
        })
        .flat_map(|a| [a, a + 4].map(|x| format!("{x:#x}")))
        .collect();
    assert_eq!(addrs.len(), 8, "{}", String::from_utf8_lossy(&nm.stdout));
    let under_wine = |image: &Path, addrs: &[String]| {
        let mut args = vec!["addr2line", "-f", "-i", "-e", image.to_str().unwrap()];
        args.extend(addrs.iter().map(String::as_str));
        run_under_wine(&cli, &args).replace('\r', "")
    };
    let binutils = Command::new("x86_64-w64-mingw32-addr2line")
        .args(["-f", "-i", "-e"])
        .arg(&exe)
        .args(&addrs)
        .output()
        .unwrap();
    assert_eq!(
        under_wine(&exe, &addrs),
        String::from_utf8_lossy(&binutils.stdout),
        "{addrs:?}"
    );

    // The PDB: every instruction of the image's code.
    let image = testsupport::clang_pe_with_pdb("pdb_chain.c", "-O2", &dir.join("pdb"), "chain");
    addrs = testsupport::llvm_instruction_addrs(&image)
        .into_iter()
        .map(|a| format!("{a:#x}"))
        .collect();
    assert!(addrs.len() > 10, "instructions of {}", image.display());
    let linux = Command::new(&testsupport::release_artifacts().cli)
        .args(["addr2line", "-f", "-i", "-e"])
        .arg(&image)
        .args(&addrs)
        .output()
        .unwrap();
    let linux = String::from_utf8_lossy(&linux.stdout);
    assert!(linux.contains("middle_inl(int)"), "{linux}");
    assert_eq!(under_wine(&image, &addrs), linux);
}
