//! Building the no-CFI fixture chain, making cores, and asking gdb and
//! libunwind for their chains: shared by the x86-64 tests and the accuracy
//! report.
#![allow(dead_code)]

use super::cores;
use callstack::unwind::insn::{x86_64::unwinder, Method};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One build of the fixture chain.
#[derive(Clone, Debug)]
pub struct Variant {
    pub opt: &'static str,
    pub strip: bool,
    pub cfi: bool,
    /// Build with frame pointers (`-fno-omit-frame-pointer`).
    pub fp: bool,
}

impl Variant {
    pub fn name(&self) -> String {
        format!(
            "{}{}-{}{}",
            self.opt.trim_start_matches('-'),
            if self.fp { "-fp" } else { "" },
            if self.cfi { "cfi" } else { "nocfi" },
            if self.strip { "-stripped" } else { "" }
        )
    }
}

/// Builds the executable (no `-g`: a `.debug_frame` would be CFI).
pub fn build_exe(dir: &Path, v: &Variant) -> PathBuf {
    let fx = testsupport::c_fixtures();
    let out = dir.join(v.name());
    let mut cmd = Command::new("gcc");
    cmd.arg(v.opt).arg(if v.fp {
        "-fno-omit-frame-pointer"
    } else {
        "-fomit-frame-pointer"
    });
    cmd.arg("-DINSN_MAIN");
    if v.cfi {
        cmd.arg("-DWITH_CFI");
    } else {
        cmd.args(["-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]);
    }
    cmd.arg(fx.join("insn_chain.c"))
        .arg(fx.join("insn_asm_x86_64.S"));
    cmd.arg("-o").arg(&out).arg("-ldl");
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    if v.strip {
        assert!(Command::new("strip").arg(&out).status().unwrap().success());
    }
    out
}

/// `.text` of an executable.
pub fn text(exe: &Path) -> Vec<u8> {
    use object::{Object, ObjectSection};
    let data = std::fs::read(exe).unwrap();
    let f = object::File::parse(&*data).unwrap();
    f.section_by_name(".text").unwrap().data().unwrap().to_vec()
}

/// Runs `exe` (with ASLR off, so two builds with the same `.text` give the
/// same addresses) in its own directory until it aborts; returns the core
/// and the program's stdout.
pub fn make_core(exe: &Path, args: &str) -> (PathBuf, String) {
    let dir = exe.parent().unwrap().join(format!(
        "run-{}",
        exe.file_name().unwrap().to_string_lossy()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new("sh")
        .current_dir(&dir)
        .arg("-c")
        .arg(format!(
            "ulimit -c unlimited; exec setarch -R {} {}",
            exe.display(),
            args
        ))
        .output()
        .unwrap();
    let core = dir.join("core");
    assert!(core.exists(), "no core from {}: {:?}", exe.display(), o);
    (core, String::from_utf8_lossy(&o.stdout).into_owned())
}

/// gdb's `bt` on a core: the pc of each frame, innermost first (inlined
/// frames, which repeat a pc, folded).
pub fn gdb_core_pcs(exe: &Path, core: &Path) -> Vec<u64> {
    testsupport::fold_repeats(testsupport::gdb_core_pcs(&["gdb"], exe, core))
}

/// libunwind's chain, printed by the fixture (`libunwind: 0x... 0x...`).
pub fn libunwind_pcs(stdout: &str) -> Option<Vec<u64>> {
    let line = stdout.lines().find(|l| l.starts_with("libunwind:"))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok())
        .collect();
    if v.is_empty() {
        None
    } else {
        Some(v)
    }
}

/// Drops gdb's virtual tail-call frames (reconstructed from DWARF call-site
/// information in libc's debug info: their pc follows a `jmp`, not a call,
/// and no return address of theirs is on the stack).
pub fn physical_frames(exe: &Path, core_path: &Path, pcs: &[u64]) -> Vec<u64> {
    let core = cores::open(core_path, exe);
    let mut code = cores::code(&core);
    pcs.iter()
        .enumerate()
        .filter(|(i, &pc)| *i == 0 || unwinder::call_before(&mut code, pc).is_some())
        .map(|(_, &pc)| pc)
        .collect()
}

/// Our chain on the core's (first) thread, by machine code alone.
pub fn our_core_chain(exe: &Path, core_path: &Path) -> Vec<(u64, Method)> {
    let core = cores::open(core_path, exe);
    let mut code = cores::code(&core);
    let (desc, stack_end) = cores::first_thread(&core);
    let mut out = [(0u64, Method::Context); 128];
    let n = callstack::unwind::insn::unwind_prstatus(
        callstack::unwind::Machine::X86_64,
        &desc,
        &mut core.memory(),
        &mut code,
        stack_end,
        &mut out,
    )
    .unwrap();
    out[..n].to_vec()
}

/// Address of `main` (from the unstripped build).
pub fn symbol(exe: &Path, name: &str) -> Option<(u64, u64)> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(exe).unwrap();
    let f = object::File::parse(&*data).unwrap();
    let s = f.symbols().find(|s| s.name() == Ok(name))?;
    Some((s.address(), s.size()))
}

/// How many frames of `truth[from..]` a tool got right: find `truth[from]`
/// in `got`, then count consecutive equal frames.
pub fn frames_right(truth: &[u64], from: usize, got: &[u64]) -> usize {
    let Some(i) = got.iter().position(|&p| p == truth[from]) else {
        return 0;
    };
    truth[from..]
        .iter()
        .zip(&got[i..])
        .take_while(|(a, b)| a == b)
        .count()
}
