//! Heap tracking by call stack: who allocates, who leaks.
//!
//! - [`Tracking`]: a `#[global_allocator]` wrapper that records, for every
//!   allocation, the stack hash of a [`capture_fast`](crate::capture_fast)
//!   or [`capture_exact`](crate::capture_exact) stack (the user picks, see
//!   [`Capture`]) with its size; per stack it keeps live bytes, peak,
//!   allocation and free counts.
//! - [`Recorder`]: the tables behind it, also used by the `LD_PRELOAD`
//!   library of `callstack memtrack` (crate `callstack-preload`).
//! - [`shared`]: a recorder kept in a shared file mapping, read back after
//!   its process is gone however it ended (`callstack memtrack`).
//! - [`HeapSnapshot`]: a copy of the counters; written to and read from a
//!   heap recording file ([`HeapSnapshot::write_to`], [`HeapSnapshot::read_from`]),
//!   (feature `symbolize`) reported as text: top sites by live bytes
//!   and by allocations, and leaks; and turned into a heap
//!   [`Profile`](crate::profile::Profile) ([`HeapSnapshot::to_profile`]) for
//!   folded stacks, flamegraphs and pprof (`callstack report FILE`).
//!
//! ```no_run
//! use callstack::alloc::{Capture, Tracking};
//! #[global_allocator]
//! static A: Tracking<std::alloc::System> = Tracking::new(std::alloc::System, Capture::Fast);
//!
//! fn main() {
//!     A.print_leaks_at_exit(10);
//!     let v = vec![1u8; 1000];
//!     std::mem::forget(v);
//!     # #[cfg(feature = "symbolize")]
//!     print!("{}", A.report(5));
//! }
//! ```
//!
//! ## Sampled tracking
//! [`Tracking::sampled`] (and `callstack memtrack --sample-bytes N`)
//! records about one allocation per N bytes allocated instead of every
//! one, with the Poisson rule of tcmalloc and Go: an allocation of `size`
//! bytes is picked with probability `1 - exp(-size / N)` and counted as
//! what it stands for, so that every site's allocations, bytes, frees and
//! live bytes are unbiased estimates ([`sample`]). An allocation not picked
//! costs one thread-local counter update, no capture; a free of a block
//! not picked, one read of a 128 KiB filter. The snapshot says N
//! ([`HeapSnapshot::sample_bytes`]) and reports say their figures are
//! estimates.
//!
//! ## Inside the allocator
//! Recording never allocates and takes no lock: the site and live-block
//! tables are pre-sized open-addressing tables in anonymous mappings made on
//! first use (see [`Recorder`]); a full table is counted
//! ([`HeapCounters`]), never grown. A free of a block the recorder never
//! saw (allocated before tracking began, or while it was off) is counted
//! and ignored.
//!
//! ## Heap recording file
//! `CSHEAP\0\0`, a version byte (3), three zero bytes; varints: the
//! capture kind (0 fast, 1 exact), the number of sites, the four
//! [`HeapCounters`], the mean bytes between samples (0: every allocation;
//! versions 1 and 2 have no such varint); per site six varints (allocations, allocated bytes,
//! frees, freed bytes, peak live bytes, live blocks of size 0; version 1
//! has the first five); then a trace file
//! (`docs/trace-format.md`) with the process's modules and one stack per
//! site, in site order.

pub mod sample;
pub mod shared;
mod table;

pub use table::{Recorder, Taken, MAX_DEPTH, MAX_PROBE};

use std::alloc::{GlobalAlloc, Layout};
use std::io::{self, Read, Write};

/// Which capture [`Tracking`] (or the preload library) takes at each
/// allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capture {
    /// [`capture_fast`](crate::capture_fast): frame pointers.
    Fast,
    /// [`capture_exact`](crate::capture_exact): DWARF CFI.
    Exact,
}

impl Capture {
    /// Captures the caller's stack (`skip` more frames dropped) into `out`.
    #[inline(always)]
    pub fn capture(self, skip: usize, out: &mut [usize]) -> usize {
        match self {
            Capture::Fast => crate::capture_fast(skip, out),
            Capture::Exact => crate::capture_exact(skip, out),
        }
    }
}

