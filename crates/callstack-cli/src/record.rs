//! `callstack record [-F HZ] [-o FILE] [-p PID | -- COMMAND ARGS...]`:
//! sample any program with perf events (no recompiling, no frame
//! pointers needed: the copied user stacks are unwound with the program's
//! CFI), write the profile as a callstack trace file for `callstack report`.
//!
//! Where perf events are refused (`perf_event_paranoid`, a container, a
//! kernel without them), or with `--preload`, a command is sampled from
//! inside instead: `libcallstack_preload.so` (`$CALLSTACK_PRELOAD_LIB`, else
//! next to this binary) is preloaded and runs the in-process profiler
//! (`callstack::profiler`, CPU-time timers per thread) from the program's
//! start to its exit, writing the same file.

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
    /// Sample the command from inside (LD_PRELOAD of the in-process
    /// profiler) instead of with perf events; what `record` falls back to
    /// when perf events are refused. Not for `-p`.
    #[arg(long, conflicts_with = "pid")]
    preload: bool,
    /// The command to run and record.
    #[arg(last = true, required_unless_present = "pid")]
    command: Vec<OsString>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub fn run(args: Args) -> Result<(), String> {
    if args.preload {
        return run_preloaded(&args);
    }
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
    });
    let profile = match profile {
        Ok(p) => p,
        Err(callstack::remote::perf::RecordError::PerfRefused(e)) if args.pid.is_none() => {
            if shown {
                eprintln!();
            }
            eprintln!(
                "callstack record: perf events refused ({e}): sampling the command from inside (LD_PRELOAD)"
            );
            return run_preloaded(&args);
        }
        Err(e) => return Err(e.to_string()),
    };
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

/// Runs the command with the in-process sampler preloaded (see the module
/// docs); the program writes the profile at its exit.
fn run_preloaded(args: &Args) -> Result<(), String> {
    let Some((prog, rest)) = args.command.split_first() else {
        return Err("--preload needs a command (`-- COMMAND ARGS...`)".into());
    };
    let lib = crate::memtrack::preload_lib()?;
    // The command creates the file itself (a program it execs writes
    // FILE.PID): an old one must go first.
    match std::fs::remove_file(&args.output) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("{}: {e}", args.output.display()))
        }
        _ => {}
    }
    let mut preload = lib.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD") {
        preload.push(" ");
        preload.push(old);
    }
    if !args.quiet {
        eprintln!("callstack record: sampling in process at {} Hz", args.hz);
    }
    let status = std::process::Command::new(prog)
        .args(rest)
        .env("LD_PRELOAD", &preload)
        .env("CALLSTACK_RECORD_OUT", &args.output)
        .env("CALLSTACK_RECORD_HZ", args.hz.to_string())
        .status()
        .map_err(|e| format!("cannot start {}: {e}", prog.to_string_lossy()))?;
    if !args.output.exists() {
        return Err(format!(
            "{} wrote no profile ({status}; a program that ends in _exit or by a signal writes none)",
            prog.to_string_lossy()
        ));
    }
    if !args.quiet {
        eprintln!(
            "callstack record: wrote {}; see `callstack report {}`",
            args.output.display(),
            args.output.display()
        );
    }
    Ok(())
}
