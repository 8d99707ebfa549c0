//! The process's own symbolizer, one per process: behind
//! [`called_from`](super::called_from), [`Trace::symbolize`](crate::Trace::symbolize),
//! [`SymbolizedTrace`] and the C API's `callstack_symbolize`.

use super::{Address, Symbolized, Symbolizer};
use std::fmt;
use std::sync::Mutex;

static SHARED: Mutex<Option<Symbolizer>> = Mutex::new(None);

/// Runs `f` on the process-wide symbolizer of this process's own modules
/// (built on first use, then kept with its caches), after bringing its
/// module list up to date with the loader if it does not know `probe` or
/// modules were loaded or unloaded since (`dlopen`/`dlclose`).
///
/// Takes a lock: not async-signal-safe. Symbolize outside signal handlers.
///
/// ```
/// let mut out = [0usize; 8];
/// let n = callstack::capture_exact(0, &mut out);
/// let name = callstack::symbolize::with_process_symbolizer(out[0], |s| {
///     s.symbolize_return(out[0]).frames.last().and_then(|f| f.function.clone())
/// });
/// assert!(n > 0 && name.is_some());
/// ```
pub fn with_process_symbolizer<R>(probe: usize, f: impl FnOnce(&mut Symbolizer) -> R) -> R {
    let mut guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let s = guard.get_or_insert_with(Symbolizer::new);
    s.sync_with_loader(probe);
    f(s)
}

/// A symbolized stack of this process: each address with its levels
/// (inlined functions first). `Display` prints one line per level, as the C
/// API's `callstack_print_trace` does:
///
/// ```text
/// #0   0x000055d1c0a1b2c3 in mycrate::leaf at src/lib.rs:10
/// #1   0x000055d1c0a1b400 in (inlined) mycrate::mid at src/lib.rs:20
/// #1   0x000055d1c0a1b400 in mycrate::outer at src/lib.rs:31
/// ```
///
/// ```
/// let t = callstack::Trace::<64>::capture_exact(0);
/// let text = t.symbolize().to_string();
/// assert!(text.starts_with("#0 "));
/// ```
#[derive(Clone, Debug)]
pub struct SymbolizedTrace {
    /// Each address with what it resolved to, innermost first.
    pub frames: Vec<(usize, Symbolized)>,
}

impl SymbolizedTrace {
    /// Resolves `frames` (return addresses, except `frames[0]` when
    /// `first_is_exact`: an interrupted pc) with the process-wide symbolizer
    /// (see [`with_process_symbolizer`]).
    pub fn new(frames: &[usize], first_is_exact: bool) -> SymbolizedTrace {
        let probe = frames.first().copied().unwrap_or(0);
        let frames = with_process_symbolizer(probe, |s| {
            frames
                .iter()
                .enumerate()
                .map(|(i, &a)| {
                    let addr = if i == 0 && first_is_exact {
                        Address::Exact(a)
                    } else {
                        Address::Return(a)
                    };
                    (a, s.resolve(addr))
                })
                .collect()
        });
        SymbolizedTrace { frames }
    }
}

impl fmt::Display for SymbolizedTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (a, sym)) in self.frames.iter().enumerate() {
            if sym.module.is_none() {
                writeln!(f, "#{i:<3} {a:#018x} in ?? (no module)")?;
                continue;
            }
            for line in sym.to_string().lines() {
                writeln!(f, "#{i:<3} {a:#018x} in {line}")?;
            }
        }
        Ok(())
    }
}