/// A global allocator that records every allocation of `A` by call stack.
///
/// ```no_run
/// use callstack::alloc::{Capture, Tracking};
/// #[global_allocator]
/// static A: Tracking<std::alloc::System> = Tracking::new(std::alloc::System, Capture::Exact);
/// # fn main() {}
/// ```
///
/// Cost per allocation: one capture (at most [`MAX_DEPTH`] frames), a
/// hash, a few atomic updates; see BENCHMARKS.md.
pub struct Tracking<A> {
    inner: A,
    capture: Capture,
    rec: Recorder,
}

impl<A> Tracking<A> {
    /// Wraps `inner`, capturing with `capture` at each allocation.
    pub const fn new(inner: A, capture: Capture) -> Self {
        Tracking {
            inner,
            capture,
            rec: Recorder::new(),
        }
    }

    /// Wraps `inner` like [`Tracking::new`], but records about one
    /// allocation per `mean_bytes` bytes allocated (Poisson sampling by
    /// bytes, see [the module docs](self#sampled-tracking)); the reports
    /// hold unbiased estimates. `mean_bytes` 0 records every allocation.
    /// tcmalloc and Go sample one per 512 KiB by default.
    ///
    /// ```no_run
    /// use callstack::alloc::{Capture, Tracking};
    /// #[global_allocator]
    /// static A: Tracking<std::alloc::System> =
    ///     Tracking::sampled(std::alloc::System, Capture::Exact, 512 * 1024);
    /// # fn main() {}
    /// ```
    pub const fn sampled(inner: A, capture: Capture, mean_bytes: u64) -> Self {
        Tracking {
            inner,
            capture,
            rec: Recorder::sampled(mean_bytes),
        }
    }

    /// The recorder (tables and counters).
    pub fn recorder(&self) -> &Recorder {
        &self.rec
    }

    /// Stops or resumes recording (frees of blocks recorded before are
    /// ignored while stopped, so their sites keep them as live).
    pub fn set_enabled(&self, on: bool) {
        self.rec.set_enabled(on);
    }

    /// A copy of the counters of every site. Its own allocations (and
    /// those of anything else this thread runs inside [`quietly`]) are not
    /// recorded.
    pub fn snapshot(&self) -> HeapSnapshot {
        quietly(|| {
            let mut s = self.rec.snapshot();
            s.capture = self.capture;
            s
        })
    }

    #[inline(always)]
    fn record(&self, p: *mut u8, size: usize) {
        let mean = self.rec.sample_bytes();
        if mean != 0 && !sample::take_sample(mean, size) {
            return;
        }
        if !p.is_null() && self.rec.is_enabled() && !QUIET.get() {
            let mut frames = [0usize; MAX_DEPTH];
            let n = self.capture.capture(0, &mut frames);
            self.rec.record_alloc(&frames[..n], p as usize, size);
        }
    }
}

thread_local! {
    // Whether this thread's allocations go unrecorded (see `quietly`). A
    // const initializer and no `Drop`: a plain TLS slot, no allocation.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's allocations not recorded by any
/// [`Tracking`] allocator (frees are still recorded): for the tool's own
/// work, such as building a report. A block allocated inside and freed
/// outside counts as an unknown free.
pub fn quietly<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            QUIET.set(self.0);
        }
    }
    let _restore = Restore(QUIET.replace(true));
    f()
}

#[cfg(feature = "symbolize")]
impl<A: 'static + Sync> Tracking<A> {
    /// The text report of [`HeapSnapshot::report`] for this process (its
    /// own allocations not recorded).
    pub fn report(&self, top: usize) -> String {
        quietly(|| {
            let snap = self.snapshot();
            let mut sym = crate::Symbolizer::new();
            snap.report(&mut sym, top)
        })
    }

    /// The leaks (blocks still live now), symbolized: see
    /// [`HeapSnapshot::leak_report`].
    pub fn leak_report(&self, top: usize) -> String {
        quietly(|| {
            let snap = self.snapshot();
            let mut sym = crate::Symbolizer::new();
            snap.leak_report(&mut sym, top)
        })
    }

    /// Prints [`Tracking::leak_report`] of the top `top` sites to standard
    /// error when the process exits (through `atexit`; not on `_exit` or a
    /// fatal signal). Only the first call (of this or
    /// [`Tracking::leaks_from_env`]) has an effect.
    pub fn print_leaks_at_exit(&'static self, top: usize) {
        leaks_at_exit::register(self, top);
    }
}

