//! The first capture of a process through frames too big for the packed
//! rule (their rules take wide-rule slots, which the first capture keeps on
//! its state page until the cache goes live): the next captures, through
//! the warm loop, give the same frames. Its own test binary, so that the
//! capture here is the process's first.

use std::ffi::{c_void, CString};
use testsupport::{scratch_dir, Gcc};

type BigFn = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void);

extern "C" fn capture_three(arg: *mut c_void) {
    // SAFETY: `arg` is the `Vec` the test passes.
    let out = unsafe { &mut *(arg as *mut Vec<Vec<usize>>) };
    for _ in 0..3 {
        let mut buf = [0usize; 128];
        let n = callstack::capture_exact(0, &mut buf);
        out.push(buf[..n].to_vec());
    }
}

#[test]
fn the_first_capture_through_big_frames_equals_the_warm_ones() {
    let dir = scratch_dir("exact-first");
    let so = Gcc::new(&["big_frames.c"])
        .flags("-O2 -fomit-frame-pointer -shared -fPIC")
        .build(&dir.join("libbig_frames.so"));
    let path = CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: loading a library we just built; `big_70k` has `BigFn`'s type.
    let big: BigFn = unsafe {
        let lib = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        assert!(!lib.is_null());
        let f = libc::dlsym(lib, c"big_70k".as_ptr());
        assert!(!f.is_null());
        std::mem::transmute::<*mut c_void, BigFn>(f)
    };
    let caps = std::thread::Builder::new()
        .stack_size(4 << 20)
        .spawn(move || {
            let mut c: Vec<Vec<usize>> = Vec::new();
            // SAFETY: the callback and its argument match `big_70k`'s use.
            unsafe { big(capture_three, &mut c as *mut _ as *mut c_void) };
            c
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(caps.len(), 3);
    // The exported name before each return address (the loader's own
    // lookup, so that this test needs no `symbolize` feature).
    let names: Vec<String> = caps[0]
        .iter()
        .map(|&a| {
            // SAFETY: `dladdr` only reads loader state; `info` is written.
            let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
            let found = unsafe { libc::dladdr((a - 1) as *const c_void, &mut info) } != 0;
            if !found || info.dli_sname.is_null() {
                return "??".to_string();
            }
            // SAFETY: a NUL-terminated name of the loaded object.
            unsafe { std::ffi::CStr::from_ptr(info.dli_sname) }
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let at = names
        .iter()
        .position(|n| n == "big_8k")
        .unwrap_or_else(|| panic!("no big_8k in {names:?}"));
    assert_eq!(names[at + 1], "big_70k", "{names:?}");
    assert!(
        names.len() > at + 3,
        "the walk stopped at the big frames: {names:?}"
    );
    // The three captures are made from one call site: equal frame for frame.
    assert_eq!(caps[0], caps[1], "first and second capture");
    assert_eq!(caps[1], caps[2], "second and third capture");
}
