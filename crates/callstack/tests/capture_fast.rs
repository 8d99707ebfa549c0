//! `capture_fast` and `Trace` in a Rust program: exact frame counts, the
//! `skip`/`out` contract, the chain checked against binutils addr2line, 16
//! threads at once, and crafted corrupt frame chains that must end the walk
//! without a fault.
use callstack::{capture_fast, Trace};
use std::hint::black_box;
use std::sync::{Arc, Barrier};

mod sym {
    //! Symbolization of this test's own addresses with binutils addr2line.

    /// Load address of the module holding `addr`, from `dladdr`.
    pub fn module_base(addr: usize) -> Option<usize> {
        // SAFETY: Dl_info is plain data; dladdr only fills it.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr reads no memory at `addr`, it only looks it up.
        if unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } == 0 {
            return None;
        }
        Some(info.dli_fbase as usize)
    }

    /// Function names of return addresses inside this executable, by
    /// addr2line at `ra - 1 - load base`; `None` for addresses elsewhere.
    /// The name is that of the function whose frame holds the address (the
    /// outermost of an inlined chain: `capture_fast` itself is inlined).
    pub fn names(addrs: &[usize]) -> Vec<Option<String>> {
        let exe_base = module_base(names as *const () as usize).unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let inside: Vec<bool> = addrs
            .iter()
            .map(|&a| module_base(a - 1) == Some(exe_base))
            .collect();
        let offsets: Vec<u64> = addrs
            .iter()
            .zip(&inside)
            .filter(|(_, &i)| i)
            .map(|(&a, _)| (a - 1 - exe_base) as u64)
            .collect();
        let mut found = testsupport::addr2line_inlined(&exe, &offsets)
            .into_iter()
            .map(|chain| chain.last().cloned().unwrap_or_default());
        inside
            .iter()
            .map(|&i| if i { found.next() } else { None })
            .collect()
    }

    /// The last `::` component of a demangled name (`capture_fast::chain_a`
    /// -> `chain_a`).
    pub fn short(name: &Option<String>) -> &str {
        name.as_deref()
            .map(|n| n.rsplit("::").next().unwrap())
            .unwrap_or("?")
    }
}

/// `n` frames of itself, then a capture into `out` (not a tail call).
#[inline(never)]
fn recurse(n: usize, skip: usize, out: &mut [usize]) -> usize {
    let r = if n <= 1 {
        capture_fast(skip, out)
    } else {
        recurse(black_box(n - 1), skip, out)
    };
    black_box(r)
}

#[test]
fn depth_1_to_200_gives_depth_plus_a_fixed_k() {
    let mut out = [0usize; 512];
    let k = recurse(1, 0, &mut out) - 1;
    assert!(k >= 1, "nothing below the recursion");
    let mut inner = Vec::new();
    for depth in 1..=200 {
        let n = recurse(depth, 0, &mut out);
        assert_eq!(n, depth + k, "depth {depth}");
        // Every entry is a real return address in a loaded module.
        for &a in &out[..n] {
            assert!(sym::module_base(a - 1).is_some(), "garbage {a:#x}");
        }
        // The innermost `depth` entries are the recursion (checked below).
        inner.extend_from_slice(&out[..depth.min(3)]);
    }
    let names = sym::names(&inner);
    assert!(
        names.iter().all(|n| sym::short(n) == "recurse"),
        "{names:?}"
    );
}

#[inline(never)]
fn probe(skip: usize, out: &mut [usize]) -> usize {
    black_box(capture_fast(skip, out))
}