#[cfg(feature = "symbolize")]
mod leaks_at_exit {
    use super::Tracking;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
    use std::sync::OnceLock;

    type Report = Box<dyn Fn() -> String + Send + Sync>;
    static REPORT: OnceLock<Report> = OnceLock::new();
    static TOP: AtomicUsize = AtomicUsize::new(0);
    static REGISTERED: AtomicBool = AtomicBool::new(false);

    pub(super) fn register<A: 'static + Sync>(t: &'static Tracking<A>, top: usize) {
        if REGISTERED.swap(true, AcqRel) {
            return;
        }
        TOP.store(top, Relaxed);
        let _ = REPORT.set(Box::new(move || t.leak_report(TOP.load(Relaxed))));
        // SAFETY: registering a plain `extern "C" fn()` with no captured state.
        unsafe {
            libc::atexit(at_exit);
        }
    }

    extern "C" fn at_exit() {
        if let Some(r) = REPORT.get() {
            let text = r();
            use std::io::Write;
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    }

    /// `CALLSTACK_LEAKS=N` in the environment: the top N, else `None`.
    pub(super) fn from_env() -> Option<usize> {
        // SAFETY: getenv with a NUL-terminated name; the result is read at
        // once, before anything could change the environment.
        let v = unsafe { libc::getenv(c"CALLSTACK_LEAKS".as_ptr()) };
        if v.is_null() {
            return None;
        }
        // SAFETY: getenv returned a NUL-terminated string.
        let s = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
        let mut n = 0usize;
        for &b in s {
            if !b.is_ascii_digit() {
                return Some(20);
            }
            n = n.saturating_mul(10).saturating_add((b - b'0') as usize);
        }
        Some(if n == 0 { 20 } else { n })
    }
}

// SAFETY: every call is forwarded to `inner` with the caller's arguments;
// recording reads the stack and updates atomics in pre-mapped tables,
// never allocates and never unwinds.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Tracking<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.inner.alloc(layout) };
        self.record(p, layout.size());
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        self.record(p, layout.size());
        p
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        self.rec.record_free(p as usize);
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.dealloc(p, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Out of the table before the block can be freed and its address
        // handed to another thread.
        let taken = self.rec.take(p as usize);
        // SAFETY: the caller's contract, passed on.
        let q = unsafe { self.inner.realloc(p, layout, new_size) };
        match (q.is_null(), taken) {
            (true, Some(t)) => self.rec.put_back(p as usize, t),
            (false, Some(t)) => {
                self.rec.commit_free(t);
                self.record(q, new_size);
            }
            (false, None) => self.record(q, new_size),
            (true, None) => {}
        }
        q
    }
}

#[cfg(feature = "symbolize")]
impl<A> Tracking<A> {
    /// If the environment variable `CALLSTACK_LEAKS` is set (to the number
    /// of sites to show, default 20), registers the leak report at exit as
    /// [`Tracking::print_leaks_at_exit`] does. Call it early in `main`: the
    /// allocator itself cannot, as the report needs the `'static` tracker.
    pub fn leaks_from_env(&'static self)
    where
        A: Sync + 'static,
    {
        if let Some(n) = leaks_at_exit::from_env() {
            self.print_leaks_at_exit(n);
        }
    }
}

/// The recorder's own counters: what it could not record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapCounters {
    /// Allocations counted in the overflow site (the site table was full):
    /// their stacks are unknown.
    pub overflow_site_allocs: u64,
    /// Blocks not entered in the live table (full): their frees will be
    /// unknown and their sites keep them as live.
    pub live_overflow: u64,
    /// Frees of blocks the recorder never saw (allocated before tracking
    /// began or while it was off), ignored.
    pub unknown_frees: u64,
    /// Allocations not recorded because the tables were being mapped by
    /// another thread, or could not be mapped.
    pub dropped: u64,
}

