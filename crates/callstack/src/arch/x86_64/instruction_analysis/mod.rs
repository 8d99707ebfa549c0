//! x86-64 instruction analysis: where is the return address of a frame that
//! has neither CFI nor a frame pointer?
//!
//! One small symbolic executor serves two questions:
//! - [`epilogue::analyze`]: from the pc, follow the code *forward* to the
//!   function's `ret`; the stack pointer there, as an offset from the stack
//!   pointer (or frame pointer) at the pc, locates the return address. This
//!   needs no knowledge of where the function starts, which on x86 cannot be
//!   found by scanning backwards (variable-length instructions).
//! - [`prologue::analyze`]: from a known function start (a symbol, or the
//!   target of the call that made the frame), follow the code to the pc; the
//!   stack pointer there, relative to the one at entry, gives the same rule,
//!   and works for functions that never return (`abort`-like paths).
//!
//! The executor tracks each of the 16 general registers as a symbolic value
//! (`sp_at_pc + k`, `fp_at_pc + k`, a load from such an address, or unknown)
//! and up to [`MAX_STORES`] stack slots written on the way (`push`, `mov
//! [rsp+k], reg`), through `push`/`pop`, `add`/`sub`/`lea`/`mov` on registers,
//! `leave`, `enter`, `and rsp, -N` (realignment: `rsp` unknown until restored
//! from a register), calls (stepped over; caller-saved registers become
//! unknown), unconditional jumps (followed, tail calls included), indirect
//! jumps (a tail call: taken as a candidate result) and conditional jumps (a
//! bounded depth-first search of both paths with a visited set against loops).
//!
//! State is fixed-size and the instruction count bounded ([`MAX_INSNS`]): no
//! allocation, safe in a signal handler.

pub mod epilogue;
pub mod prologue;
pub mod unwinder;

use crate::types::{Base, CodeMemory};
use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register,
};

/// Most instructions decoded for one question, over all paths.
pub const MAX_INSNS: usize = 2000;
/// Most stack slots remembered per path.
pub const MAX_STORES: usize = 16;
/// Most pending branch paths.
pub const MAX_PENDING: usize = 12;
/// Size of the visited-address set (loop and re-merge detection).
const VISITED: usize = 256;

const RSP: usize = 4;
const RBP: usize = 5;

/// What a symbolic value is relative to: the stack pointer or frame pointer
/// at the pc, or `Tmp`, an unknown base set by `and rsp, -N` (stack
/// realignment) so that the realigned frame's own pushes and loads can still
/// be tracked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SB {
    Sp,
    Fp,
    Tmp,
}

impl SB {
    /// The public base, `None` for `Tmp`.
    pub fn base(self) -> Option<Base> {
        match self {
            SB::Sp => Some(Base::Sp),
            SB::Fp => Some(Base::Fp),
            SB::Tmp => None,
        }
    }
}

/// A symbolic 64-bit value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Val {
    Unknown,
    /// `base + off`.
    Rel(SB, i32),
    /// The word loaded from `base + off`.
    Load(SB, i32),
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct State {
    pub regs: [Val; 16],
    stores: [(SB, i32, Val); MAX_STORES],
    nstores: u8,
    /// Per base (`Sp`, `Fp`, `Tmp`), the byte range `[lo, hi)` covering
    /// every slot this path wrote and then forgot for want of room: a load
    /// from it is unknown, never the word that was there at the pc (the
    /// path overwrote it). Empty when `lo >= hi`.
    lost: [(i32, i32); 3],
}

impl State {
    /// Registers as found at the pc: rsp = Sp+0, rbp = Fp+0, the rest unknown.
    pub fn at_pc() -> State {
        let mut regs = [Val::Unknown; 16];
        regs[RSP] = Val::Rel(SB::Sp, 0);
        regs[RBP] = Val::Rel(SB::Fp, 0);
        State {
            regs,
            stores: [(SB::Sp, 0, Val::Unknown); MAX_STORES],
            nstores: 0,
            lost: [(0, 0); 3],
        }
    }

