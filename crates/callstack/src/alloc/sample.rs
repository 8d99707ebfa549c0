//! Sampling by bytes: record about one allocation per `mean` bytes
//! allocated, and weigh each recorded one so that the sums stay unbiased.
//!
//! The rule is the one tcmalloc, jemalloc and Go's runtime use. Each thread
//! keeps a count of bytes left before its next sample, drawn from an
//! exponential distribution of mean `mean`; an allocation of `size` bytes
//! takes `size` off it, and is sampled when that crosses zero (then a new
//! count is drawn). Because the exponential distribution forgets how much
//! of it was used, every allocation is sampled independently with
//! probability `p(size) = 1 - exp(-size / mean)`: a large block almost
//! always, a small one rarely. A sampled block stands for `1 / p(size)`
//! blocks and `size / p(size)` bytes ([`weight`]), which makes the sum
//! over a site's samples an unbiased estimate of its allocations and bytes.
//! The estimated count is rounded up or down at random
//! ([`draw_round_up`]; the recorder keeps the draw with the block, so
//! that its free counts the same), which keeps even a site of large blocks
//! (weights just above 1) unbiased.
//!
//! Cost when not sampled: one thread-local subtraction and compare
//! ([`take_sample`]); the capture and the tables are skipped. A free has to
//! know whether its block was sampled without touching the (large, mostly
//! empty) live table: [`filter`] keeps a count and a tag of sampled live
//! blocks per bucket of addresses, 128 KiB in all, read once per free.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

thread_local! {
    // Bytes this thread may still allocate before its next sample; below
    // zero once the count must be drawn (first use). A const initializer
    // and no `Drop`: a plain TLS slot, no allocation on first use.
    static LEFT: Cell<i64> = const { Cell::new(-1) };
    // The thread's random state (0: not seeded yet).
    static RNG: Cell<u64> = const { Cell::new(0) };
}

/// Seeds of the threads' generators, told apart by a counter.
static SEEDS: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

/// Whether this thread's allocation of `size` bytes is sampled, sampling
/// one allocation per `mean` bytes on average (`mean` > 0). One
/// thread-local update when it is not; allocation-free and
/// async-signal-safe.
#[inline(always)]
pub fn take_sample(mean: u64, size: usize) -> bool {
    // One look-up of the thread's slot (a call to `__tls_get_addr` in a
    // shared library), one subtraction.
    let crossed_zero = LEFT.with(|c| {
        let left = c.get().wrapping_sub(size as i64);
        c.set(left);
        left < 0
    });
    crossed_zero && crossed(mean, size)
}

/// The count crossed zero (or was never drawn): draw again; whether this
/// allocation is sampled.
#[cold]
#[inline(never)]
fn crossed(mean: u64, size: usize) -> bool {
    if RNG.get() == 0 {
        // First use on this thread: draw the count it starts from (the
        // size of this allocation is then taken from that count).
        seed();
        let left = next_count(mean) - size as i64;
        if left >= 0 {
            LEFT.set(left);
            return false;
        }
    }
    LEFT.set(next_count(mean));
    true
}

/// Seeds this thread's generator.
fn seed() {
    let here = LEFT.with(|c| c as *const Cell<i64> as u64);
    let seed = SEEDS.fetch_add(0x6a09_e667_f3bc_c909, Relaxed) ^ here;
    RNG.set(splitmix(seed) | 1);
}

