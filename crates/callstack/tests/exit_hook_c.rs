//! Exit hooks on C frames of a shared library built by gcc at test time
//! (`tests/fixtures/c/exit_hook_lib.c`; `-O0`, `-O2` with and without frame
//! pointers; the cross compiler under qemu-user): hooks at two depths run
//! in order with the return values intact; captures below the hooked
//! frames and inside the hooks name the real callers, function by function.
//! On AArch64 gcc's frame record sits at the bottom of the frame, so the
//! slot patched is the one the CFI names, and a frame-record walk
//! (`capture_fast`) must find the entry by that slot. A return address
//! kept in a register, or signed by pointer authentication, is refused.
#![cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_os = "linux"
))]

use callstack::exit_hook;
use callstack::symbolize::{Address, Symbolizer};
use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use testsupport::{scratch_dir, Gcc};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

type Cb = extern "C" fn(i64) -> i64;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Quad {
    a: f64,
    b: f64,
    c: f64,
    d: f64,
}

struct Lib {
    outer: extern "C" fn(Cb, i64) -> i64,
    quad: extern "C" fn(Cb, f64) -> Quad,
    /// AArch64 only (the fixture's assembly).
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    ra_in_register: Option<extern "C" fn(Cb, i64) -> i64>,
}

/// Builds the fixture with `flags` into `name` and loads it.
fn load(flags: &str, name: &str) -> Lib {
    let dir = scratch_dir("exit-hook-c");
    let so = Gcc::new(&["exit_hook_lib.c"])
        .flags(&format!("{flags} -fPIC -shared"))
        .build(&dir.join(name));
    let path = std::ffi::CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: dlopen/dlsym of a library we just built; the symbols have the
    // signatures the fixture defines.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen {so:?}");
        let sym = |n: &std::ffi::CStr| libc::dlsym(h, n.as_ptr());
        let outer = sym(c"hk_outer");
        let quad = sym(c"hk_quad_of");
        assert!(!outer.is_null() && !quad.is_null());
        let reg = sym(c"hk_ra_in_register");
        Lib {
            outer: std::mem::transmute::<*mut libc::c_void, extern "C" fn(Cb, i64) -> i64>(outer),
            quad: std::mem::transmute::<*mut libc::c_void, extern "C" fn(Cb, f64) -> Quad>(quad),
            ra_in_register: (!reg.is_null()).then(|| {
                std::mem::transmute::<*mut libc::c_void, extern "C" fn(Cb, i64) -> i64>(reg)
            }),
        }
    }
}

/// What the callback does: 0 nothing, 1 hooks its caller (`hk_inner`) and
/// the caller's caller (`hk_outer`), 2 hooks its caller only, 3 records
/// what installing a hook on its caller gives.
static MODE: AtomicU32 = AtomicU32::new(0);

#[derive(Default)]
struct Seen {
    exact_before: Vec<usize>,
    fast_before: Vec<usize>,
    exact_after: Vec<usize>,
    fast_after: Vec<usize>,
    in_inner_hook: Vec<usize>,
    in_outer_hook: Vec<usize>,
    order: String,
    install: Option<Result<(), exit_hook::ExitHookError>>,
}

static SEEN: Mutex<Option<Seen>> = Mutex::new(None);

fn with_seen<R>(f: impl FnOnce(&mut Seen) -> R) -> R {
    let mut g = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Seen::default))
}

#[inline(never)]
fn capture_exact_vec() -> Vec<usize> {
    let mut out = [0usize; 128];
    let n = callstack::capture_exact(0, &mut out);
    out[..n].to_vec()
}

#[inline(never)]
fn capture_fast_vec() -> Vec<usize> {
    let mut out = [0usize; 128];
    let n = callstack::capture_fast(0, &mut out);
    out[..n].to_vec()
}

extern "C" fn callback(x: i64) -> i64 {
    let exact_before = capture_exact_vec();
    let fast_before = capture_fast_vec();
    let mut install = None;
    match MODE.load(Ordering::Relaxed) {
        1 => {
            exit_hook::install(1, || {
                let c = capture_exact_vec();
                with_seen(|s| {
                    s.in_inner_hook = c;
                    s.order.push('i');
                });
            })
            .unwrap();
            exit_hook::install(2, || {
                let c = capture_exact_vec();
                with_seen(|s| {
                    s.in_outer_hook = c;
                    s.order.push('o');
                });
            })
            .unwrap();
        }
        2 => {
            exit_hook::install(1, || with_seen(|s| s.order.push('q'))).unwrap();
        }
        3 => {
            install = Some(exit_hook::install(1, || {}).map(|_| ()));
        }
        _ => {}
    }
    let exact_after = capture_exact_vec();
    let fast_after = capture_fast_vec();
    with_seen(|s| {
        s.exact_before = exact_before;
        s.fast_before = fast_before;
        s.exact_after = exact_after;
        s.fast_after = fast_after;
        s.install = install;
    });
    black_box(x * 3)
}

#[inline(never)]
fn run_outer(lib: &Lib, x: i64) -> i64 {
    let r = (lib.outer)(callback, black_box(x));
    black_box(r)
}

#[inline(never)]
fn run_quad(lib: &Lib, x: f64) -> Quad {
    let r = (lib.quad)(callback, black_box(x));
    black_box(r)
}

/// Runs `f` with the callback in `mode` and returns its result and what
/// the callback and the hooks saw.
fn run<R>(mode: u32, f: impl FnOnce() -> R) -> (R, Seen) {
    *SEEN.lock().unwrap_or_else(|e| e.into_inner()) = None;
    MODE.store(mode, Ordering::Relaxed);
    let r = f();
    MODE.store(0, Ordering::Relaxed);
    let s = SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .unwrap();
    (r, s)
}

