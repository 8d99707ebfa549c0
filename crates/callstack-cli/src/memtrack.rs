//! `callstack memtrack [-o FILE] [--summary FILE] [--sample-bytes N] -- COMMAND ARGS...`:
//! run a program with `libcallstack_preload.so` preloaded, recording every
//! allocation by call stack (or with `--sample-bytes N`, about one per N
//! bytes, weighed into unbiased estimates: `callstack::alloc::sample`), then print a summary: top sites by live bytes
//! and by allocations, the leaks (blocks still live at exit), and every
//! process recorded.
//!
//! A wrapper as `time` is (see [`crate::child`]): the program's standard
//! streams, signals and exit status are its own; our summary goes to
//! standard error (or `--summary FILE`).
//!
//! The library is `$CALLSTACK_PRELOAD_LIB`, else `libcallstack_preload.so`
//! next to this binary. Each process that loads it keeps its tables in a
//! shared file mapping, `DIR/PID.tables`, in a directory made for the run
//! (under `/dev/shm` when there is one, else next to FILE) and removed at
//! the end (layout: `callstack::alloc::shared`). A process that exits
//! writes its recording itself to `FILE.PID`; one that ends otherwise
//! (`_exit`, abort, a fatal signal, SIGKILL) leaves its tables, which we
//! turn into `FILE.PID` once its lock is free. The program started here
//! gets FILE. `callstack report FILE` reads a recording as a heap profile
//! (`--pprof`, `--svg` by bytes, `--folded`; sample types alloc_objects,
//! alloc_space, inuse_objects, inuse_space: in use at exit = leaked).

use crate::child::{self, Ended};
use callstack::alloc::shared::{self, ProcessTables};
use callstack::alloc::HeapSnapshot;
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `callstack memtrack`.
#[derive(clap::Args)]
pub struct Args {
    /// Where the recording of the program goes (other processes it starts:
    /// FILE.PID).
    #[arg(
        short = 'o',
        long = "output",
        default_value = "callstack-memtrack.heap"
    )]
    output: PathBuf,
    /// Write the summary to this file instead of standard error.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// How stacks are captured: `exact` (DWARF CFI, right for code without
    /// frame pointers) or `fast` (frame pointers).
    #[arg(long, default_value = "exact", value_parser = ["exact", "fast"])]
    capture: String,
    /// Sites listed in each part of the summary.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Record about one allocation per N bytes allocated instead of every
    /// one (Poisson sampling by bytes, as tcmalloc and Go do; 524288 is
    /// their default): every count and byte figure is then an unbiased
    /// estimate, and an allocation not sampled costs a counter update
    /// instead of a stack capture. 0 records every allocation.
    #[arg(long, value_name = "N", default_value_t = 0)]
    sample_bytes: u64,
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

/// The summary of a recording: totals, top sites, leaks.
pub fn summary_text(path: &Path, top: usize) -> Result<String, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let snap = HeapSnapshot::read_from(std::io::BufReader::new(f))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut sym = snap.symbolizer();
    let mut o = snap.report(&mut sym, top);
    o.push('\n');
    o.push_str(&snap.leak_report(&mut sym, top));
    o.push_str(&format!(
        "\nheap profile (pprof, flamegraph): callstack report {} --pprof OUT.pb.gz --svg OUT.svg\n",
        path.display()
    ));
    Ok(o)
}

