//! Two small `unsafe` helpers of the lazy DWARF reader:
//!
//! - [`Inflating`]: a zlib-compressed section (`SHF_COMPRESSED`, as in
//!   Debian's `-dbg` packages) inflated front to back into a buffer of its
//!   full size. Readers see the prefix inflated so far and wait only for
//!   the bytes they ask for. Inflation runs on a worker thread of its own
//!   when one can be started (the sections of one debug file then inflate
//!   side by side, and beside the caller's own work: glibc's 9.9 MB take
//!   about 15 ms on one core), else on the reader's thread, only as far as
//!   asked.
//! - [`Frozen`]: an append-only list whose items never move, so a `&T`
//!   handed out stays valid while the list grows (the unit list grows as
//!   `.debug_info` is inflated).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// A zlib stream inflated into a buffer of its full size.
///
/// Invariant: bytes `[0, done)` are inflated and never written again;
/// every slice handed out covers only those bytes, and inflation writes
/// only at `[done, len)`, through the raw pointer, never through a slice
/// that was handed out. One party inflates: the worker thread, or (without
/// one) the owner under the `RefCell`.
pub(crate) struct Inflating {
    shared: Arc<Shared>,
    mode: Mode,
}

enum Mode {
    /// Inflated on the reader's thread, as far as asked.
    Here(RefCell<Stream>),
    /// Inflated to the end by a worker thread, shared by the sections
    /// started together (joined when the last of them is dropped).
    Worker {
        worker: Arc<Worker>,
        input: &'static [u8],
        /// In a child forked while the worker ran (the child has no
        /// worker): the stream this thread inflates instead.
        orphan: RefCell<Option<Stream>>,
    },
}

/// A worker thread inflating sections one after the other.
struct Worker {
    sections: Vec<Arc<Shared>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The process that started the thread: a forked child has no such
    /// thread, so it neither waits for it nor joins it.
    pid: u32,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The worker reads the mapped streams: it must be done before the
        // mappings go (their owner drops them after the sections).
        for s in &self.sections {
            s.cancel.store(true, Ordering::Relaxed);
        }
        if let Some(t) = self.thread.take() {
            if self.pid == std::process::id() {
                let _ = t.join();
            }
        }
    }
}

struct Stream {
    z: flate2::Decompress,
    input: &'static [u8],
    failed: bool,
}

/// The buffer and how far it is inflated, shared with the worker.
struct Shared {
    buf: *mut u8,
    len: usize,
    _owner: Buffer,
    /// Bytes inflated so far (stored with `Release` after writing them).
    done: AtomicUsize,
    /// Whether inflation has stopped: at the end, at a corrupt part of
    /// the stream, or cancelled. Guarded for `moved` waits.
    ended: Mutex<bool>,
    moved: Condvar,
    /// Set when the owner is dropped: the worker stops at its next step.
    cancel: AtomicBool,
}

// SAFETY: the buffer is written only by the one party that inflates, at
// `[done, len)`, and read only at `[0, done)` after an `Acquire` load of
// `done` (see the invariant of `Inflating`); the rest is atomics and a
// mutex.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

/// Zeroed memory for a section to inflate into, freed on drop.
///
/// Large buffers are anonymous mappings aligned to 2 MiB and marked for
/// transparent huge pages (`MADV_HUGEPAGE`, honoured where the kernel's
/// THP mode is `madvise` or `always`): glibc's 5.8 MB `.debug_info` then
/// costs 3 page faults instead of about 1400, on the thread that inflates
/// it, which is the critical path of `callstack pstack` on a small target.
/// Pages never inflated into are never touched (anonymous memory is
/// zero-filled on first write).
struct Buffer {
    ptr: *mut u8,
    len: usize,
    /// The mapping (start, length) when mapped; `None`: a boxed slice.
    mapping: Option<(usize, usize)>,
}

/// Huge page size on x86-64 and aarch64 (4 KiB base pages).
const HUGE: usize = 1 << 21;

impl Buffer {
    fn zeroed(len: usize) -> Buffer {
        if len >= HUGE / 2 {
            if let Some(b) = Buffer::mapped(len) {
                return b;
            }
        }
        let boxed: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        Buffer {
            ptr: Box::into_raw(boxed) as *mut u8,
            len,
            mapping: None,
        }
    }

    /// Anonymous mappings are Unix's: elsewhere every buffer is boxed.
    #[cfg(not(unix))]
    fn mapped(_len: usize) -> Option<Buffer> {
        None
    }

