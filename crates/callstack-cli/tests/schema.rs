//! The JSON of `callstack core`, `pstack` and `symbolize` against the JSON
//! Schemas published in docs/schema/ (draft 2020-12).
//!
//! The validator here implements the keywords those schemas use (`type`,
//! `required`, `properties`, `additionalProperties`, `items`, `enum`,
//! `const`, `oneOf`, `$ref` into `$defs`, `minimum`, and the one `pattern`
//! they use) and fails on any other keyword, so a schema cannot silently
//! say more than is checked.

use serde_json::Value;
use std::hint::black_box;
use std::path::Path;
use std::process::{Command, Stdio};
use testsupport::{release_artifacts, scratch_dir, workspace_root, Gcc};

const KNOWN: &[&str] = &[
    "$schema",
    "$id",
    "title",
    "description",
    "type",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "oneOf",
    "$ref",
    "$defs",
    "minimum",
    "pattern",
];

fn hex_pattern(s: &str) -> bool {
    s.len() > 2
        && s.starts_with("0x")
        && s[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => panic!("unknown type {t}"),
    }
}

/// Errors of `v` against `s` (empty: valid), each with its JSON path.
fn validate(root: &Value, s: &Value, v: &Value, path: &str, errs: &mut Vec<String>) {
    let s = s.as_object().expect("a schema is an object");
    for k in s.keys() {
        assert!(
            KNOWN.contains(&k.as_str()),
            "schema keyword {k} is not checked here"
        );
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let name = r.strip_prefix("#/$defs/").expect("only #/$defs/ refs");
        validate(root, &root["$defs"][name], v, path, errs);
    }
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(t) => type_ok(t, v),
            Value::Array(ts) => ts.iter().any(|t| type_ok(t.as_str().unwrap(), v)),
            _ => panic!("bad type"),
        };
        if !ok {
            errs.push(format!("{path}: {v} is not of type {t}"));
            return;
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            errs.push(format!("{path}: {v} is not {c}"));
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            errs.push(format!("{path}: {v} is not one of {e:?}"));
        }
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str) {
        assert_eq!(p, "^0x[0-9a-f]+$", "only the hex pattern is implemented");
        if let Some(x) = v.as_str() {
            if !hex_pattern(x) {
                errs.push(format!("{path}: {x:?} does not match {p}"));
            }
        }
    }
    if let (Some(m), Some(n)) = (s.get("minimum").and_then(Value::as_i64), v.as_i64()) {
        if n < m {
            errs.push(format!("{path}: {n} < {m}"));
        }
    }
    if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
        let ok = alts
            .iter()
            .filter(|a| {
                let mut e = Vec::new();
                validate(root, a, v, path, &mut e);
                e.is_empty()
            })
            .count();
        if ok != 1 {
            errs.push(format!(
                "{path}: {v} matches {ok} of oneOf's schemas, not 1"
            ));
        }
    }
    if let Some(o) = v.as_object() {
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !o.contains_key(r.as_str().unwrap()) {
                errs.push(format!("{path}: required key {r} missing"));
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (k, x) in o {
            let p = format!("{path}.{k}");
            match (props.and_then(|p| p.get(k)), s.get("additionalProperties")) {
                (Some(ps), _) => validate(root, ps, x, &p, errs),
                (None, Some(Value::Bool(false))) => errs.push(format!("{p}: key not allowed")),
                (None, Some(a @ Value::Object(_))) => validate(root, a, x, &p, errs),
                _ => {}
            }
        }
    }
    if let (Some(items), Some(a)) = (s.get("items"), v.as_array()) {
        for (i, x) in a.iter().enumerate() {
            validate(root, items, x, &format!("{path}[{i}]"), errs);
        }
    }
}

fn check(schema: &str, v: &Value) {
    let path = workspace_root().join("docs/schema").join(schema);
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
    let mut errs = Vec::new();
    validate(&s, &s, v, "$", &mut errs);
    assert!(errs.is_empty(), "{schema}: {errs:#?}\n{v}");
}

fn run_json(args: &[&str], stdin: Option<&[u8]>) -> Value {
    let mut c = Command::new(&release_artifacts().cli);
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = c.spawn().unwrap();
    if let Some(b) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_validator_rejects_what_the_schema_forbids() {
    let good = serde_json::json!({"schema_version": 1, "threads": [{"tid": 1, "name": null,
        "frames": [{"pc": "0x10", "function": "f", "file": null, "line": 3, "inlined": false,
        "module": null, "method": "cfi"}, {"pc": "0x20", "function": "g", "file": null,
        "line": null, "inlined": false, "module": null, "method": "cfi", "tail_call": true}]}]});
    check("pstack.schema.json", &good);
    let s: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("docs/schema/pstack.schema.json")).unwrap(),
    )
    .unwrap();
    for (ptr, bad) in [
        ("/schema_version", serde_json::json!(2)),
        ("/threads/0/frames/0/pc", serde_json::json!("16")),
        ("/threads/0/frames/0/method", serde_json::json!("guess")),
        ("/threads/0/tid", serde_json::json!("1")),
        ("/threads/0/frames/1/tail_call", serde_json::json!(false)),
    ] {
        let mut v = good.clone();
        *v.pointer_mut(ptr).unwrap() = bad;
        let mut errs = Vec::new();
        validate(&s, &s, &v, "$", &mut errs);
        assert!(!errs.is_empty(), "{ptr} accepted");
    }
    let mut v = good.clone();
    v["threads"][0]["frames"][0]
        .as_object_mut()
        .unwrap()
        .remove("line");
    let mut errs = Vec::new();
    validate(&s, &s, &v, "$", &mut errs);
    assert!(!errs.is_empty());
}

