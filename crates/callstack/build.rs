//! The one place the crate asks which architecture it is compiled for, for
//! the items that exist only where captures run in-process: it sets
//! `cfg(callstack_native)` when `src/arch/` has a module for the target
//! architecture (`crate::arch::native`), and `cfg(callstack_exit_hooks)`
//! when that module also has an exit-hook trampoline
//! (`crate::arch::native::exit_hook`), and `cfg(callstack_insn)` when it
//! has in-process machine-code analysis (`crate::arch::native::regs_entry`,
//! which `unwind::insn::InProcess` walks from, and a decoder warmed up at
//! load), and `cfg(callstack_risc_insn)` when its in-process walk keeps
//! prologue analysis's rules in the rule cache. Adding an architecture
//! adds its name here and its folder under `src/arch/`.
//!
//! The operating system: the in-process machinery above (`callstack_native`
//! and the rest) is Linux's (the ELF loader, `/proc`, signals); on Windows
//! (`src/sys/windows/`) none of it is set, and `cfg(callstack_fast)` marks
//! what `capture_fast` needs (its naked entry, the frame-record walk), set
//! wherever an architecture and an operating system have it.

/// The architectures with an in-process module (`src/arch/<name>/`).
const NATIVE: &[&str] = &["x86_64", "aarch64", "riscv64"];
/// Those of them whose folder has `exit_hook.rs` (the trampoline, its
/// `window`, `trampoline`, `start_context_pc`, `is_plain`, `SLOT_FROM_RULE`).
const EXIT_HOOKS: &[&str] = &["x86_64", "aarch64"];
/// Those of them with in-process machine-code analysis (`regs_entry`).
const INSN: &[&str] = &["x86_64"];
/// Those of them whose in-process walk keeps the rules of prologue
/// analysis in the rule cache (`exact::settle_insn`, `exact::insn_caller`).
const RISC_INSN: &[&str] = &["aarch64", "riscv64"];
/// The architectures whose Windows ABI has a `capture_fast` entry
/// (`src/sys/windows/<name>.rs`).
const WINDOWS_FAST: &[&str] = &["x86_64"];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(callstack_native)");
    println!("cargo::rustc-check-cfg=cfg(callstack_exit_hooks)");
    println!("cargo::rustc-check-cfg=cfg(callstack_insn)");
    println!("cargo::rustc-check-cfg=cfg(callstack_risc_insn)");
    println!("cargo::rustc-check-cfg=cfg(callstack_fast)");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "windows" {
        if WINDOWS_FAST.contains(&arch.as_str()) {
            println!("cargo::rustc-cfg=callstack_fast");
        }
    } else if NATIVE.contains(&arch.as_str()) {
        println!("cargo::rustc-cfg=callstack_native");
        println!("cargo::rustc-cfg=callstack_fast");
        if EXIT_HOOKS.contains(&arch.as_str()) {
            println!("cargo::rustc-cfg=callstack_exit_hooks");
        }
        if INSN.contains(&arch.as_str()) {
            println!("cargo::rustc-cfg=callstack_insn");
        }
        if RISC_INSN.contains(&arch.as_str()) {
            println!("cargo::rustc-cfg=callstack_risc_insn");
        }
    }
}
