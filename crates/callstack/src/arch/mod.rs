//! Architecture-specific pieces, one module per architecture.
//!
//! Each architecture module has the same shape:
//! - `FRAME_RECORD`: where the frame-pointer record keeps the caller's frame
//!   pointer and the return address (and how far below the frame pointer
//!   it starts: RISC-V's `s0` points just above it),
//! - `fast_entry` (only when compiled for that architecture): the naked entry
//!   of [`crate::capture_fast`], which builds an exact frame record of its own
//!   before handing over to the portable walk,
//! - `context` (only when compiled for that architecture): the registers of
//!   a signal handler's `ucontext_t`, as `user_regs_struct` words and as
//!   the unwinder's registers.
//!
//! The full list of an architecture's files, required and optional, is in
//! ARCHITECTURE.md ("How to add an architecture").
//!
//! The architecture modules are compiled on every host, because cores of
//! other architectures are unwound offline; only the in-process entries are
//! behind `cfg(target_arch)`. `native` names the host's module; `cfg(callstack_native)`
//! (set by the build script, the one list of in-process architectures) marks
//! the items outside `arch/` that exist only where it does.
//! A target without a module here compiles, and its captures return 0.

pub mod aarch64;
pub mod arm;
mod machine;
pub mod mips;
pub mod risc;
pub mod riscv64;
pub mod scan;
pub mod x86_64;

pub use machine::{prstatus_word, Machine, PrstatusError, Registers};
#[cfg(feature = "remote")]
pub use machine::{PrstatusLayout, MAX_REGS};

#[cfg(target_arch = "aarch64")]
pub use self::aarch64 as native;
#[cfg(target_arch = "riscv64")]
pub use self::riscv64 as native;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64 as native;

/// The host's architecture, when it has a module here (`native::MACHINE`).
#[cfg(callstack_native)]
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
pub const NATIVE_MACHINE: Option<Machine> = Some(native::MACHINE);
/// The host's architecture: none of the modules here.
#[cfg(not(callstack_native))]
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
pub const NATIVE_MACHINE: Option<Machine> = None;

/// The host's architecture (x86-64 on hosts without an in-process module,
/// so that the offline unwinder still compiles).
#[cfg(target_arch = "aarch64")]
pub type NativeArch = self::aarch64::Aarch64;
/// The host's architecture (x86-64 on hosts without an in-process module,
/// so that the offline unwinder still compiles).
#[cfg(target_arch = "riscv64")]
pub type NativeArch = self::riscv64::Riscv64;
/// The host's architecture (x86-64 on hosts without an in-process module,
/// so that the offline unwinder still compiles).
#[cfg(not(any(target_arch = "aarch64", target_arch = "riscv64")))]
pub type NativeArch = self::x86_64::X86_64;

/// The layout of the in-process rule cache (`unwind/local/cache.rs`), which
/// every architecture's hot loop (`native::exact::run_hot`) reads through a
/// pointer: [`CACHE_WORDS`](rule_cache::CACHE_WORDS) words
/// `key | packed rule << 48` in 2-way sets, then
/// [`WIDE_SLOTS`](rule_cache::WIDE_SLOTS) wide words, then the
/// architecture's `exact::PRED_SLOTS` `u16` predictions (none but on
/// x86-64).
#[cfg_attr(not(callstack_native), allow(dead_code))]
pub(crate) mod rule_cache {
    /// log2 of [`CACHE_WORDS`].
    pub(crate) const CACHE_BITS: u32 = 13;
    /// Words of the main array.
    pub(crate) const CACHE_WORDS: usize = 1 << CACHE_BITS;
    /// Slots of the wide-rule table after the main array; slot 0 is unused.
    pub(crate) const WIDE_SLOTS: usize = 512;
    /// The key bits of a cache word (the rule is in bits 48-63).
    pub(crate) const KEY_MASK: u64 = (1 << 48) - 1;

    /// The first (even) index of the 2-way set of `key` (a lookup address
    /// plus one: a return address is its own key).
    #[inline(always)]
    pub(crate) fn set(key: u64) -> usize {
        ((key ^ (key >> CACHE_BITS)) as usize) & (CACHE_WORDS - 2)
    }
}

/// Slots in the exit hooks' hash table (`unwind::hook_table`); a power of
/// two (the hash is masked with `SLOTS - 1`). Every architecture's
/// trampoline probes the same table with the same hash, in assembly and in
/// its CFI expression.
pub(crate) const SLOTS: usize = 1024;
/// Slots probed from a key's hash; the table has `SLOTS + PROBES` entries,
/// so a probe never wraps.
pub(crate) const PROBES: usize = 8;

/// The exit-hook table slot of a key (a hooked frame's CFA): the same hash
/// as the trampolines' assembly and CFI expressions.
#[inline(always)]
pub(crate) fn hash(key: u64) -> usize {
    (((key >> 4) ^ (key >> 14) ^ (key >> 24)) as usize) & (SLOTS - 1)
}

/// Where an exit-hook trampoline stopped at an exact pc keeps the original
/// return address, where its frame holds no record of it (see each
/// architecture's `exit_hook::window`).
// Each architecture's trampoline has some of these windows.
#[allow(dead_code)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HookWindow {
    /// Only in the hook table, under the key `sp` (the caller's `sp`).
    Table,
    /// At `sp - 8`, just below the stack pointer (the caller's `sp`).
    BelowSp,
    /// In the link register (the caller's `sp` is `sp`).
    Lr,
}

