//! `capture_fast` and `capture_exact` through C code whose only unwind
//! information is its frame records: a library built by the (cross) gcc
//! with `-O2 -fno-omit-frame-pointer` and no unwind tables. The records are
//! where the compiler puts them on each architecture (on RISC-V just below
//! the frame pointer, which points at the CFA), so the chains name the C
//! frames exactly: `cb`, `dl_inner`, `dl_outer`, `call_through`.

#![allow(clippy::deref_addrof)]

use testsupport::{scratch_dir, Gcc};

/// Which capture the callback takes.
static EXACT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static mut OUT: [usize; 64] = [0; 64];
static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn cb() {
    // SAFETY: one capture at a time (the tests hold `SERIAL`).
    let out = unsafe { &mut *(&raw mut OUT) };
    let n = if EXACT.load(std::sync::atomic::Ordering::SeqCst) {
        callstack::capture_exact(0, out)
    } else {
        callstack::capture_fast(0, out)
    };
    N.store(n, std::sync::atomic::Ordering::SeqCst);
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The name of the function holding return address `pc`.
fn name(pc: usize) -> String {
    // The library's exported functions by `dladdr` (backtrace's list of
    // modules may predate the `dlopen`), this test's by backtrace.
    // SAFETY: dladdr fills `info` for any address.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr((pc - 1) as *const libc::c_void, &mut info) != 0
            && !info.dli_sname.is_null()
            && !info.dli_fname.is_null()
            && std::ffi::CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .contains("libfp_")
        {
            return std::ffi::CStr::from_ptr(info.dli_sname)
                .to_string_lossy()
                .into_owned();
        }
    }
    let mut name = format!("{pc:#x}");
    backtrace::resolve(pc as *mut _, |s| {
        if let Some(n) = s.name() {
            name = n.to_string();
        }
    });
    // Rust names end in a hash (`::h0123...`).
    match name.rfind("::h") {
        Some(i) if name.len() - i == 19 => name[..i].to_string(),
        _ => name,
    }
}

#[inline(never)]
fn call_through(lib: *mut libc::c_void) -> Vec<String> {
    // SAFETY: `dl_outer` has the C signature `void(void(*)(void))`.
    unsafe {
        let f = libc::dlsym(lib, c"dl_outer".as_ptr());
        assert!(!f.is_null());
        let f: extern "C" fn(extern "C" fn()) = std::mem::transmute(f);
        f(cb);
    }
    let n = N.load(std::sync::atomic::Ordering::SeqCst);
    // SAFETY: written by `cb` above, on this thread.
    let out = unsafe { &*(&raw const OUT) };
    std::hint::black_box(out[..n].iter().map(|&pc| name(pc)).collect())
}

fn chain(exact: bool) -> Vec<String> {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("c-frame-records");
    let so = Gcc::new(&["exact_dl.c"])
        .flags("-O2 -fno-omit-frame-pointer -fno-asynchronous-unwind-tables -fno-unwind-tables -shared -fPIC")
        .build(&dir.join(format!("libfp_{exact}.so")));
    let path = std::ffi::CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: loading a library we just built.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    assert!(!lib.is_null());
    EXACT.store(exact, std::sync::atomic::Ordering::SeqCst);
    call_through(lib)
}

const WANT: [&str; 4] = [
    "c_frame_records::cb",
    "dl_inner",
    "dl_outer",
    "c_frame_records::call_through",
];

#[test]
fn capture_fast_walks_the_c_frame_records() {
    let names = chain(false);
    assert!(names.len() > WANT.len(), "{names:?}");
    assert_eq!(&names[..WANT.len()], &WANT, "{names:?}");
}

#[test]
fn capture_exact_takes_the_c_frame_records_where_there_is_no_cfi() {
    let names = chain(true);
    assert!(names.len() > WANT.len(), "{names:?}");
    assert_eq!(&names[..WANT.len()], &WANT, "{names:?}");
    assert_eq!(
        names
            .iter()
            .filter(|n| n.as_str() == "c_frame_records::chain")
            .count(),
        1,
        "{names:?}"
    );
}
