//! A code object's line table: instruction offset to source line, in each
//! format CPython has used.
//!
//! - before 3.10, `co_lnotab`: pairs (bytecode increment, line increment),
//!   the line increment signed from 3.6;
//! - 3.10, `co_linetable`: pairs (bytecode range length, line delta), a delta
//!   of -128 meaning "no line";
//! - 3.11 and later, the location table: entries of a header byte (bit 7
//!   set; a 4-bit code and the entry's length in code units) and varints.
//!
//! Every decoder stops at the end of the table: bad input gives `None`,
//! never a panic.

/// Which line table format a code object's table is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `co_lnotab` (before 3.10); offsets in bytes.
    Lnotab,
    /// 3.10's `co_linetable`; offsets in bytes.
    Linetable310,
    /// The location table of 3.11+; offsets in code units (2 bytes).
    Locations,
}

impl Format {
    /// The format of CPython `major.minor`'s tables.
    pub fn for_version(version: (u8, u8)) -> Format {
        if version >= (3, 11) {
            Format::Locations
        } else if version >= (3, 10) {
            Format::Linetable310
        } else {
            Format::Lnotab
        }
    }
}

/// The line of the instruction at `offset` (bytes before 3.11, code units
/// from 3.11, as [`Format`] says) of a code object whose first line is
/// `first_line` and whose table is `table`. `None` when the instruction
/// has no line or the table does not cover it.
pub fn line_for(format: Format, table: &[u8], first_line: i64, offset: i64) -> Option<u32> {
    let line = match format {
        Format::Lnotab => lnotab(table, first_line, offset),
        Format::Linetable310 => linetable_310(table, first_line, offset),
        Format::Locations => locations(table, first_line, offset),
    }?;
    u32::try_from(line).ok().filter(|&l| l > 0)
}

fn lnotab(table: &[u8], first_line: i64, offset: i64) -> Option<i64> {
    let mut line = first_line;
    let mut addr: i64 = 0;
    for pair in table.chunks_exact(2) {
        addr += i64::from(pair[0]);
        if addr > offset {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    Some(line)
}

fn linetable_310(table: &[u8], first_line: i64, offset: i64) -> Option<i64> {
    // A frame not started yet (`f_lasti` -1): the first line, as CPython says.
    if offset < 0 {
        return Some(first_line);
    }
    let mut line = first_line;
    let mut start: i64 = 0;
    for pair in table.chunks_exact(2) {
        let end = start + i64::from(pair[0]);
        let delta = pair[1] as i8;
        let has_line = delta != -128;
        if has_line {
            line += i64::from(delta);
        }
        if start <= offset && offset < end {
            return has_line.then_some(line);
        }
        start = end;
    }
    None
}

/// Reads the location table's unsigned varint (6 bits a byte, bit 6 says
/// more follow).
fn varint(table: &[u8], at: &mut usize) -> Option<u64> {
    let mut value: u64 = 0;
    let mut shift = 0u32;
    loop {
        let b = *table.get(*at)?;
        *at += 1;
        if shift < 64 {
            value |= u64::from(b & 63) << shift;
        }
        shift += 6;
        if b & 64 == 0 {
            return Some(value);
        }
    }
}

fn svarint(table: &[u8], at: &mut usize) -> Option<i64> {
    let u = varint(table, at)?;
    let magnitude = (u >> 1) as i64;
    Some(if u & 1 != 0 { -magnitude } else { magnitude })
}

fn locations(table: &[u8], first_line: i64, offset: i64) -> Option<i64> {
    // An instruction before the first (a frame not started yet) is on the
    // first line, as CPython's `PyCode_Addr2Line` says.
    if offset < 0 {
        return Some(first_line);
    }
    let mut line = first_line;
    let mut start: i64 = 0;
    let mut at = 0usize;
    while at < table.len() {
        let head = table[at];
        at += 1;
        if head & 0x80 == 0 {
            // Not an entry's first byte: the table is not what it should be.
            return None;
        }
        let code = (head >> 3) & 15;
        let len = i64::from(head & 7) + 1;
        let has_line = match code {
            15 => false,
            14 => {
                line = line.checked_add(svarint(table, &mut at)?)?;
                // End line, start and end columns.
                for _ in 0..3 {
                    varint(table, &mut at)?;
                }
                true
            }
            13 => {
                line = line.checked_add(svarint(table, &mut at)?)?;
                true
            }
            10..=12 => {
                line += i64::from(code - 10);
                at += 2;
                true
            }
            _ => {
                at += 1;
                true
            }
        };
        let end = start + len;
        if start <= offset && offset < end {
            return has_line.then_some(line);
        }
        start = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_table_forms() {
        // Entry 1: no-column form (13), 2 units, line +3.
        // Entry 2: one-line form (11: line +1), 1 unit, two column bytes.
        // Entry 3: no location (15), 1 unit.
        // Entry 4: long form (14), 1 unit, line -2, then three varints.
        // Entry 5: short form (code 0), 1 unit, one column byte.
        let t = [
            0x80 | (13 << 3) | 1,
            6,
            0x80 | (11 << 3),
            5,
            9,
            0x80 | (15 << 3),
            0x80 | (14 << 3),
            5,
            0,
            1,
            2,
            0x80,
            4,
        ];
        let f = Format::Locations;
        assert_eq!(line_for(f, &t, 10, 0), Some(13));
        assert_eq!(line_for(f, &t, 10, 1), Some(13));
        assert_eq!(line_for(f, &t, 10, 2), Some(14));
        assert_eq!(line_for(f, &t, 10, 3), None);
        assert_eq!(line_for(f, &t, 10, 4), Some(12));
        assert_eq!(line_for(f, &t, 10, 5), Some(12));
        assert_eq!(line_for(f, &t, 10, 6), None);
        assert_eq!(line_for(f, &t, 10, -1), Some(10));
    }

    #[test]
    fn older_tables() {
        // co_lnotab: 6 bytes on the first line, then +1 line, 4 bytes, +2 lines.
        let t = [6, 1, 4, 2];
        assert_eq!(line_for(Format::Lnotab, &t, 5, 0), Some(5));
        assert_eq!(line_for(Format::Lnotab, &t, 5, 6), Some(6));
        assert_eq!(line_for(Format::Lnotab, &t, 5, 10), Some(8));
        // 3.10: [0, 6) line +0, [6, 10) no line, [10, 14) line +2.
        let t = [6, 0, 4, 0x80, 4, 2];
        let f = Format::Linetable310;
        assert_eq!(line_for(f, &t, 5, 2), Some(5));
        assert_eq!(line_for(f, &t, 5, 7), None);
        assert_eq!(line_for(f, &t, 5, 12), Some(7));
        assert_eq!(line_for(f, &t, 5, 14), None);
    }

    #[test]
    fn truncated_tables_give_none() {
        let f = Format::Locations;
        assert_eq!(line_for(f, &[0x80 | (14 << 3)], 1, 0), None);
        assert_eq!(line_for(f, &[0x80 | (13 << 3), 0x40], 1, 0), None);
        assert_eq!(line_for(f, &[0x01], 1, 0), None);
    }
}
