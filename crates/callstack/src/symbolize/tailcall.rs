//! Tail-call frames: the functions that ran between a caller and its
//! callee but left no frame on the stack, because each ended with a jump
//! to the next (`return f(x)` compiled to `jmp f`).
//!
//! The unwinder sees the caller, whose return address is a call to `a`,
//! directly above the callee `c`. When `a` is not `c`, the DWARF call-site
//! DIEs (`DW_TAG_call_site` with `DW_AT_call_tail_call`, DWARF 5 or GNU's
//! extension) may say how `a` got to `c`: `a` tail-calls `b`, which
//! tail-calls `c`. gdb shows those functions as frames of their own
//! ("tail-call frames"); so do `callstack pstack` and `callstack core`.
//!
//! The search follows gdb's rules (its `call_site_find_chain`):
//! - the caller's return address must be the return address of one of
//!   its call sites, whose target is known;
//! - from that target, every path of tail calls that reaches the callee's
//!   function is a candidate chain (a call site is not used twice in one
//!   path);
//! - when there are several, only the call sites common to all are kept:
//!   the longest common start (next to the caller) and end (next to the
//!   callee); none in common means no frames at all;
//! - a tail call whose target is computed at run time (or unknown), or a
//!   target that is not a function's entry, could lead anywhere: no
//!   frames either.
//!
//! Bad DWARF cannot loop or blow up: a path is at most [`MAX_DEPTH`] calls
//! long and a search visits at most [`MAX_STEPS`] functions; past either
//! it gives no frames.

use super::dwarf::{CallTarget, DwarfIndex, FuncRef};
use super::elf::{ElfModule, SymbolExtent};
use std::sync::Arc;

/// The longest chain of tail calls searched.
pub(crate) const MAX_DEPTH: usize = 64;

/// The most functions one search visits.
pub(crate) const MAX_STEPS: usize = 4096;

/// The search gave up: an unknown target, or past a bound.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct GiveUp;

/// The return addresses of the tail-call sites between a caller and its
/// callee, innermost (nearest the callee) first: each is the pc gdb gives
/// its tail-call frame. File addresses of `m`; `caller` is the caller's
/// return address, `callee` an address in the callee (its pc, or its
/// return address minus one). Empty when there are none or they cannot
/// be known.
pub(crate) fn between(m: &ElfModule, caller: u64, callee: u64) -> Vec<u64> {
    let Some(d) = m.dwarf.as_ref() else {
        return Vec::new();
    };
    let Some(site) = caller
        .checked_sub(1)
        .and_then(|p| d.function_at(p))
        .and_then(|f| d.call_sites(f).iter().find(|s| s.pc == caller).copied())
    else {
        return Vec::new();
    };
    let callee_fn = d.function_at(callee);
    // The common case first, without the symbol table: the caller calls
    // the callee's function itself.
    match site.target {
        CallTarget::Unknown => return Vec::new(),
        CallTarget::Entry(e) if callee_fn.and_then(|f| d.entry(f)) == Some(e) => return Vec::new(),
        CallTarget::Name(n) if callee_fn.and_then(|f| d.function_name(f)) == Some(n) => {
            return Vec::new()
        }
        _ => {}
    }
    // gdb's function start: the DWARF function's entry, else the symbol's.
    let callee_entry = match callee_fn {
        Some(f) => d.entry(f),
        None => m.symbol(callee, SymbolExtent::Section).map(|s| s.addr),
    };
    let (Some(callee_entry), Some(first)) = (callee_entry, resolve(m, site.target)) else {
        return Vec::new();
    };
    chain(first, callee_entry, |entry| tail_sites(m, d, entry)).unwrap_or_default()
}

/// A call target's entry address (a declared function's from the symbol
/// table).
fn resolve(m: &ElfModule, t: CallTarget) -> Option<u64> {
    match t {
        CallTarget::Entry(e) => Some(e),
        CallTarget::Name(n) => m.address_of(n),
        CallTarget::Unknown => None,
    }
}

