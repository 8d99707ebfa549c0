//! Split DWARF (`-gsplit-dwarf`) and C++ names: `callstack core` and
//! `callstack pstack` give gdb's frames, inlined and tail-call frames
//! included, with gdb's names, files and lines, frame for frame.
//!
//! Fixtures (built here, `-O2 -g`): `split_inline.c` (main -> outer ->
//! mid, inlined -> inner blocked in `read`; with an argument, main ->
//! tail_from -> tail_to -> inner through two jumps) and `split_names.cpp`
//! (a static function in a namespace, an inlined one, an anonymous
//! namespace, a lambda, a class template's method, a method of a class
//! defined in a function). Layouts: `.dwo` files in DWARF 4 (GNU's
//! extension) and DWARF 5, an absolute and a relative (`.`) comp_dir with
//! the program run from another directory, a `.dwp` package (binutils'
//! `dwp` for DWARF 4, `llvm-dwp` for DWARF 5) with the `.dwo` files
//! gone, a `.dwo` missing, and full (not split) debug info for the C++
//! names; `addr2line -i` on every instruction.
//!
//! The oracle is gdb's Python API on a core of the blocked process (name,
//! file, line and kind of every frame). gdb prints C++ function names
//! without their parameters, except a lambda's `operator()`: names are
//! compared without a final parameter list. The frames, `.dwp` and
//! `addr2line -i` cases are built by gcc, and by clang too when it is installed (clang's DWARF 5 split units: skeleton and
//! split_compile units, `.debug_addr`, `DW_FORM_rnglistx`, loclists,
//! `DW_FORM_strx*`, no `.debug_aranges`; its `.dwp` by `llvm-dwp`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use testsupport::{gcore, release_artifacts, scratch_dir};

/// One frame: name, file's last component, line, inlined.
type F = (String, String, u32, bool);

const GDB_PY: &str = r#"
import gdb, os
f = gdb.newest_frame()
while f is not None:
    sal = f.find_sal()
    fn = os.path.basename(sal.symtab.filename) if sal.symtab else "??"
    print("FRAME %s|%s|%d|%d" % (f.name() or "??", fn, sal.line, int(f.type() == gdb.INLINE_FRAME)))
    f = f.older()
"#;

/// `name` without a final parameter list (and ` const`).
fn bare(name: &str) -> String {
    let n = name.strip_suffix(" const").unwrap_or(name);
    if !n.ends_with(')') {
        return n.to_string();
    }
    let mut depth = 0;
    for (i, c) in n.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    // `(anonymous namespace)` is no parameter list.
                    return if i == 0 {
                        n.to_string()
                    } else {
                        n[..i].to_string()
                    };
                }
            }
            _ => {}
        }
    }
    n.to_string()
}

