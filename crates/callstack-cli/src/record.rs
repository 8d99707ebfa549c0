//! `callstack record [-F HZ] [-o FILE] [-p PID | -- COMMAND ARGS...]`:
//! sample any program with perf events (no recompiling, no frame
//! pointers needed: the copied user stacks are unwound with the program's
//! CFI), write the profile as a callstack trace file for `callstack report`.
//! The user stack copy starts at 8 KiB and grows when samples are cut at
//! its end (`--stack-size` fixes it; `--stack-size-min` lets it shrink);
//! `--memory-budget` bounds the
//! per-module state; with `-a`, each sample is labelled with its process.
//! In CPython processes (3.7-3.13), each sample's `_PyEval_EvalFrameDefault`
//! frames are replaced by the Python functions they ran (function, file,
//! line), read from the running process near the sample's time
//! (`callstack::python::record`); `--no-python` keeps the native frames.
//!
//! Where perf events are refused (`perf_event_paranoid`, a container, a
//! kernel without them), or with `--preload`, a command is sampled from
//! inside instead: `libcallstack_preload.so` (`$CALLSTACK_PRELOAD_LIB`, else
//! next to this binary) is preloaded and runs the in-process profiler
//! (`callstack::profiler`, CPU-time timers per thread) from the program's
//! start to its exit, writing the same file.
//!
//! Like a shell, `record` exits with the command's status: its exit code,
//! or 128 + the number of the signal that ended it (127 when the command
//! is not found, 126 when it cannot be executed; no file is written then).
//! The command's standard output is its own: `record` writes its lines to
//! standard error, the progress line (rewritten with `\r`) only when that
//! is a terminal. SIGINT and SIGTERM sent to `record` are passed on to the
//! command, and the recording goes on until it ends (see [`on_signal`]).

use callstack::remote::perf::{
    record_rotating, Control, Evicted, RecordError, RecordOptions, Target,
};
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

