//! `callstack memtrack [-o FILE] -- COMMAND ARGS...`: run a program with
//! `libcallstack_preload.so` preloaded, recording every allocation by call
//! stack, then print a summary: top sites by live bytes and by
//! allocations, and the leaks (blocks still live at exit).
//!
//! The library is `$CALLSTACK_PRELOAD_LIB`, else `libcallstack_preload.so`
//! next to this binary. The recording (see `callstack::alloc`) is written
//! by the program at exit to FILE; processes it forks or execs write
//! `FILE.PID`. `callstack report FILE` reads it as a heap profile
//! (`--pprof`, `--svg` by bytes, `--folded`; sample types alloc_objects,
//! alloc_space, inuse_objects, inuse_space: in use at exit = leaked).

use callstack::alloc::HeapSnapshot;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `callstack memtrack`.
#[derive(clap::Args)]
pub struct Args {
    /// Where the program writes its recording.
    #[arg(
        short = 'o',
        long = "output",
        default_value = "callstack-memtrack.heap"
    )]
    output: PathBuf,
    /// How stacks are captured: `exact` (DWARF CFI, right for code without
    /// frame pointers) or `fast` (frame pointers).
    #[arg(long, default_value = "exact", value_parser = ["exact", "fast"])]
    capture: String,
    /// Sites listed in each part of the summary.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// The program and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

/// The preload library: `$CALLSTACK_PRELOAD_LIB`, else next to this binary.
pub(crate) fn preload_lib() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("CALLSTACK_PRELOAD_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let lib = exe.with_file_name("libcallstack_preload.so");
    if lib.exists() {
        Ok(lib)
    } else {
        Err(format!(
            "{} not found (build it with `cargo build --release -p callstack-preload`, or set CALLSTACK_PRELOAD_LIB)",
            lib.display()
        ))
    }
}

/// Reads and prints a recording: totals, top sites, leaks.
pub fn print_summary(path: &std::path::Path, top: usize) -> Result<(), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let snap = HeapSnapshot::read_from(std::io::BufReader::new(f))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut sym = snap.symbolizer();
    print!("{}", snap.report(&mut sym, top));
    println!();
    print!("{}", snap.leak_report(&mut sym, top));
    println!(
        "\nheap profile (pprof, flamegraph): callstack report {} --pprof OUT.pb.gz --svg OUT.svg",
        path.display()
    );
    Ok(())
}

pub fn run(args: Args) -> Result<ExitCode, String> {
    let lib = preload_lib()?;
    let lib = lib
        .canonicalize()
        .map_err(|e| format!("{}: {e}", lib.display()))?;
    // The program's working directory is ours: an absolute path survives
    // a `chdir` in the program.
    let out =
        std::path::absolute(&args.output).map_err(|e| format!("{}: {e}", args.output.display()))?;
    match std::fs::remove_file(&out) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", out.display())),
    }
    let mut preload = lib.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD") {
        if !old.is_empty() {
            preload.push(":");
            preload.push(old);
        }
    }
    let mut child = std::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env("CALLSTACK_MEMTRACK_OUT", &out)
        .env("CALLSTACK_MEMTRACK_CAPTURE", &args.capture)
        .spawn()
        .map_err(|e| format!("{}: {e}", PathBuf::from(&args.command[0]).display()))?;
    let pid = child.id();
    let status = child.wait().map_err(|e| format!("wait: {e}"))?;
    // The program claims FILE at start and fills it at exit. A program that
    // exec'd another (a wrapper script's `exec`) left FILE empty and the
    // new image wrote FILE.PID under the same pid.
    let empty = std::fs::metadata(&out)
        .map(|m| m.len() == 0)
        .unwrap_or(true);
    let mut out = out;
    if empty {
        let mut same_pid = out.clone().into_os_string();
        same_pid.push(format!(".{pid}"));
        let same_pid = PathBuf::from(same_pid);
        if same_pid.exists() {
            out = same_pid;
        } else {
            return Err(format!(
                "{} wrote no recording to {} ({status}): it must end through exit() or a return from main, not _exit() or a signal",
                PathBuf::from(&args.command[0]).display(),
                out.display()
            ));
        }
    }
    println!("recording: {}", out.display());
    print_summary(&out, args.top)?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(c.clamp(1, 255) as u8),
        None => ExitCode::FAILURE,
    })
}
