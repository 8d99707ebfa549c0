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

/// The longest chain of tail calls searched.
pub(crate) const MAX_DEPTH: usize = 64;

/// The most functions one search visits.
pub(crate) const MAX_STEPS: usize = 4096;

/// A function's tail calls: (return address, target entry) each.
type TailSites = Vec<(u64, u64)>;

/// The search gave up: an unknown target, or past a bound.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct GiveUp;

/// A module opened by the symbolizer, where it is loaded.
pub(crate) struct Loaded<'a> {
    /// Its runtime address range.
    pub start: u64,
    pub end: u64,
    pub module: &'a ElfModule,
    /// Runtime address minus file address.
    pub bias: u64,
}

/// The modules a search may go through (those opened so far), sorted by
/// address: a chain may leave the caller's module (a call through the PLT
/// to a library function that ends with a tail call).
pub(crate) struct World<'a> {
    pub modules: Vec<Loaded<'a>>,
}

impl<'a> World<'a> {
    fn at(&self, addr: u64) -> Option<&Loaded<'a>> {
        let i = self.modules.partition_point(|l| l.start <= addr);
        let l = self.modules.get(i.checked_sub(1)?)?;
        (addr < l.end).then_some(l)
    }

    /// A call target's runtime entry address. A declared function is
    /// looked up by name: in the module making the call (where a local
    /// symbol is a hidden alias, such as glibc's `__GI_` names), then as
    /// gdb's minimal symbols are, a global symbol of any other module
    /// before a local one.
    fn resolve(&self, home: &Loaded<'a>, t: CallTarget) -> Option<u64> {
        match t {
            CallTarget::Entry(e) => Some(e.wrapping_add(home.bias)),
            CallTarget::Name(n) => {
                if let Some((a, _)) = home.module.address_of(n) {
                    return Some(a.wrapping_add(home.bias));
                }
                let mut local = None;
                for l in self.modules.iter().filter(|l| !std::ptr::eq(*l, home)) {
                    match l.module.address_of(n) {
                        Some((a, true)) => return Some(a.wrapping_add(l.bias)),
                        Some((a, false)) if local.is_none() => local = Some(a.wrapping_add(l.bias)),
                        _ => {}
                    }
                }
                local
            }
            CallTarget::Unknown => None,
        }
    }

    /// The DWARF function containing runtime address `addr`.
    fn function_at(&self, addr: u64) -> Option<(&Loaded<'a>, &'a DwarfIndex, FuncRef)> {
        let l = self.at(addr)?;
        let d = l.module.dwarf.as_ref()?;
        Some((l, d, d.function_at(addr.wrapping_sub(l.bias))?))
    }

    /// The tail calls of the function entered at runtime address `entry`:
    /// (return address, target entry) each. `None` when `entry` is no
    /// DWARF function's entry or a tail call's target is unknown.
    fn tail_sites(&self, entry: u64) -> Option<Vec<(u64, u64)>> {
        let (l, d, f) = self.function_at(entry)?;
        if d.entry(f)?.wrapping_add(l.bias) != entry {
            return None;
        }
        d.call_sites(f)
            .iter()
            .filter(|s| s.tail)
            .map(|s| Some((s.pc.wrapping_add(l.bias), self.resolve(l, s.target)?)))
            .collect()
    }
}

/// The return addresses of the tail-call sites between a caller and its
/// callee, innermost (nearest the callee) first: each is the pc gdb gives
/// its tail-call frame. Runtime addresses: `caller` is the caller's return
/// address, `callee` an address in the callee (its pc, or its return
/// address minus one). Empty when there are none or they cannot be known.
pub(crate) fn between(w: &World<'_>, caller: u64, callee: u64) -> Vec<u64> {
    let Some((home, d, f)) = caller.checked_sub(1).and_then(|p| w.function_at(p)) else {
        return Vec::new();
    };
    let file_pc = caller.wrapping_sub(home.bias);
    let Some(site) = d.call_sites(f).iter().find(|s| s.pc == file_pc).copied() else {
        return Vec::new();
    };
    let callee_fn = w.function_at(callee);
    // The common case first, without the symbol tables: the caller calls
    // the callee's function itself.
    let callee_dwarf_entry = callee_fn.and_then(|(l, d, f)| Some(d.entry(f)?.wrapping_add(l.bias)));
    match site.target {
        CallTarget::Unknown => return Vec::new(),
        CallTarget::Entry(e)
            if callee_dwarf_entry.is_some()
                && callee_dwarf_entry == Some(e.wrapping_add(home.bias)) =>
        {
            return Vec::new()
        }
        CallTarget::Name(n) if callee_fn.and_then(|(_, d, f)| d.function_name(f)) == Some(n) => {
            return Vec::new()
        }
        _ => {}
    }
    // gdb's function start: the DWARF function's entry, else the symbol's.
    let callee_entry = match callee_fn {
        Some(_) => callee_dwarf_entry,
        None => w.at(callee).and_then(|l| {
            let s = l
                .module
                .symbol(callee.wrapping_sub(l.bias), SymbolExtent::Section)?;
            Some(s.addr.wrapping_add(l.bias))
        }),
    };
    let (Some(callee_entry), Some(first)) = (callee_entry, w.resolve(home, site.target)) else {
        return Vec::new();
    };
    chain(first, callee_entry, |entry| w.tail_sites(entry)).unwrap_or_default()
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
    let mut stack: Vec<(TailSites, usize)> = Vec::new();
    let mut enter = |entry: u64, stack: &mut Vec<(TailSites, usize)>| {
        steps += 1;
        if steps > MAX_STEPS || stack.len() >= MAX_DEPTH {
            return Err(GiveUp);
        }
        stack.push((sites(entry).ok_or(GiveUp)?, 0));
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
