//! Reading the memory of the stack being unwound: one trait, three sources.
//!
//! The unwinder never dereferences a pointer itself. It asks a [`Memory`] for
//! each word, and whoever owns the memory answers: this process (bounded by
//! the thread's stack), a core file (its `PT_LOAD` segments), or another
//! process (`process_vm_readv`). A read that cannot be answered is an error
//! that ends the walk, never a fault.

/// Why a read of unwound memory failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// The address is outside every range this source may read.
    OutOfBounds(u64),
    /// The source could not read the address (an I/O error, a hole in a core).
    Unreadable(u64),
}

impl core::fmt::Display for ReadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ReadError::OutOfBounds(a) => write!(f, "address {a:#x} is outside the readable stack"),
            ReadError::Unreadable(a) => write!(f, "could not read memory at {a:#x}"),
        }
    }
}

/// A source of memory for the unwinder.
///
/// Implementations for the current process must be async-signal-safe and
/// must not allocate.
pub trait Memory {
    /// Reads the little-endian 64-bit word at `addr`.
    fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError>;

    /// Reads the little-endian 32-bit word at `addr` (for 32-bit targets).
    fn read_u32(&mut self, addr: u64) -> Result<u32, ReadError> {
        let aligned = addr & !7;
        let word = self.read_u64(aligned)?;
        Ok((word >> ((addr - aligned) * 8)) as u32)
    }

    /// Tells the source that the walk has moved to another stack at `sp`
    /// (after a signal frame: from an alternate signal stack back to the
    /// thread's stack). A source bounded by stacks looks up the new stack's
    /// bounds; the default does nothing.
    fn note_stack(&mut self, sp: u64) {
        let _ = sp;
    }
}
