//! The recorder's tables: fixed-size, lock-free, allocation-free.
//!
//! - Sites: records kept dense, in the order the sites are first met (a
//!   counter hands out the next record, which its thread fills: hash,
//!   frames, then `ready`), found through an index: open addressing keyed
//!   by the stack hash, one 4-byte slot per site holding its record's
//!   number plus one. An index slot is claimed once (compare-and-swap from
//!   0 to the filled record) and never released; a thread that loses the
//!   race for a slot keeps its record for the next free slot, or clears
//!   its hash if the winner holds the same stack. The counters of a record
//!   are plain atomics. When no slot is free within [`MAX_PROBE`] steps,
//!   or no record is left, the allocation is counted in the overflow site
//!   (the last record, without frames). Dense records and a small index
//!   keep the pages a program touches few: a shared file of the tables
//!   holds, and a fork copies, a few dozen pages for a few hundred sites.
//! - Live blocks: open addressing keyed by address, one 16-byte slot per
//!   block (address; site index and size packed in one word), the blocks
//!   of a run of memory in a run of slots (one slot per 16 bytes of
//!   address, or per a quarter of the sampling mean when sampled: see
//!   `addr_slot`). A freed
//!   block's slot becomes a tombstone that a later insert may reuse; a slot
//!   never goes back to empty, so a lookup may stop at the first empty one.
//!   A lookup gives up after [`MAX_PROBE`] steps (a free of an unknown
//!   block: counted and ignored), and an insert with no free slot in reach
//!   is counted as a live overflow.
//!
//! The recorder's storage is one region: its own counters, then the site
//! index, then the site records, then the live table ([`Recorder::storage_len`] bytes). It is an
//! anonymous `mmap` made on first use (pages are touched only as slots
//! are), never through the allocator being tracked, or memory the caller
//! hands over ([`Recorder::use_storage`]): `callstack memtrack` gives it a
//! shared file mapping that outlives the process, and reads it back with
//! a second `Recorder` over a copy of the file.
//!
//! Every update is a single aligned atomic store or read-modify-write on
//! one word, so a process killed at any point leaves the region readable:
//! at most the one update each thread was in the middle of is lost or
//! half-done (a block counted as allocated at its site but missing from
//! the live table, or taken out of the live table but not yet counted as
//! freed at its site: either way its site keeps it as live). A site
//! record handed out but not yet published in the index has no allocation
//! counted: a snapshot skips it, as it skips a record given up after a
//! lost race.

use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::*,
};

/// Frames kept per allocation site.
pub const MAX_DEPTH: usize = 32;
/// Slots looked at before an insert or lookup gives up.
pub const MAX_PROBE: usize = 256;

const EMPTY: usize = 0;
const TOMBSTONE: usize = 1;
const SIZE_BITS: u32 = 40;
/// A sampled block's count rounds up (see `sample::draw_round_up`).
const UP_BIT: u64 = 1 << (SIZE_BITS - 1);
const SIZE_MASK: u64 = UP_BIT - 1;

#[repr(C)]
pub(crate) struct SiteSlot {
    pub hash: AtomicU64,
    pub ready: AtomicU32,
    pub nframes: AtomicU32,
    pub allocs: AtomicU64,
    pub alloc_bytes: AtomicU64,
    pub frees: AtomicU64,
    pub free_bytes: AtomicU64,
    pub peak: AtomicU64,
    /// Allocations of size 0, and frees of such blocks.
    pub zero_allocs: AtomicU64,
    pub zero_frees: AtomicU64,
    pub frames: [AtomicUsize; MAX_DEPTH],
}

/// The recorder's own counters, at the start of its storage.
#[repr(C)]
struct Counters {
    live_overflow: AtomicU64,
    unknown_frees: AtomicU64,
    /// Site records handed out (may exceed the capacity: then none is).
    next_site: AtomicU64,
    /// The mean bytes between samples the records were made with (0: every
    /// allocation), for a reader of the storage.
    sample_bytes: AtomicU64,
    _pad: [u64; 4],
}

#[repr(C)]
struct LiveSlot {
    addr: AtomicUsize,
    val: AtomicU64,
}

/// A block removed from the live table by [`Recorder::take`], not yet
/// counted as freed: [`Recorder::commit_free`] counts it,
/// [`Recorder::put_back`] restores it (a failed `realloc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    site: u32,
    size: u64,
    /// Whether its estimated count rounds up (sampled blocks).
    up: bool,
    /// What the block stands for: 1 and `size` unless sampled.
    blocks: u64,
    bytes: u64,
}

impl Taken {
    /// The block's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The bytes the block stands for: its size, or when the recorder
    /// samples, the estimate its sample weighs
    /// ([`sample::estimated_bytes`](crate::alloc::sample::estimated_bytes)).
    pub fn weighted_bytes(&self) -> u64 {
        self.bytes
    }
}

