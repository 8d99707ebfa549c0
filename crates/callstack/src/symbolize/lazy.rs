//! Two small `unsafe` helpers of the lazy DWARF reader:
//!
//! - [`Inflating`]: a zlib-compressed section (`SHF_COMPRESSED`, as in
//!   Debian's `-dbg` packages) inflated front to back, only as far as the
//!   reader has asked. Symbolizing a few frames of glibc then inflates the
//!   part of `.debug_info` up to the units hit, not all of it.
//! - [`Frozen`]: an append-only list whose items never move, so a `&T`
//!   handed out stays valid while the list grows (the unit list grows as
//!   `.debug_info` is inflated).

use std::cell::{Cell, RefCell};

/// A zlib stream inflated on demand into a buffer of its full size.
///
/// Invariant: bytes `[0, done)` are inflated and never written again;
/// every slice handed out covers only those bytes, and inflation writes
/// only at `[done, len)`, through the raw pointer, never through a slice
/// that was handed out.
pub(crate) struct Inflating {
    buf: *mut u8,
    len: usize,
    done: Cell<usize>,
    state: RefCell<State>,
}

struct State {
    z: flate2::Decompress,
    input: &'static [u8],
    failed: bool,
}

/// Inflate at least this much past what is asked, to amortize calls.
const CHUNK: usize = 256 * 1024;

impl Inflating {
    /// `input`: the zlib stream (after the ELF compression header);
    /// `len`: the uncompressed size the header declares.
    pub(crate) fn new(input: &'static [u8], len: usize) -> Inflating {
        // Zeroed memory comes from fresh anonymous pages for large sizes:
        // pages never inflated into are never touched.
        let boxed: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        let buf = Box::into_raw(boxed) as *mut u8;
        Inflating {
            buf,
            len,
            done: Cell::new(0),
            state: RefCell::new(State {
                z: flate2::Decompress::new(true),
                input,
                failed: false,
            }),
        }
    }

    /// The uncompressed size.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The inflated prefix, inflating first until it covers `end` bytes
    /// (or the whole section, or up to a corrupt part of the stream).
    pub(crate) fn prefix(&self, end: usize) -> &'static [u8] {
        let end = end.min(self.len);
        if self.done.get() < end {
            self.inflate_to(end.saturating_add(CHUNK).min(self.len));
        }
        // SAFETY: `[0, done)` lies in the buffer, is initialized (zeroed
        // then inflated) and is never written again (see the invariant);
        // the buffer lives until `self` is dropped, and callers keep the
        // slice no longer than `self` (it is owned by the `DwarfIndex` that
        // uses the slices, as its last field).
        unsafe { std::slice::from_raw_parts(self.buf, self.done.get()) }
    }

    fn inflate_to(&self, target: usize) {
        let mut st = self.state.borrow_mut();
        while !st.failed && self.done.get() < target {
            let done = self.done.get();
            // SAFETY: `[done, target)` lies in the buffer and no slice
            // covering it was ever handed out (slices stop at `done`).
            let out = unsafe { std::slice::from_raw_parts_mut(self.buf.add(done), target - done) };
            let consumed = st.z.total_in() as usize;
            let input = st.input.get(consumed..).unwrap_or(&[]);
            let before = st.z.total_out();
            let r = st.z.decompress(input, out, flate2::FlushDecompress::None);
            let made = (st.z.total_out() - before) as usize;
            self.done.set(done + made);
            match r {
                Ok(flate2::Status::Ok) if made > 0 || st.z.total_in() as usize > consumed => {}
                // Stream ended early, an error, or no progress: stop here;
                // the reader sees a truncated section.
                _ => st.failed = true,
            }
        }
    }
}

// SAFETY: an `Inflating` owns its buffer exclusively, like the `Box` it
// was made from; moving it to another thread moves that ownership. It is
// not `Sync` (interior mutability through `Cell`/`RefCell`).
unsafe impl Send for Inflating {}

impl Drop for Inflating {
    fn drop(&mut self) {
        // SAFETY: `buf` and `len` come from `Box::into_raw` of a boxed
        // slice of `len` bytes in `new`, reconstructed once, here.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.buf, self.len)) });
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
