//! Windows x64 unwind data (a PE image's `.pdata` and `.xdata`) compiled
//! into the CFI path's row form ([`RowView`]), so that the architecture's
//! `compile_row` turns it into the same rule (`Sp`/`Bp` with the caller's
//! `rbp` slot) a DWARF row becomes.
//!
//! The exception directory (data directory 3 of the PE32+ optional
//! header) is an array of `RUNTIME_FUNCTION`s sorted by address:
//! `BeginAddress`, `EndAddress`, `UnwindInfoAddress` (image-relative).
//! A function's `UNWIND_INFO`:
//!
//! ```text
//!   u8  version (bits 0-2), flags (bits 3-7: EHANDLER 1, UHANDLER 2, CHAININFO 4)
//!   u8  size of the prologue
//!   u8  count of unwind-code slots (u16 each)
//!   u8  frame register (bits 0-3), frame offset / 16 (bits 4-7)
//!   u16 codes[count], padded to an even count: prologue offset (u8),
//!       operation (bits 0-3), operation info (bits 4-7), then the
//!       operation's extra slots
//!   then, with CHAININFO, the parent's RUNTIME_FUNCTION
//! ```
//!
//! The codes describe the prologue in reverse: the last instruction first.
//! Here they are replayed forwards, from the parent of a chain down to the
//! function itself, tracking where the stack pointer stands from the CFA
//! (the caller's `rsp` after the return; the return address at `CFA - 8`),
//! where `rbp` was saved, and whether a frame register was set. A code
//! applies at an address when the prologue offset it carries is at or
//! before that address (all of the parents' codes apply). What is read is
//! bounded by the image: every offset is checked against its size.
//!
//! Epilogues are not in the unwind data: an exact pc is recognised as one
//! by its code ([`epilogue`]: what follows is `add rsp, n` or
//! `lea rsp, [rbp + n]`, `pop`s and `ret` or a jump, the only shapes the
//! x64 ABI allows), as Windows' own unwinder does.
//!
//! Not covered: frame registers other than `rbp` (no rule here: the caller
//! then takes the frame-pointer rule), `UWOP_PUSH_MACHFRAME` (interrupt and
//! exception frames).

use crate::types::{CfaView, RowView, RuleView};

/// DWARF numbers of `rsp`, `rbp`, `rip` (x86-64 psABI), for the row.
const DW_RBP: u16 = 6;
const DW_RSP: u16 = 7;
const DW_RIP: u16 = 16;
/// Windows' number of `rbp` in unwind codes (rax 0, rcx 1, rdx 2, rbx 3,
/// rsp 4, rbp 5, rsi 6, rdi 7, r8-r15).
const WIN_RBP: u8 = 5;

const UNW_FLAG_CHAININFO: u8 = 4;
/// Chains followed at most (real chains have one or two links).
const MAX_CHAIN: usize = 8;

/// The bytes of a PE image as it is mapped (section contents at their
/// image-relative addresses), read by offset.
pub(crate) trait Image {
    /// `len` bytes at image offset `rva`, if they lie inside the image.
    fn bytes(&self, rva: u32, len: u32) -> Option<&[u8]>;

    /// A little-endian `u16` at `rva`.
    fn u16_at(&self, rva: u32) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(rva, 2)?.try_into().ok()?))
    }

    /// A little-endian `u32` at `rva`.
    fn u32_at(&self, rva: u32) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(rva, 4)?.try_into().ok()?))
    }
}

impl Image for [u8] {
    fn bytes(&self, rva: u32, len: u32) -> Option<&[u8]> {
        let start = rva as usize;
        self.get(start..start.checked_add(len as usize)?)
    }
}

/// A `RUNTIME_FUNCTION`: a function's range and its unwind data, all
/// image-relative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RuntimeFunction {
    pub begin: u32,
    pub end: u32,
    pub unwind: u32,
}

