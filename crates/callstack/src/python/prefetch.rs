//! One system call for a warm read of a Python stack.
//!
//! Reading a thread's Python stack follows pointers: the interpreter, the
//! thread state, each frame, each frame's code object. Read one by one,
//! each costs a `process_vm_readv`, and on a recording of the whole host
//! those calls were most of the recorder's time. From one read to the
//! next a running program's stack mostly stays where it was, so
//! [`Prefetched`] first reads again, all in one call
//! ([`ReadTarget::read_each`]), every range the last read asked for, then
//! answers the walk's reads from those bytes where they cover them and
//! from the target where they do not (a stack that moved, a new code
//! object). The bytes are this read's, not the last one's: only where to
//! look is remembered, so the walk sees the memory as it is now.

use crate::remote::ReadTarget;
use std::cell::RefCell;

/// At most this many ranges, and this many bytes, are read ahead.
const MAX_RANGES: usize = 1024;
const MAX_BYTES: usize = 256 << 10;
/// Ranges at most this far apart are read as one, up to this long.
const MERGE_GAP: u64 = 2048;
const MAX_MERGED: u64 = 16 << 10;
/// Each range is read on, within its last page, up to this many bytes
/// past its end: a thread's frame stack grows upward (3.11+), and the
/// frames called since the last read lie right after the last one's.
/// Bytes of a page already pinned cost a copy, not another page.
const AFTER: u64 = 1024;
const PAGE: u64 = 4096;

/// `[addr, addr + len)` made longer within its last page, by at most
/// [`AFTER`] bytes (no page is added: if the range is readable, so is
/// the rest of its page).
fn within_page(addr: u64, len: usize) -> (u64, usize) {
    let end = addr.saturating_add(len as u64);
    if len == 0 {
        return (addr, len);
    }
    let page_end = ((end - 1) | (PAGE - 1)).saturating_add(1);
    let to = page_end.min(end.saturating_add(AFTER));
    (addr, (to - addr) as usize)
}

/// The plan of the next read: the ranges this read asked for (bounded),
/// those less than [`MERGE_GAP`] apart made one: a thread's frames lie
/// together in its frame stack (3.11+), and the kernel's cost is per
/// range. (No page can be missing between two readable ranges that
/// close.)
fn next_plan(mut asked: Vec<(u64, usize)>) -> Vec<(u64, usize)> {
    asked.sort_unstable();
    let mut merged: Vec<(u64, usize)> = Vec::with_capacity(asked.len());
    for (addr, len) in asked {
        let end = addr.saturating_add(len as u64);
        if let Some(last) = merged.last_mut() {
            let last_end = last.0 + last.1 as u64;
            if addr <= last_end.saturating_add(MERGE_GAP)
                && end.saturating_sub(last.0) <= MAX_MERGED
            {
                last.1 = (end.max(last_end) - last.0) as usize;
                continue;
            }
        }
        merged.push((addr, len));
    }
    let mut asked: Vec<(u64, usize)> = merged.into_iter().map(|(a, n)| within_page(a, n)).collect();
    let mut bytes = 0usize;
    let keep = asked
        .iter()
        .take(MAX_RANGES)
        .take_while(|r| {
            bytes += r.1;
            bytes <= MAX_BYTES
        })
        .count();
    asked.truncate(keep);
    asked
}

/// The target's memory at the ranges of the last read, read ahead in one
/// call, over the target itself. See the [module documentation](self).
pub(super) struct Prefetched<'a> {
    mem: &'a dyn ReadTarget,
    /// Sorted by address: each range read ahead, as (address, offset in
    /// `bytes`, length).
    blocks: Vec<(u64, usize, usize)>,
    /// The bytes of every range read ahead, one after the other: one
    /// buffer, handed from read to read ([`Prefetched::finish`]), where a
    /// buffer per range cost the sampler a tenth of its time in `calloc`
    /// and `free`.
    bytes: Vec<u8>,
    /// Read on a miss: the rest of the missed range's page (the next
    /// frames, when a frame was missed).
    extra: RefCell<Vec<(u64, Vec<u8>)>>,
    /// The ranges asked for by this read, in order: the next one's plan.
    asked: RefCell<Vec<(u64, usize)>>,
}