    /// Whether the 8 bytes at `b + off` overlap a forgotten slot.
    fn is_lost(&self, b: SB, off: i32) -> bool {
        let (lo, hi) = self.lost[b as usize];
        lo < hi && off < hi && off.saturating_add(8) > lo
    }

    /// Forgets stored slot `i`, remembering that its bytes were written.
    fn evict(&mut self, i: usize) {
        let (b, off, _) = self.stores[i];
        let r = &mut self.lost[b as usize];
        let end = off.saturating_add(8);
        *r = if r.0 < r.1 {
            (r.0.min(off), r.1.max(end))
        } else {
            (off, end)
        };
        self.remove(i);
    }

    /// Removes stored slot `i`, keeping the others in order.
    fn remove(&mut self, i: usize) {
        self.stores.copy_within(i + 1..self.nstores as usize, i);
        self.nstores -= 1;
    }

    fn store(&mut self, addr: Val, v: Val) {
        let Val::Rel(b, off) = addr else { return };
        // Drop overlapping slots (in order: the order is the slots' age).
        // One overwritten in part is lost: its other bytes changed too.
        let mut i = 0;
        while i < self.nstores as usize {
            let (sb, so, _) = self.stores[i];
            if sb == b && so == off {
                self.remove(i);
            } else if sb == b && so.abs_diff(off) < 8 {
                self.evict(i);
            } else {
                i += 1;
            }
        }
        if self.nstores as usize == MAX_STORES {
            // Full: forget the oldest slot holding an unknown value (a
            // spill of some computed value), else the newest copy of a
            // value another slot also holds (debug code spills its
            // arguments two or three times), else the newest slot. The
            // oldest slots are the prologue's pushes (the caller's rbp and
            // callee-saved registers) that the epilogue pops: what the
            // analysis needs, kept as long as possible. Whatever is
            // forgotten reads as unknown from then on (`lost`).
            let stores = &self.stores[..MAX_STORES];
            let victim = stores
                .iter()
                .position(|s| matches!(s.2, Val::Unknown | Val::Load(..)))
                .or_else(|| {
                    (1..MAX_STORES)
                        .rev()
                        .find(|&i| stores[..i].iter().any(|s| s.2 == stores[i].2))
                })
                .unwrap_or(MAX_STORES - 1);
            self.evict(victim);
        }
        self.stores[self.nstores as usize] = (b, off, v);
        self.nstores += 1;
    }

    /// Drops every value relative to `b` (a base being redefined).
    fn forget(&mut self, b: SB) {
        self.lost[b as usize] = (0, 0);
        for r in self.regs.iter_mut() {
            if matches!(*r, Val::Rel(x, _) | Val::Load(x, _) if x == b) {
                *r = Val::Unknown;
            }
        }
        let mut i = 0;
        while i < self.nstores as usize {
            if self.stores[i].0 == b {
                self.remove(i);
            } else {
                i += 1;
            }
        }
    }

    fn load(&self, addr: Val) -> Val {
        let Val::Rel(b, off) = addr else {
            return Val::Unknown;
        };
        for &(sb, so, v) in &self.stores[..self.nstores as usize] {
            if sb == b && so == off {
                return v;
            }
        }
        if self.is_lost(b, off) {
            return Val::Unknown;
        }
        Val::Load(b, off)
    }

    /// Where, if anywhere, the value `v` was stored.
    pub fn find_store(&self, v: Val) -> Option<(SB, i32)> {
        self.stores[..self.nstores as usize]
            .iter()
            .rev()
            .find(|s| s.2 == v)
            .map(|s| (s.0, s.1))
    }
}

fn add(v: Val, k: i64) -> Val {
    match v {
        Val::Rel(b, o) => match (o as i64).checked_add(k).map(i32::try_from) {
            Some(Ok(n)) => Val::Rel(b, n),
            _ => Val::Unknown,
        },
        _ => Val::Unknown,
    }
}

