//! `callstack addr2line`: binutils `addr2line`, output for output, faster.
//!
//! Same flags (`-e -a -f -i -C -p -s`), same output formats (`??`, `??:0`
//! for an address nothing describes, `??:?` for a function without line),
//! addresses in hex from the arguments or, when there are none, one per
//! line from standard input. Like binutils, every answer is flushed before
//! the next address is read, so it can serve as a pipe-driven child
//! process; unlike binutils, answers are flushed only when no more input
//! is already buffered, which keeps bulk runs from making a write per
//! address.

use callstack::symbolize::{Address, Symbolized, Symbolizer};
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// Arguments of `callstack addr2line` (binutils-compatible).
#[derive(clap::Args)]
pub struct Args {
    /// The object file to read (executable, shared library or debug file).
    #[arg(short = 'e', long = "exe", default_value = "a.out")]
    exe: PathBuf,
    /// Print each address before its answer.
    #[arg(short = 'a', long = "addresses")]
    addresses: bool,
    /// Print function names.
    #[arg(short = 'f', long = "functions")]
    functions: bool,
    /// Also print the functions an address was inlined into.
    #[arg(short = 'i', long = "inlines")]
    inlines: bool,
    /// Demangle function names (Rust and C++).
    #[arg(short = 'C', long = "demangle")]
    demangle: bool,
    /// One line per address (`func at file:line (inlined by) ...`).
    #[arg(short = 'p', long = "pretty-print")]
    pretty: bool,
    /// Print file base names only.
    #[arg(short = 's', long = "basenames")]
    basenames: bool,
    /// Threads for a batch of known addresses (arguments, or standard input
    /// that is a regular file). Each thread opens the file and answers a
    /// contiguous part of the sorted addresses; units shared by both parts
    /// are parsed twice, so this pays only on idle cores.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Extra directory to search for split debug info (repeatable).
    #[arg(long = "debug-dir")]
    debug_dirs: Vec<PathBuf>,
    /// Addresses, in hex (with or without 0x). None: read standard input.
    addrs: Vec<String>,
}

/// Parses a hex address like binutils' `bfd_scan_vma(s, NULL, 16)`: an
/// optional `0x`, then hex digits up to the first other character;
/// nothing valid gives 0.
pub fn parse_hex(s: &str) -> u64 {
    let s = s.trim_start();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    let mut v: u64 = 0;
    for c in s.chars() {
        match c.to_digit(16) {
            Some(d) => v = v.wrapping_shl(4) | d as u64,
            None => break,
        }
    }
    v
}

fn write_answer(
    out: &mut impl Write,
    args: &Args,
    addr: u64,
    s: &Symbolized,
) -> std::io::Result<()> {
    if args.addresses {
        write!(out, "0x{addr:016x}")?;
        out.write_all(if args.pretty { b": " } else { b"\n" })?;
    }
    if s.frames.is_empty() {
        if args.functions {
            out.write_all(if args.pretty { b"?? " } else { b"??\n" })?;
        }
        return out.write_all(b"??:0\n");
    }
    let n = if args.inlines { s.frames.len() } else { 1 };
    let mut buf = [0u8; 10];
    // binutils keeps printing the first row's discriminator on the
    // inlined-by lines (one variable, set once per address).
    let disc = s.frames[0].discriminator;
    // Without -i binutils prints the innermost frame's location but the
    // name of the innermost function too; with -i it walks outwards.
    for (i, f) in s.frames.iter().take(n).enumerate() {
        if i > 0 && args.pretty {
            out.write_all(b" (inlined by) ")?;
        }
        if args.functions {
            let name = if args.demangle {
                f.function.as_deref()
            } else {
                f.mangled.as_deref().or(f.function.as_deref())
            };
            out.write_all(name.unwrap_or("??").as_bytes())?;
            out.write_all(if args.pretty { b" at " } else { b"\n" })?;
        }
        let file = f.file.as_deref().map(|p| {
            if args.basenames {
                p.rsplit('/').next().unwrap_or(p)
            } else {
                p
            }
        });
        out.write_all(file.unwrap_or("??").as_bytes())?;
        match f.line {
            Some(l) if l != 0 => {
                out.write_all(b":")?;
                out.write_all(decimal(&mut buf, l))?;
                if let Some(d) = f.discriminator.or(disc) {
                    out.write_all(b" (discriminator ")?;
                    out.write_all(decimal(&mut buf, d))?;
                    out.write_all(b")")?;
                }
                out.write_all(b"\n")?;
            }
            _ => out.write_all(b":?\n")?,
        }
    }
    Ok(())
}

/// `v` in decimal, in `buf` (without going through `fmt`: one call per
/// output line adds up over a large batch).
fn decimal(buf: &mut [u8; 10], mut v: u32) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

fn stdin_is_regular_file() -> bool {
    // SAFETY: fstat on fd 0 into a zeroed struct we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(0, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
    }
}

