//! Exact capture of Rust frames, compared with the frame-pointer walk.

#[inline(never)]
fn recurse(n: usize, out: &mut Vec<usize>, fast: &mut Vec<usize>) {
    if n == 0 {
        let mut buf = [0usize; 256];
        let k = callstack::capture_exact(0, &mut buf);
        out.extend_from_slice(&buf[..k]);
        let k = callstack::capture_fast(0, &mut buf);
        fast.extend_from_slice(&buf[..k]);
        return;
    }
    recurse(n - 1, out, fast);
    std::hint::black_box(n);
}

#[test]
fn exact_matches_fast_on_frame_pointer_code() {
    for prepared in [false, true] {
        if prepared {
            callstack::prepare();
        }
        let (mut e, mut f) = (Vec::new(), Vec::new());
        recurse(20, &mut e, &mut f);
        // The frame-pointer walk stops in std (no frame pointers); exact goes on.
        assert!(e.len() > f.len(), "exact {e:x?}\nfast {f:x?}");
        // Fast's first frames are exact's first frames (same call sites).
        assert_eq!(e[1..21], f[1..21], "exact {e:x?}\nfast {f:x?}");
    }
}
