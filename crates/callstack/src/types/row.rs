//! One CFI row as the architectures read it ([`RowView`]): the CFA rule and
//! the register rules, independent of the CFI parser that produced it.

/// A register rule of a CFI row, independent of gimli's reader type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleView<'a> {
    /// Not recoverable (for the return address: the outermost frame).
    Undefined,
    /// Unchanged in the caller.
    SameValue,
    /// Saved at `CFA + n`.
    Offset(i64),
    /// The value is `CFA + n`.
    ValOffset(i64),
    /// Saved in another register.
    Register(u16),
    /// Saved at the address a DWARF expression computes (CFA pushed first).
    Expression(&'a [u8]),
    /// The value a DWARF expression computes (CFA pushed first).
    ValExpression(&'a [u8]),
    /// A constant value.
    Constant(u64),
    /// An architectural rule the unwinder does not know.
    Other,
}

/// The CFA rule of a CFI row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CfaView<'a> {
    /// `CFA = reg + offset`.
    RegOffset(u16, i64),
    /// `CFA` is the value of a DWARF expression.
    Expression(&'a [u8]),
}

/// The most register rules a row holds: an AArch64 function that keeps
/// values in every callee-saved register saves 20 (x19-x30, d8-d15), an
/// x86-64 one 7.
pub(crate) const MAX_VIEW_REGS: usize = 24;

/// One CFI row: the CFA rule and the register rules, with expressions as
/// byte slices of the section.
#[derive(Clone, Copy, Debug)]
pub struct RowView<'a> {
    /// How to compute the CFA.
    pub cfa: CfaView<'a>,
    regs: [(u16, RuleView<'a>); MAX_VIEW_REGS],
    n: usize,
    ra: u16,
}

impl<'a> RowView<'a> {
    /// Builds a view from explicit parts (tests, other row sources).
    pub fn new(cfa: CfaView<'a>, ra_register: u16, regs: &[(u16, RuleView<'a>)]) -> Self {
        let mut v = RowView {
            cfa,
            regs: [(0, RuleView::Other); MAX_VIEW_REGS],
            n: 0,
            ra: ra_register,
        };
        for &(r, rule) in regs.iter().take(MAX_VIEW_REGS) {
            v.regs[v.n] = (r, rule);
            v.n += 1;
        }
        v
    }

    /// Builds a view of `n` (at most [`MAX_VIEW_REGS`]) rules given by `rule(i)`, without
    /// an intermediate array (the cold capture's `cfi_fast` rows).
    #[inline]
    pub(crate) fn from_fn(
        cfa: CfaView<'a>,
        ra_register: u16,
        n: usize,
        rule: impl Fn(usize) -> (u16, RuleView<'a>),
    ) -> Self {
        let mut v = RowView {
            cfa,
            regs: [(0, RuleView::Other); MAX_VIEW_REGS],
            n: n.min(MAX_VIEW_REGS),
            ra: ra_register,
        };
        for i in 0..v.n {
            v.regs[i] = rule(i);
        }
        v
    }

    /// The rule of register `reg`: a register the row does not mention is
    /// unchanged in the caller, except the return-address column, which is
    /// then undefined.
    pub fn reg(&self, reg: u16) -> RuleView<'a> {
        for &(r, rule) in &self.regs[..self.n] {
            if r == reg {
                return rule;
            }
        }
        if reg == self.ra {
            RuleView::Undefined
        } else {
            RuleView::SameValue
        }
    }

    /// Whether the row gives `reg` a rule of its own (an unmentioned
    /// return-address column means "undefined" to [`RowView::reg`]; on an
    /// architecture whose return address is a real register, aarch64's
    /// `x30`, it rather means the value is still in that register).
    pub fn mentions(&self, reg: u16) -> bool {
        self.regs[..self.n].iter().any(|r| r.0 == reg)
    }
}
