//! Which function is the program's `main`, where a backtrace ends (gdb 13's
//! rule, checked against gdb 13.1 on Rust and C programs):
//!
//! - gdb takes the name of `main` from the subprogram marked
//!   `DW_AT_main_subprogram` (rustc marks the user's `crate::main`), and
//!   `main` when no unit marks one (C).
//! - It stops after the real (not inlined) frame whose function starts
//!   where that function starts. For a Rust `main`, gdb 13 finds the
//!   function by its full name among the debug symbols, and when the crate
//!   also has a namespace of that name (rustc emits `crate::main` as a
//!   namespace as soon as `main` holds a closure or a nested item), it gets
//!   the namespace and never stops: such programs print down to `_start`.
//!   A `main` inlined into the runtime's closure has no frame of its own, so
//!   nothing stops there either.

use gimli::{EndianSlice, RunTimeEndian};
use std::path::Path;

/// Where a module's backtraces end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MainRule {
    /// After the real frame of the function of this name (`crate::main`,
    /// or `main` for a program without `DW_AT_main_subprogram`).
    At(String),
    /// Never (a Rust `main` shadowed by a namespace of its name).
    Never,
}

/// Whether a function of this name may be a program's `main` (only then
/// is its module's debug info read for the rule).
pub fn may_be_main(function: &str) -> bool {
    function == "main" || function.ends_with("::main")
}

impl MainRule {
    /// Whether a real frame in `function` is the last one printed.
    pub fn stops_at(&self, function: &str) -> bool {
        match self {
            MainRule::At(name) => name == function,
            MainRule::Never => false,
        }
    }
}

/// The rule of the module whose debug info is in `path` (its separate debug
/// file when there is one). A file that cannot be read gives gdb's default:
/// `main`.
pub fn main_rule(path: &Path) -> MainRule {
    let Ok(file) = std::fs::File::open(path) else {
        return MainRule::At("main".into());
    };
    // SAFETY: the file is mapped read-only and only read; a file changed
    // under us gives wrong names, not unsoundness we act on (as for the
    // symbolizer's own mappings).
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return MainRule::At("main".into());
    };
    scan(&map).unwrap_or_else(|| MainRule::At("main".into()))
}

/// DW_LANG_Rust.
const DW_LANG_RUST: u16 = 0x1c;

fn scan(data: &[u8]) -> Option<MainRule> {
    use object::{Object, ObjectSection};
    let obj = object::File::parse(data).ok()?;
    let endian = if obj.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let sections = gimli::DwarfSections::load(|id| -> Result<_, gimli::Error> {
        Ok(obj
            .section_by_name(id.name())
            .and_then(|s| s.uncompressed_data().ok())
            .unwrap_or(std::borrow::Cow::Borrowed(&[][..])))
    })
    .ok()?;
    let dwarf = sections.borrow(|s| EndianSlice::new(s, endian));
    let mut main: Option<String> = None;
    // Qualified names of the namespaces called `main`.
    let mut namespaces: Vec<String> = Vec::new();
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        // gdb reads every unit; only Rust units carry the mark here (gcc
        // sets it for Fortran only), so other units are passed over after
        // their first entry, and so are the Rust standard library's
        // (compiled in `/rustc/<hash>`), which holds neither the user's
        // `main` nor namespaces of its name.
        let Ok(abbrevs) = dwarf.abbreviations(&header) else {
            continue;
        };
        let mut first = header.entries(&abbrevs);
        let lang = match first.next_dfs() {
            Ok(Some(root)) => match root.attr_value(gimli::DW_AT_language) {
                Some(gimli::AttributeValue::Language(l)) => l.0,
                _ => 0,
            },
            _ => continue,
        };
        if lang != DW_LANG_RUST {
            continue;
        }
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let Ok(mut tree) = unit.entries_tree(None) else {
            continue;
        };
        let Ok(root) = tree.root() else { continue };
        let from_std = root
            .entry()
            .attr_value(gimli::DW_AT_comp_dir)
            .and_then(|v| dwarf.attr_string(&unit, v).ok())
            .is_some_and(|d| d.slice().starts_with(b"/rustc/"));
        if from_std {
            continue;
        }
        let mut path: Vec<String> = Vec::new();
        walk(&dwarf, &unit, root, &mut path, &mut main, &mut namespaces);
    }
    Some(match main {
        None => MainRule::At("main".into()),
        Some(m) if namespaces.contains(&m) => MainRule::Never,
        Some(m) => MainRule::At(m),
    })
}

type Reader<'a> = EndianSlice<'a, RunTimeEndian>;

/// Visits the children of `node`: descends into namespaces only (a
/// function's own children are never a function marked main), recording
/// the marked subprogram's and the `main` namespaces' qualified names.
fn walk(
    dwarf: &gimli::Dwarf<Reader<'_>>,
    unit: &gimli::Unit<Reader<'_>>,
    node: gimli::EntriesTreeNode<'_, '_, Reader<'_>>,
    path: &mut Vec<String>,
    main: &mut Option<String>,
    namespaces: &mut Vec<String>,
) {
    let mut children = node.children();
    while let Ok(Some(child)) = children.next() {
        let e = child.entry();
        let tag = e.tag();
        if tag != gimli::DW_TAG_namespace && tag != gimli::DW_TAG_subprogram {
            continue;
        }
        let name: Option<String> = e
            .attr_value(gimli::DW_AT_name)
            .and_then(|v| dwarf.attr_string(unit, v).ok())
            .map(|s| String::from_utf8_lossy(s.slice()).to_string());
        let Some(name) = name else {
            continue;
        };
        let qualified = |path: &[String]| {
            let mut q = path.join("::");
            if !q.is_empty() {
                q.push_str("::");
            }
            q.push_str(&name);
            q
        };
        if tag == gimli::DW_TAG_namespace {
            if name == "main" {
                namespaces.push(qualified(path));
            }
            path.push(name);
            walk(dwarf, unit, child, path, main, namespaces);
            path.pop();
        } else if main.is_none()
            && matches!(
                e.attr_value(gimli::DW_AT_main_subprogram),
                Some(gimli::AttributeValue::Flag(true))
            )
        {
            *main = Some(qualified(path));
        }
    }
}
