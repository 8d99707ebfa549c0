//! A per-pc cache of instruction-analysis results: "unwind rules compiled
//! ahead", filled on first use.
//!
//! What the x86-64 analysis of a frame finds depends on the code alone: the
//! rule from the function's start to the pc (prologue analysis), the rules
//! from the pc to each `ret` (epilogue analysis), the function's start, and
//! whether the pc is the signal trampoline; what a return address looks
//! like (the call instruction right before it) depends on the code alone
//! too, and so does the rule stack scanning checks a candidate with (the
//! prologue analysis from the candidate call's target to the pc). [`InsnCache`] keeps those per pc, so that a warm frame costs a cache
//! lookup and the rules' stack loads instead of decoding the function again.
//! Which rule is taken is still decided against the stack on every capture
//! (its return address must follow a call, the frame record must be
//! believable), and stack scanning is never cached: a warm capture returns
//! what a cold one would on the same stack.
//!
//! # Beside the rule cache
//!
//! `capture_exact` keeps a frame's rule in the in-process rule cache (the
//! 16-bit words of CFI rules, `unwind/local/cache.rs`) when the code alone
//! settles it: no function start known, not the signal trampoline, and a
//! first epilogue candidate of the CFI rule's form (`rule::from_insn`,
//! packed by `exact::pack_insn` and marked as a machine-code rule). What
//! stays here is what that word cannot hold or what the code alone does
//! not settle:
//! - what each address taken as a return address follows ([`RaInfo`]):
//!   checked on every frame found by analysis, it is a fact about the
//!   *caller's* address, whose rule-cache word holds the caller's own rule,
//!   and for a direct call its target must match the callee (a pair);
//! - frames with several answers, chosen against the stack (the prologue
//!   rule, accepted on a weaker check than the epilogue candidates after
//!   it; the later candidates when the first one's return address fails),
//!   frames at exact pcs, and rules outside the CFI rule's forms (`ret
//!   imm16`, `rbp` as a value, frames over 504 bytes);
//! - scanning's checks, keyed by the pc and a call target;
//! - everything of [`in_process_cache`], whose reader knows function
//!   symbols (`unwind::insn::InProcess`, a walk by machine code alone that
//!   has no rule cache).
//!
//! The cache is a fixed-size table of [`SETS`] sets of [`WAYS`] entries,
//! each entry one 64-byte line of atomic words guarded by a sequence
//! counter: readers never wait (a line being written reads as a miss), a
//! writer that finds the line busy skips its fill (so a signal handler
//! interrupting a fill on the same thread neither waits nor corrupts it).
//! Lookups and fills allocate nothing, take no lock and make no system
//! call: async-signal-safe. A static cache lives in `.bss`; its pages are
//! touched only as entries fill.
//!
//! # When to clear
//!
//! The cache is only right while the code it describes stays the same.
//! [`invalidate`] clears the caches this crate uses for its own process
//! ([`fallback_cache`] for `capture_exact`'s fallback, [`in_process_cache`]
//! for `unwind::insn::InProcess`), in O(1) (a generation counter: the
//! old entries read as stale and are overwritten as they come). It is called
//! when `callstack::prepare()` takes a new snapshot of the loaded modules
//! and when `InProcess::new` takes its snapshot:
//! after `dlopen`/`dlclose`, or after JIT code is rewritten in place, call
//! either of those (or [`invalidate`]) before capturing again. Only answers
//! about code the reader can read are cached (the pc, and for a scan check
//! the call's target too), and each is stored under the generation read
//! before its code was, so a capture racing with a new snapshot can at
//! worst store an answer about code present in both snapshots.
//!
//! A cache is tied to one code reader (a different reader may know function
//! bounds the other does not, and so find other rules): give each its own.

use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::types::{Base, CallBefore, FpRule, InsnRule};

/// Sets in an [`InsnCache`] (a power of two).
pub const SETS: usize = 1024;
/// Entries per set.
pub const WAYS: usize = 2;
/// Most epilogue candidates an entry holds; a pc with more is analyzed on
/// every capture (rare: most functions give one or two).
pub const MAX_EPILOGUE: usize = 3;

