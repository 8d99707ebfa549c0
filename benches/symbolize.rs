//! Symbolization speed and memory against the field, in one run:
//! 10,000 return addresses of a large binary with full debug info,
//! resolved to function + file:line + inlined frames.
//!
//! Peers: the `addr2line` crate used directly (gimli + object + mmap, the
//! same names/lines/inlines asked), and blazesym. Command-line peers
//! (binutils addr2line, llvm-symbolizer) are in benches/symbolize-cli.sh.
//!
//! The binary: `$CALLSTACK_BENCH_BINARY`, else our `callstack` CLI built
//! with `debug = 2` into target/bench-bigdebug (built on first run).
//!
//! Run: `cargo bench -p callstack-benches --bench symbolize -- --warm-up-time 1 --measurement-time 3`
//! Prints a summary table (medians of 5 cold runs, ratios, peak RSS of a
//! fresh process per peer) before criterion's own measurements.

use callstack::symbolize::{Address, Symbolizer};
use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const N: usize = 10_000;

fn target_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CALLSTACK_BENCH_BINARY") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tdir = root.join("target/bench-bigdebug");
    let exe = tdir.join("release/callstack");
    if !exe.exists() {
        eprintln!(
            "building the bench binary (callstack CLI, debug = 2) into {}",
            tdir.display()
        );
        let st = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
            .current_dir(&root)
            .env("CARGO_PROFILE_RELEASE_DEBUG", "2")
            .env("CARGO_TARGET_DIR", &tdir)
            .args(["build", "--release", "-q", "-p", "callstack-cli"])
            .status()
            .expect("cargo");
        assert!(st.success());
    }
    exe
}

/// `N` return addresses (the address after each `call` in .text), evenly
/// sampled, in code order then shuffled deterministically.
fn return_addresses(path: &Path) -> Vec<u64> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let text = obj.section_by_name(".text").unwrap();
    let bytes = text.data().unwrap();
    let mut dec = Decoder::with_ip(64, bytes, text.address(), DecoderOptions::NONE);
    let mut ras = Vec::new();
    while dec.can_decode() {
        let i = dec.decode();
        if i.flow_control() == FlowControl::Call || i.flow_control() == FlowControl::IndirectCall {
            ras.push(i.next_ip());
        }
    }
    assert!(!ras.is_empty());
    let mut out: Vec<u64> = (0..N).map(|i| ras[i * ras.len() / N]).collect();
    let mut x: u64 = 0x9e37_79b9;
    for i in (1..out.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.swap(i, (x % (i as u64 + 1)) as usize);
    }
    out
}

// ---- the peers -------------------------------------------------------

/// Ours: open, resolve each return address (frames with demangled names,
/// files, lines, inlines). Returns the number of frames.
fn ours_pass(path: &Path, ras: &[u64]) -> usize {
    let mut s = Symbolizer::for_file(path).unwrap();
    let addrs: Vec<Address> = ras.iter().map(|&a| Address::Return(a as usize)).collect();
    s.symbolize_batch(&addrs)
        .iter()
        .map(|r| r.frames.len())
        .sum()
}

/// Ours, one address at a time in the given (shuffled) order.
fn ours_one_by_one_pass(path: &Path, ras: &[u64]) -> usize {
    let mut s = Symbolizer::for_file(path).unwrap();
    ras.iter()
        .map(|&a| s.symbolize(Address::Return(a as usize)).frames.len())
        .sum()
}

type Slice = gimli::EndianSlice<'static, gimli::RunTimeEndian>;

