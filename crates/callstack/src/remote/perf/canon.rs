//! One address range per mapped file for a whole recording.
//!
//! A profile names its frames by address, through its module records. When
//! several processes are recorded (`record -a`, or a command that starts
//! others), their address spaces overlap: two programs built without PIE
//! both load at 0x400000, and a library sits at a different address in each
//! process. Their raw addresses would then name each other's functions, and
//! pprof (one mapping per location) could not tell them apart.
//!
//! So every sampled address is moved into one range per file (a
//! [`Canon`]): the first process that maps a file keeps its own addresses
//! for it (a single-process recording is unchanged), the same file in any
//! other process is moved onto that range, and a different file whose real
//! range overlaps one already placed gets a range of its own above every
//! user address ([`SYNTHETIC_BASE`]). Each file is then one module record,
//! named once, whatever the number of processes that mapped it; the
//! address minus the record's bias is still the address in the file, so a
//! server symbolizes it as any other.

use crate::remote::Module;
use crate::tracefile::ModuleRecord;
use std::collections::HashMap;
use std::path::PathBuf;

/// Where ranges of their own start: above every user address of the hosts
/// supported (47, 48 or 52 bits), below the kernel's half.
pub(super) const SYNTHETIC_BASE: u64 = 0x4000_0000_0000_0000;

/// Their alignment: readable addresses, one range per 4 GiB.
const SYNTHETIC_ALIGN: u64 = 1 << 32;

/// Whether a module is anonymous executable memory (the kernel's `//anon`
/// of an mmap record, a named `[anon:...]` region).
fn is_anonymous(name: &str) -> bool {
    name == "//anon" || name.starts_with("[anon")
}

/// What makes two processes' modules the same file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    path: PathBuf,
    build_id: Option<Vec<u8>>,
    /// For a module with no file found and no build-id (a deleted file, a
    /// memfd): its process; nothing says another's is the same.
    pid: Option<u32>,
}

/// The recording's ranges, one per file (more only when a file's range
/// had to grow over another's).
#[derive(Debug)]
pub(super) struct Canon {
    /// The ranges of each file, as indices into `records`.
    by_key: HashMap<Key, Vec<usize>>,
    records: Vec<ModuleRecord>,
    /// The start of the next range of its own.
    next: u64,
}

impl Default for Canon {
    fn default() -> Self {
        Canon {
            by_key: HashMap::new(),
            records: Vec::new(),
            next: SYNTHETIC_BASE,
        }
    }
}

impl Canon {
    /// Places module `m` of process `pid` and returns what to add
    /// (wrapping) to its addresses, and the record of the range they move
    /// into. The same file in another process (or the same process again)
    /// finds its range, grown when this mapping covers more of the file
    /// (a process whose module map came from `/proc/PID/maps` knows all
    /// its segments, one known from the kernel's records its executable
    /// ones).
    pub(super) fn place(&mut self, m: &Module, pid: u32) -> (u64, ModuleRecord) {
        let rec = super::module_record(m);
        if is_anonymous(&m.name) || rec.start < rec.bias || rec.end <= rec.start {
            // JIT code: not moved; named by address from its process's
            // perf map or jitdump file. Nor a module whose range does not
            // start in its file (below its load bias: mappings of two
            // loads taken for one).
            return (0, rec);
        }
        let key = Key {
            path: rec.path.clone(),
            build_id: rec.build_id.clone(),
            pid: (m.file.is_none() && m.build_id.is_none() && m.image.is_none()).then_some(pid),
        };
        let (lo, hi) = (
            rec.start.wrapping_sub(rec.bias),
            rec.end.wrapping_sub(rec.bias),
        );
        for &i in self.by_key.get(&key).into_iter().flatten() {
            let r = &self.records[i];
            let (start, end) = (lo.wrapping_add(r.bias), hi.wrapping_add(r.bias));
            let (start, end) = (start.min(r.start), end.max(r.end));
            if (start, end) != (r.start, r.end) && self.overlaps(start, end, Some(i)) {
                continue;
            }
            let r = &mut self.records[i];
            (r.start, r.end) = (start, end);
            return (r.bias.wrapping_sub(rec.bias), r.clone());
        }
        let placed = if self.overlaps(rec.start, rec.end, None) {
            let lo_aligned = lo & !(SYNTHETIC_ALIGN - 1);
            let len = hi.saturating_sub(lo_aligned);
            let bias = self.next.wrapping_sub(lo_aligned);
            self.next = self
                .next
                .saturating_add(len.div_ceil(SYNTHETIC_ALIGN).max(1) * SYNTHETIC_ALIGN);
            ModuleRecord {
                start: lo.wrapping_add(bias),
                end: hi.wrapping_add(bias),
                bias,
                ..rec.clone()
            }
        } else {
            rec.clone()
        };
        let delta = placed.bias.wrapping_sub(rec.bias);
        self.by_key.entry(key).or_default().push(self.records.len());
        self.records.push(placed.clone());
        (delta, placed)
    }

    /// Whether `start..end` overlaps a range placed (other than `but`).
    fn overlaps(&self, start: u64, end: u64, but: Option<usize>) -> bool {
        self.records
            .iter()
            .enumerate()
            .any(|(i, r)| Some(i) != but && r.start < end && start < r.end)
    }