/// Addresses at or above this are not cached (they do not fit the packed
/// key; no user-space address reaches it).
const ADDR_LIMIT: u64 = 1 << 56;

// Bits of the info word.
const INFO_START_MASK: u64 = ADDR_LIMIT - 1;
const INFO_ANALYZED: u64 = 1 << 56;
const INFO_PROLOGUE: u64 = 1 << 57;
const INFO_NEPI_SHIFT: u32 = 58; // 2 bits
const INFO_TRAMP: u64 = 1 << 60;
const INFO_RA_KNOWN: u64 = 1 << 61;
const INFO_CALL_SHIFT: u32 = 62; // 2 bits: 0 none, 1 indirect, 2 direct

const TAG_VALID: u64 = 1 << 63;
const TAG_FIRST: u64 = 1 << 56;
/// A scan check's entry: keyed by the pc and a call target (in the target
/// word), it holds the prologue rule from that target to the pc.
const TAG_VERIFY: u64 = 1 << 57;

/// What the code says about one frame's pc: everything the x86-64 unwind
/// step needs that does not depend on the stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameAnalysis {
    /// The pc is the signal trampoline (`__restore_rt`).
    pub trampoline: bool,
    /// The start of the function holding the pc, when a symbol says so.
    pub func_start: Option<u64>,
    /// The rule found by prologue analysis from the function's entry.
    pub prologue: Option<InsnRule>,
    /// The rules found by epilogue analysis, in the order to try them.
    pub epilogue: [Option<InsnRule>; super::instruction_analysis::epilogue::MAX_CANDIDATES],
}

impl FrameAnalysis {
    /// The epilogue rules.
    pub fn epilogue_rules(&self) -> impl Iterator<Item = InsnRule> + '_ {
        self.epilogue.iter().map_while(|r| *r)
    }
}

/// What the code says about an address taken as a return address: is it
/// the signal trampoline, and which call instruction ends right before it.
/// Only known for executable addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaInfo {
    /// The address is the signal trampoline (a handler returns there).
    pub trampoline: bool,
    /// The call right before it, if any.
    pub call: Option<CallBefore>,
    /// The call before it is direct and alignment padding follows it: a
    /// call that never returns (`abort`, a `.cold` part's last call), whose
    /// frame the code after it says nothing of.
    pub noreturn: bool,
}

/// One 64-byte line: `seq`, then the tag, the info word, the direct call
/// target, the prologue rule and up to [`MAX_EPILOGUE`] epilogue rules.
#[repr(C, align(64))]
struct Line {
    /// `generation << 32 | version`; the version is odd while a writer
    /// fills the line.
    seq: AtomicU64,
    data: [AtomicU64; 7],
}

const D_TAG: usize = 0;
const D_INFO: usize = 1;
const D_TARGET: usize = 2;
const D_PROLOGUE: usize = 3;
const D_EPI: usize = 4;

impl Line {
    const fn new() -> Line {
        Line {
            seq: AtomicU64::new(0),
            data: [const { AtomicU64::new(0) }; 7],
        }
    }
}

/// A fixed-size, lock-free, allocation-free cache of instruction-analysis
/// results, keyed by pc. See the [module documentation](self).
///
/// ```
/// use callstack::unwind::insn::cache::{FrameAnalysis, InsnCache};
/// static CACHE: InsnCache = InsnCache::new();
/// let a = FrameAnalysis { func_start: Some(0x1000), ..Default::default() };
/// CACHE.put_frame(0x1010, false, CACHE.generation(), &a);
/// assert_eq!(CACHE.get_frame(0x1010, false), Some(a));
/// CACHE.clear();
/// assert_eq!(CACHE.get_frame(0x1010, false), None);
/// ```
pub struct InsnCache {
    lines: [[Line; WAYS]; SETS],
    /// Current generation (never 0: zeroed lines are stale).
    generation: AtomicU32,
    /// Lines written (for tests and statistics; touched only on fills).
    fills: AtomicU64,
    victim: AtomicU32,
}

