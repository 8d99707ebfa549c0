//! Names of DIEs in a dwz supplementary file (`.gnu_debugaltlink`).
//!
//! dwz moves DIEs shared by several programs (types, the abstract
//! instances of inline functions of common headers) into a supplementary
//! file; the debug file then points at them with `DW_FORM_GNU_ref_alt`
//! (DWARF 5: `DW_FORM_ref_sup4/8`), which gimli reads as
//! [`gimli::AttributeValue::DebugInfoRefSup`], an offset into the
//! supplementary `.debug_info`. `elf.rs` finds the file and hands it to
//! gimli as [`gimli::Dwarf::sup`] (which is enough for the strings,
//! `DW_FORM_GNU_strp_alt`); [`SupNames`] resolves the DIE references: the
//! linkage name, else the name, else that of the DIE's abstract origin or
//! specification, within the supplementary file.
//!
//! The DWARF reader (`dwarf.rs`) calls [`SupNames::die_name`] where a
//! name leads to a `DebugInfoRefSup` origin.

use super::elf::Slice;
use super::IntMap;
use gimli::{AttributeValue, DebugInfoOffset};
use std::cell::{OnceCell, RefCell};

/// A name as stored in the supplementary file's `.debug_str`.
pub(crate) type SupName = &'static [u8];

struct SupUnit {
    header: gimli::UnitHeader<Slice>,
    /// One past the unit's last byte in `.debug_info`.
    end: usize,
    /// Parsed on first use; `None` when it cannot be.
    unit: OnceCell<Option<gimli::Unit<Slice>>>,
}

/// Lazily indexed units of a supplementary file and the names found so far.
#[derive(Default)]
pub(crate) struct SupNames {
    units: OnceCell<Vec<SupUnit>>,
    names: RefCell<IntMap<u64, Option<SupName>>>,
}

impl SupNames {
    pub(crate) fn new() -> SupNames {
        SupNames::default()
    }

    fn units(&self, sup: &gimli::Dwarf<Slice>) -> &[SupUnit] {
        self.units.get_or_init(|| {
            let mut v = Vec::new();
            let mut it = sup.units();
            while let Ok(Some(header)) = it.next() {
                let start = header.offset().0;
                v.push(SupUnit {
                    end: start.saturating_add(header.length_including_self()),
                    header,
                    unit: OnceCell::new(),
                });
            }
            v
        })
    }

    /// The name of the DIE at `offset` in the supplementary `.debug_info`
    /// of `sup`: its linkage name, else its name, else (following
    /// `DW_AT_abstract_origin` / `DW_AT_specification` up to `depth` steps)
    /// its origin's. `None` for an offset outside every unit, a corrupt
    /// DIE, or no name.
    pub(crate) fn die_name(
        &self,
        sup: &gimli::Dwarf<Slice>,
        offset: DebugInfoOffset,
        depth: usize,
    ) -> Option<SupName> {
        let key = offset.0 as u64;
        if let Some(n) = self.names.borrow().get(&key) {
            return *n;
        }
        let n = self.die_name_uncached(sup, offset, depth);
        self.names.borrow_mut().insert(key, n);
        n
    }