/// An exponentially distributed byte count of mean `mean`, from this
/// thread's generator.
fn next_count(mean: u64) -> i64 {
    let r = xorshift();
    // A uniform in (0, 1]: 53 random bits, never 0.
    let u = ((r >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
    let n = -u.ln() * mean as f64;
    n.min((i64::MAX / 2) as f64) as i64
}

fn xorshift() -> u64 {
    let mut x = RNG.get();
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    RNG.set(x);
    x
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How many blocks one sampled block of `size` bytes stands for, sampling
/// one allocation per `mean` bytes: the inverse of its probability of
/// being sampled, `1 / (1 - exp(-size / mean))` (1 when `mean` is 0).
///
/// ```
/// use callstack::alloc::sample::weight;
/// assert_eq!(weight(0, 100), 1.0);
/// // A 4 KiB block at one sample per 512 KiB stands for about 128.5.
/// assert!((weight(512 * 1024, 4096) - 128.5).abs() < 0.01);
/// // A block far larger than the mean stands for itself.
/// assert_eq!(weight(4096, 1 << 20), 1.0);
/// ```
pub fn weight(mean: u64, size: u64) -> f64 {
    if mean == 0 || size == 0 {
        // Size 0 is never sampled (probability 0): itself if it ever is.
        return 1.0;
    }
    // exp_m1 keeps small size/mean exact.
    1.0 / -(-(size as f64 / mean as f64)).exp_m1()
}

/// The bytes one sampled block of `size` bytes stands for: `size` times
/// its [`weight`], rounded.
pub fn estimated_bytes(mean: u64, size: u64) -> u64 {
    (size as f64 * weight(mean, size))
        .round()
        .min(u64::MAX as f64) as u64
}

/// The blocks one sampled block of `size` bytes stands for, as a whole
/// number: its [`weight`] rounded down, or up when `round_up`. Drawing
/// `round_up` with [`draw_round_up`] (true with the probability of the
/// weight's fraction) makes the count unbiased; a recorder keeps the draw
/// with the block so that its free counts the same.
pub fn estimated_blocks(mean: u64, size: u64, round_up: bool) -> u64 {
    let w = weight(mean, size);
    let whole = w.floor().min(u64::MAX as f64) as u64;
    if round_up && w > w.floor() {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// Whether a sampled block of `size` bytes rounds its count up: true with
/// the probability of the fraction of its [`weight`], from this thread's
/// generator. Allocation-free.
pub fn draw_round_up(mean: u64, size: u64) -> bool {
    let w = weight(mean, size);
    let frac = w - w.floor();
    if frac == 0.0 {
        return false;
    }
    if RNG.get() == 0 {
        seed();
    }
    let u = (xorshift() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    u < frac
}

/// Counts of sampled live blocks per bucket of addresses, with a tag of
/// the blocks' addresses, shared by every sampled recorder of the process:
/// a free whose bucket is empty, or holds only blocks of another tag,
/// needs no look into the live table.
///
/// A bucket is 16 bits: the count of its blocks (7 bits), whether they
/// have more than one tag (1 bit) and the tag of the first (8 bits, a hash
/// of the address's 1 MiB window, the part the bucket's number does not
/// pin down). A free of a block not sampled reads the live table only when
/// its bucket holds a block of its tag: at one sample per 16 KiB on a
/// 100 MB heap (6000 sampled blocks live, 9% of the buckets in use), one
/// free in 200 rather than one in 11 with a count alone, and each of those
/// reads was a cache miss (the largest cost of sampled tracking on
/// python3). A bucket whose count reaches 127 stays there (its frees
/// always look); a bucket's "more than one tag" clears when it empties.
pub mod filter {
    use std::sync::atomic::{AtomicU16, Ordering::Relaxed};

    const BITS: u32 = 16;
    static BUCKETS: [AtomicU16; 1 << BITS] = [const { AtomicU16::new(0) }; 1 << BITS];

    // Bits 0-7: the tag; 8-14: the count; 15: more than one tag.
    const TAG: u16 = 0xff;
    const COUNT_SHIFT: u32 = 8;
    const ONE: u16 = 1 << COUNT_SHIFT;
    const FULL: u16 = 0x7f;
    const MIXED: u16 = 0x8000;

    /// The bucket of `ptr`: its 16-byte granule within its 1 MiB window,
    /// the window's number folded in. Not a hash: the frees of nearby
    /// blocks (most frees: a program frees what it allocated lately, and
    /// allocators hand out neighbouring blocks) read the same cache line
    /// of the filter, where a hash sent each to a line of its own, a
    /// cache miss on most frees of a large program (half the cost of a
    /// free not sampled, on cc1). Page-aligned blocks still spread: the
    /// fold moves their buckets with every window.
    #[inline(always)]
    fn bucket(ptr: usize) -> &'static AtomicU16 {
        &BUCKETS[index(ptr)]
    }

    #[inline(always)]
    pub(super) fn index(ptr: usize) -> usize {
        let p = ptr as u64;
        (((p >> 4) ^ (p >> (4 + BITS))) & ((1 << BITS) - 1)) as usize
    }

    /// The tag of `ptr`: 8 bits of a hash of its 1 MiB window. Two blocks
    /// of one bucket lie at the same granule of different windows (the
    /// bucket's number is the granule with the window folded in), so the
    /// window tells them apart.
    #[inline(always)]
    pub(super) fn tag(ptr: usize) -> u16 {
        (((ptr as u64) >> 20).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u16
    }

    #[inline(always)]
    fn count(b: u16) -> u16 {
        (b >> COUNT_SHIFT) & FULL
    }

    /// A sampled block now lives at `ptr`.
    #[inline]
    pub fn insert(ptr: usize) {
        let t = tag(ptr);
        let _ = bucket(ptr).fetch_update(Relaxed, Relaxed, |b| match count(b) {
            0 => Some(ONE | t),
            // Full: the count stays, and every free looks from now on (a
            // block of another tag may be among those not counted).
            FULL => (b & MIXED == 0).then_some(b | MIXED),
            _ if b & TAG == t => Some(b + ONE),
            _ => Some((b + ONE) | MIXED),
        });
    }

    /// Whether a sampled block may live at `ptr` (false: surely none).
    #[inline(always)]
    pub fn may_hold(ptr: usize) -> bool {
        let b = bucket(ptr).load(Relaxed);
        count(b) != 0 && (b & MIXED != 0 || b & TAG == tag(ptr))
    }

    /// The sampled block at `ptr` is gone.
    #[inline]
    pub fn remove(ptr: usize) {
        let _ = bucket(ptr).fetch_update(Relaxed, Relaxed, |b| match count(b) {
            0 | FULL => None,
            1 => Some(0),
            _ => Some(b - ONE),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over many allocations of mixed sizes, the estimates add up to the
    /// true totals within a few percent.
    #[test]
    fn estimates_are_unbiased_over_mixed_sizes() {
        let mean = 8 * 1024;
        let sizes = [16usize, 48, 200, 1000, 4096, 65536, 300_000];
        let (mut true_n, mut true_b) = ([0u64; 7], [0u64; 7]);
        let (mut est_n, mut est_b) = ([0u64; 7], [0u64; 7]);
        for i in 0..2_000_000usize {
            let k = (i * 7 + i / 3) % sizes.len();
            let s = sizes[k];
            true_n[k] += 1;
            true_b[k] += s as u64;
            if take_sample(mean, s) {
                let up = draw_round_up(mean, s as u64);
                est_n[k] += estimated_blocks(mean, s as u64, up);
                est_b[k] += estimated_bytes(mean, s as u64);
            }
        }
        for k in 0..sizes.len() {
            // The estimate's relative spread is about 1/sqrt(samples) for
            // sizes well under the mean: allow five times that.
            let p = 1.0 - (-(sizes[k] as f64) / mean as f64).exp();
            let tol = 5.0 * ((1.0 - p) / (true_n[k] as f64 * p)).sqrt() + 0.005;
            let eb = est_b[k] as f64 / true_b[k] as f64;
            let en = est_n[k] as f64 / true_n[k] as f64;
            assert!(
                (eb - 1.0).abs() < tol,
                "size {}: bytes ratio {eb} (tolerance {tol})",
                sizes[k]
            );
            assert!(
                (en - 1.0).abs() < tol,
                "size {}: count ratio {en} (tolerance {tol})",
                sizes[k]
            );
        }
    }

    /// About one sample per `mean` bytes.
    #[test]
    fn samples_come_once_per_mean_bytes() {
        let mean = 4096;
        let mut n = 0;
        for _ in 0..1_000_000 {
            n += take_sample(mean, 64) as u32;
        }
        // 64 MB / 4 KiB = 15 625 expected (each with p = 1 - e^(-1/64)).
        assert!((15_000..16_300).contains(&n), "{n} samples");
    }

    /// Neighbouring blocks' buckets are neighbours (one cache line of
    /// counts for 1 KiB of heap), each block of a window its own bucket,
    /// and page-aligned blocks (large ones) do not all share a few.
    #[test]
    fn nearby_blocks_share_a_line_of_the_filter() {
        let base = 0x5555_5570_0000usize;
        let lines: std::collections::HashSet<usize> =
            (0..64).map(|k| filter::index(base + 16 * k) / 64).collect();
        assert_eq!(lines.len(), 1);
        let window: std::collections::HashSet<usize> =
            (0..1 << 16).map(|k| filter::index(base + 16 * k)).collect();
        assert_eq!(window.len(), 1 << 16);
        let pages: std::collections::HashSet<usize> = (0..4096)
            .map(|k| filter::index(0x7f00_0000_0000 + (k << 12) + 16))
            .collect();
        assert!(pages.len() >= 4000, "{}", pages.len());
    }

    #[test]
    fn the_filter_counts_blocks_per_bucket() {
        let p = 0xdead_0000usize;
        assert!(!filter::may_hold(p));
        filter::insert(p);
        filter::insert(p);
        assert!(filter::may_hold(p));
        filter::remove(p);
        assert!(filter::may_hold(p));
        filter::remove(p);
        assert!(!filter::may_hold(p));
    }

    /// Blocks of one bucket and another window: told apart by their tag
    /// while the bucket holds one tag; every block of the bucket looks
    /// once it holds two, until it empties.
    #[test]
    fn the_filter_tells_windows_apart() {
        // Same bucket: the granule moves with the window's low bits.
        let a = 0x7100_0000_0000usize + 0x340;
        let w = 1usize << 20;
        // Blocks of other windows in a's bucket: the granule that, folded
        // with the window's number, gives a's bucket.
        let others: Vec<usize> = (1..64usize)
            .map(|k| {
                let win = (a + k * w) >> 20;
                let gran = (filter::index(a) ^ win) & 0xffff;
                (win << 20) | (gran << 4)
            })
            .collect();
        for &o in &others {
            assert_eq!(filter::index(o), filter::index(a));
        }
        let b = *others
            .iter()
            .find(|&&o| filter::tag(o) != filter::tag(a))
            .unwrap();
        assert!(!filter::may_hold(a) && !filter::may_hold(b));
        filter::insert(a);
        assert!(filter::may_hold(a));
        assert!(
            !filter::may_hold(b),
            "another window's block is not looked for"
        );
        filter::insert(b);
        assert!(filter::may_hold(a) && filter::may_hold(b));
        let c = *others.iter().find(|&&o| o != b).unwrap();
        assert!(filter::may_hold(c), "two tags: every block looks");
        filter::remove(a);
        assert!(filter::may_hold(b));
        filter::remove(b);
        assert!(!filter::may_hold(a) && !filter::may_hold(b) && !filter::may_hold(c));
        filter::insert(c);
        assert!(filter::may_hold(c) && (filter::tag(a) == filter::tag(c) || !filter::may_hold(a)));
        filter::remove(c);

        // A full bucket: an insert of another tag makes every free look.
        let d = 0x7200_0000_0000usize + 0x560;
        for _ in 0..200 {
            filter::insert(d);
        }
        let e = (1..64usize)
            .map(|k| {
                let win = (d + k * w) >> 20;
                (win << 20) | ((filter::index(d) ^ win) & 0xffff) << 4
            })
            .find(|&o| filter::tag(o) != filter::tag(d))
            .unwrap();
        assert_eq!(filter::index(e), filter::index(d));
        filter::insert(e);
        assert!(
            filter::may_hold(e),
            "a full bucket cannot count e: it must look"
        );
    }
}
