//! `callstack_capture_exact` in a statically linked C program (gcc
//! -static), with and without `callstack_prepare()`: glibc's static
//! `_dl_find_object` reports the text alone and no `.eh_frame_hdr`, so the
//! executable's image comes from its own program headers. The chain
//! `tests/fixtures/c/static_exact.c` promises (c, b, a, main) is checked by
//! name, with binutils' addr2line on the (non-PIE) executable.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::process::Command;
use testsupport::{addr2line_functions, scratch_dir, Gcc};

#[test]
fn exact_capture_in_a_static_program() {
    let dir = scratch_dir("c_static");
    let exe = Gcc::new(&["static_exact.c"])
        .flags("-O2 -static")
        .link_callstack()
        .build(&dir.join("static_exact"));
    for args in [&[][..], &["prepare"][..]] {
        let o = Command::new(&exe).args(args).output().unwrap();
        assert!(o.status.success(), "{o:?}");
        let text = String::from_utf8_lossy(&o.stdout);
        let ras: Vec<u64> = text
            .lines()
            .filter_map(|l| l.strip_prefix("frame 0x"))
            .map(|h| u64::from_str_radix(h, 16).unwrap())
            .collect();
        let offsets: Vec<u64> = ras.iter().map(|r| r - 1).collect();
        let names = addr2line_functions(&exe, &offsets);
        assert!(
            names.len() >= 4 && names[..4] == ["c", "b", "a", "main"],
            "{args:?}: {names:?}\n{text}"
        );
    }
}