/// Index 0..16 of a 64-bit general register (full register of any width).
fn gpr(r: Register) -> Option<usize> {
    if r == Register::None {
        return None;
    }
    let f = r.full_register();
    if f.is_gpr64() {
        Some(f as usize - Register::RAX as usize)
    } else {
        None
    }
}

/// Whether a write to `r` (any width) replaces the whole 64-bit register
/// with a value we can model (a 64-bit write).
fn is_64(r: Register) -> bool {
    r.is_gpr64()
}

/// The address `[base + disp]` as a symbolic value (no index register).
fn mem_addr(st: &State, ins: &Instruction) -> Val {
    if ins.memory_index() != Register::None {
        return Val::Unknown;
    }
    match gpr(ins.memory_base()) {
        Some(b) if is_64(ins.memory_base()) => add(st.regs[b], ins.memory_displacement64() as i64),
        _ => Val::Unknown,
    }
}

fn mem_operand_index(ins: &Instruction) -> Option<u32> {
    (0..ins.op_count()).find(|&i| ins.op_kind(i) == OpKind::Memory)
}

fn clobber_caller_saved(st: &mut State) {
    // rax, rcx, rdx, rsi, rdi, r8-r11
    for r in [0usize, 1, 2, 6, 7, 8, 9, 10, 11] {
        st.regs[r] = Val::Unknown;
    }
}

/// What one instruction's execution did to the path.
pub(crate) enum Step {
    /// Go on at the next instruction.
    Next,
    /// Continue at this address (a direct jump).
    Jump(u64),
    /// A conditional branch: both the target and the next instruction.
    Branch(u64),
    /// A `ret` (with its immediate).
    Return(u16),
    /// An indirect jump: a tail call when the stack is at the entry state.
    IndirectJump,
    /// This path cannot be followed (invalid code, trap, lost stack pointer).
    DeadEnd,
}