fn sh(dir: &Path, cmd: &str) {
    let o = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds `src` in `dir` as `exe` (compiled to `<exe>.o` there, so the
/// `.dwo` is `<exe>.dwo`), with `flags`, by gcc.
fn build(dir: &Path, src: &str, exe: &str, flags: &str) -> PathBuf {
    build_by("gcc", dir, src, exe, flags)
}

/// The compilers to build the split fixtures with: gcc, and clang when
/// it is installed (scripts/install-test-deps.sh installs it).
fn compilers() -> Vec<&'static str> {
    if have("clang") && have("clang++") {
        vec!["gcc", "clang"]
    } else {
        eprintln!("clang is not installed: gcc only");
        vec!["gcc"]
    }
}

/// [`build`] by `compiler` (`gcc` or `clang`; `g++` or `clang++` for
/// C++).
fn build_by(compiler: &str, dir: &Path, src: &str, exe: &str, flags: &str) -> PathBuf {
    let path = testsupport::workspace_root()
        .join("tests/fixtures/c")
        .join(src);
    let cc = match (compiler, src.ends_with(".cpp")) {
        ("gcc", false) => "gcc",
        ("gcc", true) => "g++",
        ("clang", false) => "clang",
        ("clang", true) => "clang++",
        _ => panic!("unknown compiler {compiler}"),
    };
    sh(
        dir,
        &format!(
            "{cc} -O2 -g {flags} -c {} -o {exe}.o && {cc} {exe}.o -o {exe}",
            path.display()
        ),
    );
    dir.join(exe)
}

struct Running {
    child: Child,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `exe` (from `cwd`) and waits until it blocks in `read`.
fn start(exe: &Path, args: &[&str], cwd: &Path) -> Running {
    let mut child = Command::new(exe)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("ready"), "fixture said {line:?}");
    let pid = child.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        if sc.split_whitespace().next() == Some("0") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never blocked");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Running { child }
}

/// gdb's frames of the core's thread (gdb run from `cwd`).
fn gdb_frames(exe: &Path, core: &Path, cwd: &Path) -> Vec<F> {
    let script = core.with_extension("py");
    std::fs::write(&script, GDB_PY).unwrap();
    let o = testsupport::gdb_batch("gdb")
        .current_dir(cwd)
        .arg("-x")
        .arg(&script)
        .arg(exe)
        .arg(core)
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&o.stdout);
    let out: Vec<F> = text
        .lines()
        .filter_map(|l| l.strip_prefix("FRAME "))
        .map(|l| {
            let p: Vec<&str> = l.split('|').collect();
            (
                bare(p[0]),
                p[1].to_string(),
                p[2].parse().unwrap(),
                p[3] == "1",
            )
        })
        .collect();
    assert!(
        !out.is_empty(),
        "gdb: {text} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Our frames (`callstack ARGS --json`, run from `cwd`) and stderr.
fn our_frames(args: &[&str], cwd: &Path) -> (Vec<F>, String) {
    let o = Command::new(&release_artifacts().cli)
        .args(args)
        .arg("--json")
        .current_dir(cwd)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "callstack {args:?}: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let frames = v["threads"][0]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let file = f["file"].as_str().unwrap_or("??");
            (
                bare(f["function"].as_str().unwrap_or("??")),
                file.rsplit('/').next().unwrap().to_string(),
                f["line"].as_u64().unwrap_or(0) as u32,
                f["inlined"].as_bool().unwrap(),
            )
        })
        .collect();
    (frames, stderr)
}

/// The frames from the fixture's own functions up (libc's `read` and
/// what calls it inside libc are left out: their debug info is not the
/// subject).
fn own(frames: &[F]) -> Vec<F> {
    let first = frames
        .iter()
        .position(|f| f.1.starts_with("split_"))
        .unwrap_or(frames.len());
    frames[first..].to_vec()
}

/// gdb's frames and ours, from a core and from the live process, for
/// `exe args` run from `cwd`; returns gdb's (own frames).
fn compare(what: &str, exe: &Path, args: &[&str], cwd: &Path) -> Vec<F> {
    let dir = exe.parent().unwrap();
    let run = start(exe, args, cwd);
    let pid = run.child.id();
    let core = gcore(pid, dir);
    let gdb = own(&gdb_frames(exe, &core, cwd));
    let (ours, stderr) = our_frames(
        &["core", exe.to_str().unwrap(), core.to_str().unwrap()],
        cwd,
    );
    assert_eq!(own(&ours), gdb, "{what}: core, ours vs gdb\n{stderr}");
    assert!(!stderr.contains("warning"), "{what}: {stderr}");
    let (ours, stderr) = our_frames(&["pstack", &pid.to_string()], cwd);
    assert_eq!(own(&ours), gdb, "{what}: pstack, ours vs gdb\n{stderr}");
    let _ = std::fs::remove_file(&core);
    gdb
}

fn names(frames: &[F]) -> Vec<&str> {
    frames.iter().map(|f| f.0.as_str()).collect()
}

#[test]
fn split_dwarf_frames_like_gdb() {
    let dir = scratch_dir("split-dwarf");
    let elsewhere = scratch_dir("split-dwarf-elsewhere");
    for (cc, v) in compilers().into_iter().flat_map(|c| [(c, 4), (c, 5)]) {
        let flags = format!("-gsplit-dwarf -gdwarf-{v}");
        let c = build_by(cc, &dir, "split_inline.c", &format!("inl_{cc}{v}"), &flags);
        assert!(dir.join(format!("inl_{cc}{v}.dwo")).is_file());
        let gdb = compare(&format!("{cc} C, DWARF {v}"), &c, &[], &elsewhere);
        assert_eq!(
            names(&gdb),
            ["inner", "mid", "outer", "main"],
            "{cc} DWARF {v}: {gdb:?}"
        );
        let gdb = compare(
            &format!("{cc} C tail calls, DWARF {v}"),
            &c,
            &["t"],
            &elsewhere,
        );
        // clang's DWARF 5 tail-call sites carry `DW_AT_call_pc` (the
        // jump's address) and no return pc: gdb 13 drops such sites and
        // shows no tail-call frame; so do we (a known gap). Ours still
        // equals gdb's there.
        if (cc, v) != ("clang", 5) {
            assert_eq!(
                names(&gdb),
                ["inner", "tail_to", "tail_from", "main"],
                "{cc} DWARF {v}: {gdb:?}"
            );
        }
        let cpp = build_by(
            cc,
            &dir,
            "split_names.cpp",
            &format!("names_{cc}{v}"),
            &flags,
        );
        let gdb = compare(&format!("{cc} C++, DWARF {v}"), &cpp, &[], &elsewhere);
        assert_eq!(
            names(&gdb),
            [
                "shop::wait_here",
                "shop::stock",
                "(anonymous namespace)::helper",
                "Basket<int>::weigh(int)::{lambda(int)#1}::operator()",
                "Basket<int>::weigh",
                // gdb qualifies a local class's method by its enclosing
                // function when clang nests the class's DIE in it.
                if cc == "clang" {
                    "run_local(int)::Local::run"
                } else {
                    "Local::run"
                },
                "run_local",
                "main"
            ],
            "{gdb:?}"
        );
    }
}