/// The addr2line crate used directly, as its docs suggest, asked the same:
/// every frame's demangled name and location.
fn addr2line_pass(path: &Path, ras: &[u64]) -> usize {
    use object::{Object, ObjectSection};
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: read-only private map of a file nobody rewrites during the bench.
    let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
    // Leak-free 'static view: `map` outlives every use below.
    let data: &'static [u8] = unsafe { std::slice::from_raw_parts(map.as_ptr(), map.len()) };
    let obj = object::File::parse(data).unwrap();
    let mut owned: Vec<Vec<u8>> = Vec::new();
    let dwarf = gimli::Dwarf::load(|id| -> Result<Slice, gimli::Error> {
        let b: &'static [u8] = match obj
            .section_by_name(id.name())
            .map(|s| s.uncompressed_data())
        {
            Some(Ok(std::borrow::Cow::Borrowed(b))) => b,
            Some(Ok(std::borrow::Cow::Owned(v))) => {
                owned.push(v);
                let v = owned.last().unwrap();
                unsafe { std::slice::from_raw_parts(v.as_ptr(), v.len()) }
            }
            _ => &[],
        };
        Ok(gimli::EndianSlice::new(b, gimli::RunTimeEndian::Little))
    })
    .unwrap();
    let ctx = addr2line::Context::from_dwarf(dwarf).unwrap();
    let mut n = 0;
    for &a in ras {
        let mut it = ctx.find_frames(a - 1).skip_all_loads().unwrap();
        while let Ok(Some(f)) = it.next() {
            if let Some(name) = &f.function {
                let raw = name.raw_name().unwrap();
                black_box(callstack::symbolize::demangle(&raw).into_owned());
            }
            if let Some(l) = &f.location {
                black_box((l.file, l.line, l.column));
            }
            n += 1;
        }
    }
    drop(ctx);
    drop(map);
    n
}

/// The addr2line crate given the same advantage as our batch: addresses
/// sorted first.
fn addr2line_sorted_pass(path: &Path, ras: &[u64]) -> usize {
    let mut v = ras.to_vec();
    v.sort_unstable();
    addr2line_pass(path, &v)
}

fn blazesym_pass(path: &Path, ras: &[u64]) -> usize {
    use blazesym::symbolize::{source::Elf, source::Source, Input, Symbolized, Symbolizer};
    let s = Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .build();
    let src = Source::Elf(Elf::new(path));
    let probes: Vec<u64> = ras.iter().map(|a| a - 1).collect();
    let out = s.symbolize(&src, Input::VirtOffset(&probes)).unwrap();
    out.iter()
        .map(|r| match r {
            Symbolized::Sym(sym) => 1 + sym.inlined.len(),
            Symbolized::Unknown(_) => 0,
        })
        .sum()
}

type Pass = fn(&Path, &[u64]) -> usize;
const PEERS: &[(&str, Pass)] = &[
    ("callstack", ours_pass),
    ("callstack 1-by-1", ours_one_by_one_pass),
    ("addr2line crate", addr2line_pass),
    ("addr2line sorted", addr2line_sorted_pass),
    ("blazesym", blazesym_pass),
];

/// CPU time of this thread: on a shared, loaded machine it moves much
/// less than wall time when other processes take the cores.
fn cpu_now() -> Duration {
    // SAFETY: clock_gettime fills the timespec we pass.
    unsafe {
        let mut t: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t);
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    }
}

