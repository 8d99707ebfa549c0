//! An in-process Symbolizer after `dlclose`: a library loaded later at the
//! same address gets its own names, not the cached ones of the library
//! that was there before.
#![cfg(feature = "symbolize")]

use callstack::symbolize::{Address, Symbolizer};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use testsupport::{scratch_dir, Gcc};

fn build_lib(dir: &Path, name: &str, funcs: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let mut text = String::new();
    for (i, f) in funcs.iter().enumerate() {
        text.push_str(&format!(
            "__attribute__((noinline)) int {f}(int x)\n{{\n    int s = {i};\n    \
             for (int k = 0; k < x; k++)\n        s += k * {m};\n    return s;\n}}\n\n",
            m = i + 3
        ));
    }
    std::fs::write(&src, text).unwrap();
    Gcc::new(&[src.to_str().unwrap()])
        .flags("-O0 -fPIC -shared")
        .build(&dir.join(format!("lib{name}.so")))
}

fn open(path: &Path) -> *mut libc::c_void {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a library of plain functions, no constructors.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h
}

/// The address of `name` in `lib` and the base the library is loaded at.
fn sym(lib: *mut libc::c_void, name: &str) -> (usize, usize) {
    let c = CString::new(name).unwrap();
    // SAFETY: `lib` is a live handle; dladdr fills `info` for a loaded address.
    unsafe {
        let p = libc::dlsym(lib, c.as_ptr());
        assert!(!p.is_null(), "{name}");
        let mut info: libc::Dl_info = std::mem::zeroed();
        assert_ne!(libc::dladdr(p, &mut info), 0);
        (p as usize, info.dli_fbase as usize)
    }
}

#[test]
fn library_loaded_where_a_closed_one_was_gets_its_own_names() {
    let dir = scratch_dir("symbolize-dlclose");
    let a = build_lib(&dir, "syma", &["syma_first", "syma_second"]);
    let b = build_lib(
        &dir,
        "symb",
        &["symb_alpha", "symb_beta", "symb_gamma", "symb_delta"],
    );
    let mut s = Symbolizer::new();

    let la = open(&a);
    let (a_second, a_base) = sym(la, "syma_second");
    let r = s.symbolize(Address::Exact(a_second)).clone();
    assert_eq!(r.function(), Some("syma_second"), "{r:?}");
    assert_eq!(r.module.as_ref().unwrap().path, a);
    // SAFETY: nothing of the library is in use any more.
    assert_eq!(unsafe { libc::dlclose(la) }, 0);

    let lb = open(&b);
    // The third function: an address A never had (A has two functions of
    // the same shapes as B's first two).
    let (b_gamma, b_base) = sym(lb, "symb_gamma");
    if b_base != a_base {
        eprintln!(
            "skipped: the loader put {} at {b_base:#x}, not where {} was ({a_base:#x})",
            b.display(),
            a.display()
        );
        return;
    }
    let mut file_b = Symbolizer::for_file(&b).unwrap();
    let expected = |file_b: &mut Symbolizer, addr: usize| {
        file_b
            .symbolize(Address::Exact(addr - b_base))
            .frames
            .clone()
    };

    // A miss: the symbolizer notices the loader's change, drops A.
    let r = s.symbolize(Address::Exact(b_gamma)).clone();
    assert_eq!(r.function(), Some("symb_gamma"), "{r:?}");
    assert_eq!(r.module.as_ref().unwrap().path, b);
    assert_eq!(r.frames, expected(&mut file_b, b_gamma));
    // The address answered for A before is B's now (its cached answer went
    // with A).
    let r = s.symbolize(Address::Exact(a_second)).clone();
    assert_eq!(r.module.as_ref().unwrap().path, b, "{r:?}");
    assert_ne!(r.function(), Some("syma_second"), "{r:?}");
    assert_eq!(r.frames, expected(&mut file_b, a_second));
    assert!(s.modules().all(|m| m.path != a));

    // After a dlclose, `refresh_modules` makes even cached answers right at
    // once (cache hits are not checked against the loader).
    let (b_delta, _) = sym(lb, "symb_delta");
    assert_eq!(
        s.symbolize(Address::Exact(b_delta)).function(),
        Some("symb_delta")
    );
    // SAFETY: nothing of the library is in use any more.
    assert_eq!(unsafe { libc::dlclose(lb) }, 0);
    s.refresh_modules();
    let r = s.symbolize(Address::Exact(b_delta)).clone();
    assert!(r.module.as_ref().is_none_or(|m| m.path != b), "{r:?}");
    assert_ne!(r.function(), Some("symb_delta"), "{r:?}");
}