/// The `RUNTIME_FUNCTION` at image offset `at` (12 bytes).
fn runtime_function(img: &(impl Image + ?Sized), at: u32) -> Option<RuntimeFunction> {
    let b = img.bytes(at, 12)?;
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    Some(RuntimeFunction {
        begin: word(0),
        end: word(4),
        unwind: word(8),
    })
}

/// The exception directory of a mapped PE32+ image: `(rva, size)`.
pub(crate) fn exception_directory(img: &(impl Image + ?Sized)) -> Option<(u32, u32)> {
    if img.u16_at(0)? != 0x5a4d {
        return None; // "MZ"
    }
    let pe = img.u32_at(0x3c)?;
    if img.u32_at(pe)? != 0x4550 {
        return None; // "PE\0\0"
    }
    let opt = pe.checked_add(24)?;
    if img.u16_at(opt)? != 0x20b {
        return None; // not PE32+
    }
    // NumberOfRvaAndSizes, then the directories (8 bytes each).
    if img.u32_at(opt.checked_add(108)?)? <= 3 {
        return None;
    }
    let dir = opt.checked_add(112 + 3 * 8)?;
    let (rva, size) = (img.u32_at(dir)?, img.u32_at(dir.checked_add(4)?)?);
    (rva != 0 && size >= 12).then_some((rva, size))
}

/// The `RUNTIME_FUNCTION` covering image offset `rva`, by binary search of
/// the directory `(dir, size)`.
pub(crate) fn find_function(
    img: &(impl Image + ?Sized),
    (dir, size): (u32, u32),
    rva: u32,
) -> Option<RuntimeFunction> {
    let entry = |i: u32| runtime_function(img, dir.checked_add(i.checked_mul(12)?)?);
    let (mut lo, mut hi) = (0u32, size / 12);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let f = entry(mid)?;
        if rva < f.begin {
            hi = mid;
        } else if rva >= f.end {
            lo = mid + 1;
        } else {
            return Some(f);
        }
    }
    None
}

/// Where a frame's CFA is, and where the caller's `rbp` was saved: what
/// the unwind codes of an address come to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    /// `CFA = rsp + n` (no frame register set), or `CFA = rbp + n`.
    pub cfa_from_rbp: bool,
    /// `n` above.
    pub cfa: i64,
    /// The caller's `rbp` is saved at `CFA + bp` (`None`: untouched).
    pub bp: Option<i64>,
}

impl Frame {
    /// The leaf rule: no unwind data, the return address at `rsp`.
    pub(crate) const LEAF: Frame = Frame {
        cfa_from_rbp: false,
        cfa: 8,
        bp: None,
    };

    /// The frame as a CFI row (`RowView`), for the architecture's
    /// `compile_row`.
    pub(crate) fn row(&self) -> RowView<'static> {
        let base = if self.cfa_from_rbp { DW_RBP } else { DW_RSP };
        let mut regs = [(DW_RIP, RuleView::Offset(-8)); 2];
        let n = match self.bp {
            Some(b) => {
                regs[1] = (DW_RBP, RuleView::Offset(b));
                2
            }
            None => 1,
        };
        RowView::new(CfaView::RegOffset(base, self.cfa), DW_RIP, &regs[..n])
    }
}

/// The codes of one `UNWIND_INFO`, its frame register and offset, and its
/// chained parent.
struct Info {
    /// Image offset of the first code slot.
    codes: u32,
    count: u32,
    frame_reg: u8,
    frame_off: i64,
    parent: Option<RuntimeFunction>,
}

fn info(img: &(impl Image + ?Sized), rva: u32) -> Option<Info> {
    let h = img.bytes(rva, 4)?;
    let (flags, count) = (h[0] >> 3, u32::from(h[2]));
    if h[0] & 7 == 0 || h[0] & 7 > 2 {
        return None; // versions 1 and 2 only
    }
    let codes = rva.checked_add(4)?;
    img.bytes(codes, count * 2)?;
    let parent = if flags & UNW_FLAG_CHAININFO != 0 {
        Some(runtime_function(
            img,
            codes.checked_add(((count + 1) & !1) * 2)?,
        )?)
    } else {
        None
    };
    Some(Info {
        codes,
        count,
        frame_reg: h[3] & 15,
        frame_off: i64::from(h[3] >> 4) * 16,
        parent,
    })
}