#[test]
fn out0_is_inside_the_caller_and_skip_drops_more() {
    let mut all = [0usize; 256];
    let mut runs = vec![[0usize; 256]; 8];
    let mut counts = [0usize; 8];
    for (s, run) in runs.iter_mut().enumerate() {
        // One call site for every skip, so the chains share their frames.
        counts[s] = probe(s, run);
    }
    all.copy_from_slice(&runs[0]);
    let n = counts[0];
    let names = sym::names(&all[..2]);
    assert_eq!(sym::short(&names[0]), "probe", "{names:?}");
    assert_eq!(
        sym::short(&names[1]),
        "out0_is_inside_the_caller_and_skip_drops_more",
        "{names:?}"
    );
    for s in 1..8 {
        assert_eq!(counts[s], n - s, "skip {s}");
        assert_eq!(runs[s][..counts[s]], all[s..n], "skip {s}");
    }
    // Skipping everything, or more, returns 0.
    let mut out = [0usize; 256];
    assert_eq!(probe(n, &mut out), 0);
    assert_eq!(probe(n + 10, &mut out), 0);
    assert_eq!(probe(usize::MAX, &mut out), 0);
}

#[test]
fn a_short_out_gets_the_innermost_frames() {
    let mut full = [0usize; 256];
    let mut bufs = vec![[0usize; 256]; 0];
    let mut counts = Vec::new();
    let n = probe(0, &mut full);
    for len in 0..n + 3 {
        let mut b = [0usize; 256];
        counts.push(probe(0, &mut b[..len]));
        // Nothing written past `len`.
        assert!(b[len..].iter().all(|&x| x == 0), "wrote past {len}");
        bufs.push(b);
    }
    for (len, (&c, b)) in counts.iter().zip(&bufs).enumerate() {
        assert_eq!(c, len.min(n), "len {len}");
        // Same call site as `full` except for frame 1 (the loop's call).
        if c > 0 {
            assert_eq!(sym::short(&sym::names(&b[..1])[0]), "probe");
        }
        if c > 2 {
            assert_eq!(b[2..c], full[2..c]);
        }
    }
}

#[inline(never)]
fn chain_a(out: &mut [usize]) -> usize {
    black_box(chain_b(out))
}
#[inline(never)]
fn chain_b(out: &mut [usize]) -> usize {
    let pad = black_box([1u8; 100]);
    black_box(chain_c(out)) + pad[3] as usize - 1
}
#[inline(never)]
fn chain_c(out: &mut [usize]) -> usize {
    // Called through a function pointer.
    let d: fn(&mut [usize]) -> usize = black_box(chain_d);
    black_box(d(out))
}
#[inline(never)]
fn chain_d(out: &mut [usize]) -> usize {
    black_box(capture_fast(0, out))
}

#[test]
fn rust_chain_matches_addr2line() {
    let mut out = [0usize; 128];
    let n = chain_a(&mut out);
    let names = sym::names(&out[..n]);
    let short: Vec<&str> = names.iter().take(5).map(sym::short).collect();
    assert_eq!(
        short,
        [
            "chain_d",
            "chain_c",
            "chain_b",
            "chain_a",
            "rust_chain_matches_addr2line"
        ],
        "{names:?}"
    );
}

#[test]
fn trace_capture_iter_hash() {
    #[inline(never)]
    fn at_one_site() -> Trace<64> {
        Trace::<64>::capture_fast(0)
    }
    let mut t = Vec::new();
    for _ in 0..3 {
        t.push(at_one_site());
    }
    assert!(!t[0].is_empty());
    assert_eq!(t[0], t[1]);
    assert_eq!(t[0].hash(), t[1].hash());
    assert_eq!(t[0].hash(), callstack::hash_frames(t[0].as_slice()));
    assert_eq!(t[0].iter().collect::<Vec<_>>(), t[0].as_slice());
    assert_eq!((&t[0]).into_iter().count(), t[0].len());
    assert_eq!(
        sym::short(&sym::names(&t[0].as_slice()[..1])[0]),
        "at_one_site"
    );
    // Another call site: another trace, another hash.
    let other = at_one_site();
    assert_ne!(other, t[0]);
    assert_ne!(other.hash(), t[0].hash());
    assert_eq!(other.as_slice()[0], t[0].as_slice()[0]);
    assert_ne!(other.as_slice()[1], t[0].as_slice()[1]);
    assert_eq!(other.as_slice()[2..], t[0].as_slice()[2..]);
    // A small trace keeps the innermost frames.
    #[inline(never)]
    fn small() -> (Trace<3>, Trace<64>) {
        (Trace::<3>::capture_fast(0), Trace::<64>::capture_fast(0))
    }
    let (s, big) = small();
    assert_eq!(s.len(), 3);
    assert_eq!(s.as_slice()[1..], big.as_slice()[1..3]);
    // skip through Trace.
    #[inline(never)]
    fn skipped() -> Trace<64> {
        Trace::<64>::capture_fast(1)
    }
    let sk = skipped();
    assert_eq!(
        sym::short(&sym::names(&sk.as_slice()[..1])[0]),
        "trace_capture_iter_hash"
    );
    assert_eq!(Trace::<8>::from_frames(&[1, 2, 3]).as_slice(), &[1, 2, 3]);
    assert_eq!(Trace::<2>::from_frames(&[1, 2, 3]).as_slice(), &[1, 2]);
    assert!(Trace::<4>::new().is_empty());
}