    /// The range `rec` (a record [`Canon::place`] returned, perhaps grown
    /// since) is now, else `rec` itself.
    pub(super) fn current(&self, rec: &ModuleRecord) -> ModuleRecord {
        let holds = |r: &&ModuleRecord| {
            r.path == rec.path
                && r.build_id == rec.build_id
                && r.bias == rec.bias
                && r.start <= rec.start
                && rec.end <= r.end
        };
        // The file's own ranges first (one lookup); a range keyed by its
        // process (no file, no build-id) is searched for.
        let key = Key {
            path: rec.path.clone(),
            build_id: rec.build_id.clone(),
            pid: None,
        };
        let found = self
            .by_key
            .get(&key)
            .and_then(|ix| ix.iter().map(|&i| &self.records[i]).find(holds))
            .or_else(|| self.records.iter().find(holds));
        found.unwrap_or(rec).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn module(path: &str, id: Option<u8>, start: u64, end: u64, bias: u64) -> Module {
        Module {
            name: path.to_string(),
            file: id.map(|_| PathBuf::from(path)),
            debug_file: None,
            start,
            end,
            bias,
            build_id: id.map(|b| vec![b; 20]),
            image: None,
            mappings: Vec::new(),
        }
    }

    /// An address of `m` moved by `canon`, minus the record's bias: still
    /// the address in the file.
    fn file_address(delta: u64, rec: &ModuleRecord, addr: u64) -> u64 {
        addr.wrapping_add(delta).wrapping_sub(rec.bias)
    }

    #[test]
    fn one_range_per_file_and_none_shared_by_two_files() {
        let mut c = Canon::default();
        // The first process keeps its own addresses.
        let libc_a = module(
            "/lib/libc.so.6",
            Some(1),
            0x7f00_0000_0000,
            0x7f00_0020_0000,
            0x7f00_0000_0000,
        );
        let (d, r) = c.place(&libc_a, 10);
        assert_eq!((d, r.start, r.bias), (0, libc_a.start, libc_a.bias));
        // The same file elsewhere in another process: moved onto it.
        let libc_b = module(
            "/lib/libc.so.6",
            Some(1),
            0x7e00_0000_0000,
            0x7e00_0020_0000,
            0x7e00_0000_0000,
        );
        let (d, r2) = c.place(&libc_b, 11);
        assert_eq!(r2, r);
        assert_eq!(libc_b.start.wrapping_add(d), libc_a.start);
        // Two programs without PIE at the same addresses: the second gets a
        // range of its own, above every user address, the address in its
        // file unchanged.
        let a = module("/bin/a", Some(2), 0x40_0000, 0x40_5000, 0);
        let b = module("/bin/b", Some(3), 0x40_0000, 0x40_5000, 0);
        let (da, ra) = c.place(&a, 10);
        let (db, rb) = c.place(&b, 11);
        assert_eq!(da, 0);
        assert!(rb.start >= SYNTHETIC_BASE, "{rb:?}");
        assert!(rb.start >= ra.end || rb.end <= ra.start);
        assert_eq!(file_address(db, &rb, 0x40_1170), 0x40_1170);
        // Placing again finds the same ranges.
        assert_eq!(c.place(&b, 12), (db, rb.clone()));
        // A file with no build-id and no file found (a deleted one): never
        // taken for another process's.
        let gone_a = module(
            "/tmp/gone (deleted)",
            None,
            0x1000_0000,
            0x1000_1000,
            0x1000_0000,
        );
        let gone_b = module(
            "/tmp/gone (deleted)",
            None,
            0x2000_0000,
            0x2000_1000,
            0x2000_0000,
        );
        let (_, ga) = c.place(&gone_a, 10);
        let (_, gb) = c.place(&gone_b, 11);
        assert_ne!(ga, gb);
        // A module whose range starts below its bias (two loads' mappings
        // taken for one) is not placed.
        let bogus = module("/lib/ld.so", Some(9), 0x1000, 0x9000_0000, 0x7000_0000);
        assert_eq!(c.place(&bogus, 11).0, 0);
        assert!(!c.records.iter().any(|r| r.path == Path::new("/lib/ld.so")));
        // JIT code stays where it is, whatever it overlaps: named by its
        // address from its process's perf map.
        let anon = module("//anon", None, 0x3f_0000, 0x7f00_0010_0000, 0x3f_0000);
        assert_eq!(c.place(&anon, 11).0, 0);
    }

    #[test]
    fn a_range_grows_to_what_a_process_maps_of_its_file() {
        let mut c = Canon::default();
        // Known from the kernel's records: its executable segment only.
        let text = module(
            "/bin/p",
            Some(4),
            0x5555_0000_1000,
            0x5555_0000_3000,
            0x5555_0000_0000,
        );
        let (_, first) = c.place(&text, 1);
        // Another process's, from /proc/PID/maps: every segment.
        let whole = module(
            "/bin/p",
            Some(4),
            0x5600_0000_0000,
            0x5600_0000_5000,
            0x5600_0000_0000,
        );
        let (d, grown) = c.place(&whole, 2);
        assert_eq!(
            (grown.start, grown.end),
            (0x5555_0000_0000, 0x5555_0000_5000)
        );
        assert_eq!(file_address(d, &grown, 0x5600_0000_4000), 0x4000);
        // The first record, kept since, stands for the grown range now.
        assert_eq!(c.current(&first), grown);
        // A range that cannot grow (another file right after it): a second
        // range for the file, not an overlap.
        let next = module(
            "/bin/q",
            Some(5),
            0x5555_0000_5000,
            0x5555_0000_6000,
            0x5555_0000_5000,
        );
        c.place(&next, 1);
        let longer = module(
            "/bin/p",
            Some(4),
            0x5700_0000_0000,
            0x5700_0000_8000,
            0x5700_0000_0000,
        );
        let (d, other) = c.place(&longer, 3);
        assert_ne!(other.start, grown.start);
        assert_eq!(file_address(d, &other, 0x5700_0000_7000), 0x7000);
        for (i, x) in c.records.iter().enumerate() {
            for y in &c.records[i + 1..] {
                assert!(x.end <= y.start || y.end <= x.start, "{x:?} overlaps {y:?}");
            }
        }
    }
}
