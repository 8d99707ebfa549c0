//! `callstack addr2line` prints what binutils `addr2line` prints, line for
//! line, for the same flags, on the symbolization fixtures (C at -O0 and
//! -O2 with inlining, DWARF 4, -gz, split debug info, stripped; Rust).
//!
//! No normalization is needed on these binaries. Known differences
//! elsewhere, not exercised here: binutils reads `.debug_types`/DWARF
//! 4 type units and `DW_AT_GNU_*` split DWARF (.dwo) that we skip, and for
//! an address in a unit with line rows but no function it may pick a
//! different nearby symbol.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use testsupport::{release_artifacts, scratch_dir, workspace_root, Gcc};

fn instruction_addrs(exe: &Path, prefixes: &[&str]) -> Vec<String> {
    let o = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(exe)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.ends_with(">:") {
            let name = line.split_once(" <").map(|x| x.1).unwrap_or("");
            inside = !name.contains("@plt") && prefixes.iter().any(|p| name.starts_with(p));
            continue;
        }
        if line.is_empty() {
            inside = false;
        } else if inside {
            if let Some((a, _)) = line.trim_start().split_once(':') {
                out.push(format!("0x{a}"));
            }
        }
    }
    out
}

fn run(cmd: &mut Command, stdin: Option<&str>) -> String {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = stdin {
        use std::io::Write;
        let mut i = child.stdin.take().unwrap();
        i.write_all(input.as_bytes()).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

const FLAG_SETS: &[&str] = &[
    "-f -i -C -a",
    "-p -i -f -a -C",
    "-a",
    "",
    "-f",
    "-i -p",
    "-s -f -i",
    "-f -i",
];

fn compare(exe: &Path, addrs: &[String]) {
    let cli = &release_artifacts().cli;
    // Addresses outside everything and odd spellings, too.
    let mut addrs = addrs.to_vec();
    addrs.extend(["0x0", "0", "ffffffff", "0X10", "zz"].map(String::from));
    for flags in FLAG_SETS {
        let f: Vec<&str> = flags.split_whitespace().collect();
        let theirs = run(
            Command::new("addr2line")
                .args(&f)
                .arg("-e")
                .arg(exe)
                .args(&addrs),
            None,
        );
        let ours = run(
            Command::new(cli)
                .arg("addr2line")
                .args(&f)
                .arg("-e")
                .arg(exe)
                .args(&addrs),
            None,
        );
        assert_lines_equal(&theirs, &ours, exe, flags);
    }
    // Standard input, one address per line.
    let input = addrs.join("\n") + "\n";
    let theirs = run(
        Command::new("addr2line")
            .args(["-a", "-f", "-i", "-e"])
            .arg(exe),
        Some(&input),
    );
    let ours = run(
        Command::new(cli)
            .args(["addr2line", "-a", "-f", "-i", "-e"])
            .arg(exe),
        Some(&input),
    );
    assert_lines_equal(&theirs, &ours, exe, "stdin -a -f -i");
}

fn assert_lines_equal(theirs: &str, ours: &str, exe: &Path, flags: &str) {
    let (t, o): (Vec<_>, Vec<_>) = (theirs.lines().collect(), ours.lines().collect());
    for (i, (a, b)) in t.iter().zip(&o).enumerate() {
        assert_eq!(a, b, "{} {flags}: line {i} differs", exe.display());
    }
    assert_eq!(t.len(), o.len(), "{} {flags}: line counts", exe.display());
}

fn gcc(tag: &str, flags: &str) -> PathBuf {
    let dir = scratch_dir("cli-addr2line");
    Gcc::new(&["sym_inline.c"])
        .flags(flags)
        .build(&dir.join(format!("sym_inline_{tag}")))
}

const C_FUNCS: &[&str] = &["sym_", "main>"];

#[test]
fn c_o2_o0_dwarf4_gz_match_binutils() {
    for (tag, flags) in [
        ("o2", "-O2"),
        ("o0", "-O0"),
        ("dwarf4", "-O2 -gdwarf-4"),
        ("gz", "-O2 -gz"),
    ] {
        let exe = gcc(tag, flags);
        let addrs = instruction_addrs(&exe, C_FUNCS);
        assert!(addrs.len() > 200, "{tag}: {}", addrs.len());
        compare(&exe, &addrs);
    }
}

#[test]
fn split_and_stripped_match_binutils() {
    let reference = gcc("ref", "-O2");
    let addrs = instruction_addrs(&reference, C_FUNCS);
    let split = gcc("split", "-O2");
    let stripped = gcc("stripped", "-O2");
    let dbg = split.with_extension("debug");
    let sh = |args: &[&str]| {
        assert!(Command::new(args[0])
            .args(&args[1..])
            .status()
            .unwrap()
            .success())
    };
    let (s, d) = (split.to_str().unwrap(), dbg.to_str().unwrap());
    sh(&["objcopy", "--only-keep-debug", s, d]);
    sh(&["strip", "--strip-all", s]);
    sh(&["objcopy", &format!("--add-gnu-debuglink={d}"), s]);
    sh(&["strip", "--strip-all", stripped.to_str().unwrap()]);
    compare(&split, &addrs);
    compare(&stripped, &addrs);
    // The debug file alone works too.
    compare(&dbg, &addrs);
}

/// Builds the Rust fixture `sym_rust.rs` at -O2 with debug info into `exe`.
fn build_sym_rust(exe: &std::path::Path) {
    let src = workspace_root().join("tests/fixtures/rust/sym_rust.rs");
    let o = Command::new("rustc")
        .args(["-g", "-C", "opt-level=2"])
        .arg(&src)
        .arg("-o")
        .arg(exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn rust_matches_binutils() {
    let dir = scratch_dir("cli-addr2line");
    let exe = dir.join("sym_rust_o2");
    build_sym_rust(&exe);
    let addrs = instruction_addrs(&exe, &["_ZN8sym_rust"]);
    assert!(addrs.len() > 100);
    compare(&exe, &addrs);
}

#[test]
fn missing_file_is_an_error() {
    let o = Command::new(&release_artifacts().cli)
        .args(["addr2line", "-e", "/no/such/exe", "0x10"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/no/such/exe"));
}

/// Standard input from a regular file with thousands of addresses takes the
/// batch path (sorted, deduplicated; one thread and `--threads 2`): same
/// output, same order.
#[test]
fn batch_from_a_file_matches_binutils() {
    let dir = scratch_dir("cli-addr2line");
    let exe = dir.join("sym_rust_batch");
    build_sym_rust(&exe);
    // Every instruction of every function (std included), in reverse order,
    // with duplicates: exercises sorting and putting answers back in order.
    let mut addrs = instruction_addrs(&exe, &[""]);
    addrs.truncate(2400);
    addrs.reverse();
    let dup: Vec<String> = addrs.iter().step_by(7).cloned().collect();
    addrs.extend(dup);
    assert!(addrs.len() > 2000, "{}", addrs.len());
    let input = dir.join("batch_addrs.txt");
    std::fs::write(&input, addrs.join("\n") + "\n").unwrap();
    let run_with = |cmd: &mut Command| {
        let o = cmd
            .stdin(std::fs::File::open(&input).unwrap())
            .output()
            .unwrap();
        assert!(o.status.success());
        String::from_utf8(o.stdout).unwrap()
    };
    let theirs = run_with(
        Command::new("addr2line")
            .args(["-a", "-f", "-i", "-C", "-e"])
            .arg(&exe),
    );
    for threads in ["1", "2"] {
        let ours = run_with(
            Command::new(&release_artifacts().cli)
                .args([
                    "addr2line",
                    "--threads",
                    threads,
                    "-a",
                    "-f",
                    "-i",
                    "-C",
                    "-e",
                ])
                .arg(&exe),
        );
        assert_lines_equal(&theirs, &ours, &exe, "batch -a -f -i -C");
    }
}

/// glibc with libc6-dbg: a separate debug file found by build-id whose
/// `.debug_*` sections are zlib-compressed, so `.debug_info` is inflated
/// lazily, front to back, as units are hit. Function names and line
/// numbers equal binutils' on addresses spread over all of libc. (File
/// paths are compared by line number only: on this DWARF 5 binutils 2.40
/// prints some paths with the directory twice, `./locale/./locale/x.c`,
/// and names a few files differently, `ctype-info.c` for `ctype.h`.)
#[test]
fn compressed_glibc_debug_file_matches_binutils_names_and_lines() {
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let notes = Command::new("readelf").arg("-n").arg(libc).output();
    let id = notes.ok().and_then(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_owned))
    });
    let Some(id) = id.filter(|id| id.len() > 2) else {
        eprintln!("skipped: no libc.so.6 with a build-id");
        return;
    };
    let debug = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &id[..2],
        &id[2..]
    ));
    let sections = Command::new("readelf").arg("-SW").arg(&debug).output();
    let compressed = sections.is_ok_and(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .any(|l| l.contains(".debug_info") && l.split_whitespace().any(|f| f.contains('C')))
    });
    if !compressed {
        eprintln!(
            "skipped: no compressed libc6-dbg debug file at {}",
            debug.display()
        );
        return;
    }
    let o = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(libc)
        .output()
        .unwrap();
    let mut addrs: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && (f[1] == "T" || f[1] == "t")).then(|| format!("0x{}", f[0]))
        })
        .collect();
    addrs.sort();
    addrs.dedup();
    let addrs: Vec<String> = addrs.into_iter().step_by(20).collect();
    assert!(addrs.len() > 40, "too few libc functions: {}", addrs.len());
    let flags = ["-s", "-f", "-i", "-a", "-C", "-e"];
    let theirs = run(
        Command::new("addr2line").args(flags).arg(libc).args(&addrs),
        None,
    );
    let ours = run(
        Command::new(&release_artifacts().cli)
            .arg("addr2line")
            .args(flags)
            .arg(libc)
            .args(&addrs),
        None,
    );
    let (t, o): (Vec<_>, Vec<_>) = (theirs.lines().collect(), ours.lines().collect());
    assert_eq!(t.len(), o.len(), "line counts:\n{theirs}\n---\n{ours}");
    let mut lines = 0;
    for (i, (a, b)) in t.iter().zip(&o).enumerate() {
        match (a.rsplit_once(':'), b.rsplit_once(':')) {
            (Some((_, la)), Some((_, lb))) => {
                assert_eq!(la, lb, "line {i}: {a} / {b}");
                lines += (la != "?" && la != "0") as usize;
            }
            _ => assert_eq!(a, b, "line {i}"),
        }
    }
    assert!(
        lines > addrs.len() / 2,
        "too few answers with a line: {lines}"
    );
}

