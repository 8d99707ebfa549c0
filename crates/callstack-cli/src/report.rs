//! `callstack report FILE`: a profile (from `callstack record`, the
//! in-process profiler, any callstack trace file, or a heap recording of
//! `callstack memtrack`) symbolized, as a top-N
//! table of functions and in the formats of the field: folded stacks,
//! flamegraph SVG (inferno) and gzip'd pprof.

use callstack::profile::{self, Names, Profile};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `callstack report`.
#[derive(clap::Args)]
pub struct Args {
    /// The profile (a callstack trace file; `-` for standard input).
    file: PathBuf,
    /// How many functions the table shows (0: no table).
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Write a flamegraph SVG here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Write a gzip'd pprof profile here (for `go tool pprof`, Pyroscope,
    /// Parca).
    #[arg(long)]
    pprof: Option<PathBuf>,
    /// Write folded stacks here (`-`: standard output).
    #[arg(long)]
    folded: Option<PathBuf>,
    /// The sample type the table, folded stacks and SVG count (`samples`,
    /// `cpu`, `inuse_space`, ...; default: the profile's default).
    #[arg(long = "sample-type")]
    sample_type: Option<String>,
    /// Keep threads apart: the thread name (or id) as the root frame of the
    /// folded stacks and the SVG.
    #[arg(long = "per-thread")]
    per_thread: bool,
    /// Do not read the modules' files: name addresses `module+0xoffset`.
    #[arg(long = "no-symbolize")]
    no_symbolize: bool,
    /// Look for module files under this root first.
    #[arg(long)]
    sysroot: Option<PathBuf>,
    /// Extra directory searched for debug info and modules by build-id;
    /// repeatable.
    #[arg(long = "debug-dir")]
    debug_dirs: Vec<PathBuf>,
}

/// Reads a profile from a file, or from standard input for `-`: a
/// callstack trace file, or a heap recording of `callstack memtrack`
/// (turned into a heap profile: alloc and in-use objects and bytes).
pub fn read_profile(path: &std::path::Path) -> Result<Profile, String> {
    use std::io::BufRead;
    let src: Box<dyn std::io::Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?)
    };
    let mut r = std::io::BufReader::new(src);
    let head = r
        .fill_buf()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if head.starts_with(&callstack::alloc::HEAP_MAGIC) {
        let snap = callstack::alloc::HeapSnapshot::read_from(r)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(snap.to_profile());
    }
    Profile::read_trace(r).map_err(|e| format!("{}: {e}", path.display()))
}

fn create(path: &std::path::Path) -> Result<std::io::BufWriter<std::fs::File>, String> {
    std::fs::File::create(path)
        .map(std::io::BufWriter::new)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A value with its unit, short.
fn human(v: i64, unit: &str) -> String {
    match unit {
        "nanoseconds" => format!("{:.2}s", v as f64 / 1e9),
        "bytes" => {
            let f = v as f64;
            if f.abs() >= 1024.0 * 1024.0 * 1024.0 {
                format!("{:.1}GiB", f / (1024.0 * 1024.0 * 1024.0))
            } else if f.abs() >= 1024.0 * 1024.0 {
                format!("{:.1}MiB", f / (1024.0 * 1024.0))
            } else if f.abs() >= 1024.0 {
                format!("{:.1}KiB", f / 1024.0)
            } else {
                format!("{v}B")
            }
        }
        _ => v.to_string(),
    }
}

pub fn run(args: Args) -> Result<(), String> {
    let mut p = read_profile(&args.file)?;
    let st = match &args.sample_type {
        Some(name) => p.sample_type_index(name).ok_or_else(|| {
            let known: Vec<&str> = p.sample_types.iter().map(|t| t.name.as_str()).collect();
            format!(
                "{}: no sample type {name:?} (the profile has: {})",
                args.file.display(),
                known.join(", ")
            )
        })?,
        None => p.default_sample_type.min(p.sample_types.len() - 1),
    };
    let unit = p.sample_types[st].unit.clone();
    let names = if args.no_symbolize {
        Names::unresolved(&p)
    } else {
        Names::symbolize(&p, args.sysroot.as_deref(), &args.debug_dirs)
    };
    let io = |e: std::io::Error| e.to_string();

    if let Some(path) = &args.pprof {
        let mut w = create(path)?;
        profile::pprof::write_gzip(&p, &names, &mut w).map_err(io)?;
        w.flush().map_err(|e| format!("{}: {e}", path.display()))?;
    }

    // Folded lines, per thread when asked (the pprof file keeps threads as
    // labels either way).
    let folded = if args.per_thread {
        let mut lines = std::collections::BTreeMap::new();
        for s in &p.stacks {
            let v = s.values.get(st).copied().unwrap_or(0);
            if v == 0 {
                continue;
            }
            let root = match s.thread {
                Some(t) => match p.threads.get(&t) {
                    Some(n) => format!("{n} ({t})"),
                    None => format!("thread {t}"),
                },
                None => "all threads".to_string(),
            };
            let mut line = root.replace(';', ":");
            for n in names.stack_names(s) {
                line.push(';');
                line.push_str(&n.replace(';', ":"));
            }
            *lines.entry(line).or_insert(0i64) += v;
        }
        lines
    } else {
        p.merge_threads();
        profile::folded(&p, &names, st)
    };

    if let Some(path) = &args.folded {
        let mut text = String::new();
        for (l, v) in &folded {
            text.push_str(&format!("{l} {v}\n"));
        }
        if path.as_os_str() == "-" {
            std::io::stdout().write_all(text.as_bytes()).map_err(io)?;
        } else {
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }

    if let Some(path) = &args.svg {
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = format!(
            "{} ({})",
            args.file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            p.sample_types[st].name
        );
        opts.count_name = unit.clone();
        // Negative values (a heap profile's frees) have no width.
        let lines: Vec<String> = folded
            .iter()
            .filter(|(_, &v)| v > 0)
            .map(|(l, v)| format!("{l} {v}"))
            .collect();
        let w = create(path)?;
        if lines.is_empty() {
            return Err(format!(
                "{}: no samples of type {} to draw",
                args.file.display(),
                p.sample_types[st].name
            ));
        }
        inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), w)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }

    if args.top > 0 {
        let total = p.total(st);
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        let t = &p.sample_types[st];
        write!(
            out,
            "{}: {} stacks, {} {}/{} total",
            args.file.display(),
            p.stacks.len(),
            human(total, &t.unit),
            t.name,
            t.unit
        )
        .map_err(io)?;
        if p.duration_ns > 0 {
            write!(out, ", {:.2}s", p.duration_ns as f64 / 1e9).map_err(io)?;
        }
        writeln!(out, ", {} lost", p.lost).map_err(io)?;
        writeln!(
            out,
            "{:>8} {:>7} {:>8} {:>7}  function",
            "self", "self%", "total", "total%"
        )
        .map_err(io)?;
        let pct = |v: i64| {
            if total == 0 {
                0.0
            } else {
                100.0 * v as f64 / total as f64
            }
        };
        for e in profile::top(&p, &names, st).iter().take(args.top) {
            writeln!(
                out,
                "{:>8} {:>6.2}% {:>8} {:>6.2}%  {}",
                human(e.self_value, &unit),
                pct(e.self_value),
                human(e.total_value, &unit),
                pct(e.total_value),
                e.function
            )
            .map_err(io)?;
        }
        out.flush().map_err(io)?;
    }
    Ok(())
}
