//! Exact capture in this process: the rule source over the loaded modules,
//! the stack-bounded memory, and the entries behind [`crate::capture_exact`]
//! and [`crate::capture_from_context`].
//!
//! # How modules and tables are published
//! - **Compiled tables** live in an immutable snapshot (every executable
//!   segment of every loaded module, with its compiled [`UnwindTable`](crate::unwind::UnwindTable)),
//!   published through an `AtomicPtr`. [`prepare`] builds a new snapshot
//!   (reusing the tables of modules that did not change) and swaps it in;
//!   old snapshots are never freed, so a capture that loaded one may read it
//!   for as long as it likes. [`prepare`] runs `dl_iterate_phdr`, allocates
//!   and takes locks: it is for set-up paths, never for a signal handler.
//! - **Cold path**: a capture meeting an address in no snapshot module asks
//!   glibc's `_dl_find_object` (glibc 2.35 and later; lock-free and
//!   async-signal-safe) for the module and its `.eh_frame_hdr`, and
//!   evaluates the CFI directly (binary search of `.eh_frame_hdr`, the FDE's
//!   instructions run with storage on the stack). It then raises a flag that
//!   the next [`prepare`] (or the background refresher of
//!   [`prepare_in_background`]) sees. So the very first capture needs no
//!   set-up at all, allocates nothing and takes no lock.
//! - **Rule cache**: a global 2-way set-associative cache of 8192 words maps
//!   a return address to its packed rule (one relaxed atomic load per
//!   frame), with a table of wide rules (frames too big for 16 bits, up to
//!   4 GiB) beside it. Filled on a miss whether or not [`prepare`] ran: from
//!   a compiled table, or from the CFI directly (`cfi::rule_at`) for a
//!   module only `_dl_find_object` knows, which is then noted in `SEEN`.
//!   The first capture of the process keeps its rules in a small pending
//!   array that the next capture moves into the cache (so the first one
//!   does not fault in the cache's pages). Cleared when a snapshot without
//!   some module of the old one is published, or when a capture finds a
//!   snapshot module unloaded or a `SEEN` module replaced (below).
//! - **dlopen/dlclose**: a new library is found by the cold path at once;
//!   its rules are cached once it is noted in `SEEN` (64 modules; past
//!   that, a new module's rules are not cached). A cache miss whose module
//!   overlaps a noted one with another mapping or `.eh_frame_hdr` clears
//!   the cache (the noted one was unloaded); a library rebuilt and reloaded
//!   at the same place with the same layout is not told apart there (the
//!   snapshot's build-id check does, after [`prepare`]).
//!   After a `dlclose`, with glibc's `_dl_find_object` (2.35+): a capture
//!   that misses the rule cache in a snapshot module, or reads its code,
//!   first checks with `_dl_find_object` (lock-free) that the module is
//!   still the object loaded there; if not, it unwinds that frame from the
//!   CFI of whatever is loaded there now, clears the rule cache (once) and
//!   flags the snapshot for the next [`prepare`]. So no stale rule is taken
//!   from the snapshot and no unloaded code is read. What remains until
//!   [`prepare`] runs (or the first such miss): a frame whose return
//!   address equals one cached from the unloaded library may be unwound
//!   with its old rule (stack reads stay checked: wrong frames at worst,
//!   never a fault). Calling [`prepare`] after `dlclose` closes that too.
//!   Without `_dl_find_object`, [`prepare`] after `dlclose` is required
//!   before the unloaded range can be reused: until then the snapshot still
//!   lists the library and its code may be read. Either way, a library must
//!   not be unloaded while a capture may be walking through it (its code is
//!   then on that thread's stack: a bug in itself).
//! - Without `_dl_find_object` (glibc older than 2.35, or a libc without
//!   it), only snapshot modules are known: call [`prepare`] once before
//!   capturing, or captures stop at the first unknown module.
//!
//! # Where things are
//! Imports go one way (`entries` → `walk` → `source`/`code` → `snapshot` →
//! `hot` → `cache` → `flags`; `loader` beside them); nothing here switches on
//! the architecture, which `arch::native` supplies (the hot loop
//! `exact::run_hot`, the cache's wide rules, the signal trampoline test).
//! The stack's bounds and the checked reads of a walk (`StackMemory`) are
//! `crate::stack`'s.
//! - `flags.rs`: the `FLAGS` page (with its `.init_array` toucher) and the
//!   `SEEN` table's slots: a leaf.
//! - `loader.rs`: what the dynamic loader says, lock-free: `_dl_find_object`
//!   (`dl_find`), the main executable's image, executable segments, CFI
//!   sections. (The loader's add/remove counters, which `prepare` compares,
//!   are `modules::loader_counters`.)
//! - `cache.rs`: the rule cache (laid out as `arch::rule_cache` says) and the
//!   functions that fill, flush or clear it.
//! - `hot.rs`: the hot loop (`hot_loop`, `hot_run`, `hot_skip`): the
//!   architecture's `run_hot` over the rule cache.
//! - `snapshot.rs`: the module snapshot (`LocalModule`, `Snapshot`, its
//!   still-loaded check, `published`), [`prepare`], [`prepare_in_background`].
//! - `source.rs`: `LocalSource`, the walk's rule source, and the modules
//!   whose rules the cache holds without a snapshot (`seen_module`).
//! - `code.rs`: `LocalCode`, this process's code for the instruction-analysis
//!   fallback.
//! - `walk.rs`: the walk drivers (`walk_pcs`, `walk_pcs_after`,
//!   `walk_frames`), which run the one `Unwinder` loop.
//! - `entries.rs`: the naked entries and the functions they jump to
//!   (`exact_from_entry`, `info_from_entry`, `frame_from_entry`).
//! - `tests.rs`: the rule cache and the hot loop on fake stacks.

mod cache;
mod code;
pub use code::lookups as code_lookups;
mod entries;
mod flags;
mod hot;
mod loader;
#[cfg(all(test, any(callstack_insn, callstack_risc_insn), feature = "symbolize"))]
mod settled_tests;
mod snapshot;
mod source;
#[cfg(all(test, target_arch = "x86_64"))]
#[allow(non_snake_case)]
mod tests;
mod walk;

use crate::unwind::NativeArch;
#[cfg(callstack_native)]
pub use entries::exact_entry;
#[cfg(callstack_exit_hooks)]
pub(crate) use entries::{frame_entry, FrameRequest};
#[cfg(callstack_native)]
pub(crate) use entries::{info_entry, InfoRequest};
pub(crate) use flags::FLAGS;
pub use loader::has_dl_find_object;
#[cfg(test)]
pub(crate) use loader::sections_from_hdr;
pub(crate) use loader::{dl_find, exec_segment_in};
pub(crate) use snapshot::snapshot_code_range;
pub use snapshot::{prepare, prepare_in_background, PrepareStats};
pub(crate) use walk::{walk_frames, walk_pcs};

type A = NativeArch;
