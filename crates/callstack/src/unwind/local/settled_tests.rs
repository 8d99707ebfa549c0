//! A warm `capture_exact` through a C library built without CFI and
//! without frame pointers walks the library's frames from the rule cache:
//! their words hold the machine-code rules the analysis settled (marked as
//! such, read by the CFI as `NoCfi`), the warm path takes them without the
//! generic step, the chain is the cold capture's, function by function,
//! and `capture_exact_with_info` still reports those frames as found by
//! machine-code analysis.

use super::cache::cache_get;
use super::source::INSN_FRAMES;
use crate::arch::native::exact::INSN_MARK;
use crate::unwind::{Frame, Method};
use std::ffi::c_void;
use testsupport::insn_lib::{load, Lib};

/// The library without CFI or frame pointers, by the stage's compiler
/// (the cross compiler under qemu-user), its middle frame in assembly
/// on x86-64 and in C elsewhere (as `tests/insn_inprocess.rs` does).
fn build_lib() -> Lib {
    let fx = testsupport::c_fixtures();
    let dir = testsupport::scratch_dir("local-settled-insn");
    let so = dir.join("libinsn-settled-nocfi.so");
    let cc = std::env::var("CALLSTACK_TEST_CC").unwrap_or_else(|_| "gcc".into());
    let mid = if cfg!(callstack_insn) {
        "insn_asm_x86_64.S"
    } else {
        "insn_mid.c"
    };
    let o = std::process::Command::new(cc)
        .args(["-O2", "-fomit-frame-pointer", "-fPIC", "-shared"])
        .args(["-fno-asynchronous-unwind-tables", "-fno-unwind-tables"])
        .arg(fx.join("insn_chain.c"))
        .arg(fx.join(mid))
        .arg("-o")
        .arg(&so)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    load(&so)
}

struct Cap {
    pcs: Vec<usize>,
    frames: Vec<Frame>,
    insn: usize,
}

extern "C" fn capture(arg: *mut c_void) {
    // SAFETY: `arg` is the `Cap` of `run`.
    let cap = unsafe { &mut *(arg as *mut Cap) };
    let mut out = [0usize; 128];
    let before = INSN_FRAMES.with(|c| c.get());
    let n = crate::capture_exact(0, &mut out);
    cap.insn = INSN_FRAMES.with(|c| c.get()) - before;
    cap.pcs = out[..n].to_vec();
    let mut f = [Frame {
        pc: 0,
        sp: 0,
        fp: 0,
        method: Method::Context,
    }; 128];
    let (m, _) = crate::capture_exact_with_info(0, &mut f);
    cap.frames = f[..m].to_vec();
}

#[inline(never)]
fn run(lib: &Lib) -> Cap {
    let mut cap = Cap {
        pcs: vec![],
        frames: vec![],
        insn: 0,
    };
    // SAFETY: `insn_entry` calls `capture(&mut cap)` once and returns.
    unsafe { (lib.entry)(capture, &mut cap as *mut Cap as *mut c_void) };
    std::hint::black_box(cap)
}

