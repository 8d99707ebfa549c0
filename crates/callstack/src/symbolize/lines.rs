//! Line programs, decoded lazily, by our own interpreter.
//!
//! A unit's line program is first run through once without keeping any
//! row, to find its sequences (address range, and where in the program
//! each begins); the rows of a sequence are decoded when an address first
//! falls in it. In a Rust unit every function is a sequence, and a cold
//! pass hits a few of them per unit: most rows are never built, sorted or
//! stored. Running the state machine here rather than through gimli's
//! `LineRows` is about three times cheaper per instruction (no
//! `LineInstruction` built and matched per opcode).
//!
//! Semantics are gimli's, which the symbolizer used before (and still
//! uses for what this does not cover): the same rows, the same
//! tombstones (a `DW_LNE_set_address` going backwards or to -2/-1 drops
//! rows until the next address), the same errors (a bad LEB128, a
//! truncated opcode, an address overflow end the whole program). A
//! program with `DW_LNE_define_file` (never emitted by current compilers)
//! or VLIW operation indexes is left to gimli ([`Program::new`] or
//! [`Program::sequences`] says so).

use super::die::Bytes;
use super::elf::Slice;
use std::cell::{OnceCell, RefCell};

/// One row, as the symbolizer keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) addr: u64,
    pub(crate) file: u32,
    pub(crate) line: u32,
    pub(crate) column: u32,
    pub(crate) discriminator: u32,
}

impl Row {
    pub(crate) fn new(addr: u64, file: u64, line: u64, column: u64, discriminator: u64) -> Row {
        let c = |v: u64| v.min(u32::MAX as u64) as u32;
        Row {
            addr,
            file: c(file),
            line: c(line),
            column: c(column),
            discriminator: c(discriminator),
        }
    }
}

/// One sequence: its address range and where its rows are. At one
/// address only the last row counts, as in the addr2line crate.
///
/// The rows of a sequence whose addresses never go down (all that
/// compilers emit) are not kept: its first lookup decodes it once and
/// keeps the state machine's registers every [`EVERY`] rows; a lookup
/// then decodes at most that many rows from the checkpoint before the
/// address (a large function has thousands of rows: an eighth of the
/// memory of keeping them all). Others (a tombstone can merge two
/// sequences) are decoded once and kept, and searched as gimli's rows
/// would be.
pub(crate) struct Sequence {
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Program offset where its decoding starts (with a fresh state).
    from: usize,
    monotone: bool,
    rows: OnceCell<Box<[Row]>>,
    checks: OnceCell<Box<[Check]>>,
}

/// Rows between two checkpoints.
const EVERY: usize = 16;

/// The registers just after a row was emitted, and that row's
/// discriminator (reset to 0 for the next row).
#[derive(Clone, Copy)]
struct Check {
    st: State,
    /// Program offset after the opcode that emitted the row.
    pos: usize,
    discriminator: u64,
}

impl Sequence {
    /// A sequence whose rows are already known.
    pub(crate) fn decoded(start: u64, end: u64, rows: Box<[Row]>) -> Sequence {
        Sequence {
            start,
            end,
            from: usize::MAX,
            monotone: false,
            rows: OnceCell::from(rows),
            checks: OnceCell::new(),
        }
    }

    /// All its rows (decoded now if they were not kept).
    #[cfg(test)]
    pub(crate) fn rows(&self, program: Option<&Program>) -> Box<[Row]> {
        match (self.rows.get(), program) {
            (Some(r), _) => r.clone(),
            (None, Some(p)) => p.rows(self.from),
            (None, None) => Box::new([]),
        }
    }

    /// The row at `probe` (the last one at or before it).
    pub(crate) fn find(&self, program: Option<&Program>, probe: u64) -> Option<Row> {
        if self.monotone && self.rows.get().is_none() {
            let p = program?;
            let checks = self.checks.get_or_init(|| p.checkpoints(self.from));
            let i = checks.partition_point(|c| c.st.address <= probe);
            let c = checks.get(i.checked_sub(1)?)?;
            return Some(p.find_from(c, probe));
        }
        let rows = self.rows.get_or_init(|| match program {
            Some(p) => p.rows(self.from),
            None => Box::new([]),
        });
        let j = rows.partition_point(|r| r.addr <= probe);
        rows.get(j.checked_sub(1)?).copied()
    }
}

/// Why [`Program::sequences`] stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Malformed program: no line information for the unit.
    Bad,
    /// An opcode we leave to gimli.
    Unsupported,
}