/// Replays one info's prologue forwards onto `st` (codes whose prologue
/// offset is beyond `limit` have not run yet). `None`: a code this module
/// does not cover.
fn replay(img: &(impl Image + ?Sized), inf: &Info, limit: u32, st: &mut State) -> Option<()> {
    // The slots, in stored order (last prologue instruction first), each
    // operation with its extra slots: gathered, then applied in reverse.
    let slot = |i: u32| img.u16_at(inf.codes.checked_add(2 * i)?);
    let mut ops: [(u8, u8, u8, u32); 256] = [(0, 0, 0, 0); 256];
    let mut n = 0;
    let mut i = 0;
    while i < inf.count {
        let s = slot(i)?;
        let (off, op, opinfo) = ((s & 0xff) as u8, ((s >> 8) & 15) as u8, (s >> 12) as u8);
        let (extra, arg) = match op {
            0 | 2 | 3 => (0, 0), // PUSH_NONVOL, ALLOC_SMALL, SET_FPREG
            1 if opinfo == 0 => (1, u32::from(slot(i + 1)?) * 8), // ALLOC_LARGE, size / 8
            1 if opinfo == 1 => (2, u32::from(slot(i + 1)?) | u32::from(slot(i + 2)?) << 16),
            4 => (1, u32::from(slot(i + 1)?) * 8), // SAVE_NONVOL, offset / 8
            5 => (2, u32::from(slot(i + 1)?) | u32::from(slot(i + 2)?) << 16), // SAVE_NONVOL_FAR
            6 => (1, 0), // EPILOG (version 2): describes epilogues, not the prologue
            8 => (1, 0), // SAVE_XMM128
            9 => (2, 0), // SAVE_XMM128_FAR
            _ => return None, // PUSH_MACHFRAME, unknown
        };
        if n == ops.len() {
            return None;
        }
        ops[n] = (off, op, opinfo, arg);
        n += 1;
        i += 1 + extra;
    }
    for &(off, op, opinfo, arg) in ops[..n].iter().rev() {
        if op == 6 || u32::from(off) > limit {
            continue;
        }
        match op {
            0 => {
                st.sp -= 8;
                if opinfo == WIN_RBP {
                    st.bp = Some(st.sp);
                }
            }
            1 => st.sp -= i64::from(arg),
            2 => st.sp -= i64::from(opinfo) * 8 + 8,
            3 => {
                if inf.frame_reg != WIN_RBP {
                    return None;
                }
                // rbp = rsp + frame offset, and the frame's base (the
                // saves' base) is rsp here.
                st.fp = Some(st.sp + inf.frame_off);
                st.base = Some(st.sp);
            }
            4 | 5 if opinfo == WIN_RBP => st.saved_rbp_at = Some(i64::from(arg)),
            _ => {}
        }
    }
    Some(())
}

/// The prologue replayed so far: offsets from the CFA.
struct State {
    /// `rsp` (the CFA minus 8 for the return address at the start).
    sp: i64,
    /// `rbp` once a SET_FPREG ran.
    fp: Option<i64>,
    /// `rsp` when it ran: the base of the saves' offsets.
    base: Option<i64>,
    /// Where a PUSH_NONVOL saved `rbp`.
    bp: Option<i64>,
    /// A SAVE_NONVOL's offset of `rbp` from the frame's base.
    saved_rbp_at: Option<i64>,
}

