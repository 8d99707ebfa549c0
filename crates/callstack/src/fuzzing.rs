//! Internal parsers of untrusted bytes, reachable from the fuzz targets
//! under `fuzz/` and from the test that replays their regression corpus.
//! Not part of the API: names and signatures here may change at any time.

/// `/proc/<pid>/maps` lines.
#[cfg(not(windows))]
pub mod maps {
    /// The signal-safe `start-end` parser (stack bounds, crash reports).
    pub fn parse_range(line: &[u8]) -> Option<(usize, usize)> {
        crate::sys::maps::parse_range(line)
    }

    /// The crash handler's full-line parser: `(start, end, offset, path)`.
    #[cfg(target_os = "linux")]
    pub fn parse_crash_line(line: &[u8]) -> Option<(usize, usize, usize, &[u8])> {
        crate::crash::fuzzing::maps_line_fields(line)
    }
}

/// ELF note areas.
pub mod notes {
    /// The crash handler's non-allocating `NT_GNU_BUILD_ID` finder.
    #[cfg(target_os = "linux")]
    pub fn build_id_in_notes(notes: &[u8]) -> Option<&[u8]> {
        crate::crash::fuzzing::build_id_in_notes(notes)
    }
}

/// What `callstack::remote` reads of an ELF image (a file or the vDSO).
#[cfg(all(feature = "remote", not(windows)))]
pub mod remote {
    pub use crate::remote::fuzzing::{build_id, exec_segments, load_bias, load_segments};
}

/// CFI interpretation.
pub mod cfi {
    /// The fast `.eh_frame` interpreter of the capture path checked against
    /// gimli on the FDE at `off` of `eh` (mapped at `eh_addr`) for `addr`:
    /// `Err` describes a row where the two disagree.
    pub fn fast_vs_gimli(eh: &[u8], eh_addr: u64, off: usize, addr: u64) -> Result<(), String> {
        crate::unwind::check_against_gimli(eh, eh_addr, off, addr)
    }
}