impl core::fmt::Debug for InsnCache {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("InsnCache")
            .field("generation", &self.generation())
            .field("fills", &self.fills())
            .finish()
    }
}

impl Default for InsnCache {
    fn default() -> Self {
        InsnCache::new()
    }
}

/// A snapshot of one line's words, read consistently.
struct Read {
    tag: u64,
    info: u64,
    target: u64,
    prologue: u64,
    epi: [u64; MAX_EPILOGUE],
}

impl InsnCache {
    /// An empty cache (a `const fn`: make it a `static`).
    pub const fn new() -> InsnCache {
        InsnCache {
            lines: [const { [const { Line::new() }; WAYS] }; SETS],
            generation: AtomicU32::new(1),
            fills: AtomicU64::new(0),
            victim: AtomicU32::new(0),
        }
    }

    /// Forgets every entry, in O(1). Async-signal-safe.
    pub fn clear(&self) {
        // Skip 0 on wrap-around: a zeroed line must stay stale.
        let g = self
            .generation
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1);
        if g == 0 {
            let _ = self
                .generation
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// The current generation: read it *before* reading the code an entry
    /// is computed from, and give it to the `put_*` call, so that an entry
    /// computed across a [`clear`](Self::clear) is stored as stale.
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// How many lines have been written since the cache was made (fills
    /// and updates; a warm capture that hits everywhere adds none).
    pub fn fills(&self) -> u64 {
        self.fills.load(Ordering::Relaxed)
    }

    /// How many entries of the current generation hold a frame analysis.
    /// Walks the whole table: for tests and reports, not for the hot path.
    pub fn len(&self) -> usize {
        let g = self.generation();
        let mut n = 0;
        for set in &self.lines {
            for line in set {
                if let Some(r) = read_line(line, g) {
                    if r.info & INFO_ANALYZED != 0 && r.tag & TAG_VERIFY == 0 {
                        n += 1;
                    }
                }
            }
        }
        n
    }

    /// Whether no entry of the current generation holds a frame analysis.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The set of a key: the tag, and for scan-check entries the target.
    fn set(&self, tag: u64, target: u64) -> &[Line; WAYS] {
        let k = tag ^ target.rotate_left(29);
        let h = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SETS.trailing_zeros());
        &self.lines[h as usize & (SETS - 1)]
    }

    #[inline]
    fn lookup(&self, tag: u64, target: u64) -> Option<Read> {
        let g = self.generation();
        self.set(tag, target)
            .iter()
            .find_map(|l| read_line(l, g).filter(|r| same_key(r, tag, target)))
    }

    /// The analysis of the frame at `pc` (`first`: `pc` is an exact pc
    /// rather than a return address), if cached.
    #[inline]
    pub fn get_frame(&self, pc: u64, first: bool) -> Option<FrameAnalysis> {
        let tag = tag(pc, first)?;
        let r = self.lookup(tag, 0)?;
        if r.info & INFO_ANALYZED == 0 {
            return None;
        }
        let start = r.info & INFO_START_MASK;
        let mut a = FrameAnalysis {
            trampoline: r.info & INFO_TRAMP != 0,
            func_start: (start != 0).then_some(start),
            prologue: None,
            epilogue: [None; super::instruction_analysis::epilogue::MAX_CANDIDATES],
        };
        if r.info & INFO_PROLOGUE != 0 {
            a.prologue = Some(unpack_rule(r.prologue)?);
        }
        let n = ((r.info >> INFO_NEPI_SHIFT) & 3) as usize;
        for i in 0..n {
            a.epilogue[i] = Some(unpack_rule(r.epi[i])?);
        }
        Some(a)
    }

    /// What is known of `ra` as a return address, if cached.
    #[inline]
    pub fn get_ra(&self, ra: u64) -> Option<RaInfo> {
        let r = self.lookup(tag(ra, false)?, 0)?;
        if r.info & INFO_RA_KNOWN == 0 {
            return None;
        }
        let call = match r.info >> INFO_CALL_SHIFT {
            1 => Some(CallBefore::Indirect),
            2 | 3 => Some(CallBefore::Direct(r.target)),
            _ => None,
        };
        Some(RaInfo {
            trampoline: r.info & INFO_TRAMP != 0,
            call,
            noreturn: r.info >> INFO_CALL_SHIFT == 3,
        })
    }

