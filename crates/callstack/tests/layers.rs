//! The crate's top-level modules import each other without cycles (see
//! ARCHITECTURE.md): `types` at the bottom, then `arch`, `unwind`,
//! `symbolize`, `remote` and the tools. Read from the sources: every
//! `crate::<module>` path outside comments counts as an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level module of a file under `src`.
fn top(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

/// Imports between top-level modules: `from -> {to}`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let tops: BTreeSet<String> = files
        .iter()
        .map(|f| top(&src, f))
        .filter(|t| t != "lib")
        .collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let from = top(&src, f);
        if from == "lib" {
            continue;
        }
        for line in std::fs::read_to_string(f).unwrap().lines() {
            let code = line.split("//").next().unwrap_or("");
            for (i, _) in code.match_indices("crate::") {
                let to: String = code[i + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if to != from && tops.contains(&to) {
                    g.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    g
}

/// A cycle of `g`, if it has one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let g = graph();
    assert!(g.contains_key("unwind"), "no imports found: {g:?}");
    if let Some(c) = find_cycle(&g) {
        panic!("import cycle: {}", c.join(" -> "));
    }
}

#[test]
fn the_vocabulary_and_the_architectures_sit_at_the_bottom() {
    let g = graph();
    assert_eq!(g.get("types"), None, "types imports {:?}", g.get("types"));
    let arch: Vec<_> = g.get("arch").into_iter().flatten().collect();
    assert_eq!(arch, ["types"], "arch may import only types");
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&g), None);
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
}
