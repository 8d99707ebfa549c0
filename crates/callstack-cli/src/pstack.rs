//! `callstack pstack [--json] PID`: every thread's backtrace from a live
//! process, which is stopped only while its registers and stacks are copied.

use callstack::remote::process::LiveProcess;
use callstack::remote::Lookup;
use std::path::PathBuf;

use crate::stacks;

/// Arguments of `callstack pstack`.
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
    /// Look up the process's file paths under this directory first.
    #[arg(long, value_name = "DIR")]
    sysroot: Option<PathBuf>,
    /// A directory of separate debug files (`.build-id/xx/rest.debug`); repeatable.
    #[arg(long = "debug-dir", value_name = "DIR")]
    debug_dir: Vec<PathBuf>,
    /// Print on stderr how long the target was stopped.
    #[arg(long)]
    timing: bool,
    /// The process id.
    pid: u32,
}

pub fn run(args: Args) -> Result<(), String> {
    let lookup = Lookup {
        sysroot: args.sysroot,
        debug_dirs: args.debug_dir.clone(),
    };
    let live = LiveProcess::capture(args.pid, &lookup).map_err(|e| e.to_string())?;
    if args.timing {
        eprintln!(
            "callstack: target stopped for {:.3} ms ({} threads)",
            live.stopped_for().as_secs_f64() * 1e3,
            live.snapshot().threads.len()
        );
    }
    let snap = live.snapshot();
    stacks::warn(snap);
    let progress = stacks::Progress::new(snap.threads.len(), 0);
    let threads = stacks::collect(
        snap,
        &mut live.memory(),
        &progress,
        args.past_main,
        &args.debug_dir,
    );
    stacks::print_methods(&threads, args.json, args.methods)
}
