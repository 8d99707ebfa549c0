//! `callstack addr2line`: binutils `addr2line`, output for output, faster.
//!
//! Same flags (`-e -a -f -i -C[=STYLE] -p -s -j -b -r -R`), same output formats (`??`, `??:0`
//! for an address nothing describes, `??:?` for a function without line),
//! addresses in hex from the arguments or, when there are none, one per
//! line from standard input (read as bytes, as binutils reads them: a line
//! that is not UTF-8 is an address like any other, a line longer than 99
//! bytes is read as several). Like binutils, every answer is flushed before
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
    /// Demangle function names (Rust and C++). STYLE as binutils takes it:
    /// `auto`, `gnu-v3`, `rust`, `java`, `gnat`, `dlang` demangle (whatever
    /// the style, names are demangled by their own scheme); `none` does not.
    #[arg(
        short = 'C',
        long = "demangle",
        value_name = "STYLE",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "auto"
    )]
    demangle: Option<String>,
    /// Addresses are offsets into this section (binutils' `-j`).
    #[arg(short = 'j', long = "section", value_name = "NAME")]
    section: Option<String>,
    /// The object's format, as binutils names it (`elf64-x86-64`,
    /// `elf32-littlearm`, `elf64-little`...): accepted for compatibility,
    /// the format is read from the file; a name that is not an ELF format
    /// is an error.
    #[arg(short = 'b', long = "target", value_name = "BFDNAME")]
    target: Option<String>,
    /// Limit recursion while demangling (binutils' default; accepted for
    /// compatibility: the demanglers here always bound it).
    #[arg(short = 'R', long = "recurse-limit")]
    recurse_limit: bool,
    /// No recursion limit while demangling (accepted for compatibility:
    /// the demanglers here always bound it).
    #[arg(short = 'r', long = "no-recurse-limit")]
    no_recurse_limit: bool,
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
    #[command(flatten)]
    debuginfod: crate::debuginfod::DebuginfodArgs,
    /// The debuginfod client, made once for every thread's symbolizer.
    #[arg(skip)]
    client: std::sync::OnceLock<Option<std::sync::Arc<callstack::symbolize::Debuginfod>>>,
    /// Addresses, in hex (with or without 0x). None: read standard input.
    addrs: Vec<std::ffi::OsString>,
}

/// The demangling styles binutils' `--demangle=STYLE` knows.
const DEMANGLE_STYLES: &[&str] = &["none", "auto", "gnu-v3", "java", "gnat", "dlang", "rust"];

/// Whether the name mangled as `mangled` is printed demangled: with `-C`
/// (style `auto`), every name; with a style, only names of that scheme
/// (`rust`: Rust legacy and v0, `gnu-v3`: the other `_Z` names; Java, Ada
/// and D names are not demangled here, so those styles print names as
/// stored), as binutils does.
fn demangles(args: &Args, mangled: &str) -> bool {
    let rust = mangled.starts_with("_R") || is_rust_legacy(mangled);
    match args.demangle.as_deref() {
        None | Some("none") => false,
        Some("auto") => true,
        Some("rust") => rust,
        // Rust legacy names are read as C++ nested names (see
        // `itanium_nested`).
        Some("gnu-v3") => mangled.starts_with("_Z") && !rust,
        Some(_) => false,
    }
}

/// A `_ZN<len><id>...E` name read as C++ reads it (elements as stored,
/// joined by `::`); `None` for anything else.
fn itanium_nested(name: &str) -> Option<String> {
    let mut rest = name.strip_prefix("_ZN")?.strip_suffix('E')?;
    let mut out = String::new();
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let len: usize = rest[..digits].parse().ok()?;
        let id = rest.get(digits..digits.checked_add(len)?)?;
        if !out.is_empty() {
            out.push_str("::");
        }
        out.push_str(id);
        rest = &rest[digits + len..];
    }
    Some(out)
}

/// `_ZN...17h<16 hex digits>E`, possibly with an LTO `.llvm.N` suffix.
fn is_rust_legacy(name: &str) -> bool {
    let name = match name.rfind(".llvm.") {
        Some(i) => &name[..i],
        None => name,
    };
    let b = name.as_bytes();
    b.len() > 23
        && name.starts_with("_ZN")
        && name.ends_with('E')
        && &b[b.len() - 20..b.len() - 17] == b"17h"
        && b[b.len() - 17..b.len() - 1]
            .iter()
            .all(u8::is_ascii_hexdigit)
}

