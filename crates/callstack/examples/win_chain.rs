//! Windows x86-64 (built for `x86_64-pc-windows-gnu`, run under wine by
//! `tests/windows_rust.rs` through scripts/test-windows.sh): `capture_exact`
//! through a known chain of Rust functions, on the main thread and on a
//! spawned thread.
//!
//! ```text
//!   main -> alpha -> beta -> leaf -> capture_exact
//!   thread closure -> alpha -> beta -> leaf -> capture_exact
//! ```
//!
//! Prints, for each capture, `capture <label> <n>`, then one line per
//! frame: `frame <return address> <its link-time address> <module path>`,
//! the module and its load bias from `callstack::modules::loaded_modules`
//! (the loader's list), `?` where no module holds the address.

use std::hint::black_box;

#[inline(never)]
fn leaf(skip: usize) -> Vec<usize> {
    let mut out = [0usize; 64];
    let n = callstack::capture_exact(black_box(skip), &mut out);
    black_box(out[..n].to_vec())
}

#[inline(never)]
fn beta(skip: usize) -> Vec<usize> {
    black_box(leaf(skip))
}

#[inline(never)]
fn alpha(skip: usize) -> Vec<usize> {
    black_box(beta(skip))
}

fn print(label: &str, frames: &[usize]) {
    let modules = callstack::modules::loaded_modules();
    println!("capture {label} {}", frames.len());
    for &ra in frames {
        match modules.iter().find(|m| m.contains(ra)) {
            Some(m) => println!(
                "frame {ra:#x} {:#x} {}",
                ra.wrapping_sub(m.bias),
                m.path.display()
            ),
            None => println!("frame {ra:#x} 0 ?"),
        }
    }
}

fn main() {
    let main_frames = alpha(0);
    print("main", &main_frames);
    let skipped = alpha(1);
    print("skip1", &skipped);
    let thread = std::thread::spawn(|| alpha(0)).join().unwrap();
    print("thread", &thread);
    let first = callstack::modules::loaded_modules();
    println!(
        "modules {} main {}",
        first.len(),
        first.first().is_some_and(|m| m.is_main)
    );
}
