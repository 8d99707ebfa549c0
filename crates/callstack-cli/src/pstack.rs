//! `callstack pstack [--json] PID`: every thread's backtrace from a live
//! process, which is stopped only while its registers and stacks are copied.
//!
//! A CPython interpreter's frames are read while the threads are stopped,
//! and shown in place of the `_PyEval_EvalFrameDefault` frames that run
//! them (`--no-python`: native frames only).
//!
//! `callstack pstack --minidump OUT PID` writes a minidump of the process
//! instead of printing its stacks (one line on stderr says what was
//! written); the process is left running as always.

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
    #[command(flatten)]
    minidump: crate::minidump_args::MinidumpArgs,
    /// The process id.
    pid: u32,
}

pub fn run(args: Args) -> Result<(), String> {
    if let Some(out) = &args.minidump.minidump {
        let t0 = std::time::Instant::now();
        let stats = callstack::minidump::write_live_process(
            args.pid,
            out,
            &args.minidump.options(),
            &crate::minidump_args::lookup(&args.report),
        )
        .map_err(|e| e.to_string())?;
        crate::minidump_args::note(out, &stats, args.timing.then(|| t0.elapsed()));
        return Ok(());
    }
    // A CPython interpreter's frames are read while the threads are
    // stopped, of the same instant as their stacks.
    let mut hook = stacks::PythonHook::default();
    let live = LiveProcess::capture_with(
        args.pid,
        &args.report.lookup(),
        args.report
            .python()
            .then_some(&mut hook as &mut dyn callstack::remote::process::WhileStopped),
    )
    .map_err(|e| e.to_string())?;
    if args.timing {
        eprintln!(
            "callstack: target stopped for {:.3} ms ({} threads)",
            live.stopped_for().as_secs_f64() * 1e3,
            live.snapshot().threads.len()
        );
    }
    let snap = live.snapshot();
    stacks::warn(snap);
    args.report.print_with(
        snap,
        &mut live.memory(),
        hook.frames(),
        0,
        &stacks::Header::default(),
    )
}