/// The program file `cmd` names: a path, or found in `$PATH`.
fn resolve(cmd: &OsStr) -> Option<PathBuf> {
    if cmd.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

/// Why the tracker cannot enter `exe`, if it cannot: a statically linked
/// program has no dynamic loader to honour `LD_PRELOAD`; the loader
/// ignores it for a set-user-ID or set-group-ID program run by another
/// user (secure-execution mode).
fn untrackable(exe: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(exe).ok()?;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    if meta.mode() & libc::S_ISUID != 0 && meta.uid() != uid {
        return Some(format!(
            "{} is set-user-ID (owner uid {}): the dynamic loader ignores LD_PRELOAD for it (secure-execution mode), so it cannot be tracked; it runs untracked",
            exe.display(),
            meta.uid()
        ));
    }
    if meta.mode() & libc::S_ISGID != 0 && meta.gid() != gid {
        return Some(format!(
            "{} is set-group-ID (group {}): the dynamic loader ignores LD_PRELOAD for it (secure-execution mode), so it cannot be tracked; it runs untracked",
            exe.display(),
            meta.gid()
        ));
    }
    let mut head = vec![0u8; 4096];
    let n = {
        use std::io::Read;
        let mut f = std::fs::File::open(exe).ok()?;
        f.read(&mut head).ok()?
    };
    head.truncate(n);
    if elf_without_interpreter(exe, &head)? {
        return Some(format!(
            "{} is statically linked (no dynamic loader): LD_PRELOAD cannot load the tracker into it, so it cannot be tracked; it runs untracked",
            exe.display()
        ));
    }
    None
}

/// `Some(true)` for an ELF executable without `PT_INTERP` (static, or
/// static-pie), `Some(false)` for one with it; `None` if not an ELF file
/// (a script: its interpreter is what runs) or unreadable.
fn elf_without_interpreter(exe: &Path, head: &[u8]) -> Option<bool> {
    if head.len() < 64 || &head[..4] != b"\x7fELF" {
        return None;
    }
    let is64 = head[4] == 2;
    let le = head[5] == 1;
    let u16_at = |b: &[u8], o: usize| -> usize {
        let v = [b[o], b[o + 1]];
        (if le {
            u16::from_le_bytes(v)
        } else {
            u16::from_be_bytes(v)
        }) as usize
    };
    let u32_at = |b: &[u8], o: usize| -> u64 {
        let v = [b[o], b[o + 1], b[o + 2], b[o + 3]];
        (if le {
            u32::from_le_bytes(v)
        } else {
            u32::from_be_bytes(v)
        }) as u64
    };
    let u64_at = |b: &[u8], o: usize| -> u64 {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[o..o + 8]);
        if le {
            u64::from_le_bytes(v)
        } else {
            u64::from_be_bytes(v)
        }
    };
    let e_type = u16_at(head, 16);
    let (phoff, phentsize, phnum) = if is64 {
        (u64_at(head, 32), u16_at(head, 54), u16_at(head, 56))
    } else {
        (u32_at(head, 28), u16_at(head, 42), u16_at(head, 44))
    };
    let end = phoff as usize + phentsize * phnum;
    let table = if end <= head.len() {
        head.to_vec()
    } else if end < 1 << 20 {
        let data = std::fs::read(exe).ok()?;
        if end > data.len() {
            return None;
        }
        data
    } else {
        return None;
    };
    let mut dynamic = false;
    for i in 0..phnum {
        let p_type = u32_at(&table, phoff as usize + i * phentsize);
        if p_type == 3 {
            return Some(false); // PT_INTERP
        }
        dynamic |= p_type == 2;
    }
    // A shared object without an interpreter that is no static-pie (the
    // dynamic loader itself run as a program) loads LD_PRELOAD.
    if e_type == 3 && dynamic {
        let name = exe.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| n.starts_with("ld-") || n.starts_with("ld.so")) {
            return Some(false);
        }
    }
    Some(true)
}

/// Free bytes of the file system holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let mut c = dir.as_os_str().as_bytes().to_vec();
    c.push(0);
    // SAFETY: statvfs with a NUL-terminated path and a zeroed struct.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr().cast(), &mut st) != 0 {
            return 0;
        }
        st.f_bavail as u64 * st.f_frsize as u64
    }
}

