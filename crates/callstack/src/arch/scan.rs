//! Stack scanning, the last resort: look up the stack for a word that is a
//! believable return address.
//!
//! A word is taken only if it points into executable memory right after a
//! call instruction, and that call is consistent with the frame below: a
//! direct call must target the function that contains the frame's pc (its
//! start at or below the pc, and, where a checker is given, a path from that
//! start must reach the pc with the return-address slot exactly where the
//! word was found); an indirect call, or a direct one that fails the check
//! (a PLT stub's target, a `.cold` part's parent), is accepted only in the
//! lenient pass, after no direct call matched. Scanning is bounded ([`MAX_SCAN_WORDS`]).

use crate::types::{CodeMemory, Memory};

/// Most stack words examined for one frame.
pub const MAX_SCAN_WORDS: usize = 512;

/// Most distance from a direct call's target to the pc it must contain.
pub const MAX_FUNCTION_SIZE: u64 = 1 << 20;

pub use crate::types::CallBefore;

/// A word found by scanning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanHit {
    /// The return address found.
    pub ra: u64,
    /// Where it was on the stack.
    pub slot: u64,
    /// Whether the call before it was checked against the frame's function
    /// (a direct call whose target contains the pc, verified by `verify`).
    pub verified: bool,
    /// Whether it lies in code the reader could not read (nothing checked:
    /// see [`CodeMemory::is_unread_code`]).
    pub unread: bool,
}

/// `verify(code, target, slot)` of [`scan`].
pub type Verify<'a, C> = &'a mut dyn FnMut(&mut C, u64, u64) -> bool;

/// Scans from `sp` upward for the return address of the frame at `pc`.
///
/// - `word`: pointer size (8 or 4);
/// - `call_before(code, ra)`: the architecture's decoder of the call
///   instruction that ends right before `ra`;
/// - `verify(code, target, slot)`: whether the function starting at a direct
///   call's `target` has, at `pc`, its return address in `slot` (prologue
///   analysis). `None` skips that check (then a direct call target at or
///   below `pc` within [`MAX_FUNCTION_SIZE`] suffices).
///
/// Returns the first verified hit; failing that, the first hit after an
/// indirect call or a plausible direct one, or in code the reader knows is
/// there but cannot read ([`CodeMemory::is_unread_code`]: a module whose
/// file is missing), whichever is nearer.
#[allow(clippy::too_many_arguments)]
pub fn scan<M, C>(
    mem: &mut M,
    code: &mut C,
    pc: u64,
    sp: u64,
    stack_end: u64,
    word: u8,
    call_before: fn(&mut C, u64) -> Option<CallBefore>,
    mut verify: Option<Verify<'_, C>>,
) -> Option<ScanHit>
where
    M: Memory + ?Sized,
    C: CodeMemory + ?Sized,
{
    let mut lenient: Option<ScanHit> = None;
    let func = code.function_bounds(pc);
    let mut slot = sp;
    for _ in 0..MAX_SCAN_WORDS {
        if slot.saturating_add(word as u64) > stack_end {
            break;
        }
        let w = if word == 4 {
            mem.read_u32(slot).map(u64::from)
        } else {
            mem.read_u64(slot)
        };
        let Ok(w) = w else { break };
        if w > 4096 && code.is_return_trampoline(w) {
            // Put there by an exit hook, which checked the slot held a
            // return address.
            return Some(ScanHit {
                ra: w,
                slot,
                verified: true,
                unread: false,
            });
        }
        if w > 4096 && code.is_executable(w) {
            let unverified = ScanHit {
                ra: w,
                slot,
                verified: false,
                unread: false,
            };
            match call_before(code, w) {
                Some(CallBefore::Direct(t)) => {
                    let plausible = match func {
                        Some((s, _)) => t == s,
                        None => t <= pc && pc - t < MAX_FUNCTION_SIZE,
                    };
                    if plausible {
                        let ok = match verify.as_mut() {
                            Some(v) => v(code, t, slot),
                            None => true,
                        };
                        if ok {
                            return Some(ScanHit {
                                verified: true,
                                ..unverified
                            });
                        }
                        // The check failed, but the call may still be the
                        // frame's: through a PLT stub (whose code is not the
                        // function's), or into a function whose split-off
                        // part (gcc's `f.cold`, which ends in a call to a
                        // `noreturn` function) holds the pc.
                        lenient.get_or_insert(unverified);
                    } else if func.is_none() && !is_direct_call_elsewhere(t, pc) {
                        lenient.get_or_insert(unverified);
                    }
                }
                Some(CallBefore::Indirect) => {
                    lenient.get_or_insert(unverified);
                }
                None => {
                    if call_site_unread(code, w) {
                        lenient.get_or_insert(ScanHit {
                            unread: true,
                            ..unverified
                        });
                    }
                }
            }
        } else if w > 4096 && lenient.is_none() && call_site_unread(code, w) {
            // In code the reader cannot read (a module whose file is
            // missing): as believable as an unverified call, and the
            // nearer of the two wins (a real frame in such a module must
            // not be skipped for a checkable word above it).
            lenient = Some(ScanHit {
                ra: w,
                slot,
                verified: false,
                unread: true,
            });
        }
        slot += word as u64;
    }
    lenient
}

/// Whether the call that would precede the return address `ra` lies (in
/// part) in code the reader knows is there but cannot read
/// ([`CodeMemory::is_unread_code`]): `ra` is then neither confirmed nor
/// refuted by the code, only believable. A call is at most 7 bytes long
/// (x86-64; 4 on the RISC architectures).
pub fn call_site_unread<C: CodeMemory + ?Sized>(code: &mut C, ra: u64) -> bool {
    [ra, ra.wrapping_sub(1), ra.wrapping_sub(7)]
        .into_iter()
        .any(|a| code.is_unread_code(a))
}

/// A direct call to `t` can still belong to the frame at `pc` through a
/// tail call or a PLT stub; we keep it as a lenient candidate only when the
/// target lies above the pc (a function below the pc's would contain it).
fn is_direct_call_elsewhere(t: u64, pc: u64) -> bool {
    t <= pc
}