#[test]
fn sixteen_threads_capture_at_once() {
    let barrier = Arc::new(Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut out = [0usize; 256];
                barrier.wait();
                // The first capture on a fresh thread, all at once.
                let depth = 5 + i * 3;
                let first = recurse(depth, 0, &mut out);
                let k = recurse(1, 0, &mut out) - 1;
                assert_eq!(first, depth + k, "thread {i}");
                for round in 0..2000 {
                    let d = 1 + (i * 7 + round) % 60;
                    let n = recurse(d, 0, &mut out);
                    assert_eq!(n, d + k, "thread {i} depth {d}");
                }
                k
            })
        })
        .collect();
    let ks: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // Every spawned thread has the same frames below its closure.
    assert!(ks.iter().all(|&k| k == ks[0]), "{ks:?}");
}

#[cfg(target_arch = "x86_64")]
mod corrupt {
    //! Captures with a crafted frame chain: a naked helper points rbp at a
    //! fake frame record (in this test's stack frame, or anywhere) and calls
    //! the capture. The capture's first frame is inside the helper; the walk
    //! then follows the crafted record.
    use super::*;

    /// Calls the capture with `rbp = fp`; returns what it wrote to `out`.
    #[unsafe(naked)]
    unsafe extern "C" fn capture_with_fp(fp: usize, max: u32, out: *mut usize) -> u32 {
        // SAFETY: saves rbp, loads the crafted one, calls the capture with
        // skip = 0 (edi), max (esi) and out (rdx) as passed, restores rbp.
        // rsp is 16-byte aligned at the call (8 for our return address, 8
        // for the pushed rbp).
        core::arch::naked_asm!(
            "push rbp",
            "mov rbp, rdi",
            "xor edi, edi",
            "call {capture}",
            "pop rbp",
            "ret",
            capture = sym callstack::__capture_fast_raw,
        )
    }

    /// Walks from the crafted `fp`; returns the entries after the helper's own.
    fn walk_from(fp: usize) -> Vec<usize> {
        let mut out = [0usize; 64];
        // SAFETY: `out` has 64 slots.
        let n = unsafe { capture_with_fp(black_box(fp), 64, out.as_mut_ptr()) } as usize;
        assert!(n >= 1, "the helper's own frame is always there");
        out[1..n].to_vec()
    }

    /// A return address for a crafted record: an address inside this test's
    /// code (the walk takes only return addresses in executable code).
    fn ra(k: usize) -> usize {
        walk_from as *const () as usize + k
    }

    /// A fake stack area in this thread's stack, above the helper's frame.
    #[repr(C, align(16))]
    struct Records([usize; 32]);

    impl Records {
        fn at(&self, i: usize) -> usize {
            &self.0[i] as *const usize as usize
        }
        fn set(&mut self, i: usize, next: usize, ra: usize) {
            self.0[i] = next;
            self.0[i + 1] = ra;
        }
    }