/// A line program and the header fields its interpreter needs.
pub(crate) struct Program {
    bytes: &'static [u8],
    big: bool,
    version: u16,
    address_size: u8,
    min_inst: u64,
    line_base: i64,
    line_range: u8,
    opcode_base: u8,
    std_lengths: &'static [u8],
    mask: u64,
    min_tombstone: u64,
    /// Reused while decoding a sequence (rows then copied at their size).
    scratch: RefCell<Vec<Row>>,
}

/// The state machine's registers that rows are made of.
#[derive(Clone, Copy)]
struct State {
    address: u64,
    file: u64,
    line: u64,
    column: u64,
    discriminator: u64,
    end_sequence: bool,
    tombstone: bool,
}

impl State {
    fn new() -> State {
        State {
            address: 0,
            file: 1,
            line: 1,
            column: 0,
            discriminator: 0,
            end_sequence: false,
            tombstone: false,
        }
    }
}

impl Program {
    /// `None` for what we leave to gimli: VLIW operation indexes, address
    /// sizes other than 1, 2, 4, 8, a zero line range.
    pub(crate) fn new(header: &gimli::LineProgramHeader<Slice>) -> Option<Program> {
        let enc = header.line_encoding();
        let size = header.address_size();
        if enc.maximum_operations_per_instruction != 1
            || enc.line_range == 0
            || !matches!(size, 1 | 2 | 4 | 8)
        {
            return None;
        }
        let mask = !0u64 >> (64 - size as u32 * 8);
        let program = header.raw_program_buf();
        Some(Program {
            bytes: program.slice(),
            big: gimli::Endianity::is_big_endian(gimli::Reader::endian(&program)),
            version: header.version(),
            address_size: size,
            min_inst: enc.minimum_instruction_length as u64,
            line_base: enc.line_base as i64,
            line_range: enc.line_range,
            opcode_base: header.opcode_base(),
            std_lengths: header.standard_opcode_lengths().slice(),
            mask,
            min_tombstone: (-2i64 as u64) & mask,
            scratch: RefCell::new(Vec::new()),
        })
    }

    /// The sequences, sorted by start address (stably: in program order
    /// where two start at one address), rows not decoded yet.
    pub(crate) fn sequences(&self) -> Result<Vec<Sequence>, Stop> {
        let mut out = Vec::new();
        let mut from = 0;
        let mut first: Option<u64> = None;
        let (mut last, mut monotone) = (0, true);
        self.run(0, |st, after| {
            if st.end_sequence {
                if let Some(start) = first.take() {
                    if start < st.address {
                        out.push(Sequence {
                            start,
                            end: st.address,
                            from,
                            monotone,
                            rows: OnceCell::new(),
                            checks: OnceCell::new(),
                        });
                    }
                }
                from = after;
            } else if first.is_none() {
                first = Some(st.address);
                (last, monotone) = (st.address, true);
            } else {
                monotone &= st.address >= last;
                last = st.address;
            }
            true
        })?;
        out.sort_by_key(|s| s.start);
        Ok(out)
    }

    /// The checkpoints of the sequence decoded from `from`: every
    /// [`EVERY`]th row's state.
    fn checkpoints(&self, from: usize) -> Box<[Check]> {
        let mut out = Vec::new();
        let mut n = 0usize;
        // The whole program was run once without error: none here either.
        let _ = self.run(from, |st, pos| {
            if st.end_sequence {
                return false;
            }
            if n % EVERY == 0 {
                let mut st = *st;
                let discriminator = std::mem::take(&mut st.discriminator);
                out.push(Check {
                    st,
                    pos,
                    discriminator,
                });
            }
            n += 1;
            true
        });
        out.into_boxed_slice()
    }

    /// The row at `probe` (at or after the checkpoint's address) of a
    /// sequence whose addresses never go down: the last row at or before
    /// `probe`, decoding from the checkpoint.
    fn find_from(&self, c: &Check, probe: u64) -> Row {
        let s = &c.st;
        let mut best = Row::new(s.address, s.file, s.line, s.column, c.discriminator);
        let _ = self.run_from(c.pos, c.st, |st, _| {
            if st.end_sequence || st.address > probe {
                return false;
            }
            best = Row::new(st.address, st.file, st.line, st.column, st.discriminator);
            true
        });
        best
    }

    /// The rows of the sequence decoded from `from`, up to its end.
    fn rows(&self, from: usize) -> Box<[Row]> {
        let mut rows = self.scratch.borrow_mut();
        rows.clear();
        // The whole program was run once without error: none here either.
        let _ = self.run(from, |st, _| {
            if st.end_sequence {
                return false;
            }
            let r = Row::new(st.address, st.file, st.line, st.column, st.discriminator);
            match rows.last_mut() {
                Some(last) if last.addr == r.addr => *last = r,
                _ => rows.push(r),
            }
            true
        });
        rows.as_slice().into()
    }

