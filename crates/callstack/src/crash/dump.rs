//! The helper's minidump of the crashed process: written from the crash
//! context the handler sent (see `context.rs`) with
//! [`crate::minidump::write_live_process`], which reads every thread of the
//! crashed process with `ptrace` (the helper is its child, allowed by
//! `PR_SET_PTRACER`). This runs in the helper process, never in the crashed
//! one.

use super::context::CrashContext;
use crate::minidump::{write_live_process, Crash, WriteOptions, WriteStats};
use std::path::{Path, PathBuf};

/// The file name of a crash's dump: `<exe>-<pid>-<unix-seconds>.dmp`, the
/// executable's file name taken from `/proc/PID/exe` (else `comm`). A pid
/// is not reused within the same second, so the name is unique per crash
/// on a machine.
pub(crate) fn dump_name(pid: u32) -> String {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| {
            p.file_name().map(|n| {
                n.to_string_lossy()
                    .trim_end_matches(" (deleted)")
                    .to_string()
            })
        })
        .or_else(|| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .map(|s| s.trim_end().to_string())
        })
        .unwrap_or_else(|| "process".to_string());
    let exe: String = exe
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._+-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{exe}-{pid}-{secs}.dmp")
}

/// The crashing thread's registers at the fault, from the context's
/// `user_regs_struct` words.
fn registers(c: &CrashContext) -> Option<crate::remote::Registers> {
    let (arch, words) = c.regs.as_ref()?;
    let machine = match arch.as_str() {
        "x86_64" => crate::remote::Machine::X86_64,
        "aarch64" => crate::remote::Machine::Aarch64,
        _ => return None,
    };
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    machine.registers_from_user_regs(&bytes)
}

/// Writes the minidump of the crash `c` into `dir` (created if missing).
pub(crate) fn write(c: &CrashContext, dir: &Path) -> Result<(PathBuf, WriteStats), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(dump_name(c.pid));
    let opts = WriteOptions {
        crash: Some(Crash {
            tid: c.tid,
            signal: c.signal,
            code: c.code,
            address: c.address,
            registers: registers(c),
        }),
        ..WriteOptions::default()
    };
    let lookup = crate::remote::Lookup::default();
    match write_live_process(c.pid, &path, &opts, &lookup) {
        Ok(stats) => Ok((path, stats)),
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e.to_string())
        }
    }
}