    /// Stores the analysis of the frame at `pc`, computed from code read
    /// after [`generation`](Self::generation) returned `generation`.
    /// Returns whether it was stored: not when it does not fit (a rule
    /// whose offsets exceed the packed fields, more than [`MAX_EPILOGUE`]
    /// candidates, an address above 2^56) or when another writer holds
    /// the line.
    pub fn put_frame(&self, pc: u64, first: bool, generation: u32, a: &FrameAnalysis) -> bool {
        let Some(tag) = tag(pc, first) else {
            return false;
        };
        let start = a.func_start.unwrap_or(0);
        if start >= ADDR_LIMIT {
            return false;
        }
        let prologue = match a.prologue {
            Some(r) => match pack_rule(&r) {
                Some(p) => p,
                None => return false,
            },
            None => 0,
        };
        let mut epi = [0u64; MAX_EPILOGUE];
        let mut n = 0;
        for r in a.epilogue_rules() {
            if n == MAX_EPILOGUE {
                return false;
            }
            let Some(p) = pack_rule(&r) else {
                return false;
            };
            epi[n] = p;
            n += 1;
        }
        let mut info = start | INFO_ANALYZED | ((n as u64) << INFO_NEPI_SHIFT);
        if a.prologue.is_some() {
            info |= INFO_PROLOGUE;
        }
        if a.trampoline {
            info |= INFO_TRAMP;
        }
        self.write(tag, 0, generation, |old| {
            // Keep what is known of the pc as a return address.
            let (mut info, mut target) = (info, 0);
            if let Some(o) = old {
                if o.info & INFO_RA_KNOWN != 0 {
                    info |= o.info & (INFO_RA_KNOWN | (3 << INFO_CALL_SHIFT));
                    target = o.target;
                }
            }
            [tag, info, target, prologue, epi[0], epi[1], epi[2]]
        })
    }

    /// Stores what is known of `ra` as a return address (computed as for
    /// [`put_frame`](Self::put_frame)).
    pub fn put_ra(&self, ra: u64, generation: u32, info: &RaInfo) -> bool {
        let Some(tag) = tag(ra, false) else {
            return false;
        };
        let (call, target) = match info.call {
            None => (0u64, 0),
            Some(CallBefore::Indirect) => (1, 0),
            // 3: a direct call that does not return here.
            Some(CallBefore::Direct(t)) => (if info.noreturn { 3 } else { 2 }, t),
        };
        let mut bits = INFO_RA_KNOWN | (call << INFO_CALL_SHIFT);
        if info.trampoline {
            bits |= INFO_TRAMP;
        }
        self.write(tag, 0, generation, |old| match old {
            // Keep the frame analysis already there.
            Some(o) => {
                let keep = o.info & !(INFO_RA_KNOWN | (3 << INFO_CALL_SHIFT));
                [
                    tag,
                    keep | bits,
                    target,
                    o.prologue,
                    o.epi[0],
                    o.epi[1],
                    o.epi[2],
                ]
            }
            None => [tag, bits, target, 0, 0, 0, 0],
        })
    }

    /// The prologue rule from the call target `target` to `pc`, as stack
    /// scanning checks a candidate return address with it (`Some(None)`:
    /// known to give none), if cached.
    #[inline]
    pub fn get_scan_check(&self, pc: u64, target: u64) -> Option<Option<InsnRule>> {
        let r = self.lookup(scan_tag(pc)?, target)?;
        if r.info & INFO_ANALYZED == 0 {
            return None;
        }
        if r.info & INFO_PROLOGUE == 0 {
            return Some(None);
        }
        Some(Some(unpack_rule(r.prologue)?))
    }