/// Checks the compatibility flags, and returns what `-j` adds to each
/// address (the section's address; 0 without `-j`).
fn check_flags(args: &Args) -> Result<u64, String> {
    let _ = (args.recurse_limit, args.no_recurse_limit);
    if let Some(style) = &args.demangle {
        if !DEMANGLE_STYLES.contains(&style.as_str()) {
            return Err(format!("unknown demangling style `{style}'"));
        }
    }
    if let Some(t) = &args.target {
        if !(t.starts_with("elf32-") || t.starts_with("elf64-")) {
            return Err(format!("{}: invalid bfd target", args.exe.display()));
        }
    }
    match &args.section {
        None => Ok(0),
        Some(name) => callstack::symbolize::section_address(&args.exe, name)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{}: cannot find section {name}", args.exe.display())),
    }
}

/// Parses an address as binutils' addr2line 2.40 does (checked against
/// it, `tests/addr2line.rs`): after leading ASCII white space, hex digits
/// with an optional `0x`, up to the first other byte (any byte, UTF-8 or
/// not; nothing valid gives 0, a value past 64 bits all ones); but after a
/// `+`, a C number as `strtoul(s, NULL, 0)` reads it (decimal, `0x` hex,
/// `0` octal, its own white space and sign).
pub fn parse_hex(s: &[u8]) -> u64 {
    let s = trim_c_space(s);
    match s.strip_prefix(b"+") {
        Some(rest) => parse_c_number(rest),
        None => parse_digits(strip_0x(s).unwrap_or(s), 16),
    }
}

/// `s` less its leading white space as C's `isspace` sees it (vertical
/// tab included).
fn trim_c_space(s: &[u8]) -> &[u8] {
    let n = s
        .iter()
        .take_while(|c| b" \t\n\x0b\x0c\r".contains(c))
        .count();
    &s[n..]
}

/// `s` less a leading `0x`/`0X`.
fn strip_0x(s: &[u8]) -> Option<&[u8]> {
    s.strip_prefix(b"0x").or_else(|| s.strip_prefix(b"0X"))
}

/// Digits of `radix` up to the first other byte; all ones past 64 bits.
fn parse_digits(s: &[u8], radix: u32) -> u64 {
    let mut v: u64 = 0;
    for &c in s {
        let Some(d) = (c as char).to_digit(radix) else {
            break;
        };
        v = v
            .checked_mul(radix as u64)
            .and_then(|x| x.checked_add(d as u64))
            .unwrap_or(u64::MAX);
    }
    v
}

/// `strtoul(s, NULL, 0)`: white space, a sign (a `-` negates, modulo
/// 2^64), then `0x` hex, `0` octal or decimal; all ones on overflow.
fn parse_c_number(s: &[u8]) -> u64 {
    let s = trim_c_space(s);
    let (neg, s) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let v = match strip_0x(s).filter(|r| r.first().is_some_and(u8::is_ascii_hexdigit)) {
        Some(hex) => parse_digits(hex, 16),
        None if s.first() == Some(&b'0') => parse_digits(s, 8),
        None => parse_digits(s, 10),
    };
    if neg && v != u64::MAX {
        v.wrapping_neg()
    } else {
        v
    }
}

/// The longest address line binutils reads at once (`fgets` into a
/// 100-byte buffer): a longer line is read as several addresses.
const LINE_MAX: usize = 99;

/// Reads the next address line of standard input into `line` as binutils
/// does (`fgets`): bytes up to and including a newline, at most
/// [`LINE_MAX`] of them; whatever the bytes are (not UTF-8 either).
/// `false` at the end of the input.
fn read_address_line(input: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<bool> {
    line.clear();
    while line.len() < LINE_MAX {
        let buf = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break;
        }
        let room = (LINE_MAX - line.len()).min(buf.len());
        let (take, done) = match buf[..room].iter().position(|&c| c == b'\n') {
            Some(i) => (i + 1, true),
            None => (room, false),
        };
        line.extend_from_slice(&buf[..take]);
        input.consume(take);
        if done {
            break;
        }
    }
    Ok(!line.is_empty())
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
            let itanium;
            let name = match f.mangled.as_deref() {
                Some(m) if !demangles(args, m) => {
                    // The C++ demangler reads a Rust legacy name as a plain
                    // nested name: its elements as stored, the hash kept.
                    itanium = (args.demangle.as_deref() == Some("gnu-v3"))
                        .then(|| itanium_nested(m))
                        .flatten();
                    Some(itanium.as_deref().unwrap_or(m))
                }
                _ => f.function.as_deref(),
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

#[cfg(unix)]
fn stdin_is_regular_file() -> bool {
    // SAFETY: fstat on fd 0 into a zeroed struct we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(0, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
    }
}

/// Windows: standard input is read line by line, answered as it comes.
#[cfg(not(unix))]
fn stdin_is_regular_file() -> bool {
    false
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
            let second = open_binutils(args).ok();
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
                    let mut s = open_binutils(args).expect("opened once already");
                    answers.extend(hi.iter().map(|&a| s.resolve(Address::Exact(a as usize))));
                }
            }
        });
    }
    (uniq, answers, sym)
}

