//! `callstack demo`: capture our own stack, print it, and time the capture
//! against glibc's `backtrace()` on the spot.

use std::hint::black_box;
use std::time::Instant;

/// Arguments of `callstack demo`.
#[derive(clap::Args)]
pub struct Args {
    /// Timed runs of each capture (the median is printed).
    #[arg(long, default_value_t = 20_000)]
    runs: usize,
}

extern "C" {
    fn backtrace(buffer: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int;
}

pub fn run(args: Args) -> Result<(), String> {
    let mut frames = [0usize; 64];
    let n = demo_outer(&mut frames);
    println!("capture_fast from demo_outer -> demo_middle -> demo_inner: {n} frames");
    // Names, files and lines from our own debug info (symbol tables when
    // there is none); inlined functions first, marked.
    let mut sym = callstack::symbolize::Symbolizer::new();
    for (i, &addr) in frames[..n].iter().enumerate() {
        let r = sym.symbolize(callstack::symbolize::Address::Return(addr));
        if r.frames.is_empty() {
            println!("  #{i:<2} {addr:#018x}  ?? {}", describe(addr));
        }
        for f in &r.frames {
            let name = f.function.as_deref().unwrap_or("??");
            let inl = if f.inlined { " [inlined]" } else { "" };
            match (&f.file, f.line) {
                (Some(file), Some(line)) => {
                    println!("  #{i:<2} {addr:#018x}  {name} at {file}:{line}{inl}")
                }
                _ => println!("  #{i:<2} {addr:#018x}  {name} {}{inl}", describe(addr)),
            }
        }
    }
    println!(
        "  stack hash: {:#018x}",
        callstack::hash_frames(&frames[..n])
    );

    let runs = args.runs.max(1);
    let ours = median_ns(runs, || {
        let mut out = [0usize; 64];
        black_box(callstack::capture_fast(0, black_box(&mut out)));
    });
    let glibc = median_ns(runs.min(5_000), || {
        let mut out = [core::ptr::null_mut::<libc::c_void>(); 64];
        // SAFETY: `out` has 64 slots.
        black_box(unsafe { backtrace(out.as_mut_ptr(), 64) });
    });
    println!();
    println!("timing at this depth (median of {runs} runs):");
    println!("  callstack::capture_fast  {ours:>10.1} ns");
    println!("  glibc backtrace()        {glibc:>10.1} ns");
    println!(
        "  ratio                    {:>10.1}x faster",
        glibc / ours.max(0.001)
    );
    Ok(())
}

#[inline(never)]
fn demo_outer(out: &mut [usize]) -> usize {
    black_box(demo_middle(out))
}

#[inline(never)]
fn demo_middle(out: &mut [usize]) -> usize {
    black_box(demo_inner(out))
}

#[inline(never)]
fn demo_inner(out: &mut [usize]) -> usize {
    black_box(callstack::capture_fast(0, out))
}

/// `(module + 0xoffset)` of an address, from `dladdr`.
fn describe(addr: usize) -> String {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and fills `info`.
    if unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } == 0 {
        return "?".into();
    }
    let module = if info.dli_fname.is_null() {
        "?".to_string()
    } else {
        // SAFETY: dladdr returned a NUL-terminated path.
        unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned()
    };
    format!("({module} + {:#x})", addr - info.dli_fbase as usize)
}

fn median_ns(runs: usize, mut f: impl FnMut()) -> f64 {
    // Warm up caches and the thread's stack bounds first.
    for _ in 0..100 {
        f();
    }
    let batch = 16;
    let mut samples: Vec<f64> = (0..runs / batch + 1)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}