/// The frame at image offset `rva` (a lookup address: an exact pc, or a
/// return address minus 1, inside the call) of the function `f`, from its unwind codes
/// and its chain's. `None` where this module has no rule (see the module
/// docs).
pub(crate) fn frame(img: &(impl Image + ?Sized), f: RuntimeFunction, rva: u32) -> Option<Frame> {
    // The chain, the function first: RUNTIME_FUNCTIONs whose unwind
    // address has bit 0 set point at another RUNTIME_FUNCTION.
    let resolve = |mut f: RuntimeFunction| -> Option<RuntimeFunction> {
        for _ in 0..MAX_CHAIN {
            if f.unwind & 1 == 0 {
                return Some(f);
            }
            f = runtime_function(img, f.unwind & !1)?;
        }
        None
    };
    let f = resolve(f)?;
    let mut chain: [(Option<Info>, u32); MAX_CHAIN] = Default::default();
    let mut len = 0;
    let mut cur = Some(f);
    // The address's offset in the function's code, as the codes' prologue
    // offsets count it: a code applies once the instruction ending there
    // ran, at or before the address. That holds for an exact pc (the
    // instruction there has not run) and for a return address's lookup
    // address (`ra - 1`, inside the call, whose prologue operations all end
    // at or before the call's first byte).
    let mut limit = rva.checked_sub(f.begin)?;
    while let Some(c) = cur {
        if len == MAX_CHAIN {
            return None;
        }
        let c = resolve(c)?;
        let inf = info(img, c.unwind)?;
        cur = inf.parent;
        chain[len] = (Some(inf), limit);
        // Every code of a parent ran before this fragment.
        limit = u32::MAX;
        len += 1;
    }
    let mut st = State {
        sp: -8,
        fp: None,
        base: None,
        bp: None,
        saved_rbp_at: None,
    };
    for (inf, limit) in chain[..len].iter().rev() {
        replay(img, inf.as_ref()?, *limit, &mut st)?;
    }
    // The saves' base: rsp where the frame register was set (rbp minus the
    // frame offset), else the final rsp.
    let base = st.base.unwrap_or(st.sp);
    let bp = st.saved_rbp_at.map(|o| base + o).or(st.bp);
    Some(match st.fp {
        Some(fp) => Frame {
            cfa_from_rbp: true,
            cfa: -fp,
            bp,
        },
        None => Frame {
            cfa_from_rbp: false,
            cfa: -st.sp,
            bp,
        },
    })
}

/// The frame at an exact pc whose code, `code` (the bytes from the pc on),
/// is (the rest of) an epilogue: optionally `add rsp, n` or
/// `lea rsp, [rbp + n]` first, then `pop`s, then `ret` (or, after one of
/// those, a tail jump). `None` when the code is not one.
pub(crate) fn epilogue(code: &[u8]) -> Option<Frame> {
    let imm32 = |b: &[u8]| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    // Where rsp stands from the base (rsp, or rbp after a `lea`) once the
    // instructions so far ran; whether anything came before the end.
    let (mut i, mut k, from_rbp) = match code {
        [0x48, 0x83, 0xc4, n, ..] => (4, i64::from(*n as i8), false),
        [0x48, 0x81, 0xc4, a, b, c, d, ..] => (7, imm32(&[*a, *b, *c, *d]), false),
        [0x48, 0x8d, 0x65, n, ..] => (4, i64::from(*n as i8), true),
        [0x48, 0x8d, 0xa5, a, b, c, d, ..] => (7, imm32(&[*a, *b, *c, *d]), true),
        _ => (0, 0, false),
    };
    if k < 0 {
        return None;
    }
    let mut bp = None;
    loop {
        match code.get(i..)? {
            [r @ 0x58..=0x5f, ..] => {
                if *r == 0x5c {
                    return None; // pop rsp
                }
                if *r == 0x5d {
                    bp = Some(k);
                }
                k += 8;
                i += 1;
            }
            [0x41, 0x58..=0x5f, ..] => {
                k += 8;
                i += 2;
            }
            [0xc3, ..] | [0xc2, _, _, ..] | [0xf3, 0xc3, ..] => break,
            [0xe9, ..] | [0xeb, ..] if i > 0 => break,
            _ => return None,
        }
    }
    let cfa = k + 8;
    Some(Frame {
        cfa_from_rbp: from_rbp,
        cfa,
        bp: bp.map(|o| o - cfa),
    })
}