    /// `len` bytes rounded up to huge pages, from a mapping one huge page
    /// larger so that an aligned start can be cut from it.
    #[cfg(unix)]
    fn mapped(len: usize) -> Option<Buffer> {
        let size = len.checked_add(HUGE - 1)? & !(HUGE - 1);
        let total = size.checked_add(HUGE)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let base = p as usize;
        let start = (base + HUGE - 1) & !(HUGE - 1);
        let (head, tail) = (start - base, base + total - (start + size));
        // SAFETY: the head and the tail lie in the mapping just made and
        // outside `[start, start + size)`, which is all that is kept.
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            if tail > 0 {
                libc::munmap((start + size) as *mut libc::c_void, tail);
            }
            // Only advice: on failure the buffer uses small pages.
            libc::madvise(start as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
        }
        Some(Buffer {
            ptr: start as *mut u8,
            len,
            mapping: Some((start, size)),
        })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        match self.mapping {
            // SAFETY: `[start, start + size)` is the mapping `mapped` kept,
            // unmapped once, here; no slice of it outlives the `Shared`
            // that owns this buffer (see `Inflating::prefix`).
            #[cfg(unix)]
            Some((start, size)) => unsafe {
                libc::munmap(start as *mut libc::c_void, size);
            },
            #[cfg(not(unix))]
            Some(_) => {}
            // SAFETY: `ptr` and `len` come from `Box::into_raw` of a boxed
            // slice of `len` bytes in `zeroed`, reconstructed once, here.
            None => drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len))
            }),
        }
    }
}

/// Inflate at least this much past what is asked, to amortize calls.
const CHUNK: usize = 256 * 1024;
/// How much the worker inflates between two reports of progress.
const STEP: usize = 128 * 1024;
/// Sections smaller than this inflate on the reader's thread: starting a
/// thread costs more than inflating them.
const WORKER_MIN: usize = 256 * 1024;

impl Shared {
    fn new(len: usize) -> Arc<Shared> {
        let buf = Buffer::zeroed(len);
        Arc::new(Shared {
            buf: buf.ptr,
            len,
            _owner: buf,
            done: AtomicUsize::new(0),
            ended: Mutex::new(false),
            moved: Condvar::new(),
            cancel: AtomicBool::new(false),
        })
    }

    /// Inflates `[done, target)` (or less: end or error of the stream);
    /// `false` when the stream can give no more. Only the inflating party
    /// calls it.
    fn step(&self, s: &mut Stream, target: usize) -> bool {
        let done = self.done.load(Ordering::Relaxed);
        // SAFETY: `[done, target)` lies in the buffer (`target <= len`) and
        // no slice covering it was ever handed out (slices stop at `done`).
        let out = unsafe { std::slice::from_raw_parts_mut(self.buf.add(done), target - done) };
        let consumed = s.z.total_in() as usize;
        let input = s.input.get(consumed..).unwrap_or(&[]);
        let before = s.z.total_out();
        let r = s.z.decompress(input, out, flate2::FlushDecompress::None);
        let made = (s.z.total_out() - before) as usize;
        self.done.store(done + made, Ordering::Release);
        // Stream ended early, an error, or no progress: stop here; the
        // reader sees a truncated section.
        matches!(r, Ok(flate2::Status::Ok) if made > 0 || s.z.total_in() as usize > consumed)
    }