/// Arguments of `callstack record`.
#[derive(clap::Args)]
pub struct Args {
    /// Samples per second of CPU time (per thread). Default 999; with
    /// `-a` 99, the rate of always-on whole-host profilers (each sample
    /// interrupts the program it hits: 999 Hz over a whole host costs a
    /// busy program some 2% of its time on a VM, 99 Hz under 1%).
    #[arg(short = 'F', long = "freq")]
    hz: Option<u32>,
    /// The profile to write.
    #[arg(short = 'o', long = "output", default_value = "callstack.data")]
    output: PathBuf,
    /// Record this running process (its threads now and later).
    #[arg(short = 'p', long = "pid", conflicts_with = "command")]
    pid: Option<u32>,
    /// Record every process of the host (running and started later; one
    /// event per CPU): root, CAP_PERFMON or perf_event_paranoid <= 0.
    /// Until `-d` or SIGINT/SIGTERM.
    #[arg(short = 'a', long = "all", conflicts_with_all = ["pid", "command", "preload"])]
    all: bool,
    /// With `-a`: only these processes (comma-separated pids). With
    /// `--off-cpu`, only their threads' context switches are sampled.
    #[arg(long, value_delimiter = ',', requires = "all")]
    pid_filter: Vec<u32>,
    /// With `-a`: only processes of these names (comma-separated, as in
    /// /proc/PID/comm: the program's name cut at 15 bytes).
    #[arg(long, value_delimiter = ',', requires = "all")]
    comm: Vec<String>,
    /// Stop after this many seconds.
    #[arg(short = 'd', long = "duration")]
    duration: Option<f64>,
    /// Bytes of user stack copied per sample, fixed (deeper frames are
    /// cut). Without it the copy starts at 8192 bytes (what sampling costs
    /// the program is mostly this copy) and doubles, up to 61440, whenever
    /// more than 3% of a window's samples (at least 50 and 0.1 s) were cut
    /// at its end; stderr says when it grew.
    #[arg(long = "stack-size")]
    stack_size: Option<u32>,
    /// Let the user stack copy shrink down to this many bytes (at least
    /// 1024; default 8192, the start: no shrink). After ten windows (about
    /// a second) with no sample cut, the copy shrinks to twice what the
    /// whole chains read, in 512-byte steps, never below this nor back to
    /// a size found too small; stderr says when. A smaller copy costs the
    /// program less, but a rare deep frame met after the shrink (the
    /// loader's lazy binding saves 1-3 KiB of vector registers) is cut
    /// until the copy grows again.
    #[arg(long = "stack-size-min", conflicts_with = "stack_size")]
    stack_size_min: Option<u32>,
    /// Do not print the progress line.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Sample the command from inside (LD_PRELOAD of the in-process
    /// profiler) instead of with perf events; what `record` falls back to
    /// when perf events are refused. Not for `-p`.
    #[arg(long, conflicts_with = "pid")]
    preload: bool,
    /// Write a gzip'd pprof profile every SECS seconds into the directory
    /// `-o` names (made if missing), each named by its start time
    /// (`YYYYMMDDTHHMMSS.mmmZ.pb.gz`, UTC) and holding that period's
    /// samples, with its mappings' build-ids and file offsets; memory stays
    /// flat however long the recording runs. For always-on profiling
    /// shipped to Pyroscope, Parca or any pprof store.
    #[arg(long, value_name = "SECS", conflicts_with = "preload")]
    rotate: Option<f64>,
    /// With `--rotate`: leave names to the server (the profiles hold
    /// addresses, mappings and build-ids only; no file is read to name
    /// them).
    #[arg(long, requires = "rotate")]
    no_symbolize: bool,
    /// Also record the time threads spend blocked (sleeping, waiting on
    /// I/O, a lock or a pipe; not time preempted), with the stack where
    /// they blocked, as the sample type `off_cpu` (nanoseconds) beside
    /// `cpu`: `callstack report FILE --sample-type off_cpu`. Samples every
    /// context switch: needs root or `perf_event_paranoid` <= 1. Python
    /// stacks are then read every millisecond whatever -F, so that each
    /// block takes the one read while it lasted.
    #[arg(long, conflicts_with = "preload")]
    off_cpu: bool,
    /// A bound on the memory of the per-module state the recorder keeps
    /// (compiled unwind tables, shared by build-id across processes; each
    /// process's module map; with --rotate, the symbolizer's open files),
    /// in MB (10^6 bytes). Over it, the least recently used modules are
    /// dropped (rebuilt if needed again; never those of the sample being
    /// unwound), and what was dropped is said on stderr at the end and in
    /// each --rotate profile's comments (`go tool pprof -comments`).
    #[arg(long, value_name = "MB", default_value_t = 512.0)]
    memory_budget: f64,
    /// Native frames only: do not read the Python frames of CPython
    /// processes (by default each sample's `_PyEval_EvalFrameDefault`
    /// frames are replaced by the Python functions they ran, read from the
    /// running process near the sample's time).
    #[arg(long)]
    no_python: bool,
    /// The command to run and record.
    #[arg(last = true, required_unless_present_any = ["pid", "all"])]
    command: Vec<OsString>,
}

/// The recording's control, reached from the signal handler.
static CONTROL: Control = Control::new();
/// Whether the target is a running process (`-p`): a signal ends the
/// recording instead of being passed on.
static PID_MODE: AtomicBool = AtomicBool::new(false);
/// The command run with `--preload` while it runs (0 otherwise): the
/// signal handler passes signals on to it directly.
static PRELOAD_CHILD: AtomicI32 = AtomicI32::new(0);
/// SIGINT/SIGTERM received so far.
static SIGNALS: AtomicU32 = AtomicU32::new(0);