/// Median wall and CPU time of `runs` runs of `f`.
fn time_it(runs: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..runs {
        let (t, c) = (Instant::now(), cpu_now());
        f();
        cpu.push(cpu_now() - c);
        wall.push(t.elapsed());
    }
    (median(wall), median(cpu))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Peak resident set of this process (`VmHWM`, which unlike
/// `ru_maxrss` starts afresh at exec), in KiB.
fn peak_rss_kb() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Child mode: one cold pass of one peer, then print the peak RSS.
fn rss_child(peer: &str) -> ! {
    let path = target_binary();
    // Addresses come from the parent (reading the binary here would
    // inflate the peak before the peer even starts).
    let ras: Vec<u64> = std::env::var("CALLSTACK_BENCH_ADDRS")
        .unwrap()
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    let base = peak_rss_kb();
    let (_, f) = PEERS.iter().find(|(n, _)| *n == peer).unwrap();
    black_box(f(&path, &ras));
    println!("RSS {} {}", peak_rss_kb(), base);
    std::process::exit(0)
}

fn summary() {
    let path = target_binary();
    let ras = return_addresses(&path);
    let size = std::fs::metadata(&path).unwrap().len();
    println!(
        "\nsymbolize summary: {} ({:.1} MB), {N} return addresses",
        path.display(),
        size as f64 / 1e6
    );
    println!(
        "{:<16} {:>22} {:>24} {:>8} {:>14} {:>16}",
        "peer",
        "first answer wall/cpu",
        "10k cold pass wall/cpu",
        "frames",
        "cpu vs ours",
        "peak RSS MB"
    );
    let addr_list = ras
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut ours_cpu = Duration::ZERO;
    for (name, f) in PEERS {
        let (fw, fc) = time_it(7, || {
            black_box(f(&path, &ras[..1]));
        });
        let mut frames = 0;
        let (cw, cc) = time_it(5, || {
            frames = black_box(f(&path, &ras));
        });
        if *name == "callstack" {
            ours_cpu = cc;
        }
        let rss = std::process::Command::new(std::env::current_exe().unwrap())
            .env("CALLSTACK_BENCH_RSS", name)
            .env("CALLSTACK_BENCH_ADDRS", &addr_list)
            .output()
            .ok()
            .and_then(|o| {
                let s = String::from_utf8_lossy(&o.stdout).to_string();
                let l = s.lines().find(|l| l.starts_with("RSS "))?.to_string();
                let mut it = l
                    .split_whitespace()
                    .skip(1)
                    .map(|x| x.parse::<i64>().unwrap_or(0));
                let (peak, base) = (it.next()?, it.next()?);
                Some(format!(
                    "{:.1} (+{:.1})",
                    peak as f64 / 1024.0,
                    (peak - base) as f64 / 1024.0
                ))
            })
            .unwrap_or_else(|| "?".into());
        println!(
            "{:<16} {:>10.2?} / {:>9.2?} {:>11.2?} / {:>10.2?} {:>8} {:>13.2}x {:>16}",
            name,
            fw,
            fc,
            cw,
            cc,
            frames,
            cc.as_secs_f64() / ours_cpu.as_secs_f64(),
            rss
        );
    }
    // Warm: a repeat of a cached address.
    let mut s = Symbolizer::for_file(&path).unwrap();
    for &a in &ras {
        s.symbolize(Address::Return(a as usize));
    }
    let t = Instant::now();
    let mut k = 0;
    for _ in 0..20 {
        for &a in &ras {
            k += s.symbolize(Address::Return(a as usize)).frames.len();
        }
    }
    black_box(k);
    println!(
        "callstack warm (cached) repeat: {:.1} ns per address",
        t.elapsed().as_nanos() as f64 / (20 * ras.len()) as f64
    );
    println!("(medians: 7 runs for the first answer, 5 for the pass; cpu vs ours: the peer's CPU time over ours;\n RSS: peak of a fresh process doing one cold pass, and the growth over its start)\n");
}

// ---- criterion -------------------------------------------------------

fn bench(c: &mut Criterion) {
    let path = target_binary();
    let ras = return_addresses(&path);

    let mut g = c.benchmark_group("symbolize_cold_10k");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ras.len() as u64));
    for (name, f) in PEERS {
        g.bench_function(*name, |b| b.iter(|| f(&path, black_box(&ras))));
    }
    g.finish();

    let mut g = c.benchmark_group("symbolize_first_answer");
    g.sample_size(20);
    for (name, f) in PEERS {
        g.bench_function(*name, |b| b.iter(|| f(&path, black_box(&ras[..1]))));
    }
    g.finish();

    let mut g = c.benchmark_group("symbolize_warm");
    g.throughput(Throughput::Elements(ras.len() as u64));
    let mut s = Symbolizer::for_file(&path).unwrap();
    g.bench_function("callstack_cached", |b| {
        b.iter(|| {
            ras.iter()
                .map(|&a| s.symbolize(Address::Return(a as usize)).frames.len())
                .sum::<usize>()
        })
    });
    g.bench_function("callstack_cached_single", |b| {
        let a = Address::Return(ras[17] as usize);
        b.iter(|| s.symbolize(black_box(a)).frames.len())
    });
    g.finish();

    let mut g = c.benchmark_group("called_from");
    g.bench_function("depth32_warm", |b| {
        b.iter_batched(|| (), |_| recurse(32), BatchSize::SmallInput)
    });
    g.finish();
}

#[inline(never)]
fn recurse(d: u32) -> bool {
    if d == 0 {
        callstack::called_from(black_box("symbolize::not_on_the_stack"))
    } else {
        black_box(recurse(black_box(d - 1)))
    }
}

criterion_group!(benches, bench);

fn main() {
    if let Ok(peer) = std::env::var("CALLSTACK_BENCH_RSS") {
        rss_child(&peer);
    }
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--bench") {
        summary();
    }
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