/// Per-site counters and live blocks of a tracked heap, in pre-sized
/// tables that never allocate (see the module docs of [`crate::alloc`]).
///
/// All methods are thread-safe without a lock; `record_*` never allocate.
/// The tables are mapped on the first record; a record made while another
/// thread is mapping them is dropped (counted in
/// [`HeapCounters::dropped`](crate::alloc::HeapCounters)).
pub struct Recorder {
    state: AtomicU8,
    enabled: AtomicBool,
    site_bits: u32,
    live_bits: u32,
    counters: AtomicPtr<Counters>,
    index: AtomicPtr<AtomicU32>,
    sites: AtomicPtr<SiteSlot>,
    live: AtomicPtr<LiveSlot>,
    /// Records dropped while the storage was not there (being mapped by
    /// another thread, or failed).
    dropped: AtomicU64,
    /// Mean bytes between samples (0: every allocation is recorded); see
    /// [`Recorder::set_sample_bytes`].
    sample_bytes: AtomicU64,
}

const UNINIT: u8 = 0;
const MAPPING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A recorder with room for 65 536 sites and 4 Mi live blocks
    /// (21 MiB and 64 MiB of address space, touched as used).
    pub const fn new() -> Recorder {
        Recorder::with_capacity(16, 22)
    }

    /// A recorder with room for `2^site_bits` sites and `2^live_bits` live
    /// blocks. `site_bits` is clamped to 4..=23, `live_bits` to 4..=30.
    pub const fn with_capacity(site_bits: u32, live_bits: u32) -> Recorder {
        Recorder::build(site_bits, live_bits, 0)
    }

    /// [`Recorder::new`] for allocations sampled one per `mean_bytes`
    /// bytes on average (see [`Recorder::set_sample_bytes`]).
    pub const fn sampled(mean_bytes: u64) -> Recorder {
        Recorder::build(16, 22, mean_bytes)
    }

    const fn build(site_bits: u32, live_bits: u32, sample_bytes: u64) -> Recorder {
        let site_bits = if site_bits < 4 {
            4
        } else if site_bits > 23 {
            23
        } else {
            site_bits
        };
        let live_bits = if live_bits < 4 {
            4
        } else if live_bits > 30 {
            30
        } else {
            live_bits
        };
        Recorder {
            state: AtomicU8::new(UNINIT),
            enabled: AtomicBool::new(true),
            site_bits,
            live_bits,
            counters: AtomicPtr::new(std::ptr::null_mut()),
            index: AtomicPtr::new(std::ptr::null_mut()),
            sites: AtomicPtr::new(std::ptr::null_mut()),
            live: AtomicPtr::new(std::ptr::null_mut()),
            dropped: AtomicU64::new(0),
            sample_bytes: AtomicU64::new(sample_bytes),
        }
    }

    /// Makes the recorder take allocations sampled one per `mean_bytes`
    /// bytes on average ([`sample`](crate::alloc::sample): the caller
    /// records only the allocations [`take_sample`](crate::alloc::sample::take_sample)
    /// picks), weighing each so that every site's counters are unbiased
    /// estimates of its allocations and bytes; frees of blocks not sampled
    /// are passed over without a look into the tables. 0 (the default)
    /// records every allocation exactly. Set it before the first record.
    pub fn set_sample_bytes(&self, mean_bytes: u64) {
        self.sample_bytes.store(mean_bytes, Relaxed);
        if self.state.load(Acquire) == READY {
            self.counters().sample_bytes.store(mean_bytes, Relaxed);
        }
    }

    /// The mean bytes between samples (0: every allocation is recorded).
    #[inline(always)]
    pub fn sample_bytes(&self) -> u64 {
        self.sample_bytes.load(Relaxed)
    }

    /// Stops (`false`) or resumes (`true`) recording. While stopped,
    /// allocations are not recorded and frees are ignored.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Relaxed);
    }

    /// Whether recording is on.
    #[inline]
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    fn site_cap(&self) -> usize {
        1 << self.site_bits
    }

    fn live_cap(&self) -> usize {
        1 << self.live_bits
    }

    /// `(site_bits, live_bits)` after clamping: what a second recorder
    /// over the same storage must be made with.
    pub fn capacity_bits(&self) -> (u32, u32) {
        (self.site_bits, self.live_bits)
    }

    fn index_offset() -> usize {
        std::mem::size_of::<Counters>()
    }

    fn records_offset(&self) -> usize {
        // site_cap() >= 16: the records start 64-aligned.
        Self::index_offset() + 4 * self.site_cap()
    }

    fn live_offset(&self) -> usize {
        self.records_offset() + std::mem::size_of::<SiteSlot>() * (self.site_cap() + 1)
    }

    /// Bytes of the recorder's storage (counters, sites, live blocks): the
    /// length [`Recorder::use_storage`] needs. A multiple of 4096.
    pub fn storage_len(&self) -> usize {
        let n = self.live_offset() + std::mem::size_of::<LiveSlot>() * self.live_cap();
        (n + 4095) & !4095
    }

    /// Makes the recorder keep its tables in `base` (zero-filled, or the
    /// storage of a recorder made with the same capacity, whose records it
    /// then continues or reads) instead of mapping its own. Returns `false`
    /// (and changes nothing) if the recorder already has storage.
    ///
    /// # Safety
    /// `base` must be 4096-aligned, readable and writable for
    /// [`Recorder::storage_len`] bytes, used by nothing but recorders of
    /// this capacity, and stay mapped as long as this recorder is used.
    pub unsafe fn use_storage(&self, base: *mut u8) -> bool {
        if self
            .state
            .compare_exchange(UNINIT, MAPPING, Acquire, Relaxed)
            .is_err()
        {
            return false;
        }
        self.set_storage(base);
        true
    }

    fn set_storage(&self, base: *mut u8) {
        self.counters.store(base.cast(), Relaxed);
        let mean = self.sample_bytes.load(Relaxed);
        if mean != 0 {
            // SAFETY: `base` starts with the counters (see above).
            unsafe { &*base.cast::<Counters>() }
                .sample_bytes
                .store(mean, Relaxed);
        }
        // SAFETY: the offsets are inside the region of storage_len() bytes
        // the caller vouched for (or `map_tables` mapped).
        unsafe {
            self.index
                .store(base.add(Self::index_offset()).cast(), Relaxed);
            self.sites
                .store(base.add(self.records_offset()).cast(), Relaxed);
            self.live
                .store(base.add(self.live_offset()).cast(), Relaxed);
        }
        self.state.store(READY, Release);
    }

    /// The counters in the storage (only once READY).
    fn counters(&self) -> &Counters {
        // SAFETY: READY was stored (Release, loaded Acquire by every caller
        // through `tables`) after the pointer was set to zero-filled or
        // recorder-written storage, never unmapped.
        unsafe { &*self.counters.load(Relaxed) }
    }

    /// The site index, once READY (which `tables` returned).
    fn index(&self) -> &[AtomicU32] {
        // SAFETY: READY was stored (Release, loaded Acquire by `tables`)
        // after the pointer was set to `site_cap()` zero-filled (or
        // recorder-written) slots, never unmapped.
        unsafe { std::slice::from_raw_parts(self.index.load(Relaxed), self.site_cap()) }
    }

    /// The tables, mapped on first use; `None` while another thread maps
    /// them or if mapping failed.
    #[inline]
    fn tables(&self) -> Option<(&[SiteSlot], &[LiveSlot])> {
        if self.state.load(Acquire) != READY {
            self.map_tables();
            if self.state.load(Acquire) != READY {
                return None;
            }
        }
        let s = self.sites.load(Relaxed);
        let l = self.live.load(Relaxed);
        // SAFETY: READY is stored (Release) after both pointers point at
        // `site_cap() + 1` and `live_cap()` slots of zero-filled (or
        // recorder-written) storage, never unmapped; all-zero bytes are
        // valid atomics.
        unsafe {
            Some((
                std::slice::from_raw_parts(s, self.site_cap() + 1),
                std::slice::from_raw_parts(l, self.live_cap()),
            ))
        }
    }

    #[cold]
    fn map_tables(&self) {
        if self
            .state
            .compare_exchange(UNINIT, MAPPING, Acquire, Relaxed)
            .is_err()
        {
            return;
        }
        let base = map(self.storage_len());
        if base.is_null() {
            self.state.store(FAILED, Release);
            return;
        }
        self.set_storage(base);
    }

    /// Records a new block of `size` bytes at `ptr`, allocated at the stack
    /// `frames` (innermost first; at most [`MAX_DEPTH`] are kept).
    /// Allocation-free and lock-free. When the recorder samples, call it
    /// only for the allocations picked: the block is counted as what its
    /// sample stands for.
    #[inline]
    pub fn record_alloc(&self, frames: &[usize], ptr: usize, size: usize) {
        if !self.is_enabled() {
            return;
        }
        let Some((sites, live)) = self.tables() else {
            self.dropped.fetch_add(1, Relaxed);
            return;
        };
        let frames = &frames[..frames.len().min(MAX_DEPTH)];
        let idx = find_site(
            self.index(),
            sites,
            &self.counters().next_site,
            self.site_bits,
            frames,
        );
        let up = match self.sample_bytes() {
            0 => false,
            mean => crate::alloc::sample::draw_round_up(mean, size as u64),
        };
        self.add_live(sites, live, idx, ptr, size as u64, up);
    }

    /// What a block of `size` bytes counts for: `(blocks, bytes)`.
    #[inline(always)]
    fn weigh(&self, size: u64, up: bool) -> (u64, u64) {
        use crate::alloc::sample::{estimated_blocks, estimated_bytes};
        match self.sample_bytes() {
            0 => (1, size),
            mean => (
                estimated_blocks(mean, size, up),
                estimated_bytes(mean, size),
            ),
        }
    }

    #[inline]
    fn add_live(
        &self,
        sites: &[SiteSlot],
        live: &[LiveSlot],
        idx: u32,
        ptr: usize,
        size: u64,
        up: bool,
    ) {
        let site = &sites[idx as usize];
        let (blocks, bytes) = self.weigh(size, up);
        if self.sample_bytes() != 0 {
            crate::alloc::sample::filter::insert(ptr);
        }
        site.allocs.fetch_add(blocks, Relaxed);
        let total = site.alloc_bytes.fetch_add(bytes, Relaxed) + bytes;
        let now = total.wrapping_sub(site.free_bytes.load(Relaxed));
        if now <= total && now > site.peak.load(Relaxed) {
            site.peak.fetch_max(now, Relaxed);
        }
        if size == 0 {
            site.zero_allocs.fetch_add(blocks, Relaxed);
        }
        let val = ((idx as u64) << SIZE_BITS) | if up { UP_BIT } else { 0 } | size.min(SIZE_MASK);
        let mask = self.live_cap() - 1;
        let shift = granule_shift(self.sample_bytes());
        let mut i = addr_slot(ptr, self.live_bits, shift);
        for _ in 0..MAX_PROBE {
            let slot = &live[i];
            let cur = slot.addr.load(Relaxed);
            if (cur == EMPTY || cur == TOMBSTONE)
                && slot
                    .addr
                    .compare_exchange(cur, ptr, Relaxed, Relaxed)
                    .is_ok()
            {
                slot.val.store(val, Release);
                return;
            }
            i = (i + 1) & mask;
        }
        self.counters().live_overflow.fetch_add(1, Relaxed);
    }

    /// Records the free of the block at `ptr` (a block not recorded, e.g.
    /// allocated before tracking began, is counted as an unknown free and
    /// otherwise ignored). Returns whether the block was known.
    #[inline]
    pub fn record_free(&self, ptr: usize) -> bool {
        match self.take(ptr) {
            Some(t) => {
                self.commit_free(t);
                true
            }
            None => false,
        }
    }

    /// Removes the block at `ptr` from the live table without counting the
    /// free (see [`Taken`]); `None` if the block is unknown (counted).
    #[inline]
    pub fn take(&self, ptr: usize) -> Option<Taken> {
        if !self.is_enabled() || ptr < 2 {
            return None;
        }
        let sampled = self.sample_bytes() != 0;
        if sampled && !crate::alloc::sample::filter::may_hold(ptr) {
            return None; // not sampled: nothing to look for
        }
        let (_, live) = self.tables()?;
        let mask = self.live_cap() - 1;
        let mut i = addr_slot(ptr, self.live_bits, granule_shift(self.sample_bytes()));
        for _ in 0..MAX_PROBE {
            let slot = &live[i];
            let cur = slot.addr.load(Acquire);
            if cur == ptr {
                let val = slot.val.load(Acquire);
                slot.addr.store(TOMBSTONE, Release);
                if sampled {
                    crate::alloc::sample::filter::remove(ptr);
                }
                let size = val & SIZE_MASK;
                let up = val & UP_BIT != 0;
                let (blocks, bytes) = self.weigh(size, up);
                return Some(Taken {
                    site: (val >> SIZE_BITS) as u32,
                    size,
                    up,
                    blocks,
                    bytes,
                });
            }
            if cur == EMPTY {
                break;
            }
            i = (i + 1) & mask;
        }
        if !sampled {
            // (Sampled: another block of the bucket, not this one.)
            self.counters().unknown_frees.fetch_add(1, Relaxed);
        }
        None
    }

    /// Counts a block taken by [`Recorder::take`] as freed.
    #[inline]
    pub fn commit_free(&self, t: Taken) {
        if let Some((sites, _)) = self.tables() {
            let site = &sites[t.site as usize];
            site.frees.fetch_add(t.blocks, Relaxed);
            site.free_bytes.fetch_add(t.bytes, Relaxed);
            if t.size == 0 {
                site.zero_frees.fetch_add(t.blocks, Relaxed);
            }
        }
    }

    /// Puts a block taken by [`Recorder::take`] back at `ptr`, as if it had
    /// never been taken.
    pub fn put_back(&self, ptr: usize, t: Taken) {
        if let Some((sites, live)) = self.tables() {
            // add_live counts an allocation; undo that first.
            let site = &sites[t.site as usize];
            site.allocs.fetch_sub(t.blocks, Relaxed);
            site.alloc_bytes.fetch_sub(t.bytes, Relaxed);
            if t.size == 0 {
                site.zero_allocs.fetch_sub(t.blocks, Relaxed);
            }
            self.add_live(sites, live, t.site, ptr, t.size, t.up);
        }
    }

    /// A copy of every site's counters and frames, and the recorder's own
    /// counters. Allocates (not for use inside an allocator).
    pub fn snapshot(&self) -> crate::alloc::HeapSnapshot {
        self.snapshot_in(None)
    }

    /// [`Recorder::snapshot`] reading only the site slots that overlap
    /// `data`: sorted byte ranges of the storage (as
    /// [`Recorder::use_storage`] was given it) outside which it is all
    /// zero, such as a sparse file's data extents. A read of a hole of a
    /// shared file mapping allocates a page on tmpfs; the full scan of a
    /// file-backed table would fill it.
    pub fn snapshot_of_extents(&self, data: &[(usize, usize)]) -> crate::alloc::HeapSnapshot {
        self.snapshot_in(Some(data))
    }

    fn snapshot_in(&self, data: Option<&[(usize, usize)]>) -> crate::alloc::HeapSnapshot {
        let mut snap = crate::alloc::HeapSnapshot::default();
        snap.counters.dropped = self.dropped.load(Relaxed);
        snap.sample_bytes = self.sample_bytes();
        if self.state.load(Acquire) != READY {
            return snap;
        }
        let Some((sites, _)) = self.tables() else {
            return snap;
        };
        let c = self.counters();
        snap.counters.live_overflow = c.live_overflow.load(Relaxed);
        snap.counters.unknown_frees = c.unknown_frees.load(Relaxed);
        snap.sample_bytes = c.sample_bytes.load(Relaxed);
        let slot_len = std::mem::size_of::<SiteSlot>();
        let used = (c.next_site.load(Acquire) as usize).min(self.site_cap());
        let mut extent = 0;
        for (i, s) in sites.iter().enumerate() {
            let overflow = i == sites.len() - 1;
            if i >= used && !overflow {
                continue; // never handed out
            }
            if let Some(data) = data {
                let start = self.records_offset() + i * slot_len;
                while extent < data.len() && data[extent].1 <= start {
                    extent += 1;
                }
                if extent == data.len() || data[extent].0 >= start + slot_len {
                    continue; // all zero: never claimed
                }
            }
            if !overflow && s.hash.load(Acquire) == 0 {
                continue; // not filled, or given up
            }
            let allocs = s.allocs.load(Relaxed);
            if allocs == 0 {
                continue; // not (or no longer) used
            }
            let mut frames = Vec::new();
            if s.ready.load(Acquire) == 1 {
                let n = s.nframes.load(Relaxed) as usize;
                frames.extend(s.frames[..n.min(MAX_DEPTH)].iter().map(|f| f.load(Relaxed)));
            }
            let alloc_bytes = s.alloc_bytes.load(Relaxed);
            let free_bytes = s.free_bytes.load(Relaxed);
            snap.sites.push(crate::alloc::SiteStats {
                frames,
                allocs,
                alloc_bytes,
                frees: s.frees.load(Relaxed),
                free_bytes,
                peak_bytes: s
                    .peak
                    .load(Relaxed)
                    .max(alloc_bytes.saturating_sub(free_bytes)),
                zero_live: s
                    .zero_allocs
                    .load(Relaxed)
                    .saturating_sub(s.zero_frees.load(Relaxed)),
            });
            if overflow {
                snap.counters.overflow_site_allocs = allocs;
            }
        }
        snap
    }
}