fn crash_core(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let exe = Gcc::new(&["core_crash.c"])
        .flags("-O0 -g -pthread")
        .build(&dir.join("core_crash"));
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -c unlimited; exec {}", exe.display()))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!st.success());
    let core = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n == "core" || n.starts_with("core.")
        })
        .expect("a core dumped (kernel.core_pattern `core`)");
    (exe, core)
}

#[test]
fn core_and_pstack_json_match_their_schemas() {
    let dir = scratch_dir("schema-core");
    let (exe, core) = crash_core(&dir);
    let (exe_s, core_s) = (exe.to_str().unwrap(), core.to_str().unwrap());
    for args in [
        vec!["core", "--json", core_s],
        vec!["core", "--json", "--methods", exe_s, core_s],
    ] {
        let v = run_json(&args, None);
        assert_eq!(v["schema_version"], 1);
        assert!(!v["signal"].is_null());
        check("core.schema.json", &v);
    }
    let _ = std::fs::remove_file(&core);
    // A live process.
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let pid = child.id().to_string();
    let v = run_json(&["pstack", "--json", &pid], None);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(v["schema_version"], 1);
    assert!(!v["threads"][0]["frames"].as_array().unwrap().is_empty());
    check("pstack.schema.json", &v);
    // Tail-call frames (tests/fixtures/c/tailcall.c).
    let exe = Gcc::new(&["tailcall.c"])
        .flags("-O2 -pthread")
        .build(&dir.join("tailcall"));
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut ready).unwrap();
    // Its threads block in read(2) once past their barrier.
    let pid = child.id().to_string();
    let mut v = Value::Null;
    for _ in 0..100 {
        v = run_json(&["pstack", "--json", &pid], None);
        if v.to_string().contains("\"tail_call\":true") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(v.to_string().contains("\"tail_call\":true"), "{v}");
    check("pstack.schema.json", &v);
}

/// `callstack minidump --json` follows the core schema (with its
/// `source` and `missing_modules` keys).
#[cfg(target_os = "linux")]
#[test]
fn minidump_json_matches_the_core_schema() {
    let dir = scratch_dir("schema-minidump");
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let dump = dir.join("sleep.dmp");
    let mut f = std::fs::File::create(&dump).unwrap();
    let pid = child.id() as i32;
    let written =
        minidump_writer::minidump_writer::MinidumpWriterConfig::new(pid, pid).write(&mut f);
    let _ = child.kill();
    let _ = child.wait();
    written.unwrap();
    let v = run_json(&["minidump", "--json", dump.to_str().unwrap()], None);
    assert_eq!(v["source"], "minidump");
    assert!(!v["threads"][0]["frames"].as_array().unwrap().is_empty());
    check("core.schema.json", &v);
}

#[inline(never)]
fn schema_leaf(out: &mut [usize]) -> usize {
    black_box(callstack::capture_fast(0, out))
}

#[test]
fn symbolize_json_matches_its_schema() {
    let mut frames = [0usize; 64];
    let n = schema_leaf(&mut frames);
    let mut w = callstack::tracefile::TraceWriter::new(Vec::new()).unwrap();
    w.write_loaded_modules().unwrap();
    w.write_stack(&frames[..n], false).unwrap();
    w.write_stack_tagged(&frames[..2], false, Some(7)).unwrap();
    w.write_stack(&[0x10], false).unwrap();
    let bytes = w.finish().unwrap();
    let v = run_json(&["symbolize", "--json", "-"], Some(&bytes));
    assert_eq!(v["schema_version"], 1);
    let stacks = v["stacks"].as_array().unwrap();
    assert_eq!(stacks.len(), 3);
    assert_eq!(stacks[1]["tag"], 7);
    assert!(
        stacks[0]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["function"] == "schema::schema_leaf"),
        "{}",
        stacks[0]
    );
    assert!(stacks[2]["frames"][0]["function"].is_null());
    check("symbolize.schema.json", &v);
}

/// Python frames (`"python": true`) follow the pstack schema: Debian's
/// python3.11 running the Python test fixture (skipped when absent).
#[test]
fn pstack_json_with_python_frames_matches_the_schema() {
    let python = std::path::Path::new("/usr/bin/python3.11");
    if !python.is_file() {
        eprintln!("note: /usr/bin/python3.11 not present: skipped");
        return;
    }
    let script = workspace_root().join("crates/callstack-cli/tests/fixtures/python/threads.py");
    let mut child = Command::new(python)
        .arg(&script)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut ready).unwrap();
    let pid = child.id().to_string();
    let v = run_json(&["pstack", "--json", &pid], None);
    let _ = child.kill();
    let _ = child.wait();
    assert!(v.to_string().contains("\"python\":true"), "{v}");
    check("pstack.schema.json", &v);
}
