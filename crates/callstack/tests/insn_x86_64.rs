//! Machine-code unwinding on x86-64 cores of a program built without CFI and
//! without frame pointers: the chain must equal the one of the same code
//! built with CFI (gdb's `bt` on that build's core is the truth; `.text` is
//! checked identical and ASLR is off, so the addresses are the same).
// The cores are read through `callstack::remote`.
#![cfg(feature = "remote")]
#![cfg(target_arch = "x86_64")]

mod common;
use common::chain::*;

fn check(opt: &'static str, strip: bool) {
    let dir = testsupport::scratch_dir(&format!(
        "insn-core-{}-{}",
        opt.trim_start_matches('-'),
        strip
    ));
    let truth_v = Variant {
        opt,
        strip: false,
        cfi: true,
        fp: false,
    };
    let test_v = Variant {
        opt,
        strip,
        cfi: false,
        fp: false,
    };
    let truth_exe = build_exe(&dir, &truth_v);
    let exe = build_exe(&dir, &test_v);
    assert_eq!(
        text(&truth_exe),
        text(&exe),
        ".text differs between the CFI and no-CFI builds"
    );
    let (truth_core, _) = make_core(&truth_exe, "");
    let (core, _) = make_core(&exe, "");
    let truth = physical_frames(
        &truth_exe,
        &truth_core,
        &gdb_core_pcs(&truth_exe, &truth_core),
    );
    let (main, main_size) = symbol(&truth_exe, "main").unwrap();
    // Up to main: gdb stops there. Under `setarch -R` the PIE base is fixed.
    let base = 0x5555_5555_4000u64;
    let main_pos = truth
        .iter()
        .position(|&p| p > base + main && p <= base + main + main_size)
        .unwrap_or_else(|| panic!("main not in the truth chain {truth:x?}"));
    let truth = &truth[..=main_pos];
    assert!(truth.len() >= 9, "truth chain too short: {truth:x?}");
    let ours = our_core_chain(&exe, &core);
    let pcs: Vec<u64> = ours.iter().map(|f| f.0).collect();
    assert!(
        pcs.len() >= truth.len() && &pcs[..truth.len()] == truth,
        "{}: chain differs\n truth: {truth:x?}\n  ours: {ours:x?}",
        test_v.name()
    );
    // The frames in our no-CFI code were found by instruction analysis.
    for (pc, m) in &ours[1..truth.len()] {
        assert!(
            matches!(
                m,
                callstack::unwind::insn::Method::Insn | callstack::unwind::insn::Method::Scan
            ),
            "{pc:#x} found by {m:?}"
        );
    }
}

#[test]
fn core_o2_unstripped() {
    check("-O2", false);
}

#[test]
fn core_o2_stripped() {
    check("-O2", true);
}

#[test]
fn core_o0_unstripped() {
    check("-O0", false);
}

#[test]
fn core_o0_stripped() {
    check("-O0", true);
}