#[test]
fn cxx_names_with_full_debug_info_like_gdb() {
    let dir = scratch_dir("split-dwarf-full");
    let cpp = build(&dir, "split_names.cpp", "names_full", "");
    let gdb = compare("C++, full debug info", &cpp, &[], &dir);
    assert_eq!(gdb[0].0, "shop::wait_here", "{gdb:?}");
    assert_eq!(gdb[2].0, "(anonymous namespace)::helper", "{gdb:?}");
    assert_eq!(gdb[5].0, "Local::run", "{gdb:?}");
}

/// comp_dir `.` (`-fdebug-prefix-map`): the `.dwo` is found beside the
/// program when it runs, and is inspected, from another directory.
#[test]
fn relative_comp_dir_run_from_elsewhere() {
    let dir = scratch_dir("split-dwarf-rel");
    let elsewhere = scratch_dir("split-dwarf-rel-elsewhere");
    let flags = format!("-gsplit-dwarf -fdebug-prefix-map={}=.", dir.display());
    let c = build(&dir, "split_inline.c", "inl_rel", &flags);
    // gdb looks relative to its own directory: run it from the build's.
    let run = start(&c, &[], &elsewhere);
    let core = gcore(run.child.id(), &dir);
    let gdb = own(&gdb_frames(&c, &core, &dir));
    assert_eq!(names(&gdb), ["inner", "mid", "outer", "main"], "{gdb:?}");
    let (ours, stderr) = our_frames(
        &["core", c.to_str().unwrap(), core.to_str().unwrap()],
        &elsewhere,
    );
    assert_eq!(own(&ours), gdb, "core\n{stderr}");
    let (ours, stderr) = our_frames(&["pstack", &run.child.id().to_string()], &elsewhere);
    assert_eq!(own(&ours), gdb, "pstack\n{stderr}");
}

/// A `.dwp` package beside the program, the `.dwo` files gone: DWARF 4
/// packed by binutils' `dwp` from gcc's `.dwo` and by `llvm-dwp` from
/// clang's (gdb reads both: compared with gdb on it), DWARF 5 by
/// `llvm-dwp` (binutils' `dwp` makes none, gdb 13 fails on it: compared
/// with gdb's frames of the same program with its `.dwo`).
#[test]
fn dwp_package() {
    let dir = scratch_dir("split-dwarf-dwp");
    let mut cases = vec![("gcc", 4, "dwp"), ("gcc", 5, "llvm-dwp")];
    if compilers().contains(&"clang") {
        cases.extend([("clang", 4, "llvm-dwp"), ("clang", 5, "llvm-dwp")]);
    }
    for (cc, v, tool) in cases {
        if !have(tool) {
            eprintln!("skipped: {tool} is not installed");
            continue;
        }
        for src in ["split_inline.c", "split_names.cpp"] {
            let exe = format!("{}_{cc}_dwp{v}", &src[..src.find('.').unwrap()]);
            let p = build_by(cc, &dir, src, &exe, &format!("-gsplit-dwarf -gdwarf-{v}"));
            let with_dwo = compare(&format!("{exe}, .dwo"), &p, &[], &dir);
            assert!(
                with_dwo.iter().any(|f| f.3),
                "{exe}: no inlined frame: {with_dwo:?}"
            );
            sh(
                &dir,
                &format!("{tool} -e {exe} -o {exe}.dwp && rm {exe}.dwo"),
            );
            if v == 4 {
                let gdb = compare(&format!("{exe}, .dwp"), &p, &[], &dir);
                assert_eq!(gdb, with_dwo);
                continue;
            }
            let run = start(&p, &[], &dir);
            let core = gcore(run.child.id(), &dir);
            let (ours, stderr) =
                our_frames(&["core", p.to_str().unwrap(), core.to_str().unwrap()], &dir);
            assert_eq!(own(&ours), with_dwo, "{exe}: core\n{stderr}");
            let (ours, stderr) = our_frames(&["pstack", &run.child.id().to_string()], &dir);
            assert_eq!(own(&ours), with_dwo, "{exe}: pstack\n{stderr}");
        }
    }
}

