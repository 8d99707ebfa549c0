//! `callstack_symbolize` and `callstack_print_trace` from a C program
//! linked with libcallstack.a: the names, files and lines of its own
//! capture, the buffer contract (snprintf-like truncation, errors), and the
//! printed trace.
use testsupport::{scratch_dir, Gcc};

fn run(flags: &str, tag: &str) {
    let dir = scratch_dir("symbolize-c");
    let exe = Gcc::new(&["capi_symbolize.c"])
        .flags(flags)
        .link_callstack()
        .build(&dir.join(format!("capi_symbolize_{tag}")));
    let out = std::process::Command::new(&exe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value = |key: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {text}"))
            .trim()
            .to_string()
    };
    let (leaf, mid) = (value("LEAF_LINE "), value("MID_LINE "));
    assert_eq!(
        value("SYM 0 "),
        format!("sym_leaf at {}/capi_symbolize.c:{leaf}", fixtures())
    );
    assert_eq!(
        value("SYM 1 "),
        format!("sym_mid at {}/capi_symbolize.c:{mid}", fixtures())
    );
    assert!(value("SYM 2 ").starts_with("main at "), "{text}");
    let trace: Vec<&str> = text.lines().skip_while(|l| *l != "TRACE").skip(1).collect();
    let names: Vec<&str> = trace
        .iter()
        .map(|l| l.split(" in ").nth(1).unwrap().split(' ').next().unwrap())
        .collect();
    assert_eq!(names[..3], ["sym_leaf", "sym_mid", "main"], "{text}");
    assert!(trace[0].starts_with("#0   0x"), "{text}");
    assert!(
        trace[0].ends_with(&format!("capi_symbolize.c:{leaf}")),
        "{text}"
    );
}

fn fixtures() -> String {
    testsupport::c_fixtures().display().to_string()
}

#[test]
fn c_program_symbolizes_its_capture() {
    run("-O0 -g", "O0");
    run("-O2 -g -fno-omit-frame-pointer", "O2");
}
