//! The CPU-bound workload of benches/profiler_overhead.rs, shared with
//! its pprof-rs frame-pointer peer (this crate).

#[inline(never)]
fn leaf(mut x: u64, n: u64) -> u64 {
    for _ in 0..n {
        x = std::hint::black_box(
            x.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
        );
    }
    x
}

#[inline(never)]
fn middle(x: u64, n: u64, depth: u32) -> u64 {
    if depth == 0 {
        leaf(x, n)
    } else {
        middle(x ^ depth as u64, n, depth - 1) ^ 1
    }
}

/// About a second of CPU, stacks ~20 frames deep.
pub fn workload() -> u64 {
    let mut x = 1;
    for i in 0..8000u64 {
        x ^= middle(x, 100_000 + (i % 7) * 1000, 12 + (i % 5) as u32);
    }
    x
}