/// SIGINT and SIGTERM: passed on to the command, as `perf record` does,
/// when another process sent them to `record` (`kill`); one from the
/// terminal (Ctrl-C) already reached the command, in the same process
/// group, and is not sent twice. The third one kills the command (one that
/// ignores them). With `-p`, the recording ends.
extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let n = SIGNALS.fetch_add(1, Ordering::Relaxed) + 1;
    if PID_MODE.load(Ordering::Relaxed) {
        CONTROL.stop();
        return;
    }
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    let pass = if n >= 3 {
        libc::SIGKILL
    } else if code == libc::SI_USER || code == libc::SI_QUEUE || code == libc::SI_TKILL {
        sig
    } else {
        return;
    };
    match PRELOAD_CHILD.load(Ordering::Relaxed) {
        0 => CONTROL.forward(pass),
        // SAFETY: kill is async-signal-safe; the pid is our child's,
        // cleared once it is reaped.
        pid => unsafe {
            libc::kill(pid, pass);
        },
    }
}

/// Installs [`on_signal`] for SIGINT and SIGTERM, but for one ignored
/// (`nohup`, a background job of a script): `record` ignores it too, and
/// the command inherits it ignored, as it would without `record`.
fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid; the handler only does
        // atomic operations (async-signal-safe).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old);
            if old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal
                as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                as libc::sighandler_t;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The exit code a shell gives for `status`: the program's exit code, or
/// 128 + the signal that ended it.
fn exit_code_of(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(sig)) => ExitCode::from((128 + sig) as u8),
        _ => ExitCode::FAILURE,
    }
}