/// One allocation site: a stack and its counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SiteStats {
    /// Return addresses, innermost first (empty for the overflow site).
    pub frames: Vec<usize>,
    /// Allocations made here.
    pub allocs: u64,
    /// Bytes allocated here in all.
    pub alloc_bytes: u64,
    /// Frees of blocks allocated here.
    pub frees: u64,
    /// Bytes freed of blocks allocated here.
    pub free_bytes: u64,
    /// Highest live bytes seen (approximate when threads race).
    pub peak_bytes: u64,
    /// Live blocks of size 0 (`malloc(0)` kept): among
    /// [`SiteStats::live_blocks`], but no leak.
    pub zero_live: u64,
}

impl SiteStats {
    /// Bytes allocated here and not freed.
    pub fn live_bytes(&self) -> u64 {
        self.alloc_bytes.saturating_sub(self.free_bytes)
    }

    /// Blocks allocated here and not freed.
    pub fn live_blocks(&self) -> u64 {
        self.allocs.saturating_sub(self.frees)
    }

    /// Live blocks that hold memory (size 0 left out): at exit, the leaks.
    pub fn leaked_blocks(&self) -> u64 {
        self.live_blocks().saturating_sub(self.zero_live)
    }
}

/// A copy of a recorder's sites and counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapSnapshot {
    /// How stacks were captured.
    pub capture: Capture,
    /// Every site with at least one allocation.
    pub sites: Vec<SiteStats>,
    /// What could not be recorded.
    pub counters: HeapCounters,
    /// Modules of the recorded process (filled by [`HeapSnapshot::read_from`]).
    pub modules: Vec<crate::tracefile::ModuleRecord>,
    /// The mean bytes between sampled allocations (0: every allocation was
    /// recorded). When not 0, every count and byte figure is an unbiased
    /// estimate, not an exact sum.
    pub sample_bytes: u64,
}

impl Default for HeapSnapshot {
    fn default() -> Self {
        HeapSnapshot {
            capture: Capture::Fast,
            sites: Vec::new(),
            counters: HeapCounters::default(),
            modules: Vec::new(),
            sample_bytes: 0,
        }
    }
}

/// The first 8 bytes of a heap recording.
pub const HEAP_MAGIC: [u8; 8] = *b"CSHEAP\0\0";

impl HeapSnapshot {
    /// The snapshot as a heap [`Profile`](crate::profile::Profile)
    /// (`alloc_objects`, `alloc_space`, `inuse_objects`, `inuse_space`; the
    /// in-use values are the blocks live when the snapshot was taken: at
    /// exit, the leaks). With the [`crate::profile`] writers it gives folded
    /// stacks, a flamegraph by bytes and pprof heap profiles; `callstack
    /// report FILE` does this for a heap recording. Allocations the
    /// recorder could not attribute (overflow site) keep an empty stack;
    /// `lost` counts the dropped ones. Modules: the recording's, else this
    /// process's.
    ///
    /// ```
    /// let mut snap = callstack::alloc::HeapSnapshot::default();
    /// snap.sites.push(callstack::alloc::SiteStats {
    ///     frames: vec![0x1000], allocs: 3, alloc_bytes: 300, frees: 1, free_bytes: 100, peak_bytes: 300,
    ///     zero_live: 0,
    /// });
    /// let p = snap.to_profile();
    /// assert_eq!(p.stacks[0].values, vec![3, 300, 2, 200]);
    /// ```
    pub fn to_profile(&self) -> crate::profile::Profile {
        let mut p = crate::profile::Profile::heap();
        if self.modules.is_empty() {
            p.add_loaded_modules();
        } else {
            p.modules = self.modules.clone();
        }
        p.lost = self.counters.dropped;
        if self.sample_bytes != 0 {
            p.period_type = Some(crate::profile::ValueType::new("space", "bytes"));
            p.period = self.sample_bytes.min(i64::MAX as u64) as i64;
        }
        let clamp = |v: u64| v.min(i64::MAX as u64) as i64;
        for s in &self.sites {
            p.add(
                &s.frames,
                false,
                None,
                &[
                    clamp(s.allocs),
                    clamp(s.alloc_bytes),
                    clamp(s.live_blocks()),
                    clamp(s.live_bytes()),
                ],
            );
        }
        p
    }