/// The tail calls of the function entered at `entry`: (return address,
/// target entry) each. `None` when `entry` is no DWARF function's entry
/// or a tail call's target is unknown.
fn tail_sites(m: &ElfModule, d: &DwarfIndex, entry: u64) -> Option<Vec<(u64, u64)>> {
    let f: FuncRef = d.function_at(entry)?;
    if d.entry(f)? != entry {
        return None;
    }
    let sites = d.call_sites(f);
    sites
        .iter()
        .filter(|s| s.tail)
        .map(|s| Some((s.pc, resolve(m, s.target)?)))
        .collect()
}

/// The candidate chains found so far, merged: the first chain, and how
/// many of its call sites from the start (`callers`) and from the end
/// (`callees`) every chain shares.
struct Merged {
    chain: Vec<u64>,
    callers: usize,
    callees: usize,
}

impl Merged {
    /// Merges one more candidate; `Err` when nothing is common any more.
    fn add(best: &mut Option<Merged>, path: &[u64]) -> Result<(), GiveUp> {
        let Some(m) = best else {
            *best = Some(Merged {
                chain: path.to_vec(),
                callers: path.len(),
                callees: path.len(),
            });
            return Ok(());
        };
        let callers = m
            .chain
            .iter()
            .zip(path)
            .take(m.callers)
            .take_while(|(a, b)| a == b)
            .count();
        let callees = m
            .chain
            .iter()
            .rev()
            .zip(path.iter().rev())
            .take(m.callees)
            .take_while(|(a, b)| a == b)
            .count();
        if callers == 0 && callees == 0 {
            return Err(GiveUp);
        }
        m.callers = callers;
        m.callees = callees;
        Ok(())
    }

    /// The frames, innermost first: the common end, then (unless the end
    /// is the whole chain) the common start.
    fn frames(&self) -> Vec<u64> {
        let n = self.chain.len();
        let mut out: Vec<u64> = self.chain[n - self.callees..]
            .iter()
            .rev()
            .copied()
            .collect();
        if self.callees != n {
            out.extend(self.chain[..self.callers].iter().rev());
        }
        out
    }
}