/// A command that could not be started: the message, and the exit code a
/// shell gives (127 when not found, 126 when found but not executable).
fn cannot_start(prog: &str, e: &std::io::Error) -> ExitCode {
    eprintln!("callstack record: cannot start {prog}: {e}");
    ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

impl Args {
    /// What is recorded: `-p`, `-a` or the command.
    fn target(&self) -> Target {
        match self.pid {
            Some(p) => Target::Pid(p),
            None if self.all => Target::All,
            None => Target::Command(self.command.clone()),
        }
    }

    /// The sampling rate: `-F`, else the library's default for the
    /// target (999, or 99 for the whole host).
    fn hz(&self) -> u32 {
        self.hz
            .unwrap_or_else(|| RecordOptions::default_hz(&self.target()))
    }
}

/// Runs `callstack record`; its exit code is the command's (see
/// [`exit_code_of`]), 0 for `-p` or a command the recording ended.
pub fn run(args: Args) -> Result<ExitCode, String> {
    if args.preload {
        return run_preloaded(&args);
    }
    let mut opts = RecordOptions::new(args.target());
    if let Some(hz) = args.hz {
        opts.hz = hz;
    }
    if let Some(n) = args.stack_size {
        opts.stack_bytes = n;
        opts.stack_bytes_max = n;
        opts.stack_bytes_min = n;
    }
    if let Some(n) = args.stack_size_min {
        opts.stack_bytes_min = n;
    }
    opts.duration = args
        .duration
        .filter(|d| *d > 0.0)
        .map(std::time::Duration::from_secs_f64);
    opts.off_cpu = args.off_cpu;
    if !(args.memory_budget >= 0.0 && args.memory_budget.is_finite()) {
        return Err(format!(
            "--memory-budget {}: a number of MB, 0 or more",
            args.memory_budget
        ));
    }
    let budget = (args.memory_budget * 1e6) as usize;
    opts.memory_budget = Some(budget);
    opts.pid_filter = args.pid_filter.clone();
    opts.comm_filter = args.comm.clone();
    let python = (!args.no_python).then(|| {
        // Off the CPU, Python stacks are read every millisecond at least,
        // to have one read during most blocks.
        let hz = if args.off_cpu {
            opts.hz.max(1000)
        } else {
            opts.hz
        };
        std::sync::Arc::new(callstack::python::record::PythonRecorder::new(
            hz,
            opts.lookup.clone(),
            args.all,
        ))
    });
    if let Some(p) = &python {
        opts.sample_hook = Some(p.clone());
    }
    opts.rotate = args
        .rotate
        .filter(|d| *d > 0.0)
        .map(std::time::Duration::from_secs_f64);
    if let Some(r) = args.rotate {
        if r <= 0.0 || !r.is_finite() {
            return Err(format!(
                "--rotate {r}: the period must be a positive number of seconds"
            ));
        }
        std::fs::create_dir_all(&args.output)
            .map_err(|e| format!("{}: {e}", args.output.display()))?;
    }
    PID_MODE.store(args.pid.is_some() || args.all, Ordering::Relaxed);
    catch_signals();
    // The progress line rewrites itself with `\r`: only on a terminal.
    let live = !args.quiet && std::io::stderr().is_terminal();
    let mut shown = false;
    let mut rotated = Rotated {
        budget,
        ..Rotated::default()
    };
    // The recorder's own state, at its last budget check: the symbolizer
    // of --rotate gets what is left of the budget.
    let state_bytes = std::sync::atomic::AtomicUsize::new(0);
    let mut record = || {
        record_rotating(
            &opts,
            &CONTROL,
            &mut |p| {
                state_bytes.store(p.state_bytes, Ordering::Relaxed);
                if live {
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
            },
            &mut |period| rotated.write(&args, period, state_bytes.load(Ordering::Relaxed)),
        )
    };
    // A whole-host recording samples the recorder too, and its chains
    // reach their start only when the frames from there to the unwinder
    // fit the 8 KiB of stack each sample copies: `main`'s own frame and
    // the command line's parse left no room, so the loop runs on a thread
    // of its own (as large a stack as the main thread's).
    let recorded = if args.all {
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("callstack".into())
                .stack_size(8 << 20)
                .spawn_scoped(s, record)
                .map_err(|e| format!("cannot start the recording's thread: {e}"))?
                .join()
                .map_err(|_| "the recording's thread panicked".to_string())
        })?
    } else {
        record()
    };
    if shown {
        eprintln!();
    }
    if let Some(p) = &python {
        p.stop();
        if !args.quiet {
            for w in p.warnings() {
                eprintln!("callstack record: warning: {w}");
            }
            let (reads, failed) = p.reads();
            if reads > 0 {
                eprintln!(
                    "callstack record: Python stacks read {reads} times ({failed} reads failed: frames changing meanwhile, a process ending; {} more not needed: the process had not run since its last read)",
                    p.skipped()
                );
            }
        }
    }
    let recorded = match recorded {
        Ok(r) => r,
        Err(RecordError::PerfRefused(e)) if args.off_cpu => {
            return Err(format!(
                "perf events refused ({e}): --off-cpu samples every context switch in the kernel, which needs root or perf_event_paranoid <= 1"
            ));
        }
        Err(RecordError::PerfRefused(e)) if args.all => {
            return Err(format!(
                "perf events refused ({e}): -a samples every process of the host, which needs root, CAP_PERFMON or perf_event_paranoid <= 0"
            ));
        }
        Err(RecordError::PerfRefused(e)) if args.pid.is_none() => {
            eprintln!(
                "callstack record: perf events refused ({e}): sampling the command from inside (LD_PRELOAD)"
            );
            return run_preloaded(&args);
        }
        Err(RecordError::Spawn(prog, e)) => return Ok(cannot_start(&prog, &e)),
        Err(e) => return Err(e.to_string()),
    };
    if !args.quiet {
        for g in &recorded.stack_growth {
            if g.to < g.from {
                eprintln!(
                    "callstack record: user stack copy shrank from {} to {} bytes at {:.1} s (whole chains read at most {} bytes of it)",
                    g.from,
                    g.to,
                    g.at.as_secs_f64(),
                    g.used
                );
                continue;
            }
            eprintln!(
                "callstack record: user stack copy grew from {} to {} bytes at {:.1} s ({:.0}% of samples were cut at its end)",
                g.from,
                g.to,
                g.at.as_secs_f64(),
                g.cut_percent
            );
        }
        let mut all = recorded.evicted.clone();
        all.extend(rotated.evicted.iter().cloned());
        if let Some(line) = eviction_line(&all) {
            eprintln!("{line}");
        }
    }
    if opts.rotate.is_some() {
        if let Some(e) = &rotated.error {
            return Err(e.clone());
        }
        if !args.quiet {
            eprintln!(
                "callstack record: {} samples ({} lost) in {} profiles in {}",
                rotated.samples,
                rotated.lost,
                rotated.files,
                args.output.display()
            );
        }
        return Ok(recorded.status.map_or(ExitCode::SUCCESS, exit_code_of));
    }
    let profile = &recorded.profile;
    write_profile(profile, &args.output)?;
    if !args.quiet {
        eprintln!(
            "callstack record: {} samples ({} lost); wrote {} ({} stacks); see `callstack report {}`",
            profile.stacks.iter().map(|s| s.values[0]).sum::<i64>(),
            profile.lost,
            args.output.display(),
            profile.stacks.len(),
            args.output.display()
        );
    }
    Ok(recorded.status.map_or(ExitCode::SUCCESS, exit_code_of))
}

