//! README's C program (the block under "## C API") compiles as written,
//! against libcallstack.a and against libcallstack.so (with the rpath the
//! README shows), and runs: `main` names itself through
//! `callstack_symbolize` and the trace printed to stderr starts at `main`.
use std::process::Command;
use testsupport::{release_artifacts, scratch_dir, workspace_root};

fn readme_c_block() -> String {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let after = readme
        .split_once("## C API\n")
        .expect("README has a C API section")
        .1;
    let body = after.split_once("```c\n").unwrap().1;
    body.split_once("\n```").unwrap().0.to_string()
}

fn check_run(exe: &std::path::Path) {
    let o = Command::new(exe)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    let fields: Vec<&str> = out.trim().splitn(4, ' ').collect();
    assert_eq!(fields.len(), 4, "{out}");
    let (n, m): (u32, u32) = (fields[0].parse().unwrap(), fields[1].parse().unwrap());
    assert!(n >= 1 && m >= 2, "{out}");
    assert!(
        fields[3].starts_with("main at ") && fields[3].contains("app.c:"),
        "{out}"
    );
    // callstack_called_from("main") from main.
    assert!(fields[3].ends_with(" 1"), "{out}");
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("#0") && first.contains(" in main at "),
        "{err}"
    );
    assert!(err.contains("__libc_start_call_main"), "{err}");
}

#[test]
fn readme_c_program_compiles_and_runs() {
    let art = release_artifacts();
    let dir = scratch_dir("readme-c");
    let src = dir.join("app.c");
    std::fs::write(&src, readme_c_block()).unwrap();
    let inc = &art.include_dir;
    let lib_dir = art.static_lib.parent().unwrap();

    let exe = dir.join("app_static");
    let o = Command::new("gcc")
        .args(["-g", "-Wall", "-Werror", "-Wno-unused-variable"])
        .arg(&src)
        .arg("-I")
        .arg(inc)
        .arg(&art.static_lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_run(&exe);

    let exe = dir.join("app_shared");
    let o = Command::new("gcc")
        .args(["-g", "-Wall", "-Werror", "-Wno-unused-variable"])
        .arg(&src)
        .arg("-I")
        .arg(inc)
        .arg(format!("-L{}", lib_dir.display()))
        .arg("-lcallstack")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_run(&exe);
}
