//! The machine-code tests' view of a core: the library's
//! [`CoreFile`](callstack::remote::corefile::CoreFile) plus the code the
//! analyzers read, gathered into a `ModuleCode`.
#![allow(dead_code)]

use callstack::remote::corefile::CoreFile;
use callstack::remote::Lookup;
use callstack::unwind::insn::ModuleCode;
use std::path::Path;

/// Opens `core`, with `exe` as the executable (the whole map of a
/// qemu-user core, which has no `NT_FILE`).
pub fn open(core: &Path, exe: &Path) -> CoreFile {
    CoreFile::open(core, Some(exe), &Lookup::default()).expect("open core")
}

/// The code of every module file found (at its load bias) and of the
/// core's own executable segments (the vDSO, qemu's signal trampolines).
pub fn code(core: &CoreFile) -> ModuleCode {
    let mut code = ModuleCode::new();
    for m in &core.snapshot().modules {
        let Some(path) = &m.file else { continue };
        let Ok(data) = std::fs::read(path) else {
            continue;
        };
        code.add_elf(&data, m.bias).expect("module code");
    }
    for (start, bytes) in core.executable_segments() {
        code.add_region(start, bytes.to_vec());
    }
    code
}

/// The first thread's raw `NT_PRSTATUS` and the end of its stack.
pub fn first_thread(core: &CoreFile) -> (Vec<u8>, u64) {
    let desc = core.prstatus_notes()[0].clone();
    let stack_end = core.snapshot().threads[0].stack_end.expect("stack in core");
    (desc, stack_end)
}

/// Runs the release `callstack core --json ARGS EXE CORE` and returns its
/// report and the pcs of its first thread, innermost first.
pub fn cli_core_json(args: &[&str], exe: &Path, core: &Path) -> (serde_json::Value, Vec<u64>) {
    let cli = testsupport::release_artifacts().cli.clone();
    let o = std::process::Command::new(&cli)
        .arg("core")
        .arg("--json")
        .args(args)
        .arg(exe)
        .arg(core)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "callstack core: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pcs = report["threads"][0]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            u64::from_str_radix(f["pc"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
        })
        .collect();
    (report, pcs)
}
