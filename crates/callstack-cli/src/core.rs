//! `callstack core [--json] EXE CORE`: every thread's backtrace from an ELF
//! core file.

use callstack::remote::corefile::CoreFile;
use callstack::remote::Lookup;
use std::path::PathBuf;

use crate::stacks;

/// Arguments of `callstack core`.
#[derive(clap::Args)]
pub struct Args {
    /// Print JSON (the format documented in README.md) instead of text.
    #[arg(long)]
    json: bool,
    /// Show how each frame was found (context, cfi, fp, insn, scan) and a
    /// summary of the methods: the accuracy report.
    #[arg(long)]
    methods: bool,
    /// Show the frames below `main` too (gdb's `set backtrace past-main`).
    #[arg(long)]
    past_main: bool,
    /// Look up the core's file paths under this directory first.
    #[arg(long, value_name = "DIR")]
    sysroot: Option<PathBuf>,
    /// A directory of separate debug files (`.build-id/xx/rest.debug`); repeatable.
    #[arg(long = "debug-dir", value_name = "DIR")]
    debug_dir: Vec<PathBuf>,
    /// The executable that dumped the core.
    exe: PathBuf,
    /// The core file.
    core: PathBuf,
}

pub fn run(args: Args) -> Result<(), String> {
    let lookup = Lookup {
        sysroot: args.sysroot,
        debug_dirs: args.debug_dir.clone(),
    };
    let core = CoreFile::open(&args.core, Some(&args.exe), &lookup)
        .map_err(|e| format!("{}: {e}", args.core.display()))?;
    let snap = core.snapshot();
    stacks::warn(snap);
    if snap.threads.is_empty() {
        return Err(format!("{}: no threads in the core", args.core.display()));
    }
    let progress = stacks::Progress::new(snap.threads.len(), core.size());
    let threads = stacks::collect(
        snap,
        &mut core.memory(),
        &progress,
        args.past_main,
        &args.debug_dir,
    );
    stacks::print_methods(&threads, args.json, args.methods)
}