/// The line that says what was dropped to stay under the memory budget
/// (`None` when nothing was): how many drops, the bytes, and the modules
/// (each once, the most often dropped first; the first ten).
fn eviction_line(evicted: &[Evicted]) -> Option<String> {
    if evicted.is_empty() {
        return None;
    }
    let bytes: usize = evicted.iter().map(|e| e.bytes).sum();
    let mut by: Vec<(&str, usize)> = Vec::new();
    for e in evicted {
        match by.iter_mut().find(|b| b.0 == e.what) {
            Some(b) => b.1 += 1,
            None => by.push((&e.what, 1)),
        }
    }
    by.sort_by_key(|b| std::cmp::Reverse(b.1));
    let mut names: Vec<String> = by
        .iter()
        .take(10)
        .map(|(w, n)| {
            if *n > 1 {
                format!("{w} ({n}x)")
            } else {
                w.to_string()
            }
        })
        .collect();
    if by.len() > 10 {
        names.push(format!("and {} more", by.len() - 10));
    }
    Some(format!(
        "callstack record: evicted {} modules ({:.1} MB) to stay under the budget: {}",
        evicted.len(),
        bytes as f64 / 1e6,
        names.join(", ")
    ))
}

/// The profiles written by `--rotate` so far.
#[derive(Default)]
struct Rotated {
    /// `--memory-budget` in bytes.
    budget: usize,
    /// The symbolizer's files closed to stay under it.
    evicted: Vec<Evicted>,
    files: usize,
    samples: i64,
    lost: u64,
    /// The first write that failed (the recording goes on).
    error: Option<String>,
    /// The last period's modules and their symbolizer, kept across
    /// periods (files not read again every period: a file is opened once
    /// whatever the processes that map it, and stays open while mapped).
    symbolizer: Option<(
        Vec<callstack::tracefile::ModuleRecord>,
        callstack::Symbolizer,
    )>,
}