/// The tail-call sites from the function entered at `first` (the target
/// of the caller's call) to the one entered at `callee`, innermost first;
/// `sites(entry)` lists the tail calls of a function as (return address,
/// target entry). `Err` when the search gave up; empty when `first` is
/// the callee or no chain was found.
pub(crate) fn chain(
    first: u64,
    callee: u64,
    mut sites: impl FnMut(u64) -> Option<Vec<(u64, u64)>>,
) -> Result<Vec<u64>, GiveUp> {
    if first == callee {
        return Ok(Vec::new());
    }
    let mut best: Option<Merged> = None;
    let mut steps = 0usize;
    // Depth-first, without recursion: each level is a function's tail
    // calls and the index of the next one to follow.
    let mut path: Vec<u64> = Vec::new();
    let mut stack: Vec<(Arc<[(u64, u64)]>, usize)> = Vec::new();
    let mut enter = |entry: u64, stack: &mut Vec<(Arc<[(u64, u64)]>, usize)>| {
        steps += 1;
        if steps > MAX_STEPS || stack.len() >= MAX_DEPTH {
            return Err(GiveUp);
        }
        stack.push((sites(entry).ok_or(GiveUp)?.into(), 0));
        Ok(())
    };
    enter(first, &mut stack)?;
    while let Some((list, next)) = stack.last_mut() {
        let Some(&(pc, target)) = list.get(*next) else {
            stack.pop();
            path.pop();
            continue;
        };
        *next += 1;
        if path.contains(&pc) {
            continue;
        }
        path.push(pc);
        if target == callee {
            Merged::add(&mut best, &path)?;
            path.pop();
        } else {
            enter(target, &mut stack)?;
        }
    }
    Ok(best.map(|m| m.frames()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A call graph: function entry -> its tail calls (site, target).
    fn graph(edges: &[(u64, &[(u64, u64)])]) -> HashMap<u64, Vec<(u64, u64)>> {
        edges.iter().map(|(f, s)| (*f, s.to_vec())).collect()
    }

    fn run(g: &HashMap<u64, Vec<(u64, u64)>>, first: u64, callee: u64) -> Result<Vec<u64>, GiveUp> {
        chain(first, callee, |e| {
            Some(g.get(&e).cloned().unwrap_or_default())
        })
    }

    #[test]
    fn one_path_gives_every_site_innermost_first() {
        // a -(0xa1)-> b -(0xb1)-> c
        let g = graph(&[(0xa, &[(0xa0, 0xd), (0xa1, 0xb)]), (0xb, &[(0xb1, 0xc)])]);
        assert_eq!(run(&g, 0xa, 0xc), Ok(vec![0xb1, 0xa1]));
        // The caller calls the callee itself.
        assert_eq!(run(&g, 0xc, 0xc), Ok(vec![]));
        // No path: nothing.
        assert_eq!(run(&g, 0xa, 0xe), Ok(vec![]));
    }

    #[test]
    fn ambiguous_paths_keep_what_is_common() {
        // a -> {b1, b2} -> c: the first and last sites are common.
        let g = graph(&[
            (0xa, &[(0xa1, 0xb1), (0xa2, 0xb1)]),
            (0xb1, &[(0xb11, 0xc)]),
        ]);
        assert_eq!(run(&g, 0xa, 0xc), Ok(vec![0xb11]));
        // a -(a1)-> x -> {y1 | y2} -> z -(z1)-> c: a1 and z1 are common.
        let g = graph(&[
            (0xa, &[(0xa1, 0x10)]),
            (0x10, &[(0x101, 0x20), (0x102, 0x21)]),
            (0x20, &[(0x201, 0x30)]),
            (0x21, &[(0x211, 0x30)]),
            (0x30, &[(0x301, 0xc)]),
        ]);
        assert_eq!(run(&g, 0xa, 0xc), Ok(vec![0x301, 0xa1]));
        // Two paths with nothing in common: no frames.
        let g = graph(&[(0xa, &[(0xa1, 0xb), (0xa2, 0xc)]), (0xb, &[(0xb1, 0xc)])]);
        assert_eq!(run(&g, 0xa, 0xc), Err(GiveUp));
    }

    #[test]
    fn cycles_and_unknown_targets_end_the_search() {
        // a <-> b, b -> c: the cycle is not followed twice.
        let g = graph(&[(0xa, &[(0xa1, 0xb)]), (0xb, &[(0xb1, 0xa), (0xb2, 0xc)])]);
        assert_eq!(run(&g, 0xa, 0xc), Ok(vec![0xb2, 0xa1]));
        // A function whose tail calls cannot be read: no frames.
        let r = chain(0xa, 0xc, |e| (e == 0xa).then(|| vec![(0xa1, 0xb)]));
        assert_eq!(r, Err(GiveUp));
        // A self tail call: a reaches c through a2 after any number of
        // a1's, so only a2 is certain.
        let g = graph(&[(0xa, &[(0xa1, 0xa), (0xa2, 0xc)])]);
        assert_eq!(run(&g, 0xa, 0xc), Ok(vec![0xa2]));
    }

    #[test]
    fn endless_graphs_are_bounded() {
        // A chain longer than MAX_DEPTH.
        let r = chain(0, u64::MAX, |e| Some(vec![(e + 0x1000, e + 1)]));
        assert_eq!(r, Err(GiveUp));
        // A dense graph: 2^n paths, stopped by MAX_STEPS.
        let r = chain(0, u64::MAX, |e| {
            Some(match e < 40 {
                true => vec![(e * 2 + 0x1000, e + 1), (e * 2 + 0x1001, e + 1)],
                false => vec![],
            })
        });
        assert_eq!(r, Err(GiveUp));
    }
}