/// Executes `ins` symbolically on `st`.
pub(crate) fn step(st: &mut State, ins: &Instruction) -> Step {
    if ins.is_invalid() {
        return Step::DeadEnd;
    }
    match ins.flow_control() {
        FlowControl::Return => {
            let imm = if ins.op_count() == 1 {
                ins.immediate16()
            } else {
                0
            };
            return Step::Return(imm);
        }
        FlowControl::UnconditionalBranch => {
            if ins.op0_kind() == OpKind::NearBranch64 {
                return Step::Jump(ins.near_branch_target());
            }
            return Step::DeadEnd;
        }
        FlowControl::IndirectBranch => return Step::IndirectJump,
        FlowControl::ConditionalBranch => {
            if matches!(ins.op0_kind(), OpKind::NearBranch64) {
                return Step::Branch(ins.near_branch_target());
            }
            return Step::DeadEnd;
        }
        FlowControl::Call | FlowControl::IndirectCall => {
            clobber_caller_saved(st);
            return Step::Next;
        }
        FlowControl::Interrupt | FlowControl::Exception => return Step::DeadEnd,
        FlowControl::Next | FlowControl::XbeginXabortXend => {}
    }
    if ins.code() == Code::Hlt {
        return Step::DeadEnd;
    }
    let r0 = if ins.op_count() > 0 && ins.op0_kind() == OpKind::Register {
        Some(ins.op0_register())
    } else {
        None
    };
    let sp = st.regs[RSP];
    match ins.mnemonic() {
        Mnemonic::Push => {
            let inc = ins.stack_pointer_increment() as i64;
            let v = match r0 {
                Some(r) if is_64(r) => st.regs[gpr(r).unwrap_or(0)],
                _ => Val::Unknown,
            };
            let nsp = add(sp, inc);
            st.regs[RSP] = nsp;
            st.store(nsp, v);
            return Step::Next;
        }
        Mnemonic::Pop => {
            let inc = ins.stack_pointer_increment() as i64;
            let v = st.load(sp);
            st.regs[RSP] = add(sp, inc);
            if let Some(r) = r0 {
                if let Some(i) = gpr(r) {
                    st.regs[i] = if is_64(r) { v } else { Val::Unknown };
                }
            }
            if st.regs[RSP] == Val::Unknown {
                return Step::DeadEnd;
            }
            return Step::Next;
        }
        Mnemonic::Leave => {
            let bp = st.regs[RBP];
            st.regs[RBP] = st.load(bp);
            st.regs[RSP] = add(bp, 8);
            return Step::Next;
        }
        Mnemonic::Enter => {
            let nsp = add(sp, -8);
            st.store(nsp, st.regs[RBP]);
            st.regs[RBP] = nsp;
            st.regs[RSP] = add(nsp, -(ins.immediate16() as i64));
            return Step::Next;
        }
        _ => {}
    }
    let Some(dst_reg) = r0 else {
        // A memory destination (or none).
        match ins.mnemonic() {
            Mnemonic::Mov if ins.op_count() == 2 && ins.op0_kind() == OpKind::Memory => {
                let a = mem_addr(st, ins);
                let v = if ins.op1_kind() == OpKind::Register && is_64(ins.op1_register()) {
                    gpr(ins.op1_register())
                        .map(|i| st.regs[i])
                        .unwrap_or(Val::Unknown)
                } else {
                    Val::Unknown
                };
                st.store(a, v);
            }
            _ => {
                if mem_operand_index(ins) == Some(0) && !read_only(ins.mnemonic()) {
                    let a = mem_addr(st, ins);
                    st.store(a, Val::Unknown);
                }
                implicit(st, ins);
            }
        }
        apply_sp_increment(st, ins);
        return if st.regs[RSP] == Val::Unknown {
            Step::DeadEnd
        } else {
            Step::Next
        };
    };
    let Some(d) = gpr(dst_reg) else {
        implicit(st, ins);
        apply_sp_increment(st, ins);
        return Step::Next;
    };
    let full = is_64(dst_reg);
    let src_reg = |st: &State| -> Option<Val> {
        if ins.op_count() >= 2 && ins.op1_kind() == OpKind::Register {
            let r = ins.op1_register();
            if is_64(r) {
                return gpr(r).map(|i| st.regs[i]);
            }
        }
        None
    };
    let imm1 = || -> Option<i64> {
        if ins.op_count() >= 2 {
            match ins.op1_kind() {
                OpKind::Immediate8to64
                | OpKind::Immediate32to64
                | OpKind::Immediate8
                | OpKind::Immediate32 => Some(ins.immediate(1) as i64),
                _ => None,
            }
        } else {
            None
        }
    };
    let new = match ins.mnemonic() {
        _ if read_only(ins.mnemonic()) => st.regs[d],
        Mnemonic::Mov if full => match ins.op1_kind() {
            OpKind::Register => src_reg(st).unwrap_or(Val::Unknown),
            OpKind::Memory => st.load(mem_addr(st, ins)),
            _ => Val::Unknown,
        },
        Mnemonic::Lea if full => mem_addr(st, ins),
        Mnemonic::Add if full => match imm1() {
            Some(k) => add(st.regs[d], k),
            None => Val::Unknown,
        },
        Mnemonic::Sub if full => match imm1() {
            Some(k) => add(st.regs[d], -k),
            None => Val::Unknown,
        },
        Mnemonic::And if d == RSP && imm1().is_some_and(|k| k < 0 && (-k) as u64 <= 4096) => {
            // Stack realignment: a fresh base the rest of the path is
            // relative to, until rsp is restored from a saved register.
            st.forget(SB::Tmp);
            Val::Rel(SB::Tmp, 0)
        }
        Mnemonic::Xchg if full && ins.op1_kind() == OpKind::Register => {
            if let Some(s) = gpr(ins.op1_register()) {
                let v = st.regs[s];
                st.regs[s] = st.regs[d];
                v
            } else {
                Val::Unknown
            }
        }
        _ => Val::Unknown,
    };
    st.regs[d] = new;
    implicit(st, ins);
    if d != RSP {
        apply_sp_increment(st, ins);
    }
    if st.regs[RSP] == Val::Unknown && d != RSP {
        return Step::DeadEnd;
    }
    Step::Next
}