/// The function of each return address (the outermost of its inlined
/// frames), `?` when unnamed.
fn names(pcs: &[usize]) -> Vec<String> {
    let mut s = Symbolizer::new();
    pcs.iter()
        .map(|&pc| {
            s.symbolize(Address::Return(pc))
                .frames
                .last()
                .and_then(|f| f.function.as_deref().map(String::from))
                .unwrap_or_else(|| "?".into())
        })
        .collect()
}

fn own(name: &str) -> String {
    format!("exit_hook_c::{name}")
}

/// Whether `hay` holds `needle` as consecutive elements.
fn holds(hay: &[String], needle: &[String]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

const VARIANTS: [(&str, &str, bool); 3] = [
    ("-O0 -fno-omit-frame-pointer", "libehk_o0.so", true),
    ("-O2 -fno-omit-frame-pointer", "libehk_o2fp.so", true),
    ("-O2 -fomit-frame-pointer", "libehk_o2.so", false),
];

#[test]
fn hooks_on_c_frames_run_and_captures_name_the_real_callers() {
    let _g = serial();
    for (flags, name, fp) in VARIANTS {
        let lib = load(flags, name);
        let (plain, _) = run(0, || run_outer(&lib, 5));
        assert_eq!(plain, ((6 * 3) + 5) * 2, "{flags}");
        for round in 0..2 {
            let (r, s) = run(1, || run_outer(&lib, 5));
            let ctx = format!("{flags}, round {round}");
            assert_eq!(r, plain, "{ctx}");
            // `hk_inner`'s hook first (its frame returns first).
            assert_eq!(s.order, "io", "{ctx}");
            // Below the hooked frames, the same callers as before the
            // installs (frame 0 is `capture_exact_vec`, frame 1 its call
            // site in the callback).
            let chain: Vec<String> = [
                own("callback"),
                "hk_inner".into(),
                "hk_outer".into(),
                own("run_outer"),
            ]
            .into();
            let exact = names(&s.exact_after);
            assert_eq!(exact[1..5], chain[..], "{ctx}: {exact:?}");
            assert_eq!(s.exact_after[2..], s.exact_before[2..], "{ctx}");
            if fp {
                let fast = names(&s.fast_after);
                assert_eq!(fast[1..5], chain[..], "{ctx}: {fast:?}");
                assert_eq!(s.fast_after[2..], s.fast_before[2..], "{ctx}");
            }
            // Inside the hooks: the trampoline's frame, then the real
            // caller of the hooked frame and the rest of the chain.
            let tramp = "__callstack_exit_hook_trampoline".to_string();
            let inner = names(&s.in_inner_hook);
            assert!(
                holds(
                    &inner,
                    &[tramp.clone(), "hk_outer".into(), own("run_outer")]
                ),
                "{ctx}: {inner:?}"
            );
            assert!(
                s.in_inner_hook.ends_with(&s.exact_before[3..]),
                "{ctx}: {inner:?}"
            );
            let outer = names(&s.in_outer_hook);
            assert!(
                holds(&outer, &[tramp.clone(), own("run_outer")]),
                "{ctx}: {outer:?}"
            );
            assert!(
                s.in_outer_hook.ends_with(&s.exact_before[4..]),
                "{ctx}: {outer:?}"
            );
        }
    }
}

#[test]
fn a_float_aggregate_passes_through_a_hooked_c_frame() {
    let _g = serial();
    for (flags, name, _) in VARIANTS {
        let lib = load(flags, name);
        let (plain, _) = run(0, || run_quad(&lib, 1.25));
        assert_eq!(
            plain,
            Quad {
                a: 1.25,
                b: 2.5,
                c: 3.75,
                d: 5.0
            }
        );
        let (r, s) = run(2, || run_quad(&lib, 1.25));
        assert_eq!(r, plain, "{flags}");
        assert_eq!(s.order, "q", "{flags}");
    }
}

/// AArch64: the hooked frame keeps its return address in x19 (nothing to
/// patch), or signs it (`-mbranch-protection=pac-ret`, where the CPU
/// authenticates: qemu-user's default CPU does): the install is refused,
/// and the function returns normally.
#[cfg(target_arch = "aarch64")]
#[test]
fn a_return_address_in_a_register_or_signed_is_refused() {
    let _g = serial();
    let lib = load("-O0", "libehk_plain.so");
    let f = lib.ra_in_register.unwrap();
    #[inline(never)]
    fn run_reg(f: extern "C" fn(Cb, i64) -> i64) -> i64 {
        black_box(f(callback, black_box(4)))
    }
    let (r, s) = run(3, || run_reg(f));
    assert_eq!(r, 12);
    assert_eq!(
        s.install,
        Some(Err(exit_hook::ExitHookError::NotPatchable(1)))
    );

    const HWCAP_PACA: libc::c_ulong = 1 << 30;
    // SAFETY: getauxval has no preconditions.
    let paca = unsafe { libc::getauxval(libc::AT_HWCAP) } & HWCAP_PACA != 0;
    let pac = load("-O2 -mbranch-protection=pac-ret", "libehk_pac.so");
    let (r, s) = run(3, || run_outer(&pac, 5));
    assert_eq!(r, 46);
    if paca {
        assert_eq!(
            s.install,
            Some(Err(exit_hook::ExitHookError::NotPatchable(1)))
        );
    } else {
        // Without the feature the signing instructions are no-ops.
        assert_eq!(s.install, Some(Ok(())));
    }
}
