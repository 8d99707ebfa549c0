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
        // On x86-64 the frame-pointer walk stops in std (built without frame
        // pointers); exact goes on. AArch64's std keeps its frame records.
        if cfg!(target_arch = "x86_64") {
            assert!(e.len() > f.len(), "exact {e:x?}\nfast {f:x?}");
        } else {
            assert!(e.len() >= f.len(), "exact {e:x?}\nfast {f:x?}");
        }
        // Fast's first frames are exact's first frames (same call sites).
        assert_eq!(e[1..21], f[1..21], "exact {e:x?}\nfast {f:x?}");
    }
}

#[inline(never)]
fn nest(n: usize, f: &mut dyn FnMut()) {
    if n == 0 {
        f();
    } else {
        nest(n - 1, f);
    }
    std::hint::black_box(n);
}

#[test]
fn skip_and_short_buffers_behave_like_capture_fast() {
    for prepared in [false, true] {
        if prepared {
            callstack::prepare();
        }
        nest(40, &mut || {
            let mut all = [0usize; 256];
            let n = callstack::capture_exact(0, &mut all);
            assert!(n > 45);
            for skip in [1usize, 5, 33, 40, 44] {
                let mut out = [0usize; 256];
                let k = callstack::capture_exact(skip, &mut out);
                assert_eq!(k, n - skip, "skip {skip}");
                // Entry 0 differs (another call site); the rest are the same frames.
                assert_eq!(out[1..k], all[skip + 1..n], "skip {skip}");
            }
            let mut short = [0usize; 7];
            assert_eq!(callstack::capture_exact(3, &mut short), 7);
            assert_eq!(short[1..], all[4..10]);
            assert_eq!(callstack::capture_exact(0, &mut []), 0);
            let t = callstack::Trace::<16>::capture_exact(0);
            assert_eq!(t.len(), 16);
            assert_eq!(t.as_slice()[1..], all[1..16]);
        });
    }
}
