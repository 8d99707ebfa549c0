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
/// The tests that call through a library share `QUERY`: one at a time.
static LIBRARY_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

extern "C" fn callback(x: i32) -> i32 {
    // SAFETY: set before the call; the tests that set it run one at a time.
    let q = unsafe { QUERY.unwrap() };
    if called_from(q) {
        x
    } else {
        -1000
    }
}

#[test]
fn through_a_shared_library() {
    let _one_at_a_time = LIBRARY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
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

/// A library unloaded and another loaded at the same place, with the same
/// code under other names: the verdicts cached for the first must not
/// answer for the second.
#[test]
fn after_dlclose_a_library_at_the_same_place_gets_its_own_verdicts() {
    let _one_at_a_time = LIBRARY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("called-from-dlclose");
    let build = |name: &str, defs: &str| {
        let so = Gcc::new(&["sym_lib.c"])
            .flags(&format!("-O2 -fPIC -shared -fno-omit-frame-pointer {defs}"))
            .build(&dir.join(name));
        std::ffi::CString::new(so.to_str().unwrap()).unwrap()
    };
    let a = build("libcf_dl_a.so", "");
    let b = build(
        "libcf_dl_b.so",
        "-Dsym_lib_apply=other_apply -Dsym_lib_twice=other_twice",
    );
    // SAFETY: dlopen/dlsym/dladdr/dlclose of libraries we just built; the
    // entry is called with the signature it defines, only while loaded.
    let load = |path: &std::ffi::CStr, entry: &std::ffi::CStr| unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null());
        let f = libc::dlsym(h, entry.as_ptr());
        assert!(!f.is_null());
        let mut info: libc::Dl_info = std::mem::zeroed();
        assert_ne!(libc::dladdr(f, &mut info), 0);
        let twice: extern "C" fn(Cb, i32) -> i32 = std::mem::transmute(f);
        (h, twice, info.dli_fbase as usize)
    };
    let run = |twice: extern "C" fn(Cb, i32) -> i32, q: &'static str| {
        // SAFETY: see `callback`.
        unsafe { QUERY = Some(q) };
        twice(callback, 1) != (-1000 + 1) * 2
    };
    let (ha, twice_a, base_a) = load(&a, c"sym_lib_twice");
    assert!(run(twice_a, "sym_lib_apply"));
    assert!(!run(twice_a, "other_apply"));
    // SAFETY: nothing of the library is used after this.
    unsafe { libc::dlclose(ha) };
    let (_hb, twice_b, base_b) = load(&b, c"other_twice");
    if base_a != base_b {
        eprintln!("skipped: the second library was loaded elsewhere ({base_a:#x} / {base_b:#x})");
        return;
    }
    assert!(
        !run(twice_b, "sym_lib_apply"),
        "a verdict of the unloaded library"
    );
    assert!(run(twice_b, "other_apply"));
}