    #[inline]
    fn advance(&self, st: &mut State, operations: u64) -> Result<(), Stop> {
        if st.tombstone {
            return Ok(());
        }
        self.add(st, self.min_inst.wrapping_mul(operations))
    }

    #[inline]
    fn add(&self, st: &mut State, n: u64) -> Result<(), Stop> {
        let a = st.address.checked_add(n).ok_or(Stop::Bad)?;
        if a & !self.mask != 0 {
            return Err(Stop::Bad);
        }
        st.address = a;
        Ok(())
    }

    fn advance_line(st: &mut State, by: i64) {
        if by < 0 {
            let down = by.unsigned_abs();
            st.line = st.line.saturating_sub(down);
        } else {
            st.line = st.line.wrapping_add(by as u64);
        }
    }

    /// Runs the program from `from` with a fresh state, calling `emit`
    /// with each row (not the tombstoned ones) and the offset after its
    /// opcode, until the program ends or `emit` returns false.
    fn run(&self, from: usize, emit: impl FnMut(&State, usize) -> bool) -> Result<(), Stop> {
        self.run_from(from, State::new(), emit)
    }

    /// [`Program::run`] from a given state (a checkpoint's).
    fn run_from(
        &self,
        from: usize,
        mut st: State,
        mut emit: impl FnMut(&State, usize) -> bool,
    ) -> Result<(), Stop> {
        let mut r = Bytes {
            buf: self.bytes,
            pos: from,
        };
        while r.pos < r.buf.len() {
            let op = r.u8().ok_or(Stop::Bad)?;
            let row = if op >= self.opcode_base {
                let adjusted = op - self.opcode_base;
                Self::advance_line(
                    &mut st,
                    self.line_base + (adjusted % self.line_range) as i64,
                );
                self.advance(&mut st, (adjusted / self.line_range) as u64)?;
                true
            } else if op == 0 {
                let len = usize::try_from(r.uleb().ok_or(Stop::Bad)?).map_err(|_| Stop::Bad)?;
                let end = r.pos.checked_add(len).ok_or(Stop::Bad)?;
                let body = r.buf.get(r.pos..end).ok_or(Stop::Bad)?;
                r.pos = end;
                let mut b = Bytes { buf: body, pos: 0 };
                match b.u8().ok_or(Stop::Bad)? {
                    1 => {
                        st.end_sequence = true;
                        true
                    }
                    2 => {
                        let a = b
                            .uint(self.address_size as usize, self.big)
                            .ok_or(Stop::Bad)?;
                        st.tombstone = a < st.address || a >= self.min_tombstone;
                        if !st.tombstone {
                            st.address = a;
                        }
                        false
                    }
                    3 if self.version <= 4 => return Err(Stop::Unsupported),
                    4 => {
                        st.discriminator = b.uleb().ok_or(Stop::Bad)?;
                        false
                    }
                    _ => false,
                }
            } else {
                match op {
                    1 => true,
                    2 => {
                        let n = r.uleb().ok_or(Stop::Bad)?;
                        self.advance(&mut st, n)?;
                        false
                    }
                    3 => {
                        Self::advance_line(&mut st, r.sleb().ok_or(Stop::Bad)?);
                        false
                    }
                    4 => {
                        st.file = r.uleb().ok_or(Stop::Bad)?;
                        false
                    }
                    5 => {
                        st.column = r.uleb().ok_or(Stop::Bad)?;
                        false
                    }
                    6 | 7 | 10 | 11 => false,
                    8 => {
                        let adjusted = 255 - self.opcode_base;
                        self.advance(&mut st, (adjusted / self.line_range) as u64)?;
                        false
                    }
                    9 => {
                        let n = r.uint(2, self.big).ok_or(Stop::Bad)?;
                        if !st.tombstone {
                            self.add(&mut st, n)?;
                        }
                        false
                    }
                    12 => {
                        r.uleb().ok_or(Stop::Bad)?;
                        false
                    }
                    _ => {
                        let args = *self.std_lengths.get(op as usize - 1).ok_or(Stop::Bad)?;
                        for _ in 0..args {
                            r.uleb().ok_or(Stop::Bad)?;
                        }
                        false
                    }
                }
            };
            if !row {
                continue;
            }
            if !st.tombstone && !emit(&st, r.pos) {
                return Ok(());
            }
            if st.end_sequence {
                st = State::new();
            } else {
                st.discriminator = 0;
            }
        }
        Ok(())
    }
}