impl<'a> Prefetched<'a> {
    /// Reads `plan` (the ranges the last read asked for) from `mem`, in
    /// one call where `mem` can.
    #[cfg(test)]
    pub(super) fn read(mem: &'a dyn ReadTarget, plan: &[(u64, usize)]) -> Prefetched<'a> {
        Prefetched::read_into(mem, plan, Vec::new())
    }

    /// [`Prefetched::read`] into `buf` (the last read's buffer, given back
    /// by [`Prefetched::finish`]), whatever it held.
    pub(super) fn read_into(
        mem: &'a dyn ReadTarget,
        plan: &[(u64, usize)],
        mut bytes: Vec<u8>,
    ) -> Prefetched<'a> {
        let total: usize = plan.iter().map(|r| r.1).sum();
        bytes.clear();
        bytes.resize(total, 0);
        let mut ok = vec![false; plan.len()];
        if !plan.is_empty() {
            let mut reqs: Vec<(u64, &mut [u8])> = Vec::with_capacity(plan.len());
            let mut rest = bytes.as_mut_slice();
            for &(addr, len) in plan {
                let (this, tail) = rest.split_at_mut(len);
                reqs.push((addr, this));
                rest = tail;
            }
            mem.read_each(&mut reqs, &mut ok);
        }
        let mut off = 0;
        let mut blocks: Vec<(u64, usize, usize)> = Vec::with_capacity(plan.len());
        for (&(addr, len), ok) in plan.iter().zip(ok) {
            if ok {
                blocks.push((addr, off, len));
            }
            off += len;
        }
        blocks.sort_by_key(|b| b.0);
        Prefetched {
            mem,
            blocks,
            bytes,
            extra: RefCell::new(Vec::new()),
            asked: RefCell::new(Vec::new()),
        }
    }

    /// The next read's plan ([`next_plan`]) and this read's buffer,
    /// for the next read to fill.
    pub(super) fn finish(self) -> (Vec<(u64, usize)>, Vec<u8>) {
        (next_plan(self.asked.into_inner()), self.bytes)
    }

    /// The next read's plan ([`next_plan`]).
    #[cfg(test)]
    pub(super) fn plan(self) -> Vec<(u64, usize)> {
        self.finish().0
    }

    /// The bytes read ahead at `[addr, addr + len)`, if a block holds them.
    fn held(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let i = self
            .blocks
            .partition_point(|b| b.0 <= addr)
            .checked_sub(1)?;
        let (start, at, n) = self.blocks[i];
        let off = usize::try_from(addr - start).ok()?;
        let end = off.checked_add(len)?;
        if end > n {
            return None;
        }
        self.bytes.get(at + off..at + end)
    }

    fn note(&self, addr: u64, len: usize) {
        self.asked.borrow_mut().push((addr, len));
    }
}

impl Prefetched<'_> {
    /// `[addr, addr + buf.len())` from the target, with the rest of its
    /// page ([`within_page`]) kept for the next reads (exactly the range
    /// when that longer read fails).
    fn read_missed(&self, addr: u64, buf: &mut [u8]) -> bool {
        if let Some(src) = self.extra.borrow().iter().find_map(|(start, bytes)| {
            let off = usize::try_from(addr.checked_sub(*start)?).ok()?;
            bytes.get(off..off.checked_add(buf.len())?)
        }) {
            buf.copy_from_slice(src);
            return true;
        }
        let (_, len) = within_page(addr, buf.len());
        let mut more = vec![0u8; len];
        if len > buf.len() && self.mem.read_bytes(addr, &mut more) {
            buf.copy_from_slice(&more[..buf.len()]);
            let mut extra = self.extra.borrow_mut();
            if extra.len() < 64 {
                extra.push((addr, more));
            }
            return true;
        }
        self.mem.read_bytes(addr, buf)
    }
}