    #[test]
    fn a_crafted_good_chain_is_followed() {
        let mut r = Records([0; 32]);
        r.set(0, r.at(4), ra(1));
        r.set(4, r.at(8), ra(2));
        r.set(8, 0, ra(3));
        black_box(&mut r);
        assert_eq!(walk_from(r.at(0)), [ra(1), ra(2), ra(3)]);
    }

    #[test]
    fn garbage_saved_frame_pointer() {
        for garbage in [
            1usize,
            0xdead_beef,
            0x7fff_0000_0001,
            usize::MAX - 7,
            usize::MAX,
        ] {
            let mut r = Records([0; 32]);
            r.set(0, r.at(4), ra(1));
            r.set(4, garbage, ra(2));
            black_box(&mut r);
            assert_eq!(walk_from(r.at(0)), [ra(1), ra(2)], "{garbage:#x}");
            // The crafted fp itself garbage: only the helper's frame.
            assert!(walk_from(garbage).is_empty(), "{garbage:#x}");
        }
    }

    #[test]
    fn cycles() {
        let mut r = Records([0; 32]);
        r.set(0, r.at(0), ra(1));
        black_box(&mut r);
        assert_eq!(walk_from(r.at(0)), [ra(1)]);
        let mut r = Records([0; 32]);
        r.set(0, r.at(6), ra(1));
        r.set(6, r.at(0), ra(2));
        black_box(&mut r);
        assert_eq!(walk_from(r.at(0)), [ra(1), ra(2)]);
    }

    #[test]
    fn pointers_below_or_off_the_stack() {
        // The heap, a global, and this thread's stack below the capture.
        let heap = Box::new([0usize; 4]);
        static GLOBAL: [usize; 4] = [0; 4];
        let here = 0usize;
        let below = &here as *const usize as usize - 64 * 1024;
        for p in [
            &heap[0] as *const usize as usize,
            GLOBAL.as_ptr() as usize,
            below & !15,
        ] {
            assert!(walk_from(p).is_empty(), "{p:#x}");
            let mut r = Records([0; 32]);
            r.set(0, p, ra(1));
            black_box(&mut r);
            assert_eq!(walk_from(r.at(0)), [ra(1)], "{p:#x}");
        }
        // An unmapped page.
        // SAFETY: a fresh anonymous mapping, unmapped again at once; only
        // its address is kept.
        let page = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, 4096);
            p as usize
        };
        assert!(walk_from(page).is_empty());
        let mut r = Records([0; 32]);
        r.set(0, page, ra(1));
        black_box(&mut r);
        assert_eq!(walk_from(r.at(0)), [ra(1)]);
    }

    #[test]
    fn misaligned() {
        for off in 1..8 {
            let mut r = Records([0; 32]);
            r.set(0, r.at(4) + off, ra(1));
            r.set(4, 0, ra(2));
            black_box(&mut r);
            assert_eq!(walk_from(r.at(0)), [ra(1)], "offset {off}");
            assert!(walk_from(r.at(0) + off).is_empty());
        }
    }

    #[test]
    fn null_return_address() {
        let mut r = Records([0; 32]);
        r.set(0, r.at(4), ra(1));
        r.set(4, r.at(8), 0);
        r.set(8, 0, ra(3));
        black_box(&mut r);
        assert_eq!(walk_from(r.at(0)), [ra(1)]);
    }

    #[test]
    fn a_return_address_outside_code_ends_the_walk() {
        // What a frame without frame pointers leaves where a record would
        // be: heap pointers, small integers, stack addresses, data.
        static DATA: [usize; 2] = [0; 2];
        let heap = Box::new(0usize);
        let local = 0usize;
        for bad in [
            0x7fd9_8000_0002usize,
            2,
            &*heap as *const usize as usize,
            &local as *const usize as usize,
            DATA.as_ptr() as usize,
        ] {
            let mut r = Records([0; 32]);
            r.set(0, r.at(4), ra(1));
            r.set(4, r.at(8), bad);
            r.set(8, 0, ra(3));
            black_box(&mut r);
            if callstack::has_dl_find_object() {
                assert_eq!(walk_from(r.at(0)), [ra(1)], "{bad:#x}");
            }
        }
    }
}