/// The `.dwo` missing: the skeleton's lines, the symbol table's names, no
/// inlined frame, and one warning naming the file. Expected: gdb's frames
/// with the `.dwo` there, each inlined frame folded into the real frame
/// below it, which takes the line of the innermost frame of its group
/// (the line table's row at its pc).
#[test]
fn missing_dwo_warns_once_and_keeps_lines() {
    let dir = scratch_dir("split-dwarf-missing");
    for (cc, v) in compilers().into_iter().flat_map(|c| [(c, 4), (c, 5)]) {
        let exe = format!("inl_missing_{cc}{v}");
        let c = build_by(
            cc,
            &dir,
            "split_inline.c",
            &exe,
            &format!("-gsplit-dwarf -gdwarf-{v}"),
        );
        let with = compare("with the .dwo", &c, &[], &dir);
        let mut want: Vec<F> = Vec::new();
        let mut line = None;
        for f in &with {
            let l = *line.get_or_insert(f.2);
            if !f.3 {
                want.push((f.0.clone(), f.1.clone(), l, false));
                line = None;
            }
        }
        let dwo = dir.join(format!("{exe}.dwo"));
        std::fs::remove_file(&dwo).unwrap();
        let run = start(&c, &[], &dir);
        let core = gcore(run.child.id(), &dir);
        let (ours, stderr) =
            our_frames(&["core", c.to_str().unwrap(), core.to_str().unwrap()], &dir);
        assert_eq!(names(&want), ["inner", "outer", "main"], "{want:?}");
        assert_eq!(own(&ours), want, "{cc} DWARF {v}\n{stderr}");
        let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
        assert_eq!(warnings.len(), 1, "{stderr}");
        assert!(warnings[0].contains(dwo.to_str().unwrap()), "{stderr}");
        let (ours, _) = our_frames(&["pstack", &run.child.id().to_string()], &dir);
        assert_eq!(own(&ours), want, "{cc} DWARF {v}: pstack");
    }
}

/// The instruction addresses of `funcs` in `exe` (objdump).
fn instructions(exe: &Path, funcs: &[&str]) -> Vec<String> {
    let o = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-C"])
        .arg(exe)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = Vec::new();
    let mut on = false;
    for l in text.lines() {
        if l.ends_with(">:") && l.contains(" <") {
            on = funcs.iter().any(|f| l.contains(f));
            continue;
        }
        if l.is_empty() {
            on = false;
        } else if on {
            if let Some((a, _)) = l.trim_start().split_once(':') {
                out.push(a.to_string());
            }
        }
    }
    out
}

fn addr2line(program: &Path, exe: &Path, addrs: &[String]) -> String {
    let o = Command::new(program)
        .args(["addr2line", "-i", "-f", "-C", "-e"])
        .arg(exe)
        .args(addrs)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn binutils_addr2line(exe: &Path, addrs: &[String]) -> String {
    let o = Command::new("addr2line")
        .args(["-i", "-f", "-C", "-e"])
        .arg(exe)
        .args(addrs)
        .output()
        .unwrap();
    String::from_utf8(o.stdout).unwrap()
}

fn text_of(exe: &Path) -> Vec<u8> {
    let out = exe.with_extension("text");
    let o = Command::new("objcopy")
        .args(["-O", "binary", "--only-section=.text"])
        .arg(exe)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success());
    std::fs::read(out).unwrap()
}