/// An `rsp` change the operands do not show (`pushfq`, `popfq`, ...).
fn apply_sp_increment(st: &mut State, ins: &Instruction) {
    let inc = ins.stack_pointer_increment();
    if inc != 0 {
        st.regs[RSP] = add(st.regs[RSP], inc as i64);
    }
}

/// Mnemonics whose first register operand is only read.
fn read_only(m: Mnemonic) -> bool {
    matches!(
        m,
        Mnemonic::Cmp
            | Mnemonic::Test
            | Mnemonic::Bt
            | Mnemonic::Nop
            | Mnemonic::Prefetchnta
            | Mnemonic::Prefetcht0
            | Mnemonic::Prefetcht1
            | Mnemonic::Prefetcht2
            | Mnemonic::Prefetchw
            | Mnemonic::Clflush
            | Mnemonic::Clflushopt
            | Mnemonic::Endbr64
            | Mnemonic::Ptwrite
            | Mnemonic::Wrfsbase
            | Mnemonic::Wrgsbase
            | Mnemonic::Out
            | Mnemonic::Outsb
            | Mnemonic::Outsw
            | Mnemonic::Outsd
    )
}

/// Registers written without being named as the first operand.
fn implicit(st: &mut State, ins: &Instruction) {
    use Mnemonic as M;
    match ins.mnemonic() {
        M::Mul
        | M::Div
        | M::Idiv
        | M::Cqo
        | M::Cdq
        | M::Cwd
        | M::Cdqe
        | M::Cwde
        | M::Cbw
        | M::Mulx => {
            st.regs[0] = Val::Unknown;
            st.regs[2] = Val::Unknown;
        }
        M::Imul if ins.op_count() == 1 => {
            st.regs[0] = Val::Unknown;
            st.regs[2] = Val::Unknown;
        }
        M::Cpuid
        | M::Rdtsc
        | M::Rdtscp
        | M::Syscall
        | M::Xgetbv
        | M::Rdpmc
        | M::Lodsb
        | M::Lodsw
        | M::Lodsd
        | M::Lodsq
        | M::Stosb
        | M::Stosw
        | M::Stosd
        | M::Stosq
        | M::Movsb
        | M::Movsw
        | M::Movsd
        | M::Movsq
        | M::Cmpsb
        | M::Cmpsw
        | M::Cmpsd
        | M::Cmpsq
        | M::Scasb
        | M::Scasw
        | M::Scasd
        | M::Scasq
        | M::Cmpxchg
        | M::Cmpxchg8b
        | M::Cmpxchg16b
        | M::Loop
        | M::Loope
        | M::Loopne
        | M::Xlatb => {
            for r in [0usize, 1, 2, 3, 6, 7, 11] {
                st.regs[r] = Val::Unknown;
            }
        }
        M::Xadd | M::Xchg if ins.op_count() == 2 && ins.op1_kind() == OpKind::Register => {
            if let Some(i) = gpr(ins.op1_register()) {
                if i != RSP && ins.op0_kind() != OpKind::Register {
                    st.regs[i] = Val::Unknown;
                }
            }
        }
        _ => {}
    }
}

/// Reads and decodes the instruction at `ip`.
pub(crate) fn decode_at<C: CodeMemory + ?Sized>(
    code: &mut C,
    ip: u64,
    out: &mut Instruction,
) -> bool {
    let mut buf = [0u8; 15];
    let n = code.read_code(ip, &mut buf);
    if n == 0 {
        return false;
    }
    let mut dec = Decoder::with_ip(64, &buf[..n], ip, DecoderOptions::NONE);
    dec.decode_out(out);
    !out.is_invalid()
}

/// A small open-addressing set of addresses, for loop detection.
pub(crate) struct Visited {
    slots: [u64; VISITED],
    len: usize,
}

impl Visited {
    pub fn new() -> Self {
        Visited {
            slots: [0; VISITED],
            len: 0,
        }
    }

