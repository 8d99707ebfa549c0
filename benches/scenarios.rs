//! Where the capture benches capture: 8, 32 and 64 frames deep in a
//! recursion, and 64 deep through 64 distinct functions (recursion repeats
//! one return address, which would flatter a cache keyed by address).
//! Shared by `capture.rs`, `exact.rs` and `insn.rs`, so all measure the
//! same chains.
use std::hint::black_box;
use std::time::Instant;

/// Where the capture is made.
pub struct Scenario {
    pub name: &'static str,
    /// Runs the closure `depth` frames deep.
    pub at: fn(&mut dyn FnMut()),
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "depth8",
        at: |f| recurse(8, f),
    },
    Scenario {
        name: "depth32",
        at: |f| recurse(32, f),
    },
    Scenario {
        name: "depth64",
        at: |f| recurse(64, f),
    },
    Scenario {
        name: "distinct64",
        at: |f| f00(f),
    },
];

/// `n` frames of itself, then `f`. Not a tail call, so every level keeps
/// its frame.
#[inline(never)]
pub fn recurse(n: usize, f: &mut dyn FnMut()) {
    if n <= 1 {
        f();
    } else {
        recurse(black_box(n - 1), f);
    }
    black_box(n);
}

/// Defines a chain of distinct functions, each calling the next (not a tail
/// call); the last one calls `f`.
macro_rules! chain {
    ($k:expr; $last:ident) => {
        #[inline(never)]
        pub fn $last(f: &mut dyn FnMut()) {
            f();
            black_box($k);
        }
    };
    ($k:expr; $this:ident $next:ident $($rest:ident)*) => {
        #[inline(never)]
        pub fn $this(f: &mut dyn FnMut()) {
            $next(f);
            black_box($k);
        }
        chain!($k + 1; $next $($rest)*);
    };
}

chain!(0usize;
    f00 f01 f02 f03 f04 f05 f06 f07 f08 f09 f10 f11 f12 f13 f14 f15
    f16 f17 f18 f19 f20 f21 f22 f23 f24 f25 f26 f27 f28 f29 f30 f31
    f32 f33 f34 f35 f36 f37 f38 f39 f40 f41 f42 f43 f44 f45 f46 f47
    f48 f49 f50 f51 f52 f53 f54 f55 f56 f57 f58 f59 f60 f61 f62 f63
);

/// Per capture function: the interleaved median ns per capture at `sc`,
/// and the frames it returned. The rows take turns, `rounds` times, each
/// timing `k` captures in a row, so a shared machine's load changes hit all
/// rows alike.
#[allow(dead_code)] // not every bench prints interleaved medians this way
pub fn interleaved(
    sc: &Scenario,
    captures: &[fn(&mut [usize]) -> usize],
    rounds: usize,
    k: u32,
) -> Vec<(f64, usize)> {
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); captures.len()];
    let mut frames = vec![0usize; captures.len()];
    for _ in 0..rounds {
        for (i, capture) in captures.iter().enumerate() {
            let mut ns = 0.0;
            (sc.at)(&mut || {
                let mut buf = [0usize; 256];
                let t = Instant::now();
                for _ in 0..k {
                    frames[i] = capture(black_box(&mut buf));
                }
                ns = t.elapsed().as_nanos() as f64 / k as f64;
            });
            samples[i].push(ns);
        }
    }
    samples
        .into_iter()
        .zip(frames)
        .map(|(mut s, f)| {
            s.sort_by(|a, b| a.partial_cmp(b).unwrap());
            (s[s.len() / 2], f)
        })
        .collect()
}
