//! The machine-code unwinding fixture `insn_chain.c` built as a shared
//! library and loaded into the test process.

use std::ffi::{c_int, c_void, CString};
use std::path::Path;

/// `insn_entry(callback, arg)`: calls down the fixture's chain, then
/// `callback(arg)` at its bottom.
pub type Entry = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void) -> c_int;

/// A loaded fixture library.
pub struct Lib {
    /// Its `insn_entry`.
    pub entry: Entry,
    /// Its load base.
    pub base: usize,
    /// An end past all its code (base plus the file's size and a margin).
    pub end: usize,
}

/// `dlopen`s the library at `path` (kept loaded for the rest of the process)
/// and finds `insn_entry`.
pub fn load(path: &Path) -> Lib {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: dlopen/dlsym/dladdr with valid C strings; the library stays
    // loaded for the rest of the process, so `entry` stays valid.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "dlopen {}", path.display());
        let sym = libc::dlsym(h, c"insn_entry".as_ptr());
        assert!(!sym.is_null());
        let mut info: libc::Dl_info = std::mem::zeroed();
        libc::dladdr(sym, &mut info);
        let base = info.dli_fbase as usize;
        let size = std::fs::metadata(path).unwrap().len() as usize + 0x10000;
        Lib {
            entry: std::mem::transmute::<*mut c_void, Entry>(sym),
            base,
            end: base + size,
        }
    }
}
