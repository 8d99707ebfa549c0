//! The one `unsafe` corner of the symbolizer: file mappings whose bytes are
//! handed out as `&'static [u8]` for as long as their owner lives.
//!
//! gimli and addr2line want a reader that borrows the section bytes; the
//! bytes live in an mmap (or in a buffer of decompressed data) owned by the
//! same struct as the parsed DWARF. [`Mapped`] owns those buffers and is
//! dropped after everything that borrows from it (see `elf::ElfModule`,
//! whose field order guarantees it).

use std::fs::File;
use std::path::Path;

/// Owner of a file mapping plus any decompressed section buffers.
pub(crate) struct Mapped {
    map: Backing,
    stash: std::sync::Mutex<Vec<Box<[u8]>>>,
}

enum Backing {
    Map(memmap2::Mmap),
    Owned(Box<[u8]>),
}

impl Mapped {
    /// Owns `bytes` (an object already in memory).
    pub(crate) fn from_bytes(bytes: Vec<u8>) -> Mapped {
        Mapped {
            map: Backing::Owned(bytes.into_boxed_slice()),
            stash: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Maps `path` read-only.
    pub(crate) fn open(path: &Path) -> std::io::Result<Mapped> {
        let file = File::open(path)?;
        // SAFETY: the mapping is read-only and private. A file truncated
        // under us while mapped would fault on access; symbolization reads
        // executables and debug files that are not rewritten in place
        // (installers replace them by rename), the same assumption every
        // debugger makes.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(Mapped {
            map: Backing::Map(map),
            stash: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The mapped bytes with an unbounded lifetime.
    ///
    /// Callers must not let the slice outlive `self`: every user stores it
    /// only in structures that are dropped before the `Mapped`.
    pub(crate) fn bytes(&self) -> &'static [u8] {
        let s: &[u8] = match &self.map {
            Backing::Map(m) => m,
            Backing::Owned(b) => b,
        };
        // SAFETY: the mapping is never unmapped or moved while `self` lives,
        // and callers keep the slice only as long as `self` (see above).
        unsafe { core::slice::from_raw_parts(s.as_ptr(), s.len()) }
    }

    /// Keeps `buf` (e.g. a decompressed section) alive as long as `self` and
    /// returns it with an unbounded lifetime, under the same rule as
    /// [`Mapped::bytes`].
    pub(crate) fn stash(&self, buf: Vec<u8>) -> &'static [u8] {
        let boxed = buf.into_boxed_slice();
        let (ptr, len) = (boxed.as_ptr(), boxed.len());
        // Moving the Box into the vector does not move its heap buffer.
        self.stash
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(boxed);
        // SAFETY: the heap buffer stays where it is until `self` is dropped.
        unsafe { core::slice::from_raw_parts(ptr, len) }
    }
}
