//! In-process machine-code capture from a signal handler: the walk passes
//! `__restore_rt` (a signal frame) back into the code that raised.
#![cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]

use callstack::unwind::insn::{InProcess, Method};
use std::sync::OnceLock;

static SNAP: OnceLock<InProcess> = OnceLock::new();
static mut FRAMES: [(u64, Method); 64] = [(0, Method::Context); 64];
static mut N: usize = 0;

extern "C" fn handler(_: libc::c_int) {
    let snap = SNAP.get().unwrap();
    let mut out = [(0u64, Method::Context); 64];
    let n = snap.capture_with_methods(&mut out);
    // SAFETY: written only here, read after the handler returned.
    unsafe {
        FRAMES = out;
        N = n;
    }
}

#[inline(never)]
fn raiser() -> usize {
    // SAFETY: raising a signal whose handler is installed.
    unsafe { libc::raise(libc::SIGUSR1) };
    std::hint::black_box(raiser as *const () as usize)
}

#[test]
fn capture_in_handler_passes_the_signal_frame() {
    SNAP.get_or_init(InProcess::new);
    // SAFETY: installing a plain handler for SIGUSR1.
    unsafe { libc::signal(libc::SIGUSR1, handler as *const () as libc::sighandler_t) };
    raiser();
    // SAFETY: the handler has run and returned.
    let frames: Vec<(u64, Method)> = unsafe { FRAMES[..N].to_vec() };
    let sig = frames
        .iter()
        .position(|f| f.1 == Method::SignalFrame)
        .unwrap_or_else(|| panic!("no signal frame in {frames:x?}"));
    // Below the signal frame: raise's frames, then `raiser`, then this test.
    let here = raiser as *const () as u64;
    let r = frames[sig..]
        .iter()
        .position(|f| f.0 > here && f.0 < here + 256)
        .unwrap_or_else(|| panic!("raiser not below the signal frame: {frames:x?}"));
    assert!(r <= 4, "{frames:x?}");
    let test_fn = capture_in_handler_passes_the_signal_frame as *const () as u64;
    assert!(
        frames[sig + r..]
            .iter()
            .any(|f| f.0 > test_fn && f.0 < test_fn + 4096),
        "the test function is not below raiser: {frames:x?}"
    );
}