/// The site of `frames`: its record's number, a new record if the stack
/// is new; the overflow record (the last) when no index slot is free
/// within reach or no record is left.
#[inline]
fn find_site(
    index: &[AtomicU32],
    sites: &[SiteSlot],
    next: &AtomicU64,
    bits: u32,
    frames: &[usize],
) -> u32 {
    let h = match site_hash(frames) {
        0 => 1,
        h => h,
    };
    let overflow = (sites.len() - 1) as u32;
    let mask = (1usize << bits) - 1;
    let mut i = (h >> (64 - bits)) as usize;
    // A record this thread filled and has not published yet.
    let mut mine: Option<u32> = None;
    for _ in 0..MAX_PROBE {
        let mut cur = index[i].load(Acquire);
        if cur == 0 {
            let r = match mine {
                Some(r) => r,
                None => match new_record(sites, next, h, frames) {
                    Some(r) => {
                        mine = Some(r);
                        r
                    }
                    None => return overflow,
                },
            };
            match index[i].compare_exchange(0, r + 1, AcqRel, Acquire) {
                Ok(_) => return r,
                Err(other) => cur = other,
            }
        }
        // The Acquire load (or failed exchange) of `cur` sees the record
        // filled before it was published.
        let r = cur - 1;
        if sites[r as usize].hash.load(Relaxed) == h {
            if let Some(m) = mine {
                sites[m as usize].hash.store(0, Relaxed); // given up
            }
            return r;
        }
        i = (i + 1) & mask;
    }
    if let Some(m) = mine {
        sites[m as usize].hash.store(0, Relaxed);
    }
    overflow
}

