//! dlopen a library, capture through it, dlclose it, capture again.

use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering};

use callstack::{Frame, Method, StopReason};
use testsupport::{scratch_dir, Gcc};

const EMPTY: Frame = Frame {
    pc: 0,
    sp: 0,
    fp: 0,
    method: Method::Cfi,
};

static mut FRAMES: [Frame; 128] = [EMPTY; 128];
static N: AtomicUsize = AtomicUsize::new(0);
static mut STOP: StopReason = StopReason::Running;

extern "C" fn cb() {
    // SAFETY: only this test's thread touches FRAMES and STOP, one call at a time.
    unsafe {
        let (n, stop) = callstack::capture_exact_with_info(0, &mut *(&raw mut FRAMES));
        STOP = stop;
        N.store(n, Ordering::SeqCst);
    }
}

fn module_of(pc: u64) -> String {
    // SAFETY: dladdr fills `info` for any address.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(pc as *const libc::c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return String::new();
        }
        std::ffi::CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned()
    }
}

#[inline(never)]
fn call_through(lib: *mut libc::c_void) -> Vec<Frame> {
    // SAFETY: `dl_outer` has the C signature `void(void(*)(void))`.
    unsafe {
        let f = libc::dlsym(lib, c"dl_outer".as_ptr());
        assert!(!f.is_null());
        let f: extern "C" fn(extern "C" fn()) = std::mem::transmute(f);
        f(cb);
        let n = N.load(Ordering::SeqCst);
        let frames = (&*(&raw const FRAMES))[..n].to_vec();
        let stop = *(&raw const STOP);
        assert_eq!(stop, StopReason::Outermost, "{frames:#x?}");
        frames
    }
}

#[test]
fn dlopen_capture_dlclose_capture() {
    let dir = scratch_dir("exact-dl");
    let so = Gcc::new(&["exact_dl.c"])
        .flags("-O2 -fomit-frame-pointer -shared -fPIC")
        .build(&dir.join("libexact_dl.so"));
    let path = CString::new(so.to_str().unwrap()).unwrap();
    for round in 0..2 {
        if round == 1 {
            // The second time with compiled tables published first.
            callstack::prepare();
        }
        // SAFETY: loading a library we just built.
        let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!lib.is_null());
        let frames = call_through(lib);
        let in_lib: Vec<usize> = frames
            .iter()
            .enumerate()
            .filter(|(_, f)| module_of(f.pc - 1).ends_with("libexact_dl.so"))
            .map(|(i, _)| i)
            .collect();
        // dl_inner and dl_outer, found by CFI, then back in this test.
        assert_eq!(in_lib.len(), 2, "round {round}: {frames:#x?}");
        assert!(frames[in_lib[0]..=in_lib[1]]
            .iter()
            .all(|f| f.method == Method::Cfi));
        assert!(
            frames.len() > in_lib[1] + 3,
            "round {round}: the walk stopped in the library"
        );
        // SAFETY: no code of the library runs any more.
        assert_eq!(unsafe { libc::dlclose(lib) }, 0);
        if round == 1 {
            callstack::prepare();
        }
        let mut out = [0usize; 128];
        let n = callstack::capture_exact(0, &mut out);
        assert!(n >= 3);
        assert!(out[..n]
            .iter()
            .all(|&pc| !module_of(pc as u64 - 1).ends_with("libexact_dl.so")));
    }
}