/// Layout of a frame-pointer record: the record starts `below` bytes under
/// the address the frame pointer holds (0 on x86-64 and AArch64, where the
/// frame pointer points at the record; 16 on RISC-V, where it points just
/// above it); the caller's frame pointer sits `fp_offset` bytes into the
/// record, the return address `ra_offset` bytes. The caller's stack pointer
/// is taken as the record's start plus 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRecordLayout {
    /// How far below the frame pointer the record starts.
    pub below: usize,
    /// Offset of the caller's frame pointer from the record's start.
    pub fp_offset: usize,
    /// Offset of the return address from the record's start.
    pub ra_offset: usize,
    /// Required alignment of a record (and of a frame pointer).
    pub align: usize,
}

/// What applying one unwind rule to a frame's registers gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The caller's registers. `signal` is true when the frame was a signal
    /// trampoline: the caller's pc is then an interrupted pc, looked up
    /// exactly, not a return address.
    Caller {
        /// The caller's registers.
        regs: crate::types::UnwindRegs,
        /// Whether the caller was interrupted by a signal.
        signal: bool,
    },
    /// The frame is the outermost one: its return address is undefined.
    End,
    /// There is no CFI for this address.
    NoCfi,
    /// The rule needs the CFI evaluated directly (a DWARF expression the
    /// compiled form does not cover).
    Evaluate,
}

/// What every architecture supplies to the generic unwinder: the register
/// numbers of DWARF, the compiled rule type and how to apply it, the
/// frame-pointer rule and the signal frame layout.
///
/// The architecture modules are compiled on every host, so an offline
/// unwinder (core files) may use any of them.
pub trait Arch: Copy + Default + core::fmt::Debug + Send + Sync + 'static {
    /// The compiled unwind rule of one address range: a small `Copy` value.
    type Rule: Copy + PartialEq + core::fmt::Debug + Send + Sync + 'static;
    /// A short name (`"x86_64"`).
    const NAME: &'static str;
    /// DWARF number of the stack pointer.
    const SP: u16;
    /// DWARF number of the frame pointer.
    const FP: u16;
    /// DWARF number of the return-address column.
    const RA: u16;
    /// The rule of an address without CFI.
    const NO_CFI: Self::Rule;
    /// The rule of a row that must be evaluated directly.
    const EVALUATE: Self::Rule;
    /// The rule of a signal trampoline (an FDE with the `S` augmentation).
    const SIGNAL_FRAME: Self::Rule;
    /// The rule at a function's first instruction, before it runs (the
    /// CIE's initial row): the frame as the call left it.
    const ENTRY: Self::Rule;
    /// The frame record of the frame-pointer fallback.
    const FRAME_RECORD: FrameRecordLayout;
    /// The vendor extensions this architecture's CFI may use, for gimli
    /// (AArch64's `DW_CFA_AARCH64_negate_ra_state`, written after each
    /// `paciasp`: without it gimli refuses the FDE).
    const CFI_VENDOR: gimli::Vendor = gimli::Vendor::Default;

    /// The value of DWARF register `reg` in `regs`, if tracked.
    fn reg(regs: &crate::types::UnwindRegs, reg: u16) -> Option<u64>;

    /// Compiles one CFI row into a rule, or [`Arch::EVALUATE`] when it
    /// does not fit. `signal` is whether the FDE's CIE has the `S`
    /// augmentation (a signal trampoline).
    fn compile_row(row: &crate::types::RowView<'_>, signal: bool) -> Self::Rule;

    /// Applies `rule` to `regs` (the registers of the frame whose rule it
    /// is), reading the stack through `mem`.
    fn apply<M: crate::types::Memory + ?Sized>(
        rule: Self::Rule,
        regs: &crate::types::UnwindRegs,
        mem: &mut M,
    ) -> Result<Applied, crate::types::UnwindError>;

    /// Where the frame whose rule is `rule` (its registers `regs`) saved
    /// its return address: `(its CFA, the address of the slot)`, or `None`
    /// when it is still in a register (a leaf, a prologue) or the rule does
    /// not say. Exit hooks patch that slot; architectures whose return
    /// address always sits under the caller's stack pointer need no rule
    /// for it and keep this default.
    fn saved_ra(rule: Self::Rule, regs: &crate::types::UnwindRegs) -> Option<(u64, u64)> {
        let _ = (rule, regs);
        None
    }

    /// Packs `rule` into 16 bits for the in-process rule cache, or 0 when it
    /// does not fit (it is then looked up in the table each time).
    fn pack(rule: Self::Rule) -> u16;

    /// The rule [`Arch::pack`] packed.
    fn unpack(packed: u16) -> Self::Rule;

    /// The registers saved by the kernel in a signal frame, when the
    /// trampoline's frame has stack pointer `sp`.
    fn signal_frame<M: crate::types::Memory + ?Sized>(
        sp: u64,
        mem: &mut M,
    ) -> Result<crate::types::UnwindRegs, crate::types::UnwindError>;

    /// Whether the stack at `sp` holds a signal frame, judged by the frame
    /// alone (its layout has marks no other frame has): for a handler's
    /// return address that lies in no code the walk can read (qemu-user's
    /// trampoline page, seen from the process itself). `false` where the
    /// layout has nothing distinctive.
    fn looks_like_signal_frame<M: crate::types::Memory + ?Sized>(sp: u64, mem: &mut M) -> bool {
        let _ = (sp, mem);
        false
    }
}
