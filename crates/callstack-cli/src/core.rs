//! `callstack core [--json] EXE CORE`: every thread's backtrace from an ELF
//! core file.

use callstack::remote::corefile::CoreFile;
use std::path::PathBuf;

use crate::stacks;

/// Arguments of `callstack core`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    report: stacks::ReportArgs,
    /// The executable that dumped the core.
    exe: PathBuf,
    /// The core file.
    core: PathBuf,
}

pub fn run(args: Args) -> Result<(), String> {
    let core = CoreFile::open(&args.core, Some(&args.exe), &args.report.lookup())
        .map_err(|e| format!("{}: {e}", args.core.display()))?;
    let snap = core.snapshot();
    stacks::warn(snap);
    if snap.threads.is_empty() {
        return Err(format!("{}: no threads in the core", args.core.display()));
    }
    args.report.print(snap, &mut core.memory(), core.size())
}