impl ReadTarget for Prefetched<'_> {
    fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.note(addr, buf.len());
        match self.held(addr, buf.len()) {
            Some(src) => {
                buf.copy_from_slice(src);
                true
            }
            None => self.read_missed(addr, buf),
        }
    }

    fn read_each(&self, reqs: &mut [(u64, &mut [u8])], ok: &mut [bool]) {
        // Those held are answered here, the rest asked of the target in
        // one call.
        let mut missing: Vec<usize> = Vec::new();
        for (i, (addr, buf)) in reqs.iter_mut().enumerate() {
            self.note(*addr, buf.len());
            match self.held(*addr, buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    ok[i] = true;
                }
                None => missing.push(i),
            }
        }
        if missing.is_empty() {
            return;
        }
        let mut rest: Vec<(u64, &mut [u8])> = reqs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| missing.binary_search(i).is_ok())
            .map(|(_, (addr, buf))| (*addr, &mut **buf))
            .collect();
        let mut got = vec![false; rest.len()];
        self.mem.read_each(&mut rest, &mut got);
        for (&i, g) in missing.iter().zip(got) {
            ok[i] = g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Memory of 4 KiB at 0x1000, counting the calls made to it.
    struct Counted {
        bytes: RefCell<Vec<u8>>,
        calls: Cell<usize>,
    }

    impl ReadTarget for Counted {
        fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
            self.calls.set(self.calls.get() + 1);
            let b = self.bytes.borrow();
            let Some(off) = addr.checked_sub(0x1000).map(|o| o as usize) else {
                return false;
            };
            match b.get(off..off + buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    true
                }
                None => false,
            }
        }

        fn read_each(&self, reqs: &mut [(u64, &mut [u8])], ok: &mut [bool]) {
            let calls = self.calls.get();
            for ((addr, buf), ok) in reqs.iter_mut().zip(ok) {
                *ok = self.read_bytes(*addr, buf);
            }
            // One system call, as a running process's memory makes.
            self.calls.set(calls + 1);
        }
    }

    fn word(m: &dyn ReadTarget, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        m.read_bytes(addr, &mut b).then(|| u64::from_le_bytes(b))
    }

    /// A pointer chase: the second time, one call answers every read, with
    /// the memory as it is then; where the chain moved, the target is read.
    #[test]
    fn second_read_is_one_call_and_sees_new_bytes() {
        let mem = Counted {
            bytes: RefCell::new(vec![0; 4096]),
            calls: Cell::new(0),
        };
        let put = |addr: u64, v: u64| {
            let o = (addr - 0x1000) as usize;
            mem.bytes.borrow_mut()[o..o + 8].copy_from_slice(&v.to_le_bytes());
        };
        // 0x1000 -> 0x1100 -> 0x1200 -> 7.
        put(0x1000, 0x1100);
        put(0x1100, 0x1200);
        put(0x1200, 7);
        let chase = |m: &dyn ReadTarget| {
            let a = word(m, 0x1000)?;
            let b = word(m, a)?;
            word(m, b)
        };
        let p = Prefetched::read(&mem, &[]);
        assert_eq!(chase(&p), Some(7));
        // The first miss read the rest of its page (1 KiB of it): the
        // chain's next links came with it.
        assert_eq!(mem.calls.get(), 1);
        let plan = p.plan();
        // Close together: one range, read on within its page.
        assert_eq!(plan, vec![(0x1000, 0x208 + 0x400)]);

        // Same places, a new value: one call, and the value now.
        put(0x1200, 9);
        mem.calls.set(0);
        let p = Prefetched::read(&mem, &plan);
        assert_eq!(chase(&p), Some(9));
        assert_eq!(mem.calls.get(), 1);
        let plan = p.plan();

        // The chain moved a little (a frame pushed after the last one):
        // in the block read ahead.
        put(0x1100, 0x1300);
        put(0x1300, 11);
        mem.calls.set(0);
        let p = Prefetched::read(&mem, &plan);
        assert_eq!(chase(&p), Some(11));
        assert_eq!(mem.calls.get(), 1);
        let plan = p.plan();
        assert_eq!(plan, vec![(0x1000, 0x308 + 0x400)]);

        // Moved far: what is not held is read from the target, with the
        // rest of its page (but never past the page: 0x1ff8 is its last
        // word).
        put(0x1100, 0x1ff8);
        put(0x1ff8, 13);
        mem.calls.set(0);
        let p = Prefetched::read(&mem, &plan);
        assert_eq!(chase(&p), Some(13));
        assert_eq!(mem.calls.get(), 2);
        assert_eq!(within_page(0x1ff8, 8), (0x1ff8, 8));
        assert_eq!(within_page(0x1ff0, 0x20), (0x1ff0, 0x420));
        assert_eq!(within_page(0x1f00, 0x20), (0x1f00, 0x100));

        // A range that cannot be read now is not taken from a block.
        let p = Prefetched::read(&mem, &[(0x2000, 8), (0x1000, 8)]);
        assert_eq!(word(&p, 0x2000), None);
        assert_eq!(word(&p, 0x1000), Some(0x1100));
    }
}