fn names(pcs: &[usize]) -> Vec<String> {
    let mut s = crate::Symbolizer::new();
    pcs.iter()
        .map(|&pc| {
            let r = s.symbolize(crate::symbolize::Address::Return(pc));
            r.frames
                .last()
                .and_then(|f| f.function.as_deref())
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

#[test]
fn a_warm_capture_walks_settled_frames_from_the_rule_cache() {
    let lib = build_lib();
    crate::prepare();
    crate::unwind::insn::warm_up();
    let in_lib = |pc: usize| lib.base <= pc && pc < lib.end;
    // Words of the library's frames that hold machine-code rules.
    let settled = |pcs: &[usize]| {
        pcs.iter()
            .filter(|&&pc| in_lib(pc))
            .filter(|&&pc| cache_get(pc as u64 - 1) & 0xf000 == INSN_MARK)
            .count()
    };
    // Every capture from one call site, so that the chains are the
    // same; halfway, the analysis cache is cleared (the code may have
    // changed: what `prepare()` does on a new snapshot), which drops
    // the settled rules at their next use.
    const N: usize = 40;
    const CLEAR: usize = 20;
    let mut caps = Vec::new();
    for i in 0..N {
        if i == CLEAR {
            crate::unwind::insn::cache::invalidate();
        }
        let c = run(&lib);
        let s = settled(&c.pcs);
        caps.push((c, s));
    }
    let cold = &caps[0].0;
    let cold_names = names(&cold.pcs);
    // The library's chain, innermost first, as its code has it.
    let lib_names: Vec<&str> = cold
        .pcs
        .iter()
        .zip(&cold_names)
        .filter(|(&pc, _)| in_lib(pc))
        .map(|(_, n)| n.as_str())
        .collect();
    assert_eq!(
        lib_names,
        ["d", "c", "insn_asm_mid", "b", "a", "insn_entry"],
        "{cold_names:?}"
    );
    // Every warm capture: the cold chain, the library's callers
    // reported as found by machine-code analysis.
    for (w, _) in &caps[1..] {
        assert_eq!(w.pcs, cold.pcs);
        let pcs: Vec<usize> = w.frames.iter().map(|f| f.pc as usize).collect();
        assert_eq!(pcs[1..], cold.pcs[1..]);
        for f in w.frames.windows(2) {
            if in_lib(f[0].pc as usize) {
                assert_eq!(f[1].method, Method::Insn, "{:x}", f[1].pc);
            }
        }
    }
    // The library's frames but the innermost are found from their
    // callee's settled rule (d's callee is the callback, with CFI), and
    // the first frame above the library from insn_entry's: the frames
    // `c` .. `insn_entry` and the one above, less any whose callee's
    // rule is not settled. (Other tests of this process may clear the
    // analysis cache at any time: the count is checked over a few
    // captures.)
    let took = |r: &[(Cap, usize)]| r.iter().any(|(c, s)| c.insn >= 5 && *s >= 5);
    assert!(
        took(&caps[1..CLEAR]),
        "no warm capture took the settled rules"
    );
    // The capture after the clear takes the generic step there, and
    // settles them again.
    assert_eq!(caps[CLEAR].0.insn, 0);
    assert!(took(&caps[CLEAR + 1..]), "not settled again");
}

/// The capture through `cap` that `indirect` calls through a pointer:
/// its second pc follows an indirect call.
#[cfg(callstack_insn)]
#[inline(never)]
fn cap(out: &mut [usize]) -> usize {
    std::hint::black_box(crate::capture_exact(0, out))
}

#[cfg(callstack_insn)]
#[inline(never)]
fn indirect() -> usize {
    let f: fn(&mut [usize]) -> usize = std::hint::black_box(cap);
    let mut out = [0usize; 4];
    let n = f(&mut out);
    std::hint::black_box(n);
    out[1]
}

#[cfg(callstack_insn)]
#[inline(never)]
fn direct() -> usize {
    let mut out = [0usize; 4];
    std::hint::black_box(crate::capture_exact(0, &mut out));
    out[0]
}

/// What depends on the stack is checked on every warm frame: with the
/// same settled rule, a frame whose return address follows an
/// indirect call is taken, one whose return address follows a direct
/// call to a function far from the frame's pc is left to the generic
/// step (which would not take that rule's answer either).
#[cfg(callstack_insn)]
#[test]
fn a_settled_rule_is_taken_only_where_the_step_would_take_it() {
    use super::cache::{cache_put, flush_pending};
    use super::code::LocalCode;
    use super::source::LocalSource;
    use super::tests::{Fake, CODE};
    use crate::arch::x86_64::exact::pack_insn;
    use crate::arch::x86_64::instruction_analysis::unwinder::call_before;
    use crate::arch::x86_64::UnwindRuleX86_64 as R;
    use crate::types::CallBefore;
    use crate::unwind::{RuleSource, UnwindRegs};
    crate::unwind::insn::warm_up();
    let (ind, dir) = (indirect(), direct());
    assert_eq!(
        call_before(&mut LocalCode::new(), ind as u64),
        Some(CallBefore::Indirect)
    );
    assert!(matches!(
        call_before(&mut LocalCode::new(), dir as u64),
        Some(CallBefore::Direct(_))
    ));
    // A fake frame of fake code (never mapped: its key is this test's)
    // whose word holds a settled rule: `CFA = rsp + 16`.
    let ra0 = CODE + 40 * 0x10_0000 + 0x10;
    flush_pending();
    cache_put(ra0 - 1, pack_insn(R::Sp { cfa: 16, bp: 0 }).unwrap());
    for (ra, taken) in [(ind, true), (dir, false)] {
        let mut f = Fake::new();
        f.words[1] = ra as u64;
        let source = LocalSource::new((f.at(0), f.hi()));
        let mut regs = UnwindRegs {
            pc: ra0,
            sp: f.at(0),
            fp: 0,
            lr: 0,
        };
        let mut out = [0usize; 1];
        let (k, _) = source.fast_walk(&mut regs, &mut out);
        if taken {
            assert_eq!((k, out[0]), (1, ra));
            assert_eq!((regs.pc, regs.sp), (ra as u64, f.at(2)));
        } else {
            assert_eq!(k, 0, "{:x}", out[0]);
            assert_eq!(regs.pc, ra0);
        }
    }
}
