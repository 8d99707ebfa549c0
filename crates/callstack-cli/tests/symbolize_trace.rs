//! A trace written by this test process, symbolized by `callstack
//! symbolize` in another process: from a file, from standard input, with
//! modules found by path and by build-id.

use callstack::tracefile::{ModuleRecord, TraceWriter};
use std::hint::black_box;
use std::process::{Command, Stdio};
use testsupport::{release_artifacts, scratch_dir};

#[inline(never)]
fn trace_inner(out: &mut [usize]) -> (usize, u32) {
    let line = line!() + 1;
    let n = callstack::capture_fast(0, out);
    (n, line)
}

#[inline(never)]
fn trace_outer(out: &mut [usize]) -> (usize, u32, u32) {
    let line = line!() + 1;
    let (n, inner_line) = black_box(trace_inner(out));
    (n, inner_line, line)
}

fn symbolize(args: &[&str], stdin: Option<&[u8]>) -> String {
    let mut cmd = Command::new(&release_artifacts().cli);
    cmd.arg("symbolize").args(args);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(b) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn check(out: &str, inner_line: u32, outer_line: u32) {
    let inner = out
        .lines()
        .position(|l| {
            l.contains("in symbolize_trace::trace_inner at")
                && l.contains(&format!("symbolize_trace.rs:{inner_line}"))
        })
        .unwrap_or_else(|| panic!("no trace_inner line:\n{out}"));
    let outer = out
        .lines()
        .position(|l| {
            l.contains("in symbolize_trace::trace_outer at")
                && l.contains(&format!("symbolize_trace.rs:{outer_line}"))
        })
        .unwrap_or_else(|| panic!("no trace_outer line:\n{out}"));
    assert!(inner < outer, "{out}");
}

#[test]
fn trace_from_file_and_stdin() {
    let mut frames = [0usize; 64];
    let (n, inner_line, outer_line) = trace_outer(&mut frames);
    let mut w = TraceWriter::new(Vec::new()).unwrap();
    w.write_loaded_modules().unwrap();
    w.write_stack(&frames[..n], false).unwrap();
    w.write_stack_tagged(&frames[..2], false, Some(7)).unwrap();
    let bytes = w.finish().unwrap();
    let dir = scratch_dir("symbolize-trace");
    let path = dir.join("t.cstrace");
    std::fs::write(&path, &bytes).unwrap();

    let out = symbolize(&[path.to_str().unwrap()], None);
    check(&out, inner_line, outer_line);
    assert!(out.contains("stack 1 (tag 7):"), "{out}");

    let out = symbolize(&["-"], Some(&bytes));
    check(&out, inner_line, outer_line);

    // A truncated file (a writer killed mid-record) prints what it has.
    let out = symbolize(&["-"], Some(&bytes[..bytes.len() - 3]));
    check(&out, inner_line, outer_line);
    assert!(!out.contains("stack 1"));
}

#[test]
fn modules_found_by_build_id() {
    let mut frames = [0usize; 64];
    let (n, inner_line, outer_line) = trace_outer(&mut frames);
    let me = callstack::modules::loaded_modules().remove(0);
    let id = me.build_id.clone().expect("test binaries have a build-id");
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let dir = scratch_dir("symbolize-trace");
    let store = dir.join("debug");
    let slot = store.join(".build-id").join(&hex[..2]);
    std::fs::create_dir_all(&slot).unwrap();
    std::fs::copy(&me.path, slot.join(format!("{}.debug", &hex[2..]))).unwrap();
    let (start, end) = me.range();
    let mut w = TraceWriter::new(Vec::new()).unwrap();
    w.write_module(&ModuleRecord {
        path: "/gone/from/this/machine".into(),
        build_id: Some(id),
        start: start as u64,
        end: end as u64,
        bias: me.bias as u64,
    })
    .unwrap();
    w.write_stack(&frames[..n], false).unwrap();
    let bytes = w.finish().unwrap();
    let out = symbolize(&["--debug-dir", store.to_str().unwrap(), "-"], Some(&bytes));
    check(&out, inner_line, outer_line);
}

#[test]
fn not_a_trace_is_an_error() {
    let o = Command::new(&release_artifacts().cli)
        .args(["symbolize", "/etc/hostname"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a callstack trace"));
}

/// A module that cannot be opened (the kernel's `[kernel.kallsyms]` of a
/// recording, a file gone from this machine) is warned about once per run,
/// not once per stack that meets it; in text and in JSON.
#[test]
fn unopened_module_warned_once() {
    let mut w = TraceWriter::new(Vec::new()).unwrap();
    let kernel = 0xffff_ffff_8100_0000u64;
    w.write_module(&ModuleRecord {
        path: "[kernel.kallsyms]".into(),
        build_id: None,
        start: kernel,
        end: kernel + 0x100_0000,
        bias: 0,
    })
    .unwrap();
    w.write_module(&ModuleRecord {
        path: "/gone/from/this/machine.so".into(),
        build_id: None,
        start: 0x7000_0000,
        end: 0x7010_0000,
        bias: 0x7000_0000,
    })
    .unwrap();
    for i in 0..20usize {
        let k = kernel as usize + 0x1000 * i;
        w.write_stack_tagged(&[k, k + 0x40, 0x7000_1000 + i], true, Some(i as u64))
            .unwrap();
    }
    let bytes = w.finish().unwrap();
    for json in [false, true] {
        let mut cmd = Command::new(&release_artifacts().cli);
        cmd.arg("symbolize");
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(&bytes).unwrap();
        }
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success());
        let err = String::from_utf8(o.stderr).unwrap();
        for name in ["[kernel.kallsyms]", "/gone/from/this/machine.so"] {
            let n = err.lines().filter(|l| l.contains(name)).count();
            assert_eq!(n, 1, "json {json}: {name} warned {n} times:\n{err}");
        }
    }
}