/// binutils' `-j SECTION`, `-b BFDNAME`, `-r`/`-R` and `--demangle=STYLE`:
/// same output (C++ and Rust names, each demangled only by its own style),
/// and the same errors for an unknown section, target or style.
#[test]
fn section_target_recurse_and_demangle_style_flags_match_binutils() {
    let dir = scratch_dir("cli-addr2line-flags");
    let cpp = dir.join("sym_cpp");
    let o = Command::new("g++")
        .args(["-g", "-O1"])
        .arg(workspace_root().join("tests/fixtures/c/sym_cpp.cpp"))
        .arg("-o")
        .arg(&cpp)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rust = dir.join("sym_rust_flags");
    build_sym_rust(&rust);
    let cli = &release_artifacts().cli;
    // C++: the functions' entry points (inside inlined code, binutils
    // without -C names C++ frames by their linkage names, a difference
    // outside this test); Rust: every instruction.
    let nm = Command::new("nm").arg(&cpp).output().unwrap();
    let cpp_entries: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter(|l| l.contains(" T _ZN6symcpp"))
        .map(|l| format!("0x{}", l.split(' ').next().unwrap()))
        .collect();
    for (exe, cpp_addrs) in [(&cpp, Some(cpp_entries)), (&rust, None)] {
        let mut addrs = cpp_addrs.unwrap_or_else(|| instruction_addrs(exe, &["_ZN8sym_rust"]));
        addrs.truncate(300);
        assert!(addrs.len() >= 2, "{}", addrs.len());
        // -j: the same addresses as offsets into .text.
        let text = Command::new("objdump").arg("-h").arg(exe).output().unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        let text_addr = text
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(1) == Some(&".text")).then(|| u64::from_str_radix(f[3], 16).unwrap())
            })
            .unwrap();
        let offsets: Vec<String> = addrs
            .iter()
            .map(|a| {
                format!(
                    "{:#x}",
                    u64::from_str_radix(&a[2..], 16).unwrap() - text_addr
                )
            })
            .collect();
        for (flags, args) in [
            ("-f -j .text", &offsets),
            ("-a -j .text", &offsets),
            ("-f -b elf64-x86-64 -R", &addrs),
            ("-f -C -r", &addrs),
            ("-f --demangle", &addrs),
            ("-f --demangle=auto", &addrs),
            ("-f --demangle=gnu-v3", &addrs),
            ("-f --demangle=rust", &addrs),
            ("-f --demangle=none", &addrs),
        ] {
            let f: Vec<&str> = flags.split_whitespace().collect();
            let theirs = run(
                Command::new("addr2line")
                    .args(&f)
                    .arg("-e")
                    .arg(exe)
                    .args(args),
                None,
            );
            let ours = run(
                Command::new(cli)
                    .arg("addr2line")
                    .args(&f)
                    .arg("-e")
                    .arg(exe)
                    .args(args),
                None,
            );
            assert_lines_equal(&theirs, &ours, exe, flags);
        }
    }
    // The errors: exit status 1 and binutils' message after the program name.
    for flags in ["-j .nosuch", "-b nonsense", "--demangle=klingon"] {
        let f: Vec<&str> = flags.split_whitespace().collect();
        let theirs = Command::new("addr2line")
            .args(&f)
            .arg("-e")
            .arg(&cpp)
            .arg("0x10")
            .output()
            .unwrap();
        let ours = Command::new(cli)
            .arg("addr2line")
            .args(&f)
            .arg("-e")
            .arg(&cpp)
            .arg("0x10")
            .output()
            .unwrap();
        assert_eq!(theirs.status.code(), Some(1), "{flags}");
        assert_eq!(ours.status.code(), Some(1), "{flags}");
        let msg = |o: &std::process::Output| {
            let e = String::from_utf8_lossy(&o.stderr).into_owned();
            e.split_once(": ").map(|x| x.1.to_string()).unwrap_or(e)
        };
        assert_eq!(msg(&ours), msg(&theirs), "{flags}");
    }
}