    /// Stores the prologue rule from `target` to `pc` (computed as for
    /// [`put_frame`](Self::put_frame)).
    pub fn put_scan_check(
        &self,
        pc: u64,
        target: u64,
        generation: u32,
        rule: Option<&InsnRule>,
    ) -> bool {
        let Some(tag) = scan_tag(pc) else {
            return false;
        };
        let (info, packed) = match rule {
            Some(r) => match pack_rule(r) {
                Some(p) => (INFO_ANALYZED | INFO_PROLOGUE, p),
                None => return false,
            },
            None => (INFO_ANALYZED, 0),
        };
        self.write(tag, target, generation, |_| {
            [tag, info, target, packed, 0, 0, 0]
        })
    }

    /// Writes the line of key (`tag`, `target`): the line that holds it,
    /// else a stale one, else a victim. `make` gets the line's current
    /// content when it holds the key in `generation`. Never waits: a busy
    /// line skips the write.
    fn write(
        &self,
        tag: u64,
        target: u64,
        generation: u32,
        make: impl FnOnce(Option<&Read>) -> [u64; 7],
    ) -> bool {
        if generation != self.generation() {
            return false;
        }
        let set = self.set(tag, target);
        let mut pick = None;
        for (i, l) in set.iter().enumerate() {
            match read_line(l, generation) {
                Some(r) if same_key(&r, tag, target) => {
                    pick = Some(i);
                    break;
                }
                None if pick.is_none() => pick = Some(i),
                _ => {}
            }
        }
        let i = pick.unwrap_or_else(|| self.victim.fetch_add(1, Ordering::Relaxed) as usize % WAYS);
        let line = &set[i];
        let s = line.seq.load(Ordering::Relaxed);
        if s & 1 != 0
            || line
                .seq
                .compare_exchange(s, s | 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        // Ours until the final store. Stores of the data must not become
        // visible before the odd sequence number.
        fence(Ordering::Release);
        let old = (s >> 32) as u32 == generation && s != 0;
        let old = old.then(|| raw(line)).filter(|r| same_key(r, tag, target));
        let words = make(old.as_ref());
        for (d, w) in line.data.iter().zip(words) {
            d.store(w, Ordering::Relaxed);
        }
        let version = (s as u32).wrapping_add(2) & !1;
        line.seq.store(
            ((generation as u64) << 32) | version as u64,
            Ordering::Release,
        );
        self.fills.fetch_add(1, Ordering::Relaxed);
        true
    }
}

fn same_key(r: &Read, tag: u64, target: u64) -> bool {
    r.tag == tag && (tag & TAG_VERIFY == 0 || r.target == target)
}

fn scan_tag(pc: u64) -> Option<u64> {
    Some(tag(pc, false)? | TAG_VERIFY)
}

fn tag(pc: u64, first: bool) -> Option<u64> {
    if pc == 0 || pc >= ADDR_LIMIT {
        return None;
    }
    Some(TAG_VALID | pc | if first { TAG_FIRST } else { 0 })
}

/// The line's words, without the consistency check (the writer's own view).
fn raw(line: &Line) -> Read {
    let d = |i: usize| line.data[i].load(Ordering::Relaxed);
    Read {
        tag: d(D_TAG),
        info: d(D_INFO),
        target: d(D_TARGET),
        prologue: d(D_PROLOGUE),
        epi: [d(D_EPI), d(D_EPI + 1), d(D_EPI + 2)],
    }
}

/// The line's words if it is of `generation` and no writer changed it
/// during the read.
#[inline]
fn read_line(line: &Line, generation: u32) -> Option<Read> {
    let s1 = line.seq.load(Ordering::Acquire);
    if s1 & 1 != 0 || (s1 >> 32) as u32 != generation || s1 == 0 {
        return None;
    }
    let r = raw(line);
    fence(Ordering::Acquire);
    let s2 = line.seq.load(Ordering::Relaxed);
    (s1 == s2).then_some(r)
}

// Packed rule: bit 0 present, bit 1 CFA from fp, bits 2-3 fp rule kind
// (0 unchanged, 1 at, 2 value, 3 unknown), bit 4 fp rule from fp, bits
// 5..21 ret_pop, bits 21..43 CFA offset (signed), bits 43..64 fp offset
// (signed). The return address is at CFA - 8 (x86-64).
const CFA_BITS: u32 = 22;
const FPO_BITS: u32 = 21;

fn fits(v: i32, bits: u32) -> bool {
    let lim = 1i64 << (bits - 1);
    (-lim..lim).contains(&(v as i64))
}

/// Packs an x86-64 rule into one word; `None` when it does not fit.
pub(crate) fn pack_rule(r: &InsnRule) -> Option<u64> {
    if r.ra_at_cfa != Some(-8) || !fits(r.cfa_offset, CFA_BITS) {
        return None;
    }
    let (kind, fb, fo) = match r.fp {
        FpRule::Unchanged => (0u64, Base::Sp, 0),
        FpRule::At(b, o) => (1, b, o),
        FpRule::Value(b, o) => (2, b, o),
        FpRule::Unknown => (3, Base::Sp, 0),
    };
    if !fits(fo, FPO_BITS) {
        return None;
    }
    let mut w = 1u64;
    w |= ((r.cfa_base == Base::Fp) as u64) << 1;
    w |= kind << 2;
    w |= ((fb == Base::Fp) as u64) << 4;
    w |= (r.ret_pop as u64) << 5;
    w |= ((r.cfa_offset as u64) & ((1 << CFA_BITS) - 1)) << 21;
    w |= ((fo as u64) & ((1 << FPO_BITS) - 1)) << 43;
    Some(w)
}

/// The inverse of [`pack_rule`].
pub(crate) fn unpack_rule(w: u64) -> Option<InsnRule> {
    if w & 1 == 0 {
        return None;
    }
    let base = |bit: u64| if bit != 0 { Base::Fp } else { Base::Sp };
    let sext = |v: u64, bits: u32| ((v << (64 - bits)) as i64 >> (64 - bits)) as i32;
    let cfa_offset = sext((w >> 21) & ((1 << CFA_BITS) - 1), CFA_BITS);
    let fo = sext(w >> 43, FPO_BITS);
    let fb = base((w >> 4) & 1);
    let fp = match (w >> 2) & 3 {
        0 => FpRule::Unchanged,
        1 => FpRule::At(fb, fo),
        2 => FpRule::Value(fb, fo),
        _ => FpRule::Unknown,
    };
    Some(InsnRule {
        cfa_base: base((w >> 1) & 1),
        cfa_offset,
        ra_at_cfa: Some(-8),
        ret_pop: (w >> 5) as u16,
        fp,
    })
}

static FALLBACK: InsnCache = InsnCache::new();
static IN_PROCESS: InsnCache = InsnCache::new();

/// The cache of `capture_exact`'s instruction-analysis fallback over this
/// process's code (the reader of the published module snapshot, which knows
/// no function bounds).
pub fn fallback_cache() -> &'static InsnCache {
    &FALLBACK
}

