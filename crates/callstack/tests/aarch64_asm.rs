//! The in-process AArch64 entries (`naked_asm!` in src/arch/aarch64/) are
//! compiled only on an aarch64 host, which CI does not have. This test
//! assembles their text with `aarch64-linux-gnu-as` (from
//! scripts/install-test-deps.sh) so that at least the assembly is valid, and
//! checks with `aarch64-linux-gnu-objdump` that each entry is exactly the
//! instructions written, one per line. Skipped, with a message, when the
//! cross binutils are missing.

use std::path::Path;
use std::process::Command;
use testsupport::{scratch_dir, workspace_root};

/// The files holding the aarch64 naked entries.
const FILES: [&str; 3] = [
    "crates/callstack/src/arch/aarch64/mod.rs",
    "crates/callstack/src/arch/aarch64/exact.rs",
    "crates/callstack/src/arch/aarch64/switch.rs",
];

/// One `naked_asm!` block: the function it belongs to and its instructions,
/// `{name}` operands replaced by the symbol `name`.
struct Entry {
    function: String,
    insns: Vec<String>,
}

/// The `naked_asm!` blocks of a Rust source file.
fn entries(src: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut function = String::new();
    let mut current: Option<Entry> = None;
    for line in src.lines() {
        let l = line.trim();
        if let Some(i) = l.find("fn ") {
            if l.contains("extern \"C\" fn ") {
                let rest = &l[i + 3..];
                function = rest.split('(').next().unwrap_or("").to_string();
                // The entries a macro defines for each request type
                // (`request_entry!`): named after the macro here.
                if function.starts_with('$') {
                    function = "request_entry".to_string();
                }
            }
        }
        if l.starts_with("core::arch::naked_asm!(") {
            current = Some(Entry {
                function: function.clone(),
                insns: vec![],
            });
            continue;
        }
        if let Some(e) = current.as_mut() {
            if l.starts_with(')') {
                out.push(current.take().unwrap());
            } else if let Some(s) = l.strip_prefix('"') {
                let insn = s.trim_end_matches(',').trim_end_matches('"');
                e.insns.push(insn.replace(['{', '}'], ""));
            }
        }
    }
    out
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

#[test]
fn aarch64_naked_entries_assemble() {
    let (asm, objdump) = ("aarch64-linux-gnu-as", "aarch64-linux-gnu-objdump");
    if !have(asm) || !have(objdump) {
        eprintln!(
            "skipped: {asm} or {objdump} missing (scripts/install-test-deps.sh installs them)"
        );
        return;
    }
    let root = workspace_root();
    let mut all = Vec::new();
    for f in FILES {
        let src = std::fs::read_to_string(root.join(f)).unwrap();
        let found = entries(&src);
        assert!(!found.is_empty(), "no naked_asm! in {f}");
        all.extend(found);
    }
    let names: Vec<&str> = all.iter().map(|e| e.function.as_str()).collect();
    for want in [
        "fast_entry",
        "exact_entry",
        "request_entry",
        "call_on_stack",
    ] {
        assert!(names.contains(&want), "{want} not found: {names:?}");
    }
    let mut text = String::from(".text\n");
    for e in &all {
        text += &format!(".globl {0}\n.type {0}, %function\n{0}:\n", e.function);
        for i in &e.insns {
            text += &format!("    {i}\n");
        }
    }
    let dir = scratch_dir("aarch64-asm");
    let (s, o) = (dir.join("entries.s"), dir.join("entries.o"));
    std::fs::write(&s, &text).unwrap();
    let out = Command::new(asm)
        .arg("-o")
        .arg(&o)
        .arg(&s)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{asm} rejects the aarch64 entries:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dis = disassemble(objdump, &o);
    for e in &all {
        let got = dis
            .iter()
            .find(|(f, _)| *f == e.function)
            .map(|(_, n)| n.len())
            .unwrap_or(0);
        // Directives (`.cfi_*`) assemble to no instruction.
        let written = e.insns.iter().filter(|i| !i.starts_with('.')).count();
        assert_eq!(
            got, written,
            "{}: {} instructions written, {got} assembled:\n{dis:?}",
            e.function, written
        );
    }
    // The capture_fast entry starts with the frame record it promises:
    // stp x29, x30, [sp, #-16]!  (0xa9bf7bfd).
    let fast = &dis.iter().find(|(f, _)| f == "fast_entry").unwrap().1;
    assert_eq!(fast[0], "a9bf7bfd", "{fast:?}");
}

/// `(function, [instruction word in hex])` of each symbol of `obj`.
fn disassemble(objdump: &str, obj: &Path) -> Vec<(String, Vec<String>)> {
    let out = Command::new(objdump).arg("-d").arg(obj).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut funcs: Vec<(String, Vec<String>)> = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "0000000000000000 <fast_entry>:"
        if let Some(name) = line.strip_suffix(">:").and_then(|l| l.split_once(" <")) {
            funcs.push((name.1.to_string(), vec![]));
        } else if let Some((_, rest)) = line.split_once(":\t") {
            // "   0:\ta9bf7bfd \tstp\tx29, x30, [sp, #-16]!"
            if let (Some(f), Some(word)) = (funcs.last_mut(), rest.split_whitespace().next()) {
                f.1.push(word.to_string());
            }
        }
    }
    funcs
}