/// Resolves a batch: the distinct addresses, sorted (neighbours share
/// units and functions, which are then hot in the caches); with
/// `--threads 2` and a large batch, split in two halves answered by two
/// threads with a symbolizer each. Returns the distinct addresses, sorted,
/// and their answers (looked up by the caller: no copy per address).
fn resolve_batch(
    sym: Symbolizer,
    args: &Args,
    addrs: &[u64],
) -> (Vec<u64>, Vec<Symbolized>, Symbolizer) {
    let mut uniq: Vec<u64> = addrs.to_vec();
    uniq.sort_unstable();
    uniq.dedup();
    let threads = if uniq.len() >= 2000 {
        args.threads.clamp(1, 2)
    } else {
        1
    };
    let run = |s: &mut Symbolizer, part: &[u64]| -> Vec<Symbolized> {
        part.iter()
            .map(|&a| s.resolve(Address::Exact(a as usize)))
            .collect()
    };
    let mut sym = sym;
    let mut answers: Vec<Symbolized> = Vec::with_capacity(uniq.len());
    if threads == 1 {
        answers = run(&mut sym, &uniq);
    } else {
        let mid = uniq.len() / 2;
        let (lo, hi) = uniq.split_at(mid);
        std::thread::scope(|sc| {
            let second = Symbolizer::for_file_with_debug_dirs(&args.exe, &args.debug_dirs).ok();
            let h = second.map(|mut s2| {
                sc.spawn(move || {
                    let v = run(&mut s2, hi);
                    // The process ends soon: let the OS reclaim the tables.
                    std::mem::forget(s2);
                    v
                })
            });
            answers = run(&mut sym, lo);
            match h.and_then(|h| h.join().ok()) {
                Some(v) => answers.extend(v),
                None => {
                    // The second open failed (raced a file change): do it here.
                    let mut s = Symbolizer::for_file_with_debug_dirs(&args.exe, &args.debug_dirs)
                        .expect("opened once already");
                    answers.extend(hi.iter().map(|&a| s.resolve(Address::Exact(a as usize))));
                }
            }
        });
    }
    (uniq, answers, sym)
}

/// Addresses answered per batch (see [`run`]).
const BATCH: usize = 1 << 16;

/// Answers `addrs` in order (resolved as one sorted batch), and hands the
/// symbolizer back for the next batch.
fn answer_batch(
    sym: Symbolizer,
    args: &Args,
    addrs: &[u64],
    out: &mut impl Write,
) -> std::io::Result<Symbolizer> {
    let (uniq, answers, sym) = resolve_batch(sym, args, addrs);
    for addr in addrs {
        let s = &answers[uniq.binary_search(addr).expect("present")];
        write_answer(out, args, *addr, s)?;
    }
    Ok(sym)
}

pub fn run(args: Args) -> Result<(), String> {
    let mut sym = Symbolizer::for_file_with_debug_dirs(&args.exe, &args.debug_dirs)
        .map_err(|e| format!("'{}': {}", args.exe.display(), e.message))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, stdout.lock());
    let io = |e: std::io::Error| e.to_string();
    // All addresses known up front (arguments, or standard input that is
    // a regular file): answer them in batches of at most BATCH addresses,
    // each sorted and in parallel; memory stays bounded by one batch's
    // answers however long the input is.
    if !args.addrs.is_empty() {
        let addrs: Vec<u64> = args.addrs.iter().map(|a| parse_hex(a)).collect();
        for chunk in addrs.chunks(BATCH) {
            sym = answer_batch(sym, &args, chunk, &mut out).map_err(io)?;
        }
        std::mem::forget(sym);
        return out.flush().map_err(io);
    }
    if stdin_is_regular_file() {
        let mut input = std::io::BufReader::with_capacity(64 * 1024, std::io::stdin());
        let mut line = String::new();
        let mut chunk = Vec::with_capacity(BATCH);
        loop {
            line.clear();
            let eof = input.read_line(&mut line).map_err(io)? == 0;
            if !eof {
                chunk.push(parse_hex(&line));
            }
            if chunk.len() == BATCH || (eof && !chunk.is_empty()) {
                sym = answer_batch(sym, &args, &chunk, &mut out).map_err(io)?;
                chunk.clear();
            }
            if eof {
                break;
            }
        }
        std::mem::forget(sym);
        return out.flush().map_err(io);
    }
    let mut input = std::io::BufReader::with_capacity(64 * 1024, std::io::stdin());
    let mut line = String::new();
    loop {
        // Before blocking for more input, hand out what is answered.
        if input.fill_buf().map_err(io)?.is_empty() {
            break;
        }
        line.clear();
        if input.read_line(&mut line).map_err(io)? == 0 {
            break;
        }
        let addr = parse_hex(&line);
        let s = sym.resolve(Address::Exact(addr as usize));
        write_answer(&mut out, &args, addr, &s).map_err(io)?;
        if input.buffer().is_empty() {
            out.flush().map_err(io)?;
        }
    }
    std::mem::forget(sym);
    out.flush().map_err(io)
}