/// The frame at image offset `rva` of a mapped image: its function's
/// unwind codes; the leaf rule where no function covers `rva` (the x64
/// ABI: a function without unwind data neither moves `rsp` nor saves a
/// register); `None` where the image has no exception directory or the
/// codes are not covered here.
pub(crate) fn frame_at(img: &(impl Image + ?Sized), rva: u32) -> Option<Frame> {
    let dir = exception_directory(img)?;
    // The whole directory inside the image: an entry not found is then a
    // leaf, not an unreadable table.
    img.bytes(dir.0, dir.1)?;
    match find_function(img, dir, rva) {
        Some(f) => frame(img, f, rva),
        None => Some(Frame::LEAF),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An image of `len` bytes with a PE32+ header whose exception
    /// directory lists `funcs` (begin, end, unwind info offset) at 0x200,
    /// and `infos` written at their offsets.
    fn image(funcs: &[(u32, u32, u32)], infos: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![0u8; 0x2000];
        b[0..2].copy_from_slice(b"MZ");
        b[0x3c..0x40].copy_from_slice(&0x80u32.to_le_bytes());
        b[0x80..0x84].copy_from_slice(b"PE\0\0");
        let opt = 0x80 + 24;
        b[opt..opt + 2].copy_from_slice(&0x20bu16.to_le_bytes());
        b[opt + 108..opt + 112].copy_from_slice(&16u32.to_le_bytes());
        let dir = opt + 112 + 24;
        b[dir..dir + 4].copy_from_slice(&0x200u32.to_le_bytes());
        b[dir + 4..dir + 8].copy_from_slice(&(funcs.len() as u32 * 12).to_le_bytes());
        for (i, &(s, e, u)) in funcs.iter().enumerate() {
            let at = 0x200 + 12 * i;
            b[at..at + 4].copy_from_slice(&s.to_le_bytes());
            b[at + 4..at + 8].copy_from_slice(&e.to_le_bytes());
            b[at + 8..at + 12].copy_from_slice(&u.to_le_bytes());
        }
        for (at, bytes) in infos {
            b[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
        }
        b
    }

    /// An UNWIND_INFO: version 1, `flags`, prologue size, codes (each
    /// `(offset, op, info)` or a raw extra slot), frame register/offset.
    fn unwind_info(flags: u8, prolog: u8, frame: (u8, u8), slots: &[u16]) -> Vec<u8> {
        let mut v = vec![
            1 | flags << 3,
            prolog,
            slots.len() as u8,
            frame.0 | frame.1 << 4,
        ];
        for s in slots {
            v.extend_from_slice(&s.to_le_bytes());
        }
        if slots.len() % 2 == 1 {
            v.extend_from_slice(&[0, 0]);
        }
        v
    }

    fn code(off: u8, op: u8, info: u8) -> u16 {
        u16::from(off) | u16::from(op) << 8 | u16::from(info) << 12
    }

    #[test]
    fn gcc_frame_pointer_prologue() {
        // push rbp (1); push rbx (2); sub rsp, 0x28 (6); lea rbp, [rsp + 0x20] (11);
        // .seh_setframe rbp, 32.
        let info = unwind_info(
            0,
            11,
            (5, 2),
            &[code(11, 3, 0), code(6, 2, 4), code(2, 0, 3), code(1, 0, 5)],
        );
        let img = image(&[(0x1000, 0x1100, 0x1800)], &[(0x1800, info)]);
        // In the body: CFA = rbp + 0x10 + ... : rsp after pushes and alloc is
        // CFA - 8 - 16 - 0x28 = CFA - 0x40; rbp = that + 32 = CFA - 0x20.
        assert_eq!(
            frame_at(&img[..], 0x1050),
            Some(Frame {
                cfa_from_rbp: true,
                cfa: 0x20,
                bp: Some(-16)
            })
        );
        // An exact pc in the prologue, after the pushes only: CFA = rsp + 24
        // (the codes whose instruction ended at or before it).
        assert_eq!(
            frame_at(&img[..], 0x1002),
            Some(Frame {
                cfa_from_rbp: false,
                cfa: 24,
                bp: Some(-16)
            })
        );
    }

    #[test]
    fn an_exact_pc_at_a_prologue_instruction_has_not_run_it() {
        // push rbp (ends at 1); sub rsp, 0x20 (ends at 5).
        let info = unwind_info(0, 5, (0, 0), &[code(5, 2, 3), code(1, 0, 5)]);
        let img = image(&[(0x1000, 0x1100, 0x1800)], &[(0x1800, info)]);
        let at = |pc| frame_at(&img[..], pc).unwrap();
        assert_eq!((at(0x1000).cfa, at(0x1000).bp), (8, None));
        assert_eq!((at(0x1001).cfa, at(0x1001).bp), (16, Some(-16)));
        assert_eq!((at(0x1004).cfa, at(0x1004).bp), (16, Some(-16)));
        assert_eq!((at(0x1005).cfa, at(0x1005).bp), (48, Some(-16)));
    }

    #[test]
    fn frameless_large_alloc_and_a_leaf() {
        // push rsi (1); push rdi (2); sub rsp, 0x12340 (9): ALLOC_LARGE, size / 8.
        let info = unwind_info(
            0,
            9,
            (0, 0),
            &[
                code(9, 1, 0),
                (0x12340u32 / 8) as u16,
                code(2, 0, 7),
                code(1, 0, 6),
            ],
        );
        let img = image(&[(0x1000, 0x1100, 0x1800)], &[(0x1800, info)]);
        assert_eq!(
            frame_at(&img[..], 0x1080),
            Some(Frame {
                cfa_from_rbp: false,
                cfa: 8 + 16 + 0x12340,
                bp: None
            })
        );
        // Outside every function: a leaf.
        assert_eq!(frame_at(&img[..], 0x1200), Some(Frame::LEAF));
        assert_eq!(frame_at(&img[..], 0x0fff), Some(Frame::LEAF));
    }

    #[test]
    fn save_nonvol_of_rbp_and_a_chain() {
        // The parent: sub rsp, 0x48 (4); mov [rsp + 0x40], rbp (9): SAVE_NONVOL rbp, 0x40/8.
        let parent = unwind_info(0, 9, (0, 0), &[code(9, 4, 5), 0x40 / 8, code(4, 2, 8)]);
        // A fragment chained to it (no codes of its own).
        let mut child = unwind_info(UNW_FLAG_CHAININFO, 0, (0, 0), &[]);
        for w in [0x1000u32, 0x1100, 0x1800] {
            child.extend_from_slice(&w.to_le_bytes());
        }
        let img = image(
            &[(0x1000, 0x1100, 0x1800), (0x1200, 0x1300, 0x1900)],
            &[(0x1800, parent), (0x1900, child)],
        );
        let want = Frame {
            cfa_from_rbp: false,
            cfa: 8 + 0x48,
            bp: Some(-8 - 0x48 + 0x40),
        };
        assert_eq!(frame_at(&img[..], 0x1050), Some(want));
        assert_eq!(frame_at(&img[..], 0x1210), Some(want));
    }

    #[test]
    fn bad_data_gives_none_never_a_panic() {
        // A frame register other than rbp.
        let info = unwind_info(0, 4, (12, 0), &[code(4, 3, 0), code(2, 0, 12)]);
        let img = image(&[(0x1000, 0x1100, 0x1800)], &[(0x1800, info)]);
        assert_eq!(frame_at(&img[..], 0x1050), None);
        // Unwind info out of the image, a chain that loops, garbage.
        let img = image(&[(0x1000, 0x1100, 0xffff_fff0)], &[]);
        assert_eq!(frame_at(&img[..], 0x1050), None);
        let mut looped = unwind_info(UNW_FLAG_CHAININFO, 0, (0, 0), &[]);
        for w in [0x1000u32, 0x1100, 0x1800] {
            looped.extend_from_slice(&w.to_le_bytes());
        }
        let img = image(&[(0x1000, 0x1100, 0x1800)], &[(0x1800, looped)]);
        assert_eq!(frame_at(&img[..], 0x1050), None);
        for seed in 0..200u32 {
            let mut img = image(&[(0x1000, 0x1100, 0x1800)], &[]);
            let mut x = seed.wrapping_mul(2654435761) | 1;
            for b in &mut img[0x1800..0x1840] {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *b = x as u8;
            }
            let _ = frame_at(&img[..], 0x1050);
        }
        assert_eq!(frame_at(&[0u8; 16][..], 0), None);
        // Offsets at the top of the address space: no overflow, no panic.
        let img = image(&[(0x1000, 0x1100, 0xffff_ffff)], &[]);
        assert_eq!(frame_at(&img[..], 0x1050), None);
        let mut img = image(&[], &[]);
        img[0x3c..0x40].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        assert_eq!(frame_at(&img[..], 0x1050), None);
        let mut img = image(&[(0x1000, 0x1100, 0x1800)], &[]);
        let dir = 0x80 + 24 + 112 + 24;
        img[dir..dir + 4].copy_from_slice(&0xffff_fffcu32.to_le_bytes());
        assert_eq!(frame_at(&img[..], 0x1050), None);
    }

    #[test]
    fn epilogues_by_their_code() {
        let f = |cfa_from_rbp, cfa, bp| {
            Some(Frame {
                cfa_from_rbp,
                cfa,
                bp,
            })
        };
        // add rsp, 0x20; pop rbp; ret (gcc -O0), at each instruction.
        let code = [0x48, 0x83, 0xc4, 0x20, 0x5d, 0xc3];
        assert_eq!(epilogue(&code), f(false, 0x30, Some(-16)));
        assert_eq!(epilogue(&code[4..]), f(false, 16, Some(-16)));
        assert_eq!(epilogue(&code[5..]), f(false, 8, None));
        // lea rsp, [rbp + 0x40]; pop rsi; pop r12; pop rbp; ret.
        let code = [0x48, 0x8d, 0x65, 0x40, 0x5e, 0x41, 0x5c, 0x5d, 0xc3];
        assert_eq!(epilogue(&code), f(true, 0x40 + 32, Some(-16)));
        // add rsp, 0x1000; jmp target (a tail call).
        let code = [0x48, 0x81, 0xc4, 0, 0x10, 0, 0, 0xe9, 0, 0, 0, 0];
        assert_eq!(epilogue(&code), f(false, 0x1008, None));
        // Not epilogues: a bare jump, a call, add rsp of a negative, a
        // pop rsp, code cut short.
        assert_eq!(epilogue(&[0xe9, 0, 0, 0, 0]), None);
        assert_eq!(epilogue(&[0xe8, 0, 0, 0, 0]), None);
        assert_eq!(epilogue(&[0x48, 0x83, 0xc4, 0xf0, 0xc3]), None);
        assert_eq!(epilogue(&[0x5c, 0xc3]), None);
        assert_eq!(epilogue(&[0x5d, 0x5b]), None);
        assert_eq!(epilogue(&[]), None);
    }

    #[test]
    fn rows_compile_to_the_cfi_rules() {
        use crate::arch::x86_64::{UnwindRuleX86_64 as R, X86_64};
        use crate::arch::Arch;
        let f = Frame {
            cfa_from_rbp: true,
            cfa: 0x20,
            bp: Some(-16),
        };
        assert_eq!(
            X86_64::compile_row(&f.row(), false),
            R::Bp { cfa: 0x20, bp: -16 }
        );
        assert_eq!(
            X86_64::compile_row(&Frame::LEAF.row(), false),
            R::Sp { cfa: 8, bp: 0 }
        );
    }
}