impl Rotated {
    /// Writes one period's profile as `DIR/START.pb.gz` (through a
    /// temporary name: a reader never sees a partial file).
    fn write(&mut self, args: &Args, mut p: callstack::profile::Profile, state_bytes: usize) {
        use callstack::profile::{pprof, Names};
        let names = if args.no_symbolize {
            // Python and JIT frames are named by the recording alone: no
            // server could name them from files.
            Names::own(&p)
        } else {
            match &mut self.symbolizer {
                // Other modules (processes came and went): the files still
                // mapped stay open, shared by build-id across processes.
                Some((m, sym)) if *m != p.modules => {
                    sym.set_modules(Names::module_infos(&p, None));
                    *m = p.modules.clone();
                }
                Some(_) => {}
                None => {
                    self.symbolizer = Some((p.modules.clone(), Names::symbolizer(&p, None, &[])))
                }
            }
            let (_, sym) = self.symbolizer.as_mut().expect("just set");
            let names = Names::symbolize_with(&p, sym);
            // What the recorder's own state leaves of the budget.
            let closed: Vec<Evicted> = sym
                .evict_to(self.budget.saturating_sub(state_bytes))
                .into_iter()
                .map(|m| Evicted {
                    what: m.path.display().to_string(),
                    bytes: m.bytes,
                })
                .collect();
            p.comments
                .extend(callstack::remote::perf::eviction_comments(&closed));
            self.evicted.extend(closed);
            names
        };
        let name = format!("{}.pb.gz", utc_name(p.start_time_ns));
        let path = args.output.join(&name);
        let tmp = args.output.join(format!(".{name}.tmp"));
        let written = std::fs::File::create(&tmp).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            pprof::write_gzip(&p, &names, &mut w)?;
            w.flush()?;
            std::fs::rename(&tmp, &path)
        });
        match written {
            Ok(()) => {
                self.files += 1;
                self.samples += p.stacks.iter().map(|s| s.values[0]).sum::<i64>();
                self.lost += p.lost;
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                let msg = format!("{}: {e}", path.display());
                eprintln!("callstack record: {msg}");
                self.error.get_or_insert(msg);
            }
        }
    }
}

/// `YYYYMMDDTHHMMSS.mmmZ` of a time in nanoseconds since the Unix epoch.
fn utc_name(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let ms = ns / 1_000_000 % 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{ms:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Writes `profile` to `path`; on failure no partial file is left.
fn write_profile(profile: &callstack::profile::Profile, path: &Path) -> Result<(), String> {
    let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    let written = profile
        .write_trace(&mut w)
        .map_err(|e| e.to_string())
        .and_then(|_| w.flush().map_err(|e| e.to_string()));
    if let Err(e) = written {
        let _ = std::fs::remove_file(path);
        return Err(format!("{}: {e}", path.display()));
    }
    Ok(())
}

/// Runs the command with the in-process sampler preloaded (see the module
/// docs); the program writes the profile at its exit. Exits with the
/// program's status.
fn run_preloaded(args: &Args) -> Result<ExitCode, String> {
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
        eprintln!("callstack record: sampling in process at {} Hz", args.hz());
    }
    let child = std::process::Command::new(prog)
        .args(rest)
        .env("LD_PRELOAD", &preload)
        .env("CALLSTACK_RECORD_OUT", &args.output)
        .env("CALLSTACK_RECORD_HZ", args.hz().to_string())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return Ok(cannot_start(&prog.to_string_lossy(), &e)),
    };
    PRELOAD_CHILD.store(child.id() as i32, Ordering::Relaxed);
    catch_signals();
    let status = child.wait();
    PRELOAD_CHILD.store(0, Ordering::Relaxed);
    let status = status.map_err(|e| format!("waiting for {}: {e}", prog.to_string_lossy()))?;
    let code = exit_code_of(status);
    let written = std::fs::metadata(&args.output).is_ok_and(|m| m.len() > 0);
    if !written {
        // An empty file is no profile.
        let _ = std::fs::remove_file(&args.output);
        eprintln!(
            "callstack record: {} wrote no profile ({status})",
            prog.to_string_lossy()
        );
        return Ok(if status.success() {
            ExitCode::FAILURE
        } else {
            code
        });
    }
    if !args.quiet {
        eprintln!(
            "callstack record: wrote {}; see `callstack report {}`",
            args.output.display(),
            args.output.display()
        );
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_names() {
        assert_eq!(super::utc_name(0), "19700101T000000.000Z");
        // 2026-11-27 11:07:00.123 UTC
        assert_eq!(
            super::utc_name(1_795_777_620_123_000_000),
            "20261127T110700.123Z"
        );
        // 2024-02-29 23:59:59.999 UTC (a leap day)
        assert_eq!(
            super::utc_name(1_709_251_199_999_000_000),
            "20240229T235959.999Z"
        );
    }
}
