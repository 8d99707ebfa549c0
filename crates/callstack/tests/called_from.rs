//! `called_from` through several depths, an inlined frame and a shared
//! library (a C library built by gcc, loaded with dlopen, calling back).
#![cfg(feature = "symbolize")]

use callstack::{called_from, called_from_any};
use std::hint::black_box;
use testsupport::{scratch_dir, Gcc};

#[inline(never)]
fn level_a(depth: u32, q: &str) -> bool {
    black_box(level_b(depth, q))
}

#[inline(never)]
fn level_b(depth: u32, q: &str) -> bool {
    black_box(recurse(depth, q))
}

#[inline(never)]
fn recurse(depth: u32, q: &str) -> bool {
    if depth == 0 {
        black_box(called_from(q))
    } else {
        black_box(recurse(depth - 1, q))
    }
}

#[test]
fn through_several_depths() {
    for depth in [0, 3, 20] {
        assert!(level_a(depth, "called_from::level_a"), "depth {depth}");
        assert!(level_a(depth, "called_from::level_b"));
        assert!(level_a(depth, "called_from::recurse"));
        // A module path prefix.
        assert!(level_a(depth, "called_from"));
        assert!(!level_a(depth, "called_from::level_c"));
        assert!(!level_a(depth, "called_from::level")); // not a path prefix
        assert!(!level_a(depth, "some_other_crate::parser"));
    }
    // Repeat: cached verdicts give the same answers.
    for _ in 0..3 {
        assert!(level_a(5, "called_from::level_b"));
        assert!(!level_a(5, "called_from::nowhere"));
    }
}

#[inline(always)]
fn inlined_middle(q: &[&str]) -> bool {
    black_box(leaf_any(q))
}

#[inline(never)]
fn leaf_any(q: &[&str]) -> bool {
    black_box(called_from_any(q))
}

#[inline(never)]
fn outer_with_inlined(q: &[&str]) -> bool {
    black_box(inlined_middle(q))
}

#[test]
fn through_an_inlined_frame() {
    // `inlined_middle` has no frame of its own: only DWARF's inline info
    // knows that `outer_with_inlined` is inside it.
    assert!(outer_with_inlined(&["called_from::inlined_middle"]));
    assert!(outer_with_inlined(&[
        "nothing",
        "called_from::outer_with_inlined"
    ]));
    assert!(!outer_with_inlined(&[
        "nothing",
        "called_from::inlined_nowhere"
    ]));
    assert!(!outer_with_inlined(&[]));

    // Check that the frame really is inlined (no frame of its own).
    let mut frames = [0usize; 8];
    let n = outer_capture(&mut frames);
    assert!(n >= 2);
    let mut s = callstack::Symbolizer::new();
    let r = s.symbolize(callstack::symbolize::Address::Return(frames[1]));
    let names: Vec<_> = r
        .frames
        .iter()
        .map(|f| (f.function.as_deref().unwrap_or("??").to_string(), f.inlined))
        .collect();
    assert_eq!(
        names,
        [
            ("called_from::inlined_capture".to_string(), true),
            ("called_from::outer_capture".to_string(), false)
        ],
        "{r}"
    );
}

#[inline(never)]
fn leaf_capture(out: &mut [usize]) -> usize {
    callstack::capture_fast(0, out)
}

#[inline(always)]
fn inlined_capture(out: &mut [usize]) -> usize {
    black_box(leaf_capture(out))
}

#[inline(never)]
fn outer_capture(out: &mut [usize]) -> usize {
    black_box(inlined_capture(out))
}

type Cb = extern "C" fn(i32) -> i32;

static mut QUERY: Option<&'static str> = None;

extern "C" fn callback(x: i32) -> i32 {
    // SAFETY: set before the call, single-threaded within this test.
    let q = unsafe { QUERY.unwrap() };
    if called_from(q) {
        x
    } else {
        -1000
    }
}

#[test]
fn through_a_shared_library() {
    let dir = scratch_dir("called-from");
    let so = Gcc::new(&["sym_lib.c"])
        .flags("-O2 -fPIC -shared -fno-omit-frame-pointer")
        .build(&dir.join("libsym_lib_cf.so"));
    let path = std::ffi::CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: dlopen/dlsym of a library we just built, called with the
    // signature it defines.
    let twice: extern "C" fn(Cb, i32) -> i32 = unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null());
        let f = libc::dlsym(h, c"sym_lib_twice".as_ptr());
        assert!(!f.is_null());
        std::mem::transmute(f)
    };
    let run = |q: &'static str| {
        // SAFETY: see `callback`.
        unsafe { QUERY = Some(q) };
        twice(callback, 1) != (-1000 + 1) * 2
    };
    assert!(run("sym_lib_apply"));
    assert!(run("sym_lib_twice"));
    assert!(run("called_from::through_a_shared_library"));
    assert!(!run("sym_lib_exported"));
}
