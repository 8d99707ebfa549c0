//! `callstack symbolize TRACE_FILE`: print the stacks of a trace file
//! (see `docs/trace-format.md`) with functions, files and lines.
//!
//! Modules are found at their recorded path (under `--sysroot` first when
//! given), checked by build-id, else by build-id under the debug dirs
//! (`--debug-dir`, then `/usr/lib/debug`). `-` reads the trace from
//! standard input (a crash handler can pipe its trace here).

use callstack::symbolize::{Address, ModuleInfo, Symbolizer};
use callstack::tracefile::{Record, TraceReader};
use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Arguments of `callstack symbolize`.
#[derive(clap::Args)]
pub struct Args {
    /// The trace file, or `-` for standard input.
    trace: PathBuf,
    /// Extra directory searched for split debug info and for modules by
    /// build-id (`DIR/.build-id/xx/yyyy[.debug]`); repeatable.
    #[arg(long = "debug-dir")]
    debug_dirs: Vec<PathBuf>,
    /// Look for module files under this root first (the traced machine's
    /// files copied here).
    #[arg(long)]
    sysroot: Option<PathBuf>,
    /// Print JSON (schema: docs/schema/symbolize.schema.json) instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    debuginfod: crate::debuginfod::DebuginfodArgs,
}

/// The `schema_version` of the JSON output (docs/schema/symbolize.schema.json).
pub const SCHEMA_VERSION: u32 = 1;

fn locate(path: &Path, sysroot: Option<&Path>) -> PathBuf {
    if let Some(root) = sysroot {
        let p = root.join(path.strip_prefix("/").unwrap_or(path));
        if p.exists() {
            return p;
        }
    }
    path.to_path_buf()
}

/// Prints the symbolizer's module errors not printed yet: each once per
/// run, however many stacks (or rebuilt symbolizers) meet the module.
fn warn_new(sym: &Option<Symbolizer>, warned: &mut HashSet<String>) {
    for e in sym.iter().flat_map(|s| s.module_errors()) {
        let text = e.to_string();
        if !warned.contains(&text) {
            eprintln!("callstack: warning: {text}");
            warned.insert(text);
        }
    }
}

pub fn run(args: Args) -> Result<(), String> {
    let src: Box<dyn Read> = if args.trace.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(
            std::fs::File::open(&args.trace)
                .map_err(|e| format!("{}: {e}", args.trace.display()))?,
        )
    };
    let mut reader = TraceReader::new(std::io::BufReader::new(src))
        .map_err(|e| format!("{}: {e}", args.trace.display()))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let io = |e: std::io::Error| e.to_string();
    let mut modules: Vec<ModuleInfo> = Vec::new();
    let mut sym: Option<Symbolizer> = None;
    // One client for every module list: each file is asked for once.
    let client = args.debuginfod.client();
    let mut nstack = 0usize;
    let mut json_stacks: Vec<serde_json::Value> = Vec::new();
    let mut warned = HashSet::new();
    loop {
        let rec = reader
            .next_record()
            .map_err(|e| format!("{}: {e}", args.trace.display()))?;
        match rec {
            None => break,
            Some(Record::Module(m)) => {
                modules.push(ModuleInfo {
                    path: locate(&m.path, args.sysroot.as_deref()),
                    build_id: m.build_id,
                    start: m.start as usize,
                    end: m.end as usize,
                    bias: Some(m.bias as usize),
                });
                // The module list changed: rebuild on the next stack (the
                // modules it could not open are said before it goes).
                warn_new(&sym, &mut warned);
                sym = None;
            }
            Some(Record::Stack(st)) => {
                let s = sym.get_or_insert_with(|| {
                    let mut s = Symbolizer::from_modules(modules.clone());
                    for d in &args.debug_dirs {
                        s.add_debug_dir(d.clone());
                    }
                    s.set_debuginfod(client.clone());
                    s
                });
                if args.json {
                    let mut frames = Vec::new();
                    for (i, &a) in st.frames.iter().enumerate() {
                        let addr = if st.is_exact(i) {
                            Address::Exact(a)
                        } else {
                            Address::Return(a)
                        };
                        let r = s.symbolize(addr);
                        let module = r.module.as_ref().map(|m| m.path.display().to_string());
                        let offset = r.module.as_ref().map(|_| format!("{:#x}", r.offset));
                        let levels: Vec<Option<&callstack::symbolize::Frame>> =
                            if r.frames.is_empty() {
                                vec![None]
                            } else {
                                r.frames.iter().map(Some).collect()
                            };
                        for f in levels {
                            frames.push(serde_json::json!({
                                "index": i,
                                "pc": format!("{a:#x}"),
                                "function": f.and_then(|f| f.function.as_deref()),
                                "file": f.and_then(|f| f.file.as_deref()),
                                "line": f.and_then(|f| f.line),
                                "inlined": f.is_some_and(|f| f.inlined),
                                "module": module,
                                "offset": offset,
                            }));
                        }
                    }
                    json_stacks.push(serde_json::json!({
                        "tag": st.tag,
                        "frames": frames,
                    }));
                    nstack += 1;
                    warn_new(&sym, &mut warned);
                    continue;
                }
                match st.tag {
                    Some(t) => writeln!(out, "stack {nstack} (tag {t}):"),
                    None => writeln!(out, "stack {nstack}:"),
                }
                .map_err(io)?;
                for (i, &a) in st.frames.iter().enumerate() {
                    let addr = if st.is_exact(i) {
                        Address::Exact(a)
                    } else {
                        Address::Return(a)
                    };
                    let r = s.symbolize(addr);
                    let where_ = || match &r.module {
                        Some(m) => format!("{}+{:#x}", m.path.display(), r.offset),
                        None => "no module".to_string(),
                    };
                    if r.frames.is_empty() {
                        writeln!(out, "  #{i:<3} {a:#018x} in ?? ({})", where_()).map_err(io)?;
                    }
                    for f in &r.frames {
                        write!(
                            out,
                            "  #{i:<3} {a:#018x} in {}",
                            f.function.as_deref().unwrap_or("??")
                        )
                        .map_err(io)?;
                        match (&f.file, f.line) {
                            (Some(file), Some(l)) => write!(out, " at {file}:{l}"),
                            (Some(file), None) => write!(out, " at {file}"),
                            _ => write!(out, " ({})", where_()),
                        }
                        .map_err(io)?;
                        if f.inlined {
                            write!(out, " [inlined]").map_err(io)?;
                        }
                        writeln!(out).map_err(io)?;
                    }
                }
                writeln!(out).map_err(io)?;
                nstack += 1;
                warn_new(&sym, &mut warned);
            }
        }
    }
    warn_new(&sym, &mut warned);
    crate::debuginfod::warn(client.as_ref());
    if args.json {
        let v = serde_json::json!({"schema_version": SCHEMA_VERSION, "stacks": json_stacks});
        serde_json::to_writer(&mut out, &v).map_err(|e| e.to_string())?;
        writeln!(out).map_err(io)?;
    }
    out.flush().map_err(io)
}