/// Standard input is read as bytes, line by line, as binutils reads it: a
/// line that is not UTF-8 is answered like any other (its hex prefix, else
/// 0), and the lines after it too; a line longer than 99 bytes is several
/// addresses (binutils' `fgets` into 100 bytes); `+`, white space and
/// values past 64 bits as `bfd_scan_vma` takes them. From a pipe and from
/// a regular file (the batch path); and the same spellings as arguments.
#[test]
fn stdin_bytes_not_utf8_match_binutils() {
    let exe = gcc("bytes", "-O2");
    let addrs = instruction_addrs(&exe, C_FUNCS);
    assert!(addrs.len() > 10);
    let mut input: Vec<u8> = Vec::new();
    let real = |i: usize| addrs[i * 7 % addrs.len()].as_bytes().to_vec();
    input.extend(real(0));
    input.extend(b"\n\xff\xfe not utf-8\n");
    input.extend(real(1));
    input.extend(b"\xc3\x28 after a hex prefix\n");
    input.extend(b"\x80");
    input.extend(real(2));
    input.extend(b"\n");
    input.extend(real(3));
    input.extend(b"\n   \t+");
    input.extend(&real(4)[2..]);
    input.extend(b"\n-1\n123456789abcdef0123\n");
    // `+`: a C number (decimal, octal, hex, a sign), as binutils reads it.
    for odd in [
        &b"+10"[..],
        b"+010",
        b"+0x1a",
        b"+-12",
        b"\x0b5",
        b"-5",
        b"+ 12",
        b"++1",
        b"+++12",
        b"1+2",
        b"0x 12",
        b"+7fffffffffffffffffff",
        b"+18446744073709551616",
        b"\x0c\r 0X1f",
    ] {
        input.extend(odd);
        input.push(b'\n');
    }
    input.extend(vec![b'0'; 97]);
    input.extend(real(5)); // split by the 99-byte read
    input.extend(b"\n");
    input.extend(vec![b'f'; 98]);
    input.extend(b"\n"); // exactly 99 bytes: one read
    input.extend(vec![b'1'; 99]);
    input.extend(b"\n"); // 100 bytes: the newline alone is read next
    input.extend(real(6));
    input.extend(b"\n\n\xe2\x82\n");
    input.extend(real(7)); // no final newline
    let dir = scratch_dir("cli-addr2line");
    let file = dir.join("bytes_input.txt");
    std::fs::write(&file, &input).unwrap();
    let flags = ["-a", "-f", "-i", "-e"];
    let piped = |cmd: &mut Command| -> String {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(&input).unwrap();
        }
        let o = child.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    let from_file = |cmd: &mut Command| -> String {
        let o = cmd
            .stdin(std::fs::File::open(&file).unwrap())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    let theirs = piped(Command::new("addr2line").args(flags).arg(&exe));
    assert!(theirs.lines().count() > 40, "{theirs}");
    let ours = piped(
        Command::new(&release_artifacts().cli)
            .arg("addr2line")
            .args(flags)
            .arg(&exe),
    );
    assert_lines_equal(&theirs, &ours, &exe, "non-UTF-8 stdin (pipe)");
    let ours = from_file(
        Command::new(&release_artifacts().cli)
            .arg("addr2line")
            .args(flags)
            .arg(&exe),
    );
    assert_lines_equal(&theirs, &ours, &exe, "non-UTF-8 stdin (file)");

    // The same odd spellings as arguments (one a non-UTF-8 byte string).
    use std::os::unix::ffi::OsStrExt;
    let args: Vec<&std::ffi::OsStr> = [
        &b"+10"[..],
        b" 0x20",
        b"-1",
        b"123456789abcdef0123",
        b"\xff\xfe",
        b"10\xc3\x28",
        b"+010",
        b"+-12",
        b"+0x1a",
    ]
    .iter()
    .map(|b| std::ffi::OsStr::from_bytes(b))
    .collect();
    let out = |prog: &Path| {
        let o = Command::new(prog)
            .args(if prog.ends_with("addr2line") {
                vec![]
            } else {
                vec!["addr2line"]
            })
            .args(flags)
            .arg(&exe)
            .arg("--")
            .args(&args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let theirs = out(Path::new("addr2line"));
    let ours = out(&release_artifacts().cli);
    assert_lines_equal(&theirs, &ours, &exe, "odd spellings as arguments");
}
