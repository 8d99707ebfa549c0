//! Runs the workload under pprof-rs (frame-pointer mode) at 1 kHz and
//! prints the wall time in nanoseconds, as `profiler_overhead`'s children
//! do; the depth of the deepest stack goes to stderr.

mod workload;

fn main() {
    let t = std::time::Instant::now();
    let g = pprof::ProfilerGuardBuilder::default()
        .frequency(1000)
        .build()
        .unwrap();
    let r = workload::workload();
    let rep = g.report().build().unwrap();
    assert!(!rep.data.is_empty());
    std::hint::black_box(r);
    println!("{}", t.elapsed().as_nanos());
    let deepest = rep.data.keys().map(|f| f.frames.len()).max().unwrap_or(0);
    eprintln!("pprof-rs frame-pointer mode: {} samples, deepest stack {deepest} frames", rep.data.values().sum::<isize>());
}
