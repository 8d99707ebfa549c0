//! `callstack record [-F HZ] [-o FILE] [-p PID | -- COMMAND ARGS...]`:
//! sample any program with perf events (no recompiling, no frame
//! pointers needed: the copied user stacks are unwound with the program's
//! CFI), write the profile as a callstack trace file for `callstack report`.

use callstack::remote::perf::{record, RecordOptions, Target};
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// Arguments of `callstack record`.
#[derive(clap::Args)]
pub struct Args {
    /// Samples per second of CPU time (per thread).
    #[arg(short = 'F', long = "freq", default_value_t = 999)]
    hz: u32,
    /// The profile to write.
    #[arg(short = 'o', long = "output", default_value = "callstack.data")]
    output: PathBuf,
    /// Record this running process (its threads now and later).
    #[arg(short = 'p', long = "pid", conflicts_with = "command")]
    pid: Option<u32>,
    /// Stop after this many seconds.
    #[arg(short = 'd', long = "duration")]
    duration: Option<f64>,
    /// Bytes of user stack copied per sample (deeper frames are cut).
    #[arg(long = "stack-size", default_value_t = 16384)]
    stack_size: u32,
    /// Do not print the progress line.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// The command to run and record.
    #[arg(last = true, required_unless_present = "pid")]
    command: Vec<OsString>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub fn run(args: Args) -> Result<(), String> {
    let target = match args.pid {
        Some(p) => Target::Pid(p),
        None => Target::Command(args.command.clone()),
    };
    let mut opts = RecordOptions::new(target);
    opts.hz = args.hz;
    opts.stack_bytes = args.stack_size;
    opts.duration = args
        .duration
        .filter(|d| *d > 0.0)
        .map(std::time::Duration::from_secs_f64);
    // Ctrl-C ends the recording (and, from a terminal, the command too);
    // the profile is still written.
    // SAFETY: a handler that only stores to an atomic.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_interrupt as *const () as libc::sighandler_t,
        );
    }
    let quiet = args.quiet;
    let mut shown = false;
    let profile = record(&opts, &STOP, &mut |p| {
        if !quiet {
            eprint!(
                "\rcallstack record: {:.1}s, {} samples, {} lost, {} threads   ",
                p.elapsed.as_secs_f64(),
                p.samples,
                p.lost,
                p.threads
            );
            let _ = std::io::stderr().flush();
            shown = true;
        }
    })
    .map_err(|e| e.to_string())?;
    if shown {
        eprintln!();
    }
    let f = std::fs::File::create(&args.output)
        .map_err(|e| format!("{}: {e}", args.output.display()))?;
    profile
        .write_trace(std::io::BufWriter::new(f))
        .map_err(|e| format!("{}: {e}", args.output.display()))?;
    if !quiet {
        eprintln!(
            "callstack record: wrote {} ({} stacks); see `callstack report {}`",
            args.output.display(),
            profile.stacks.len(),
            args.output.display()
        );
    }
    Ok(())
}