/// The cache of `unwind::insn::InProcess` captures (its reader knows
/// the function symbols).
pub fn in_process_cache() -> &'static InsnCache {
    &IN_PROCESS
}

/// Clears the instruction-analysis caches of this process
/// ([`fallback_cache`] and [`in_process_cache`]): call it whenever code may
/// have changed (a new module snapshot after `dlopen`/`dlclose`, code
/// rewritten in place). `callstack::prepare()` and
/// `InProcess::new` call it. O(1),
/// async-signal-safe.
pub fn invalidate() {
    FALLBACK.clear();
    IN_PROCESS.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(cfa_base: Base, cfa_offset: i32, ret_pop: u16, fp: FpRule) -> InsnRule {
        InsnRule {
            cfa_base,
            cfa_offset,
            ra_at_cfa: Some(-8),
            ret_pop,
            fp,
        }
    }

    #[test]
    fn pack_round_trips() {
        for r in [
            rule(Base::Sp, 8, 0, FpRule::Unchanged),
            rule(Base::Fp, 16, 0, FpRule::At(Base::Fp, 0)),
            rule(Base::Sp, 0x30, 16, FpRule::At(Base::Sp, 0x20)),
            rule(Base::Sp, -8, 0, FpRule::Value(Base::Fp, -0x100)),
            rule(
                Base::Sp,
                (1 << 21) - 1,
                u16::MAX,
                FpRule::At(Base::Sp, -(1 << 20)),
            ),
            rule(
                Base::Fp,
                -(1 << 21),
                0,
                FpRule::Value(Base::Sp, (1 << 20) - 1),
            ),
            rule(Base::Sp, 0x1008, 0, FpRule::Unknown),
        ] {
            assert_eq!(unpack_rule(pack_rule(&r).unwrap()), Some(r), "{r:?}");
        }
        assert_eq!(
            pack_rule(&rule(Base::Sp, 1 << 21, 0, FpRule::Unchanged)),
            None
        );
        assert_eq!(
            pack_rule(&rule(Base::Sp, 8, 0, FpRule::At(Base::Sp, 1 << 20))),
            None
        );
        let mut r = rule(Base::Sp, 8, 0, FpRule::Unchanged);
        r.ra_at_cfa = None;
        assert_eq!(pack_rule(&r), None);
    }

    fn analysis(start: u64, n: usize) -> FrameAnalysis {
        let mut a = FrameAnalysis {
            trampoline: false,
            func_start: Some(start),
            prologue: Some(rule(Base::Sp, 0x18, 0, FpRule::Unchanged)),
            ..Default::default()
        };
        for i in 0..n {
            a.epilogue[i] = Some(rule(Base::Sp, 8 * (i as i32 + 1), 0, FpRule::Unknown));
        }
        a
    }

    #[test]
    fn frames_and_ras_share_a_line() {
        let c = Box::new(InsnCache::new());
        let g = c.generation();
        let a = analysis(0x40_1000, 2);
        assert!(c.put_frame(0x40_1234, false, g, &a));
        assert_eq!(c.get_frame(0x40_1234, false), Some(a));
        // Exact pcs are keyed apart from return addresses.
        assert_eq!(c.get_frame(0x40_1234, true), None);
        assert_eq!(c.get_ra(0x40_1234), None);
        let ra = RaInfo {
            trampoline: false,
            call: Some(CallBefore::Direct(0x40_2000)),
            noreturn: false,
        };
        assert!(c.put_ra(0x40_1234, g, &ra));
        assert_eq!(c.get_ra(0x40_1234), Some(ra));
        assert_eq!(c.get_frame(0x40_1234, false), Some(a));
        // A frame put after the return-address info keeps it.
        let b = analysis(0x40_1100, 3);
        assert!(c.put_frame(0x40_1234, false, g, &b));
        assert_eq!(c.get_frame(0x40_1234, false), Some(b));
        assert_eq!(c.get_ra(0x40_1234), Some(ra));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn scan_checks_are_keyed_by_pc_and_target() {
        let c = Box::new(InsnCache::new());
        let g = c.generation();
        let r = rule(Base::Sp, 0x28, 0, FpRule::Unchanged);
        assert!(c.put_scan_check(0x40_1234, 0x40_1000, g, Some(&r)));
        assert!(c.put_scan_check(0x40_1234, 0x40_1100, g, None));
        assert_eq!(c.get_scan_check(0x40_1234, 0x40_1000), Some(Some(r)));
        assert_eq!(c.get_scan_check(0x40_1234, 0x40_1100), Some(None));
        assert_eq!(c.get_scan_check(0x40_1234, 0x40_1200), None);
        // Apart from the frame and return-address entries of the pc.
        assert_eq!(c.get_frame(0x40_1234, false), None);
        assert_eq!(c.get_ra(0x40_1234), None);
        assert!(c.is_empty());
    }

    #[test]
    fn what_does_not_fit_is_not_stored() {
        let c = Box::new(InsnCache::new());
        let g = c.generation();
        assert!(!c.put_frame(0x1000, false, g, &analysis(0x1000, 4)));
        assert!(!c.put_frame(0, false, g, &analysis(0x1000, 1)));
        assert!(!c.put_frame(1 << 56, false, g, &analysis(0x1000, 1)));
        assert!(c.is_empty());
    }

    #[test]
    fn clear_and_stale_generations() {
        let c = Box::new(InsnCache::new());
        let g = c.generation();
        assert!(c.put_frame(0x1000, true, g, &analysis(0x1000, 1)));
        assert!(c.get_frame(0x1000, true).is_some());
        c.clear();
        assert_eq!(c.get_frame(0x1000, true), None);
        // Computed before the clear: not stored.
        assert!(!c.put_frame(0x1000, true, g, &analysis(0x1000, 1)));
        assert!(c.is_empty());
        assert!(c.put_frame(0x1000, true, c.generation(), &analysis(0x1000, 1)));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn a_set_holds_its_ways_and_evicts_beyond() {
        let c = Box::new(InsnCache::new());
        let g = c.generation();
        // Find WAYS + 1 pcs of one set.
        let want = tag(0x1000, false).unwrap();
        let target = c.set(want, 0) as *const _;
        let mut pcs = vec![];
        let mut pc = 0x1000u64;
        while pcs.len() < WAYS + 1 {
            if core::ptr::eq(c.set(tag(pc, false).unwrap(), 0), target) {
                pcs.push(pc);
            }
            pc += 1;
        }
        for &p in &pcs[..WAYS] {
            assert!(c.put_frame(p, false, g, &analysis(p, 1)));
        }
        for &p in &pcs[..WAYS] {
            assert_eq!(c.get_frame(p, false), Some(analysis(p, 1)));
        }
        assert!(c.put_frame(pcs[WAYS], false, g, &analysis(pcs[WAYS], 1)));
        assert_eq!(c.get_frame(pcs[WAYS], false), Some(analysis(pcs[WAYS], 1)));
        let kept = pcs[..WAYS]
            .iter()
            .filter(|&&p| c.get_frame(p, false).is_some())
            .count();
        assert_eq!(kept, WAYS - 1);
    }

    #[test]
    fn busy_line_reads_as_miss_and_skips_writes() {
        let c = Box::new(InsnCache::new());
        let g = c.generation();
        assert!(c.put_frame(0x5000, false, g, &analysis(0x5000, 1)));
        // Simulate a writer interrupted mid-fill (a signal handler running
        // on top of it): the line's version is odd.
        let line = c
            .set(tag(0x5000, false).unwrap(), 0)
            .iter()
            .find(|l| raw(l).tag == tag(0x5000, false).unwrap())
            .unwrap();
        let s = line.seq.load(Ordering::Relaxed);
        line.seq.store(s | 1, Ordering::Relaxed);
        assert_eq!(c.get_frame(0x5000, false), None);
        assert!(!c.put_frame(0x5000, false, g, &analysis(0x5000, 2)));
        line.seq.store(s, Ordering::Relaxed);
        assert_eq!(c.get_frame(0x5000, false), Some(analysis(0x5000, 1)));
    }

    #[test]
    fn concurrent_readers_see_whole_entries() {
        // Writers store entries whose every field is derived from the pc;
        // readers must never see a mix of two entries.
        let c: &'static InsnCache = Box::leak(Box::new(InsnCache::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut hs = vec![];
        for t in 0..2u64 {
            let stop = stop.clone();
            hs.push(std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let pc = 0x10_0000 + ((i * 7 + t) % 5000) * 16;
                    let _ = c.put_frame(
                        pc,
                        false,
                        c.generation(),
                        &analysis(pc, (pc as usize / 16) % 4),
                    );
                    i += 1;
                }
            }));
        }
        // Until entries were seen (the writers may not have started when
        // a fast reader has done 200000 reads), with a bound in time.
        let mut seen = 0;
        let start = std::time::Instant::now();
        let mut i = 0u64;
        while (i < 200_000 || seen < 10_000) && start.elapsed().as_secs() < 20 {
            let pc = 0x10_0000 + (i % 5000) * 16;
            if let Some(a) = c.get_frame(pc, false) {
                assert_eq!(a, analysis(pc, (pc as usize / 16) % 4));
                seen += 1;
            }
            i += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        assert!(seen > 0);
    }
}
