//! `called_from`: does the current stack pass through a named function?

use super::{Address, IntMap};
use std::cell::RefCell;
use std::sync::Mutex;

/// Entries kept per thread before the verdict cache is emptied.
const VERDICT_CAP: usize = 1 << 16;

thread_local! {
    /// (query hash, address) -> does a frame at the address match.
    static VERDICTS: RefCell<IntMap<u64, bool>> = RefCell::new(IntMap::default());
    /// The loader's (added, removed) counters when `VERDICTS` was last
    /// known to be right: after a `dlclose`, another library may sit at the
    /// same addresses, so the verdicts are dropped when they move.
    static LOADER: std::cell::Cell<Option<(u64, u64)>> = const { std::cell::Cell::new(None) };
}

/// Whether `name` is `query` or lies under it: `query` followed by `::`
/// (a module or type path prefix: `mycrate::parser` matches
/// `mycrate::parser::expr`), `(` (C++ parameters) or `<` (generics).
fn matches(name: &str, query: &str) -> bool {
    match name.strip_prefix(query) {
        Some("") => true,
        Some(rest) => rest.starts_with("::") || rest.starts_with('(') || rest.starts_with('<'),
        None => false,
    }
}

fn query_hash(queries: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for q in queries {
        for &b in q.as_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Whether the current call stack passes through a function named `name`:
/// its exact demangled path (`mycrate::parser::expr`, `ns::f(int)`, `main`)
/// or a path prefix (`mycrate::parser`). Inlined frames count.
///
/// The caller of `called_from` itself is part of the stack. The walk is
/// [`crate::capture_exact`] (DWARF CFI, up to 256 frames), so it works in
/// an ordinary build without frame pointers (Rust's default, C/C++ at
/// -O2); the unwind tables are compiled ([`crate::prepare`]) on the first
/// call and again after a library is loaded or unloaded.
///
/// Cost: the first call from a site symbolizes its frames (file I/O, DWARF
/// parsing); afterwards each frame costs one lookup in a per-thread cache
/// of verdicts, so a repeat call costs one exact capture (a table lookup
/// per frame) plus a hash probe per frame, plus one read of the dynamic loader's load/unload counters
/// (`dl_iterate_phdr`): when a library was loaded or unloaded since, the
/// thread's verdicts are dropped, so a library loaded where a closed one
/// was is never judged by the old one's names. Not for signal handlers (it
/// may allocate and lock).
///
/// ```
/// #[inline(never)]
/// fn parse() -> bool {
///     callstack::called_from("rust_out::main") || callstack::called_from("main")
/// }
/// assert!(parse());
/// assert!(!callstack::called_from("no_such_function_anywhere"));
/// ```
#[inline(never)]
pub fn called_from(name: &str) -> bool {
    let loader = synced_loader();
    let mut buf = [0usize; 256];
    let n = crate::capture_exact(0, &mut buf);
    check(&buf[1.min(n)..n], &[name], loader)
}

/// Whether the current call stack passes through a function matching any
/// of `names` (each as in [`called_from`]).
#[inline(never)]
pub fn called_from_any(names: &[&str]) -> bool {
    let loader = synced_loader();
    let mut buf = [0usize; 256];
    let n = crate::capture_exact(0, &mut buf);
    check(&buf[1.min(n)..n], names, loader)
}

/// The loader's (added, removed) counters, with the compiled unwind tables
/// brought up to date when they moved since the last call of any thread
/// (cold: the first call, and after a `dlopen`/`dlclose`).
fn synced_loader() -> Option<(u64, u64)> {
    static PREPARED: Mutex<Option<Option<(u64, u64)>>> = Mutex::new(None);
    // One early-stopped `dl_iterate_phdr` callback (a few tens of ns): the
    // price of never answering for a library that was unloaded.
    let loader = crate::modules::loader_counters();
    if LOADER.get() != loader || loader.is_none() {
        let mut p = PREPARED.lock().unwrap_or_else(|e| e.into_inner());
        if *p != Some(loader) {
            #[cfg(not(windows))]
            crate::prepare();
            *p = Some(loader);
        }
    }
    loader
}

fn check(frames: &[usize], names: &[&str], loader: Option<(u64, u64)>) -> bool {
    if names.is_empty() {
        return false;
    }
    let qh = query_hash(names);
    VERDICTS.with(|v| {
        let mut v = v.borrow_mut();
        if LOADER.replace(loader) != loader {
            v.clear();
        }
        for &ra in frames {
            let key = qh ^ (ra as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let verdict = match v.get(&key) {
                Some(&b) => b,
                None => {
                    let b = slow_verdict(ra, names);
                    if v.len() >= VERDICT_CAP {
                        v.clear();
                    }
                    v.insert(key, b);
                    b
                }
            };
            if verdict {
                return true;
            }
        }
        false
    })
}

#[cold]
fn slow_verdict(ra: usize, names: &[&str]) -> bool {
    // Synced with the loader also for an address it has answered before: a
    // library may have been unloaded and another loaded in its place since.
    super::with_process_symbolizer(ra, |s| {
        let sym = s.symbolize(Address::Return(ra));
        sym.frames.iter().any(|f| {
            f.function
                .as_deref()
                .is_some_and(|fun| names.iter().any(|q| matches(fun, q)))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn prefix_rules() {
        assert!(matches("a::b::c", "a::b"));
        assert!(matches("a::b::c", "a::b::c"));
        assert!(!matches("a::bc", "a::b"));
        assert!(matches("f(int)", "f"));
        assert!(matches("Vec<T>::push", "Vec"));
        assert!(!matches("main2", "main"));
    }
}