/// The executable's symbolizer, naming addresses as binutils does: a
/// symbol reaches up to the next one, past its size.
fn open_binutils(args: &Args) -> Result<Symbolizer, callstack::symbolize::Error> {
    let client = args.client.get_or_init(|| args.debuginfod.client());
    let mut s = Symbolizer::for_file_with_debuginfod(&args.exe, &args.debug_dirs, client.clone())?;
    s.set_symbol_extent(callstack::symbolize::SymbolExtent::Section);
    Ok(s)
}

/// Addresses answered per batch (see [`run`]).
const BATCH: usize = 1 << 16;

/// Answers `addrs` in order (resolved as one sorted batch), printing each
/// less `base` (the `-j` section's address), and hands the symbolizer back
/// for the next batch.
fn answer_batch(
    sym: Symbolizer,
    args: &Args,
    addrs: &[u64],
    base: u64,
    out: &mut impl Write,
) -> std::io::Result<Symbolizer> {
    let (uniq, answers, sym) = resolve_batch(sym, args, addrs);
    for addr in addrs {
        let s = &answers[uniq.binary_search(addr).expect("present")];
        write_answer(out, args, addr.wrapping_sub(base), s)?;
    }
    Ok(sym)
}

pub fn run(args: Args) -> Result<(), String> {
    let base = check_flags(&args)?;
    let parse = |s: &[u8]| parse_hex(s).wrapping_add(base);
    let mut sym =
        open_binutils(&args).map_err(|e| format!("'{}': {}", args.exe.display(), e.message))?;
    // The file is opened: whatever was to be fetched has been.
    crate::debuginfod::warn(sym.debuginfod());
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, stdout.lock());
    let io = |e: std::io::Error| e.to_string();
    // All addresses known up front (arguments, or standard input that is
    // a regular file): answer them in batches of at most BATCH addresses,
    // each sorted and in parallel; memory stays bounded by one batch's
    // answers however long the input is.
    if !args.addrs.is_empty() {
        let addrs: Vec<u64> = args
            .addrs
            .iter()
            .map(|a| parse(a.as_encoded_bytes()))
            .collect();
        for chunk in addrs.chunks(BATCH) {
            sym = answer_batch(sym, &args, chunk, base, &mut out).map_err(io)?;
        }
        std::mem::forget(sym);
        return out.flush().map_err(io);
    }
    if stdin_is_regular_file() {
        let mut input = std::io::BufReader::with_capacity(64 * 1024, std::io::stdin());
        let mut line = Vec::new();
        let mut chunk = Vec::with_capacity(BATCH);
        loop {
            let eof = !read_address_line(&mut input, &mut line).map_err(io)?;
            if !eof {
                chunk.push(parse(&line));
            }
            if chunk.len() == BATCH || (eof && !chunk.is_empty()) {
                sym = answer_batch(sym, &args, &chunk, base, &mut out).map_err(io)?;
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
    let mut line = Vec::new();
    loop {
        // Before blocking for more input, hand out what is answered.
        if input.fill_buf().map_err(io)?.is_empty() {
            break;
        }
        if !read_address_line(&mut input, &mut line).map_err(io)? {
            break;
        }
        let addr = parse(&line);
        let s = sym.resolve(Address::Exact(addr as usize));
        write_answer(&mut out, &args, addr.wrapping_sub(base), &s).map_err(io)?;
        if input.buffer().is_empty() {
            out.flush().map_err(io)?;
        }
    }
    std::mem::forget(sym);
    out.flush().map_err(io)
}
