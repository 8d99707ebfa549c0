//! The CPython struct offsets of `callstack::python::layout` against the
//! headers they came from: `src/python/layout_gen.c` is compiled against
//! every CPython version's headers found on the machine (Debian's
//! `/usr/include/python3.X`, pyenv's `versions/*/include/python3.X`), and
//! what it prints must equal the table's entry for that version. A version
//! whose headers are here but that the table lacks is listed, not failed:
//! the reader refuses it.
#![cfg(feature = "remote")]

use callstack::python::layout::Layout;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Include directories of CPython 3 headers on this machine.
fn header_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut add_children = |parent: &Path| {
        if let Ok(rd) = std::fs::read_dir(parent) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("python3") && e.path().join("Python.h").is_file() {
                    dirs.push(e.path());
                }
            }
        }
    };
    add_children(Path::new("/usr/include"));
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")));
    if let Some(root) = pyenv {
        if let Ok(rd) = std::fs::read_dir(root.join("versions")) {
            for e in rd.flatten() {
                add_children(&e.path().join("include"));
            }
        }
    }
    dirs.sort();
    dirs
}

/// What the generator prints: (major, minor), and its `name value` lines.
type Generated = ((u8, u8), Vec<(String, u64)>);

/// Runs the generator against `include`.
fn generate(include: &Path, out: &Path) -> Option<Generated> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/python/layout_gen.c");
    let o = Command::new("gcc")
        .arg("-w")
        .arg("-I")
        .arg(include)
        .arg(&src)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run gcc");
    if !o.status.success() {
        // Headers of a version the generator does not know (3.6 has no
        // `_PyRuntime`): the reader has no layout for it either.
        eprintln!(
            "note: {}: the generator does not build: {}",
            include.display(),
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
        );
        return None;
    }
    let o = Command::new(out).output().expect("run the generator");
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    let mut lines = text.lines();
    let version = lines.next()?.strip_prefix("version ")?.to_string();
    let (a, b) = version.split_once('.')?;
    let fields = lines
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.parse::<u64>().unwrap())
        })
        .collect();
    Some(((a.parse().ok()?, b.parse().ok()?), fields))
}

#[test]
fn layout_table_equals_each_versions_headers() {
    let dirs = header_dirs();
    let tmp = std::env::temp_dir().join(format!("callstack-pylayout-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut checked = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let Some((version, mut fields)) = generate(dir, &tmp.join(format!("gen{i}"))) else {
            continue;
        };
        let Some(layout) = Layout::for_version(version.0, version.1) else {
            eprintln!("note: {}: {version:?} is not in the table", dir.display());
            continue;
        };
        let mut table: Vec<(String, u64)> = layout
            .lines()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        fields.sort();
        table.sort();
        assert_eq!(table, fields, "{}: the table vs the headers", dir.display());
        checked.push(format!("{}.{} ({})", version.0, version.1, dir.display()));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    eprintln!("checked: {checked:?}");
    assert!(
        !checked.is_empty(),
        "no CPython headers here (Debian's python3-dev, or a pyenv build)"
    );
}