    /// The worker: inflates to the end (or the first error, or until
    /// cancelled), reporting progress at every step.
    fn run(&self, mut s: Stream) {
        // `ended` is set however the loop ends (a panic included), so that
        // no reader waits forever.
        struct End<'a>(&'a Shared);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                *self.0.ended.lock().unwrap_or_else(|e| e.into_inner()) = true;
                self.0.moved.notify_all();
            }
        }
        let _end = End(self);
        while !self.cancel.load(Ordering::Relaxed) {
            let done = self.done.load(Ordering::Relaxed);
            if done >= self.len || !self.step(&mut s, (done + STEP).min(self.len)) {
                break;
            }
            // Taking the lock orders this wake-up after any waiter's check
            // of `done`: none can miss it.
            drop(self.ended.lock());
            self.moved.notify_all();
        }
    }

    /// Inflates on this thread to cover `end` bytes and `CHUNK` more.
    fn inflate_here(&self, s: &mut Stream, end: usize) {
        let target = end.saturating_add(CHUNK).min(self.len);
        while !s.failed && self.done.load(Ordering::Relaxed) < target {
            s.failed = !self.step(s, target);
        }
    }

    /// Waits until `end` bytes are inflated or the worker has stopped.
    fn wait_for(&self, end: usize) {
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        while !*ended && self.done.load(Ordering::Acquire) < end {
            ended = self.moved.wait(ended).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Inflating {
    /// Inflates on the reader's thread, only as far as asked.
    /// `input`: the zlib stream (after the ELF compression header);
    /// `len`: the uncompressed size the header declares.
    pub(crate) fn new(input: &'static [u8], len: usize) -> Inflating {
        Inflating {
            shared: Shared::new(len),
            mode: Mode::Here(RefCell::new(Stream::new(input))),
        }
    }

    /// Starts inflating `streams` (each a zlib stream and its declared
    /// size), whole and in order, on one worker thread; each as [`new`]
    /// when together they are small or no thread can be started. Readers
    /// of a section wait only for the bytes they ask.
    ///
    /// One worker for the whole list, not one per section: the DWARF
    /// loader calls `spawn` twice, once for `.debug_info` (read
    /// progressively, the longest chain of work) and once for the
    /// sections it needs whole, so that on a two-core machine the first
    /// is not slowed by more threads than cores (measured: 3% faster
    /// `pstack` than a worker per section).
    ///
    /// [`new`]: Inflating::new
    pub(crate) fn spawn(streams: &[(&'static [u8], usize)]) -> Vec<Inflating> {
        let here = || streams.iter().map(|&(i, l)| Inflating::new(i, l)).collect();
        if streams.iter().map(|s| s.1).sum::<usize>() < WORKER_MIN {
            return here();
        }
        let shared: Vec<Arc<Shared>> = streams.iter().map(|s| Shared::new(s.1)).collect();
        let jobs: Vec<(Arc<Shared>, &'static [u8])> = shared
            .iter()
            .cloned()
            .zip(streams.iter().map(|s| s.0))
            .collect();
        let thread = std::thread::Builder::new()
            .name("callstack-inflate".into())
            .spawn(move || {
                for (sh, input) in jobs {
                    sh.run(Stream::new(input));
                }
            });
        let Ok(thread) = thread else {
            return here();
        };
        let worker = Arc::new(Worker {
            sections: shared.clone(),
            thread: Some(thread),
            pid: std::process::id(),
        });
        shared
            .into_iter()
            .zip(streams)
            .map(|(shared, &(input, _))| Inflating {
                shared,
                mode: Mode::Worker {
                    worker: worker.clone(),
                    input,
                    orphan: RefCell::new(None),
                },
            })
            .collect()
    }

    /// The uncompressed size.
    pub(crate) fn len(&self) -> usize {
        self.shared.len
    }

    /// The inflated prefix, inflating first (or waiting for the worker)
    /// until it covers `end` bytes (or the whole section, or up to a
    /// corrupt part of the stream).
    pub(crate) fn prefix(&self, end: usize) -> &'static [u8] {
        let sh = &*self.shared;
        let end = end.min(sh.len);
        if sh.done.load(Ordering::Acquire) < end {
            match &self.mode {
                Mode::Here(s) => sh.inflate_here(&mut s.borrow_mut(), end),
                Mode::Worker { worker, .. } if worker.pid == std::process::id() => sh.wait_for(end),
                Mode::Worker { input, orphan, .. } => {
                    // Forked while the worker ran: go on here, from a
                    // fresh stream brought to where the worker stopped.
                    let mut o = orphan.borrow_mut();
                    let s = o.get_or_insert_with(|| {
                        Stream::skipping(input, sh.done.load(Ordering::Acquire))
                    });
                    sh.inflate_here(s, end);
                }
            }
        }
        // SAFETY: `[0, done)` lies in the buffer, is initialized (zeroed
        // then inflated, `Acquire` pairing with the inflating party's
        // `Release`) and is never written again (see the invariant); the
        // buffer lives until `self` is dropped, and callers keep the slice
        // no longer than `self` (it is owned by the `DwarfIndex` that uses
        // the slices, after them in field order).
        unsafe { std::slice::from_raw_parts(sh.buf, sh.done.load(Ordering::Acquire)) }
    }

    /// The whole section, or `None` if its stream ends or breaks before
    /// the declared size.
    pub(crate) fn whole(&self) -> Option<&'static [u8]> {
        let p = self.prefix(usize::MAX);
        (p.len() == self.shared.len).then_some(p)
    }
}

impl Stream {
    fn new(input: &'static [u8]) -> Stream {
        Stream {
            z: flate2::Decompress::new(true),
            input,
            failed: false,
        }
    }

    /// A stream whose first `skip` output bytes are inflated and dropped.
    fn skipping(input: &'static [u8], skip: usize) -> Stream {
        let mut s = Stream::new(input);
        let mut scratch = vec![0u8; STEP];
        while !s.failed && (s.z.total_out() as usize) < skip {
            let want = (skip - s.z.total_out() as usize).min(STEP);
            let consumed = s.z.total_in() as usize;
            let before = s.z.total_out();
            let r = s.z.decompress(
                s.input.get(consumed..).unwrap_or(&[]),
                &mut scratch[..want],
                flate2::FlushDecompress::None,
            );
            let moved = s.z.total_out() > before || s.z.total_in() as usize > consumed;
            s.failed = !matches!(r, Ok(flate2::Status::Ok) if moved);
        }
        s
    }
}

/// An append-only list; references to its items stay valid as it grows.
pub(crate) struct Frozen<T> {
    items: RefCell<Vec<Box<T>>>,
}

impl<T> Frozen<T> {
    pub(crate) fn new() -> Frozen<T> {
        Frozen {
            items: RefCell::new(Vec::new()),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.items.borrow().len()
    }

    pub(crate) fn push(&self, item: T) {
        self.items.borrow_mut().push(Box::new(item));
    }

    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        let items = self.items.borrow();
        let p: *const T = &**items.get(i)?;
        // SAFETY: items are boxed, never removed nor mutated through the
        // list until it is dropped; growing the vector moves the boxes,
        // not what they point to.
        Some(unsafe { &*p })
    }

    /// Index of the first item for which `pred` is false (items must be
    /// partitioned by `pred`).
    pub(crate) fn partition_point(&self, pred: impl FnMut(&Box<T>) -> bool) -> usize {
        self.items.borrow().partition_point(pred)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn zlib(data: &[u8]) -> &'static [u8] {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        Box::leak(e.finish().unwrap().into_boxed_slice())
    }

    #[test]
    fn inflates_only_a_prefix_then_the_rest() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let z = Inflating::new(zlib(&data), data.len());
        let p = z.prefix(10);
        assert!(p.len() >= 10 && p.len() < data.len());
        assert_eq!(p, &data[..p.len()]);
        assert_eq!(z.prefix(usize::MAX), &data[..]);
        assert_eq!(p, &data[..p.len()], "earlier slices stay valid");
    }

    #[test]
    fn truncated_or_garbage_stream_gives_a_short_prefix() {
        let data = vec![42u8; 1_000_000];
        let full = zlib(&data);
        let z = Inflating::new(&full[..full.len() / 2], data.len());
        let p = z.prefix(data.len());
        assert!(p.len() < data.len());
        assert!(p.iter().all(|&b| b == 42));
        let g = Inflating::new(b"not zlib at all", 100);
        assert!(g.prefix(100).is_empty());
        // Declared size smaller than the stream: stops at the declared size.
        let s = Inflating::new(full, 1000);
        assert_eq!(s.prefix(usize::MAX), &data[..1000]);
    }

    #[test]
    fn a_worker_inflates_the_same_bytes() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 13 % 241) as u8).collect();
        let full = zlib(&data);
        let z = Inflating::spawn(&[(full, data.len())]).pop().unwrap();
        let p = z.prefix(10);
        assert!(p.len() >= 10);
        assert_eq!(p, &data[..p.len()]);
        assert_eq!(z.whole(), Some(&data[..]));
        let two = Inflating::spawn(&[(&full[..full.len() / 2], data.len()), (full, data.len())]);
        let t = &two[0];
        assert_eq!(
            two[1].whole(),
            Some(&data[..]),
            "the second follows the first"
        );
        assert_eq!(t.whole(), None, "a truncated stream is not whole");
        let p = t.prefix(usize::MAX);
        assert!(!p.is_empty() && p.len() < data.len());
        assert_eq!(p, &data[..p.len()]);
        // Dropped while inflating: the worker stops and is joined.
        drop(Inflating::spawn(&[(full, data.len()), (full, data.len())]));
    }

    /// A child forked while the worker inflates has no worker: it goes on
    /// inflating on its own thread, and dropping does not wait for the
    /// worker it does not have.
    #[test]
    fn a_forked_child_inflates_without_the_worker() {
        let data: Vec<u8> = (0..8_000_000u32).map(|i| (i * 31 % 239) as u8).collect();
        let full = zlib(&data);
        let z = Inflating::spawn(&[(full, data.len())]).pop().unwrap();
        let early = z.prefix(1).len();
        // SAFETY: the child only inflates, compares and exits; an alarm
        // ends it if it were to wait for the missing worker.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe { libc::alarm(20) };
            let ok = z.whole() == Some(&data[..]);
            drop(z);
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(pid > 0);
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child status {status:#x} (forked after {early} bytes)"
        );
        assert_eq!(z.whole(), Some(&data[..]));
    }

    #[test]
    fn frozen_items_keep_their_address() {
        let f = Frozen::new();
        f.push(1u64);
        let first = f.get(0).unwrap();
        for i in 0..1000 {
            f.push(i);
        }
        assert_eq!(*first, 1);
        assert_eq!(f.len(), 1001);
        assert_eq!(f.partition_point(|x| **x < 2), 3);
    }
}