    /// Inserts `a`; returns false if it was there already, or if the set is
    /// full (which ends the search as if looping).
    pub fn insert(&mut self, a: u64) -> bool {
        if self.len >= VISITED * 3 / 4 {
            return false;
        }
        let mut h = (a.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % VISITED;
        loop {
            if self.slots[h] == a.wrapping_add(1) {
                return false;
            }
            if self.slots[h] == 0 {
                self.slots[h] = a.wrapping_add(1);
                self.len += 1;
                return true;
            }
            h = (h + 1) % VISITED;
        }
    }
}

/// What a search stops on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Goal {
    /// Stop at each `ret` (and each indirect jump, as a tail call).
    Return,
    /// Stop on reaching this address.
    Reach(u64),
}

/// An end point reached by the search, with the state there.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub state: State,
    pub ret_pop: u16,
    /// Reached through an indirect jump (a tail call), not a `ret`.
    pub tail: bool,
}

/// Depth-first search from `start` with state `st0`, calling `found` at each
/// end point until it returns false. `bounds` limits fall-through and
/// conditional branches to the function (direct jumps out of it are
/// followed as tail calls, with bounds dropped).
pub(crate) fn search<C: CodeMemory + ?Sized>(
    code: &mut C,
    start: u64,
    st0: State,
    goal: Goal,
    bounds: Option<(u64, u64)>,
    mut found: impl FnMut(Found) -> bool,
) {
    // (address, state there, bounds of the function being followed)
    type Pending = (u64, State, Option<(u64, u64)>);
    let mut pending: [Pending; MAX_PENDING] = [(0, st0, None); MAX_PENDING];
    let mut npending = 1usize;
    pending[0] = (start, st0, bounds);
    let mut visited = Visited::new();
    let mut budget = MAX_INSNS;
    let mut ins = Instruction::default();
    'paths: while npending > 0 {
        npending -= 1;
        let (mut ip, mut st, mut bounds) = pending[npending];
        loop {
            if budget == 0 {
                return;
            }
            budget -= 1;
            if let Goal::Reach(t) = goal {
                if ip == t {
                    if !found(Found {
                        state: st,
                        ret_pop: 0,
                        tail: false,
                    }) {
                        return;
                    }
                    continue 'paths;
                }
            }
            if let Some((lo, hi)) = bounds {
                if ip < lo || ip >= hi {
                    continue 'paths;
                }
            }
            if !decode_at(code, ip, &mut ins) {
                continue 'paths;
            }
            match step(&mut st, &ins) {
                Step::Next => ip = ins.next_ip(),
                Step::Jump(t) => {
                    if !visited.insert(t) {
                        continue 'paths;
                    }
                    if let Some((lo, hi)) = bounds {
                        if t < lo || t >= hi {
                            if goal != Goal::Return {
                                continue 'paths;
                            }
                            bounds = None; // a tail call into another function
                        }
                    }
                    ip = t;
                }
                Step::Branch(t) => {
                    let inside = bounds.is_none_or(|(lo, hi)| lo <= t && t < hi);
                    if inside && npending < MAX_PENDING && visited.insert(t) {
                        pending[npending] = (t, st, bounds);
                        npending += 1;
                    }
                    let n = ins.next_ip();
                    if !visited.insert(n) {
                        continue 'paths;
                    }
                    ip = n;
                }
                Step::Return(pop) => {
                    if goal == Goal::Return
                        && !found(Found {
                            state: st,
                            ret_pop: pop,
                            tail: false,
                        })
                    {
                        return;
                    }
                    continue 'paths;
                }
                Step::IndirectJump => {
                    if goal == Goal::Return
                        && !found(Found {
                            state: st,
                            ret_pop: 0,
                            tail: true,
                        })
                    {
                        return;
                    }
                    continue 'paths;
                }
                Step::DeadEnd => continue 'paths,
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    use crate::types::SliceCode;

    /// Code at 0x1000 for the tests.
    pub fn code(bytes: &[u8]) -> SliceCode<'_> {
        SliceCode::new(0x1000, bytes)
    }
}