    fn die_name_uncached(
        &self,
        sup: &gimli::Dwarf<Slice>,
        offset: DebugInfoOffset,
        depth: usize,
    ) -> Option<SupName> {
        if depth == 0 {
            return None;
        }
        let units = self.units(sup);
        let i = units
            .partition_point(|u| u.header.offset().0 <= offset.0)
            .checked_sub(1)?;
        let su = &units[i];
        if offset.0 >= su.end {
            return None;
        }
        let unit = su.unit.get_or_init(|| sup.unit(su.header).ok()).as_ref()?;
        let die = offset.to_unit_offset(&unit.header)?;
        let mut e = unit.entries_raw(Some(die)).ok()?;
        let abbrev = e.read_abbreviation().ok()??;
        let mut name = None;
        let mut next = None;
        for spec in abbrev.attributes() {
            let attr = e.read_attribute(*spec).ok()?;
            match attr.name() {
                gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                    if let Ok(s) = sup.attr_string(unit, attr.value()) {
                        return Some(s.slice());
                    }
                }
                gimli::DW_AT_name => {
                    if let Ok(s) = sup.attr_string(unit, attr.value()) {
                        name = Some(s.slice());
                    }
                }
                gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => {
                    next = Some(attr.value());
                }
                _ => {}
            }
        }
        if name.is_some() {
            return name;
        }
        let target = match next? {
            AttributeValue::UnitRef(o) => o.to_debug_info_offset(&unit.header)?,
            AttributeValue::DebugInfoRef(o) => o,
            _ => return None,
        };
        self.die_name(sup, target, depth - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbolize::mapped::Mapped;
    use std::path::Path;
    use std::process::Command;

    fn run(args: &[&str], dir: &Path) -> bool {
        Command::new(args[0])
            .args(&args[1..])
            .current_dir(dir)
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn dwarf_of(map: &Mapped) -> gimli::Dwarf<Slice> {
        let obj = object::File::parse(map.bytes()).unwrap();
        crate::symbolize::elf::load_sup_dwarf(&obj, map, gimli::RunTimeEndian::Little).unwrap()
    }

    /// Two programs sharing inline functions, their debug files through
    /// `dwz -m`: every `DW_FORM_GNU_ref_alt` abstract origin of an inlined
    /// call names one of the shared inline functions.
    #[test]
    fn names_of_ref_alt_origins() {
        if !run(&["dwz", "--version"], Path::new("/")) {
            eprintln!("skipped: dwz is not installed");
            return;
        }
        let dir = testsupport::scratch_dir("symbolize-sup-unit");
        std::fs::write(
            dir.join("h.h"),
            "static inline int h_twice(int x) { return 2 * x + 1; }\n\
             static inline int h_mix(int a, int k) { return h_twice(a + k) * 3; }\n",
        )
        .unwrap();
        for v in ["p", "q"] {
            std::fs::write(
                dir.join(format!("{v}.c")),
                format!(
                    "#include <stdlib.h>\n#include \"h.h\"\n\
                     __attribute__((noinline)) int {v}_work(int a, int n)\n\
                     {{ int t = 0; for (int i = 0; i < n; i++) t += h_mix(a, i); return t; }}\n\
                     int main(int c, char **v) {{ return {v}_work(c, atoi(v[0])); }}\n"
                ),
            )
            .unwrap();
            assert!(run(&["gcc", "-O2", "-g", &format!("{v}.c"), "-o", v], &dir));
            assert!(run(
                &["objcopy", "--only-keep-debug", v, &format!("{v}.debug")],
                &dir
            ));
        }
        assert!(run(
            &[
                "dwz",
                "-m",
                "sup.debug",
                "-M",
                "sup.debug",
                "p.debug",
                "q.debug"
            ],
            &dir
        ));
        let main_map = Mapped::open(&dir.join("p.debug")).unwrap();
        let sup_map = Mapped::open(&dir.join("sup.debug")).unwrap();
        let main = dwarf_of(&main_map);
        let sup = dwarf_of(&sup_map);
        let names = SupNames::new();
        let mut found = Vec::new();
        let mut units = main.units();
        while let Some(h) = units.next().unwrap() {
            let u = main.unit(h).unwrap();
            let mut cur = u.entries();
            while let Some(die) = cur.next_dfs().unwrap() {
                if die.tag() != gimli::DW_TAG_inlined_subroutine {
                    continue;
                }
                if let Some(AttributeValue::DebugInfoRefSup(o)) =
                    die.attr_value(gimli::DW_AT_abstract_origin)
                {
                    let n = names.die_name(&sup, o, 16).expect("a name");
                    found.push(String::from_utf8_lossy(n).into_owned());
                }
            }
        }
        assert!(found.iter().any(|n| n == "h_mix"), "{found:?}");
        // atoi: glibc's inline wrapper, common to both programs too.
        assert!(found.iter().any(|n| n == "atoi"), "{found:?}");
        assert!(
            found
                .iter()
                .all(|n| ["h_mix", "h_twice", "atoi"].contains(&&**n)),
            "{found:?}"
        );
        // Offsets outside every unit, or not at a DIE: no name, no panic.
        assert_eq!(
            names.die_name(&sup, DebugInfoOffset(usize::MAX / 2), 16),
            None
        );
        for o in 0..64 {
            let _ = names.die_name(&sup, DebugInfoOffset(o), 16);
        }
    }
}