/// The run's directory of tables files: under `/dev/shm` (memory, like the
/// anonymous tables it replaces) when it has room for a few processes'
/// tables (a write to a shared file mapping on a full file system is a
/// SIGBUS in the program: a container's 64 MiB `/dev/shm` is too small),
/// else next to `out`.
fn make_dir(out: &Path) -> Result<PathBuf, String> {
    let mut bases = Vec::new();
    let shm = PathBuf::from("/dev/shm");
    if free_bytes(&shm) >= 1 << 30 {
        bases.push(shm);
    }
    bases.push(out.parent().unwrap_or(Path::new(".")).to_path_buf());
    let mut last = String::new();
    for base in bases {
        if !base.is_dir() {
            continue;
        }
        let mut tmpl = base
            .join("callstack-memtrack.XXXXXX")
            .into_os_string()
            .into_vec();
        tmpl.push(0);
        // SAFETY: mkdtemp fills the NUL-terminated template in place.
        let r = unsafe { libc::mkdtemp(tmpl.as_mut_ptr().cast()) };
        if r.is_null() {
            last = format!("{}: {}", base.display(), std::io::Error::last_os_error());
            continue;
        }
        tmpl.pop();
        let dir = PathBuf::from(OsString::from_vec(tmpl));
        // mkdtemp makes it 0700: a process of the run that changes user
        // (su, sudo) cannot reach it and keeps its tables in memory (it
        // writes FILE.PID only if it exits).
        std::fs::write(dir.join("global"), [0u8; 4096])
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        return Ok(dir);
    }
    Err(format!("cannot make a directory for the tables: {last}"))
}

use std::os::unix::ffi::OsStringExt;

/// Whether a live process holds the lock of a tables file.
fn locked(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: a zeroed flock asking about a write lock on the whole file.
    unsafe {
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) == 0
            && fl.l_type != libc::F_UNLCK as libc::c_short
    }
}

/// One process of the run.
struct Proc {
    tables: ProcessTables,
    /// Its recording (None: it still runs).
    file: Option<PathBuf>,
}

fn with_pid(out: &Path, pid: u32) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(format!(".{pid}"));
    PathBuf::from(p)
}

/// Writes `snap` to `path` through a temporary name (no partial file).
fn write_recording(snap: &HeapSnapshot, path: &Path) -> Result<(), String> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let f = std::fs::File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut w = std::io::BufWriter::new(f);
    snap.write_to(&mut w)
        .and_then(|_| w.flush())
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads every tables file of the run, writes the recordings of the
/// processes that did not write theirs, and removes the directory.
fn collect(dir: &Path, out: &Path, main_pid: u32) -> Vec<Proc> {
    let mut procs = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return procs;
    };
    for e in rd.flatten() {
        let path = e.path();
        if path.extension() != Some(OsStr::new("tables")) {
            continue;
        }
        let running = locked(&path);
        let tables = match shared::read_tables(&path) {
            Ok(t) => t,
            Err(_) => continue, // died before it was set up: nothing recorded
        };
        let file = if running {
            None
        } else {
            let own = with_pid(out, tables.pid);
            let readable = tables.written
                && std::fs::File::open(&own)
                    .ok()
                    .is_some_and(|f| HeapSnapshot::read_from(std::io::BufReader::new(f)).is_ok());
            if !readable {
                if let Err(e) = write_recording(&tables.snapshot, &own) {
                    eprintln!("callstack memtrack: {e}");
                    continue;
                }
            }
            Some(own)
        };
        procs.push(Proc { tables, file });
    }
    // The program we started gets FILE.
    for p in &mut procs {
        if p.tables.pid == main_pid {
            if let Some(f) = &p.file {
                if std::fs::rename(f, out).is_ok() {
                    p.file = Some(out.to_path_buf());
                }
            }
        }
    }
    procs.sort_by_key(|p| (p.tables.pid != main_pid, p.tables.pid));
    procs
}

fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

fn short(cmd: &str, max: usize) -> String {
    if cmd.chars().count() <= max {
        cmd.to_string()
    } else {
        let s: String = cmd.chars().take(max).collect();
        format!("{s}...")
    }
}

