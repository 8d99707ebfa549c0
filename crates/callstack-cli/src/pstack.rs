//! `callstack pstack [--json] PID`: every thread's backtrace from a live
//! process, which is stopped only while its registers and stacks are copied.

use callstack::remote::process::LiveProcess;

use crate::stacks;

/// Arguments of `callstack pstack`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    report: stacks::ReportArgs,
    /// Print on stderr how long the target was stopped.
    #[arg(long)]
    timing: bool,
    /// The process id.
    pid: u32,
}

pub fn run(args: Args) -> Result<(), String> {
    let live = LiveProcess::capture(args.pid, &args.report.lookup()).map_err(|e| e.to_string())?;
    if args.timing {
        eprintln!(
            "callstack: target stopped for {:.3} ms ({} threads)",
            live.stopped_for().as_secs_f64() * 1e3,
            live.snapshot().threads.len()
        );
    }
    let snap = live.snapshot();
    stacks::warn(snap);
    args.report
        .print(snap, &mut live.memory(), 0, &stacks::Header::default())
}
