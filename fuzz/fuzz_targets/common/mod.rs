//! Pieces the fuzz targets share.

use callstack::unwind::{Memory, ReadError};

/// Where the fuzz targets place their stack bytes.
pub const STACK_BASE: u64 = 0x7000_0000;

/// Fuzz input read as a stack at [`STACK_BASE`]; reads outside it fail.
pub struct Stack<'a>(pub &'a [u8]);

impl Memory for Stack<'_> {
    fn read_u64(&mut self, a: u64) -> Result<u64, ReadError> {
        let o = a.checked_sub(STACK_BASE).ok_or(ReadError::OutOfBounds(a))? as usize;
        self.0
            .get(o..o.checked_add(8).ok_or(ReadError::OutOfBounds(a))?)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .ok_or(ReadError::OutOfBounds(a))
    }
}