    /// Sum over all sites: (allocations, bytes allocated, frees, bytes freed).
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        self.sites.iter().fold((0, 0, 0, 0), |a, s| {
            (
                a.0 + s.allocs,
                a.1 + s.alloc_bytes,
                a.2 + s.frees,
                a.3 + s.free_bytes,
            )
        })
    }

    /// Writes the heap recording (format in the module docs) with the
    /// snapshot's modules, or this process's loaded modules if it has none.
    pub fn write_to(&self, mut w: impl Write) -> io::Result<()> {
        let mut b = Vec::with_capacity(64 + self.sites.len() * 16);
        b.extend_from_slice(&HEAP_MAGIC);
        b.extend_from_slice(&[3, 0, 0, 0]);
        let c = &self.counters;
        for v in [
            (self.capture == Capture::Exact) as u64,
            self.sites.len() as u64,
            c.overflow_site_allocs,
            c.live_overflow,
            c.unknown_frees,
            c.dropped,
            self.sample_bytes,
        ] {
            put_varint(&mut b, v);
        }
        for s in &self.sites {
            for v in [
                s.allocs,
                s.alloc_bytes,
                s.frees,
                s.free_bytes,
                s.peak_bytes,
                s.zero_live,
            ] {
                put_varint(&mut b, v);
            }
        }
        w.write_all(&b)?;
        let mut t = crate::tracefile::TraceWriter::new(&mut w)?;
        if self.modules.is_empty() {
            t.write_loaded_modules()?;
        } else {
            for m in &self.modules {
                t.write_module(m)?;
            }
        }
        for s in &self.sites {
            t.write_stack(&s.frames, false)?;
        }
        t.finish()?;
        Ok(())
    }

    /// Reads a heap recording written by [`HeapSnapshot::write_to`].
    pub fn read_from(mut r: impl Read) -> Result<HeapSnapshot, String> {
        let mut head = [0u8; 12];
        r.read_exact(&mut head)
            .map_err(|e| format!("heap recording header: {e}"))?;
        if head[..8] != HEAP_MAGIC {
            return Err("not a heap recording (bad magic)".into());
        }
        let version = head[8];
        if !(1..=3).contains(&version) {
            return Err(format!("heap recording version {} not supported", head[8]));
        }
        let mut next = || get_varint(&mut r);
        let capture = if next()? == 1 {
            Capture::Exact
        } else {
            Capture::Fast
        };
        let n = next()?;
        let counters = HeapCounters {
            overflow_site_allocs: next()?,
            live_overflow: next()?,
            unknown_frees: next()?,
            dropped: next()?,
        };
        let sample_bytes = if version >= 3 { next()? } else { 0 };
        if n > 1 << 26 {
            return Err(format!("heap recording: {n} sites is too many"));
        }
        let mut sites = Vec::with_capacity(n as usize);
        for _ in 0..n {
            sites.push(SiteStats {
                frames: Vec::new(),
                allocs: next()?,
                alloc_bytes: next()?,
                frees: next()?,
                free_bytes: next()?,
                peak_bytes: next()?,
                zero_live: if version >= 2 { next()? } else { 0 },
            });
        }
        let trace =
            crate::tracefile::read_all(r).map_err(|e| format!("heap recording stacks: {e}"))?;
        if trace.stacks.len() != sites.len() {
            return Err(format!(
                "heap recording: {} sites but {} stacks (truncated?)",
                sites.len(),
                trace.stacks.len()
            ));
        }
        for (s, st) in sites.iter_mut().zip(trace.stacks) {
            s.frames = st.frames;
        }
        Ok(HeapSnapshot {
            capture,
            sites,
            counters,
            modules: trace.modules,
            sample_bytes,
        })
    }
}

fn put_varint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push(v as u8 | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

fn get_varint(r: &mut impl Read) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let mut byte = [0u8];
        r.read_exact(&mut byte)
            .map_err(|e| format!("heap recording counters: {e}"))?;
        if shift == 63 && byte[0] > 1 {
            break;
        }
        v |= ((byte[0] & 0x7f) as u64) << shift;
        if byte[0] & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("heap recording counters: varint overflows 64 bits".into())
}

#[cfg(feature = "symbolize")]
mod report;
#[cfg(feature = "symbolize")]
pub use report::SiteFrame;