/// The list of processes and the overall peak.
fn processes_text(procs: &[Proc], out: &Path, overall_peak: u64) -> String {
    let mut o = format!("processes recorded: {}\n", procs.len());
    for p in procs {
        let t = &p.tables;
        let (allocs, bytes, _, _) = t.snapshot.totals();
        let leaked: u64 = t.snapshot.sites.iter().map(|s| s.live_bytes()).sum();
        let cmd = if t.command.is_empty() {
            "?".to_string()
        } else {
            short(&t.command, 60)
        };
        o.push_str(&format!(
            "  {} {cmd}: {allocs} allocations, {bytes} bytes, peak {} bytes, leaked {leaked} bytes -> {}\n",
            t.pid,
            t.peak,
            match &p.file {
                Some(f) => f.display().to_string(),
                None => format!(
                    "(still running: it writes {} if it exits)",
                    with_pid(out, t.pid).display()
                ),
            }
        ));
    }
    o.push_str(&format!(
        "overall peak heap: {overall_peak} bytes (the highest sum of the live heap bytes of the processes at one time; a process that died without exiting stays in the sum to the end)\n"
    ));
    o
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
    let reason = resolve(&args.command[0]).and_then(|exe| untrackable(&exe));
    if let Some(r) = &reason {
        eprintln!("callstack memtrack: {r}");
    }
    let dir = make_dir(&out)?;
    let mut preload = lib.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD") {
        if !old.is_empty() {
            preload.push(":");
            preload.push(old);
        }
    }
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env("CALLSTACK_MEMTRACK_OUT", &out)
        .env("CALLSTACK_MEMTRACK_DIR", &dir)
        .env("CALLSTACK_MEMTRACK_CAPTURE", &args.capture)
        .env(
            "CALLSTACK_MEMTRACK_SAMPLE_BYTES",
            args.sample_bytes.to_string(),
        );
    let (pid, ended) = match child::run(cmd, &args.command[0]) {
        Ok(r) => r,
        Err(e) => {
            remove_dir(&dir);
            eprintln!("callstack memtrack: {}", e.message);
            return Ok(ExitCode::from(e.exit_code));
        }
    };
    let overall_peak = std::fs::read(dir.join("global"))
        .ok()
        .filter(|g| g.len() >= 16)
        .map(|g| u64::from_ne_bytes(g[8..16].try_into().unwrap()))
        .unwrap_or(0);
    let procs = collect(&dir, &out, pid);
    remove_dir(&dir);
    if let Err(e) = report(
        &args,
        &out,
        pid,
        &procs,
        overall_peak,
        ended,
        reason.is_some(),
    ) {
        eprintln!("callstack memtrack: {e}");
    }
    Ok(ended.exit_code())
}

/// Writes the summary (to stderr or `--summary FILE`).
fn report(
    args: &Args,
    out: &Path,
    pid: u32,
    procs: &[Proc],
    overall_peak: u64,
    ended: Ended,
    told_why: bool,
) -> Result<(), String> {
    let main = procs.iter().find(|p| p.tables.pid == pid);
    let mut text = String::new();
    match main.and_then(|p| p.file.as_ref()) {
        Some(f) => {
            text.push_str(&format!(
                "callstack memtrack: {} ended with {ended}; recording: {}\n",
                Path::new(&args.command[0]).display(),
                f.display()
            ));
            text.push_str(&summary_text(f, args.top)?);
        }
        None if procs.is_empty() => {
            if !told_why {
                eprintln!(
                    "callstack memtrack: no process loaded the tracker (LD_PRELOAD): nothing was recorded ({} ended with {ended})",
                    Path::new(&args.command[0]).display()
                );
            }
            return Ok(());
        }
        None => {
            text.push_str(&format!(
                "callstack memtrack: {} ended with {ended}; it was not recorded (see the processes below)\n",
                Path::new(&args.command[0]).display()
            ));
        }
    }
    text.push('\n');
    text.push_str(&processes_text(procs, out, overall_peak));
    match &args.summary {
        Some(path) => std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display())),
        None => {
            let mut e = std::io::stderr().lock();
            e.write_all(text.as_bytes())
                .and_then(|_| e.flush())
                .map_err(|e| format!("standard error: {e}"))
        }
    }
}
