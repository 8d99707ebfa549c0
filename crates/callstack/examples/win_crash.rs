//! Windows x86-64 crash reports in a Rust program (built for
//! `x86_64-pc-windows-gnu`, run under wine by `tests/windows_rust_crash.rs`
//! through scripts/test-windows.sh): installs the crash handler, then as
//! its first argument says:
//!
//! - `caught`: panics and catches each panic with `catch_unwind` (the GCC
//!   unwinder raises it with `RaiseException`, and the frame of
//!   `catch_unwind` handles it): no crash report, exit status 0;
//! - `null`: reads through a null pointer at the end of
//!   main -> alpha -> beta -> crash: an access violation, reported;
//! - `panic`: panics there instead, with the panic hook installed
//!   (`Options::panic_hook`): a panic report, then Rust's own message and
//!   exit status 101.
//!
//! The second argument, if any, is the minidump directory. `run MODE
//! [DIR]` runs this program again with MODE (and DIR) and prints `exit
//! 0x<code>`, its whole exit status (wine hands Linux only its low byte).

use std::hint::black_box;

#[inline(never)]
fn crash(p: *const u64) -> u64 {
    if p == core::ptr::dangling() {
        panic!("panicked on purpose");
    }
    // SAFETY: none: this reads address 0 on purpose, to crash.
    black_box(unsafe { core::ptr::read_volatile(black_box(p)) })
}

#[inline(never)]
fn beta(p: *const u64) -> u64 {
    black_box(crash(p)) + 1
}

#[inline(never)]
fn alpha(p: *const u64) -> u64 {
    black_box(beta(p)) + 1
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("run") {
        let status = std::process::Command::new(std::env::current_exe().expect("this program"))
            .args(&args[2..])
            .status()
            .expect("run this program");
        println!("exit {:#x}", status.code().unwrap_or(-1) as u32);
        return;
    }
    callstack::crash::install(callstack::crash::Options {
        minidump_dir: args.get(2).map(Into::into),
        panic_hook: args.get(1).is_some_and(|a| a == "panic"),
        ..Default::default()
    })
    .expect("install the crash handler");
    match args.get(1).map(String::as_str) {
        Some("caught") => {
            std::panic::set_hook(Box::new(|_| {}));
            let caught = (0..50)
                .filter(|&i| {
                    std::panic::catch_unwind(|| black_box(i) > 100 || panic!("{i}")).is_err()
                })
                .count();
            println!("caught {caught}");
        }
        Some("null") => {
            println!("{}", alpha(black_box(core::ptr::null())));
        }
        Some("panic") => {
            println!("{}", alpha(black_box(core::ptr::dangling::<u64>())));
        }
        _ => eprintln!("usage: win_crash caught|null|panic [MINIDUMP_DIR]"),
    }
}