/// Hands out the next site record and fills it with `h` and `frames`;
/// `None` when all are taken.
#[cold]
fn new_record(sites: &[SiteSlot], next: &AtomicU64, h: u64, frames: &[usize]) -> Option<u32> {
    let r = next.fetch_add(1, Relaxed);
    if r >= (sites.len() - 1) as u64 {
        return None;
    }
    let slot = &sites[r as usize];
    slot.hash.store(h, Relaxed);
    for (d, &f) in slot.frames.iter().zip(frames) {
        d.store(f, Relaxed);
    }
    slot.nframes.store(frames.len() as u32, Relaxed);
    slot.ready.store(1, Release);
    Some(r as u32)
}

/// The site key of a stack: like [`crate::hash_frames`] but in four
/// independent lanes, so that the multiplies of 32 frames overlap instead
/// of forming one dependency chain.
#[inline]
fn site_hash(frames: &[usize]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut lanes = [
        K,
        K ^ 0x243f_6a88_85a3_08d3,
        K ^ 0x1319_8a2e_0370_7344,
        K ^ 0xa409_3822_299f_31d0,
    ];
    let mut chunks = frames.chunks_exact(4);
    for c in &mut chunks {
        for (l, &f) in lanes.iter_mut().zip(c) {
            *l = (*l ^ f as u64).wrapping_mul(K).rotate_left(29);
        }
    }
    for (l, &f) in lanes.iter_mut().zip(chunks.remainder()) {
        *l = (*l ^ f as u64).wrapping_mul(K).rotate_left(31);
    }
    let mut h = (frames.len() as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
    for l in lanes {
        h = (h ^ l).wrapping_mul(K).rotate_left(27);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// The first slot tried for the block at `ptr` in a live table of
/// `2^bits` slots, one slot per granule of `2^shift` bytes. The granules
/// of a window of `2^(bits + shift)` bytes map in order onto the table
/// (from a start hashed from the window's number): blocks near one another
/// in memory fill slots near one another, so a heap of a few hundred KiB
/// touches a few dozen pages of the table, not one page per block (what a
/// fork copies, and what a file-backed table keeps, is the pages touched).
/// With 16-byte granules two blocks of one window never share a first
/// slot; blocks of different windows meet only where the windows' hashed
/// starts bring them.
#[inline]
fn addr_slot(ptr: usize, bits: u32, shift: u32) -> usize {
    let p = ptr as u64 >> shift;
    let window = p >> bits;
    let start = window.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits);
    (p.wrapping_add(start) & ((1u64 << bits) - 1)) as usize
}

/// The live table's granule ([`addr_slot`]) for a recorder sampling one
/// allocation per `sample_bytes` on average: 16 bytes when every block is
/// recorded, else a quarter of the mean rounded down to a power of two.
/// Sampled blocks lie about `sample_bytes` apart (a block of `s` bytes is
/// taken with probability below `s / sample_bytes`, so a heap holds fewer
/// than one sampled block per `sample_bytes` bytes on average): with
/// 16-byte granules each would sit on a page of the table of its own (a
/// page fault per sample until the whole table is touched); at a quarter
/// of the mean they fill about one slot in four of a dense run, and the
/// few that share a granule take the next slots.
#[inline]
fn granule_shift(sample_bytes: u64) -> u32 {
    if sample_bytes < 64 {
        4
    } else {
        (63 - sample_bytes.leading_zeros() - 2).min(24)
    }
}

fn map(len: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_site_and_frees() {
        let r = Recorder::with_capacity(4, 6);
        r.record_alloc(&[1, 2, 3], 0x1000, 10);
        r.record_alloc(&[1, 2, 3], 0x2000, 20);
        r.record_alloc(&[4], 0x3000, 5);
        assert!(r.record_free(0x1000));
        assert!(!r.record_free(0x9990)); // never recorded
        let s = r.snapshot();
        let a = s.sites.iter().find(|s| s.frames == [1, 2, 3]).unwrap();
        assert_eq!(
            (a.allocs, a.alloc_bytes, a.frees, a.free_bytes, a.peak_bytes),
            (2, 30, 1, 10, 30)
        );
        assert_eq!(a.live_bytes(), 20);
        assert_eq!(s.counters.unknown_frees, 1);
    }

    #[test]
    fn nearby_blocks_fill_nearby_live_slots() {
        // 2000 blocks of a 64 KiB heap, 32 bytes apart: distinct slots,
        // all within 64 KiB / 16 slots of the first (a few pages of the
        // table, not one page per block).
        let base = 0x5555_5555_0000usize;
        let slots: Vec<usize> = (0..2000).map(|i| addr_slot(base + i * 32, 22, 4)).collect();
        let mut sorted = slots.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 2000);
        let first = slots[0];
        assert!(slots
            .iter()
            .all(|&s| (s.wrapping_sub(first) & ((1 << 22) - 1)) < 4096));
        // Windows far apart start at different places.
        assert_ne!(addr_slot(base, 22, 4), addr_slot(base + (1 << 26), 22, 4));
        // Every slot is inside the table, whatever the address.
        for p in [0usize, 16, usize::MAX & !15, 0x7fff_ffff_fff0] {
            for bits in [4, 10, 22, 30] {
                for shift in [4, 12, 24] {
                    assert!(addr_slot(p, bits, shift) < 1 << bits);
                }
            }
        }
    }

    #[test]
    fn sampled_blocks_share_pages_of_the_live_table() {
        // One sampled block per 16 KiB of a 16 MiB heap: with 4 KiB
        // granules their slots lie 4 apart, 16 pages of the table in
        // all, where 16-byte granules gave each block a page of its own.
        assert_eq!(granule_shift(0), 4);
        assert_eq!(granule_shift(16384), 12);
        assert_eq!(granule_shift(16385), 12);
        assert_eq!(granule_shift(1 << 40), 24);
        let base = 0x7f00_1234_0000usize;
        let shift = granule_shift(16384);
        let pages: std::collections::HashSet<usize> = (0..1024)
            .map(|i| addr_slot(base + i * 16384, 22, shift) * 16 / 4096)
            .collect();
        assert!(pages.len() <= 17, "{} pages", pages.len());

        // Blocks crowded into one granule (a run of small ones all
        // sampled) take the next slots, and are all found again.
        let r = Recorder::sampled(16384);
        let crowd: Vec<usize> = (0..40).map(|i| base + 0x10_0000 + i * 48).collect();
        for (i, &p) in crowd.iter().enumerate() {
            r.record_alloc(&[0x51, i % 3], p, 40);
        }
        for &p in crowd.iter().rev() {
            assert!(r.take(p).is_some(), "{p:#x} lost");
        }
        assert_eq!(r.snapshot().counters.unknown_frees, 0);
    }

    #[test]
    fn full_tables_overflow_cleanly() {
        let r = Recorder::with_capacity(4, 4); // 16 sites, 16 live slots
        for i in 0..100usize {
            r.record_alloc(&[i + 100], 0x10000 + i * 16, 1);
        }
        let s = r.snapshot();
        assert_eq!(s.sites.iter().map(|s| s.allocs).sum::<u64>(), 100);
        assert!(s.counters.overflow_site_allocs >= 84);
        assert_eq!(s.counters.live_overflow, 84);
        // Frees of the blocks that did not fit are unknown, not faults.
        for i in 0..100usize {
            r.record_free(0x10000 + i * 16);
        }
        assert_eq!(r.snapshot().counters.unknown_frees, 84);
    }

    #[test]
    fn site_hash_order_and_length_matter() {
        let a: Vec<usize> = (1..=9).collect();
        let mut b = a.clone();
        b.swap(0, 4); // same lane, other position
        let mut c = a.clone();
        c.swap(0, 1); // other lanes
        assert_ne!(site_hash(&a), site_hash(&b));
        assert_ne!(site_hash(&a), site_hash(&c));
        assert_ne!(site_hash(&a), site_hash(&a[..8]));
        assert_ne!(site_hash(&[0]), site_hash(&[0, 0]));
        assert_ne!(site_hash(&[1, 2, 3, 4]), site_hash(&[1, 2, 3, 4, 0]));
    }

    #[test]
    fn take_and_put_back() {
        let r = Recorder::with_capacity(4, 6);
        r.record_alloc(&[7], 0x40, 8);
        let t = r.take(0x40).unwrap();
        r.put_back(0x40, t);
        let s = r.snapshot();
        assert_eq!(
            (s.sites[0].allocs, s.sites[0].frees, s.sites[0].live_bytes()),
            (1, 0, 8)
        );
        assert!(r.record_free(0x40));
    }

    #[test]
    fn threads_without_lock() {
        static R: Recorder = Recorder::with_capacity(8, 16);
        // Mapped before the threads start, as in threads_race_for_new_sites:
        // records made while another thread maps the tables are dropped (a
        // CI run counted 3985 of 4000).
        assert!(R.tables().is_some());
        let hs: Vec<_> = (0..4usize)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..1000usize {
                        let p = (t + 1) << 32 | i << 4;
                        R.record_alloc(&[t % 2, 9], p, 3);
                        if i % 2 == 0 {
                            R.record_free(p);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let s = R.snapshot();
        assert_eq!(s.sites.len(), 2);
        assert_eq!(s.sites.iter().map(|s| s.allocs).sum::<u64>(), 4000);
        assert_eq!(
            s.sites.iter().map(|s| s.live_bytes()).sum::<u64>(),
            2000 * 3
        );
        assert_eq!(R.dropped.load(Relaxed), 0);
    }

    /// Threads meeting the same new stacks at once: one site per stack,
    /// whichever thread's record wins (a lost race's record is given up
    /// and not listed). Each lost race uses up a record, so the table has
    /// room for the worst case (8 threads filling a record for each of
    /// the 200 stacks: 1,600 < 2^11). The tables are mapped before the
    /// threads start: allocations made while another thread maps them are
    /// dropped (and counted), which is not what this test is about; with
    /// the threads truly in parallel (an idle 2-core machine) one thread's
    /// 200 allocations all fell in that window.
    #[test]
    fn threads_race_for_new_sites() {
        static R: Recorder = Recorder::with_capacity(11, 16);
        assert!(R.tables().is_some());
        let go = std::sync::Arc::new(std::sync::Barrier::new(8));
        let hs: Vec<_> = (0..8usize)
            .map(|t| {
                let go = go.clone();
                std::thread::spawn(move || {
                    go.wait();
                    for k in 0..200usize {
                        R.record_alloc(&[k + 1, 7], (t + 1) << 32 | k << 5, 5);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let s = R.snapshot();
        assert_eq!(s.sites.len(), 200);
        for k in 0..200usize {
            let site: Vec<_> = s.sites.iter().filter(|x| x.frames == [k + 1, 7]).collect();
            assert_eq!(site.len(), 1, "stack {k}");
            assert_eq!((site[0].allocs, site[0].live_bytes()), (8, 40));
        }
        assert_eq!(s.counters.overflow_site_allocs, 0);
        assert_eq!(R.dropped.load(Relaxed), 0);
    }

    /// A second recorder over the storage of a first reads what the first
    /// recorded (what `callstack memtrack` does with a dead process's
    /// tables file); blocks of size 0 are counted apart.
    #[test]
    fn storage_handed_over_and_read_back() {
        let a = Recorder::with_capacity(4, 6);
        let len = a.storage_len();
        assert_eq!(len % 4096, 0);
        let base = map(len);
        assert!(!base.is_null());
        // SAFETY: a fresh zero-filled mapping of `len` bytes, never unmapped.
        assert!(unsafe { a.use_storage(base) });
        // SAFETY: as above; `a` has storage already, so this is refused.
        assert!(!unsafe { a.use_storage(base) });
        a.record_alloc(&[1, 2], 0x100, 0);
        a.record_alloc(&[1, 2], 0x200, 0);
        a.record_alloc(&[1, 2], 0x300, 24);
        a.record_free(0x100);
        a.record_free(0x9990);
        let b = Recorder::with_capacity(4, 6);
        // SAFETY: the same storage, made for this capacity.
        assert!(unsafe { b.use_storage(base) });
        let s = b.snapshot();
        assert_eq!(s, a.snapshot());
        assert_eq!(s.sites.len(), 1);
        let t = &s.sites[0];
        assert_eq!(
            (t.allocs, t.frees, t.live_bytes(), t.zero_live),
            (3, 1, 24, 1)
        );
        assert_eq!((t.live_blocks(), t.leaked_blocks()), (2, 1));
        assert_eq!(s.counters.unknown_frees, 1);
        // Read by extents: none, the whole storage, the site's part only.
        assert!(b.snapshot_of_extents(&[]).sites.is_empty());
        assert_eq!(b.snapshot_of_extents(&[(0, len)]), s);
        let (slot, o) = (std::mem::size_of::<SiteSlot>(), b.records_offset());
        let idx = (0..17)
            .find(|&i| {
                let one = [(o + i * slot, o + (i + 1) * slot)];
                b.snapshot_of_extents(&one).sites.len() == 1
            })
            .expect("one slot holds the site");
        // One byte of the slot in an extent is enough.
        let one = [(o + idx * slot + 8, o + idx * slot + 9)];
        assert_eq!(b.snapshot_of_extents(&one), s);
    }
}