/// `callstack addr2line -i` on a split build answers for every
/// instruction of the fixture's functions what binutils' addr2line (which
/// does not read `.dwo` files) answers on the same code built with full
/// debug info: same functions, inlined chains, files and lines. C++: the
/// same as ours on the full build (binutils names a local class's method
/// by its symbol, with `[clone .isra.0]`, where DWARF and gdb say
/// `Local::run`). addr2line names as binutils does: `stock`, not gdb's
/// `shop::stock`.
#[test]
fn addr2line_inlined_chains_of_split_builds() {
    let dir = scratch_dir("split-dwarf-a2l");
    let cli = &release_artifacts().cli;
    for (cc, v) in compilers().into_iter().flat_map(|c| [(c, 4), (c, 5)]) {
        let full = build_by(
            cc,
            &dir,
            "split_inline.c",
            &format!("c_full_{cc}{v}"),
            &format!("-gdwarf-{v}"),
        );
        let split = build_by(
            cc,
            &dir,
            "split_inline.c",
            &format!("c_split_{cc}{v}"),
            &format!("-gdwarf-{v} -gsplit-dwarf"),
        );
        assert_eq!(text_of(&full), text_of(&split), "same code");
        let addrs = instructions(
            &full,
            &["<inner>", "<outer>", "<main>", "<tail_to>", "<tail_from>"],
        );
        assert!(addrs.len() > 30, "{addrs:?}");
        let want = binutils_addr2line(&full, &addrs);
        assert!(want.contains("\nmid\n"), "{want}");
        assert_eq!(addr2line(cli, &split, &addrs), want, "{cc} C, DWARF {v}");

        let full = build_by(
            cc,
            &dir,
            "split_names.cpp",
            &format!("cc_full_{cc}{v}"),
            &format!("-gdwarf-{v}"),
        );
        let split = build_by(
            cc,
            &dir,
            "split_names.cpp",
            &format!("cc_split_{cc}{v}"),
            &format!("-gdwarf-{v} -gsplit-dwarf"),
        );
        assert_eq!(text_of(&full), text_of(&split), "same code");
        let addrs = instructions(&full, &["wait_here", "helper", "weigh", "run", "main"]);
        assert!(addrs.len() > 30, "{addrs:?}");
        let want = addr2line(cli, &full, &addrs);
        // clang gives the inlined function a linkage name, which
        // binutils (and we) demangle with its namespace and parameters.
        let stock = if cc == "clang" {
            "\nshop::stock(int)\n"
        } else {
            "\nstock\n"
        };
        assert!(want.contains(stock), "{want}");
        assert_eq!(addr2line(cli, &split, &addrs), want, "{cc} C++, DWARF {v}");
    }
}

/// Without `.debug_aranges` (clang emits none; removed from gcc's), the
/// units' ranges come from the skeletons alone: a `.dwo` is opened only
/// when an address falls in its unit. Two units, the second's `.dwo`
/// missing: the first's addresses get their inlined frames and no warning
/// is printed, the second's get the skeleton's lines and one warning.
#[test]
fn dwo_opened_only_for_units_asked_without_aranges() {
    for cc in compilers() {
        lazy_units(cc);
    }
}

/// [`dwo_opened_only_for_units_asked_without_aranges`], built by `cc`.
fn lazy_units(cc: &str) {
    let dir = scratch_dir(&format!("split-dwarf-lazy-{cc}"));
    std::fs::write(
        dir.join("other.c"),
        "__attribute__((noinline)) int other_unit(int x) { return x * 2 + 1; }\n",
    )
    .unwrap();
    let src = testsupport::workspace_root().join("tests/fixtures/c/split_inline.c");
    sh(
        &dir,
        &format!(
            "{cc} -O2 -g -gsplit-dwarf -c {} -o lazy.o && {cc} -O2 -g -gsplit-dwarf -c other.c -o other.o \
             && {cc} lazy.o other.o -o lazy_full && objcopy --remove-section .debug_aranges lazy_full lazy \
             && rm other.dwo",
            src.display()
        ),
    );
    let exe = dir.join("lazy");
    let full = dir.join("lazy_full");
    let addrs = instructions(&exe, &["<outer>"]);
    let cli = &release_artifacts().cli;
    let o = Command::new(cli)
        .args(["addr2line", "-i", "-f", "-e"])
        .arg(&exe)
        .args(&addrs)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!stderr.contains("other.dwo"), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        addr2line(cli, &full, &addrs),
        "without .debug_aranges"
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("\nmid\n"));

    // The Symbolizer's report: nothing missing until the second unit is
    // asked about, then its `.dwo`, once.
    use callstack::symbolize::{Address, ErrorKind, Symbolizer};
    let missing = |s: &Symbolizer| -> Vec<PathBuf> {
        s.debug_info()
            .flat_map(|(_, r)| r.degraded.iter())
            .filter(|e| e.kind == ErrorKind::MissingSplitDwarf)
            .map(|e| e.path.clone())
            .collect()
    };
    let mut sym = Symbolizer::for_file(&exe).unwrap();
    for a in &addrs {
        let r = sym.symbolize(Address::Exact(usize::from_str_radix(a, 16).unwrap()));
        assert!(!r.frames.is_empty());
    }
    assert_eq!(missing(&sym), Vec::<PathBuf>::new());
    let other = instructions(&exe, &["<other_unit>"]);
    for a in &other {
        let r = sym.symbolize(Address::Exact(usize::from_str_radix(a, 16).unwrap()));
        let f = &r.frames[0];
        assert_eq!(f.function.as_deref(), Some("other_unit"), "{r}");
        assert!(f.file.as_deref().unwrap().ends_with("other.c"), "{r}");
    }
    assert_eq!(missing(&sym), vec![dir.join("other.dwo")]);
}

