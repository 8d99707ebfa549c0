//! The stack hash: a fast 64-bit hash of a list of addresses, for grouping
//! identical stacks (the `BackTraceHash` of `RtlCaptureStackBackTrace`).

/// Hashes a list of frame addresses into 64 bits.
///
/// Deterministic (no random seed), so equal stacks hash equal within a
/// process; ASLR makes the same stack hash differently in another process.
/// About one multiply per frame; allocation-free and async-signal-safe.
///
/// ```
/// let a = [0x1000usize, 0x2000, 0x3000];
/// assert_eq!(callstack::hash_frames(&a), callstack::hash_frames(&a));
/// assert_ne!(callstack::hash_frames(&a), callstack::hash_frames(&a[..2]));
/// ```
#[inline]
pub fn hash_frames(frames: &[usize]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = K ^ (frames.len() as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
    for &f in frames {
        h = (h ^ f as u64).wrapping_mul(K).rotate_left(29);
    }
    // Final avalanche (the MurmurHash3 finalizer).
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::hash_frames;

    #[test]
    fn order_and_length_matter() {
        assert_ne!(hash_frames(&[1, 2]), hash_frames(&[2, 1]));
        assert_ne!(hash_frames(&[]), hash_frames(&[0]));
        assert_ne!(hash_frames(&[0]), hash_frames(&[0, 0]));
    }
}
