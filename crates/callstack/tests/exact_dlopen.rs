//! dlopen a library, capture through it, dlclose it, capture again.

// The statics are reached through raw pointers (`&mut *(&raw mut X)`), as
// references to a `static mut` may not be made directly.
#![allow(clippy::deref_addrof)]

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
/// The tests run one at a time: they share `FRAMES`, and each loads and
/// unloads libraries without `prepare()` in between on purpose, which is
/// only defined for captures that do not race another thread's
/// `dlclose` (see `callstack::prepare`).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
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
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
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

fn lib_base(lib: *mut libc::c_void) -> usize {
    // SAFETY: `dl_outer` is a symbol of the library; dladdr fills `info`.
    unsafe {
        let f = libc::dlsym(lib, c"dl_outer".as_ptr());
        let mut info: libc::Dl_info = std::mem::zeroed();
        assert_ne!(libc::dladdr(f, &mut info), 0);
        info.dli_fbase as usize
    }
}

/// Tables published with library A, A unloaded without `prepare()`, then B
/// (the same code with another frame size, so other rules) loaded, most
/// likely at A's addresses: captures through B must not use A's rules.
#[test]
fn dlclose_then_another_library_without_prepare() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !callstack::has_dl_find_object() {
        eprintln!("no _dl_find_object: prepare() after dlclose is required");
        return;
    }
    let dir = scratch_dir("exact-dl-reuse");
    let build = |pad: u32, name: &str| {
        let so = Gcc::new(&["exact_dl.c"])
            .flags(&format!(
                "-O2 -fomit-frame-pointer -shared -fPIC -DPAD={pad}"
            ))
            .build(&dir.join(name));
        CString::new(so.to_str().unwrap()).unwrap()
    };
    let a = build(24, "libexact_dl_a.so");
    let b = build(4000, "libexact_dl_b.so");
    let check = |frames: &[Frame], name: &str, what: &str| {
        let in_lib: Vec<usize> = frames
            .iter()
            .enumerate()
            .filter(|(_, f)| module_of(f.pc - 1).ends_with(name))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(in_lib.len(), 2, "{what}: {frames:#x?}");
        assert_eq!(in_lib[1], in_lib[0] + 1, "{what}: {frames:#x?}");
        assert!(
            frames.len() > in_lib[1] + 3,
            "{what}: the walk stopped in the library"
        );
        // The frames after the library's are this test's own.
        assert!(
            module_of(frames[in_lib[1] + 1].pc - 1).contains("exact_dlopen"),
            "{what}: {frames:#x?}"
        );
    };
    // SAFETY: loading libraries we just built; no code of A runs after its
    // dlclose.
    unsafe {
        let la = libc::dlopen(a.as_ptr(), libc::RTLD_NOW);
        assert!(!la.is_null());
        callstack::prepare();
        let base_a = lib_base(la);
        for _ in 0..2 {
            check(&call_through(la), "libexact_dl_a.so", "A");
        }
        assert_eq!(libc::dlclose(la), 0);
        let lb = libc::dlopen(b.as_ptr(), libc::RTLD_NOW);
        assert!(!lb.is_null());
        eprintln!(
            "B loaded {} A's address",
            if lib_base(lb) == base_a {
                "at"
            } else {
                "away from"
            }
        );
        for round in 0..3 {
            check(
                &call_through(lb),
                "libexact_dl_b.so",
                &format!("B, round {round}"),
            );
        }
        assert_eq!(libc::dlclose(lb), 0);
    }
    callstack::prepare();
}