/// Rust built with `-C split-debuginfo=unpacked` (`.dwo` files) and
/// `=packed` (a `.dwp` made by rustc): `addr2line -i` answers as on the
/// same code with its debug info in the executable, inlined frames
/// included.
#[test]
fn rust_split_debuginfo() {
    if !have("rustc") {
        eprintln!("skipped: rustc is not installed");
        return;
    }
    let dir = scratch_dir("split-dwarf-rust");
    std::fs::write(
        dir.join("m.rs"),
        "#[inline(never)]\nfn inner(x: u64) -> u64 { std::hint::black_box(x * 3) }\n\
         #[inline(always)]\nfn mid(x: u64) -> u64 { inner(x + 1) + 2 }\n\
         #[inline(never)]\nfn outer(x: u64) -> u64 { mid(x * 5) + 7 }\n\
         fn main() { println!(\"{}\", outer(std::env::args().count() as u64)); }\n",
    )
    .unwrap();
    let cli = &release_artifacts().cli;
    sh(&dir, "rustc -g -C opt-level=2 m.rs -o m_full");
    let full = dir.join("m_full");
    let addrs = instructions(&full, &["<m::outer>", "<m::inner>"]);
    assert!(addrs.len() > 5, "{addrs:?}");
    let want = addr2line(cli, &full, &addrs);
    assert!(want.contains("\nm::mid\n"), "{want}");
    for kind in ["unpacked", "packed"] {
        let exe = format!("m_{kind}");
        sh(
            &dir,
            &format!("rustc -g -C opt-level=2 -C split-debuginfo={kind} m.rs -o {exe}"),
        );
        let p = dir.join(&exe);
        assert_eq!(text_of(&full), text_of(&p), "same code");
        assert_eq!(addr2line(cli, &p, &addrs), want, "{kind}");
    }
    assert!(dir.join("m_packed.dwp").is_file());
}

/// A `.dwo` truncated or with bytes overwritten: answers (the skeleton's
/// at worst), never a panic.
#[test]
fn corrupt_dwo_gives_answers_not_panics() {
    let dir = scratch_dir("split-dwarf-corrupt");
    let exe = build(&dir, "split_inline.c", "inl_bad", "-gsplit-dwarf");
    let dwo = dir.join("inl_bad.dwo");
    let good = std::fs::read(&dwo).unwrap();
    let addrs = instructions(&exe, &["<outer>", "<inner>", "<main>"]);
    let cli = &release_artifacts().cli;
    let mut variants: Vec<Vec<u8>> = [16, 64, good.len() / 3, good.len() / 2, good.len() - 1]
        .iter()
        .map(|&n| good[..n].to_vec())
        .collect();
    // Bytes overwritten at spread-out places (a fixed pattern: no
    // randomness in tests).
    for k in 1..24usize {
        let mut v = good.clone();
        for j in 0..16usize {
            let at = 64 + (k * 7919 + j * 104_729) % (good.len() - 64);
            v[at] = (k * 31 + j * 17) as u8;
        }
        variants.push(v);
    }
    for (i, v) in variants.iter().enumerate() {
        std::fs::write(&dwo, v).unwrap();
        let o = Command::new(cli)
            .args(["addr2line", "-i", "-f", "-e"])
            .arg(&exe)
            .args(&addrs)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && !stderr.contains("panicked"),
            "variant {i}: {stderr}"
        );
        assert!(!o.stdout.is_empty(), "variant {i}");
    }
}
