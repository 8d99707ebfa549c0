//! Split DWARF: the units whose DIEs live in a `.dwo` file or a `.dwp`
//! package (`gcc -gsplit-dwarf`, clang's `-gsplit-dwarf`, rustc's
//! `-Zsplit-debuginfo`).
//!
//! The object keeps a skeleton unit per compilation unit: its address
//! ranges, its line table, `DW_AT_comp_dir`, the name of the `.dwo`
//! (`DW_AT_GNU_dwo_name` in GNU's DWARF 4 extension, `DW_AT_dwo_name` in
//! DWARF 5) and the id (`DW_AT_GNU_dwo_id`, or the DWARF 5 skeleton
//! header's) that the split unit repeats. The split unit holds the
//! functions, inlined calls and call sites; its addresses are indices
//! into the object's `.debug_addr` (through the skeleton's
//! `DW_AT_addr_base`), its strings are in the `.dwo`'s own sections.
//!
//! Where the split unit is looked for, first hit wins (as gdb does):
//! 1. a package: `<object>.dwp`, `<debug file>.dwp` (the debug file's name
//!    without `.debug`), then `<root>/.build-id/xx/yyyy.dwp` under each
//!    debug root; the package is opened once per object;
//! 2. the `.dwo`: the name itself when absolute, else `comp_dir/name`
//!    (a relative `comp_dir` taken from the current directory, then from
//!    the object's directory), then `name` and its last component in the
//!    object's directory (a build tree moved, or run from elsewhere).
//!
//! A candidate is used only when it holds a unit with the skeleton's id.
//! When none does, the skeleton alone answers (its line table gives
//! files and lines, the symbol tables give names) and the missing file
//! is reported once ([`SplitLoader::take_missing`]).
//!
//! Nothing here runs for an object without skeleton units: the loader is
//! asked only when a unit's root DIE carries a dwo id.

use super::elf::Slice;
use super::mapped::Mapped;
use gimli::DwoId;
use std::borrow::Cow;
use std::cell::{OnceCell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where an object's split units may be, given by the object's opener.
#[derive(Clone, Debug, Default)]
pub(crate) struct SplitPlaces {
    /// The object's path (the executable or library).
    pub object: PathBuf,
    /// The file the skeleton units were read from, when not the object.
    pub debug_file: Option<PathBuf>,
    pub build_id: Option<Vec<u8>>,
    /// Debug roots for `.build-id/xx/yyyy.dwp`.
    pub roots: Vec<PathBuf>,
}

/// A split unit found: its own DWARF (the `.dwo`'s sections, or the
/// package's slices for it, with the object's `.debug_addr`) and the
/// unit, its bases taken from the skeleton.
pub(crate) struct SplitUnit {
    pub dwarf: Arc<gimli::Dwarf<Slice>>,
    pub unit: gimli::Unit<Slice>,
}

/// The DWARF of a `.dwo` file, made a split file of the object's.
type SplitDwarf = Arc<gimli::Dwarf<Slice>>;

/// Finds and opens the split units of one object, lazily.
pub(crate) struct SplitLoader {
    places: Option<SplitPlaces>,
    /// [`SplitLoader::objects`].
    objects: OnceCell<Vec<PathBuf>>,
    endian: gimli::RunTimeEndian,
    package: OnceCell<Option<gimli::DwarfPackage<Slice>>>,
    /// `.dwo` files already read, by path (a file holds one unit, but
    /// several skeletons could name the same file).
    dwo: RefCell<Vec<(PathBuf, Option<SplitDwarf>)>>,
    /// The missing files not reported yet, and all reported ones.
    missing: RefCell<(Vec<PathBuf>, Vec<PathBuf>)>,
    /// The mappings everything above borrows from (last: dropped after).
    maps: RefCell<Vec<Mapped>>,
}

impl SplitLoader {
    pub(crate) fn new(endian: gimli::RunTimeEndian) -> SplitLoader {
        SplitLoader {
            places: None,
            objects: OnceCell::new(),
            endian,
            package: OnceCell::new(),
            dwo: RefCell::new(Vec::new()),
            missing: RefCell::new((Vec::new(), Vec::new())),
            maps: RefCell::new(Vec::new()),
        }
    }

    /// Sets where to look (without it, no file is looked for).
    pub(crate) fn set_places(&mut self, places: SplitPlaces) {
        self.places = Some(places);
    }

    /// The missing split-DWARF files found since the last call, each
    /// once per object.
    pub(crate) fn take_missing(&self) -> Vec<PathBuf> {
        std::mem::take(&mut self.missing.borrow_mut().0)
    }

    /// Whether there is something for [`SplitLoader::take_missing`].
    pub(crate) fn has_missing(&self) -> bool {
        !self.missing.borrow().0.is_empty()
    }

    /// The split unit of `skeleton` (a unit of `main` with a dwo id), or
    /// `None` (reported as missing) when no file holds it.
    pub(crate) fn load(
        &self,
        main: &gimli::Dwarf<Slice>,
        skeleton: &gimli::Unit<Slice>,
    ) -> Option<SplitUnit> {
        let places = self.places.as_ref()?;
        let id = skeleton.dwo_id?;
        if let Some(pkg) = self.package(places) {
            if let Ok(Some(d)) = pkg.find_cu(id, main) {
                if let Some(u) = unit_with_id(Arc::new(d), id, skeleton) {
                    return Some(u);
                }
            }
        }
        let name = skeleton
            .dwo_name()
            .ok()
            .flatten()
            .and_then(|v| main.attr_string(skeleton, v).ok())
            .map(|s| s.to_string_lossy().into_owned());
        let Some(name) = name else {
            self.report(Path::new("<unnamed .dwo>"));
            return None;
        };
        let comp_dir = skeleton.comp_dir.map(|s| s.to_string_lossy().into_owned());
        let mut candidates = Vec::new();
        for object in self.objects(places) {
            for c in dwo_candidates(&name, comp_dir.as_deref(), object) {
                if !candidates.contains(&c) {
                    candidates.push(c);
                }
            }
        }
        for c in &candidates {
            if let Some(d) = self.open_dwo(c, main) {
                if let Some(u) = unit_with_id(d, id, skeleton) {
                    return Some(u);
                }
            }
        }
        let shown = candidates
            .first()
            .cloned()
            .unwrap_or_else(|| PathBuf::from(&name));
        self.report(&shown);
        None
    }

    /// The object's path as given, then with its links resolved when
    /// that differs (a live process's `/proc/PID/root/...` or
    /// `map_files` path: its neighbours are those of the real file).
    fn objects<'a>(&'a self, places: &'a SplitPlaces) -> &'a [PathBuf] {
        self.objects.get_or_init(|| {
            let mut v = vec![places.object.clone()];
            if let Ok(real) = std::fs::canonicalize(&places.object) {
                if real != places.object {
                    v.push(real);
                }
            }
            v
        })
    }

    fn report(&self, path: &Path) {
        let mut m = self.missing.borrow_mut();
        if !m.1.iter().any(|p| p == path) {
            m.1.push(path.to_path_buf());
            m.0.push(path.to_path_buf());
        }
    }

    /// The object's package, opened on first use.
    fn package(&self, places: &SplitPlaces) -> Option<&gimli::DwarfPackage<Slice>> {
        self.package
            .get_or_init(|| {
                let mut candidates: Vec<PathBuf> = self
                    .objects(places)
                    .iter()
                    .map(|o| with_suffix(o, ".dwp"))
                    .collect();
                if let Some(d) = &places.debug_file {
                    let s = d.to_string_lossy();
                    let base = s.strip_suffix(".debug").unwrap_or(&s);
                    candidates.push(PathBuf::from(format!("{base}.dwp")));
                }
                if let Some(id) = places.build_id.as_deref().filter(|id| id.len() >= 2) {
                    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
                    for r in &places.roots {
                        candidates.push(
                            r.join(".build-id")
                                .join(&hex[..2])
                                .join(format!("{}.dwp", &hex[2..])),
                        );
                    }
                }
                candidates.iter().find_map(|c| self.open_package(c))
            })
            .as_ref()
    }

    fn open_package(&self, path: &Path) -> Option<gimli::DwarfPackage<Slice>> {
        if !path.is_file() {
            return None;
        }
        let map = Mapped::open(path).ok()?;
        let obj = object::File::parse(map.bytes()).ok()?;
        let empty = gimli::EndianSlice::new(&[][..], self.endian);
        let pkg = gimli::DwarfPackage::load(
            |id: gimli::SectionId| -> Result<Slice, gimli::Error> {
                Ok(section(&obj, &map, id, self.endian))
            },
            empty,
        )
        .ok()?;
        self.maps.borrow_mut().push(map);
        Some(pkg)
    }

    /// The DWARF of the `.dwo` at `path` (read once), made a split file
    /// of `main`.
    fn open_dwo(
        &self,
        path: &Path,
        main: &gimli::Dwarf<Slice>,
    ) -> Option<Arc<gimli::Dwarf<Slice>>> {
        if let Some((_, d)) = self.dwo.borrow().iter().find(|(p, _)| p == path) {
            return d.clone();
        }
        let d = (|| {
            if !path.is_file() {
                return None;
            }
            let map = Mapped::open(path).ok()?;
            let obj = object::File::parse(map.bytes()).ok()?;
            let mut d = gimli::Dwarf::load(|id: gimli::SectionId| -> Result<Slice, gimli::Error> {
                Ok(section(&obj, &map, id, self.endian))
            })
            .ok()?;
            d.make_dwo(main);
            self.maps.borrow_mut().push(map);
            Some(Arc::new(d))
        })();
        self.dwo.borrow_mut().push((path.to_path_buf(), d.clone()));
        d
    }
}

/// The split-DWARF section `id` of `obj` (its `.dwo` name), empty when
/// absent or unreadable.
fn section(
    obj: &object::File<'static>,
    map: &Mapped,
    id: gimli::SectionId,
    endian: gimli::RunTimeEndian,
) -> Slice {
    use object::Object;
    let bytes: &'static [u8] = match id.dwo_name().and_then(|n| obj.section_by_name(n)) {
        Some(s) => match crate::elf_section::data(&s) {
            Ok(Cow::Borrowed(b)) => b,
            Ok(Cow::Owned(v)) => map.stash(v),
            Err(_) => &[],
        },
        None => &[],
    };
    gimli::EndianSlice::new(bytes, endian)
}

/// The compilation unit of `dwarf` whose id is `id`, with the skeleton's
/// bases.
fn unit_with_id(
    dwarf: Arc<gimli::Dwarf<Slice>>,
    id: DwoId,
    skeleton: &gimli::Unit<Slice>,
) -> Option<SplitUnit> {
    let mut headers = dwarf.units();
    while let Ok(Some(h)) = headers.next() {
        let Ok(mut unit) = dwarf.unit(h) else {
            continue;
        };
        // A unit without an id (an old producer) in a `.dwo` named by
        // the skeleton is taken as its split unit.
        if unit.dwo_id.is_some_and(|d| d != id) {
            continue;
        }
        unit.copy_relocated_attributes(skeleton);
        return Some(SplitUnit { dwarf, unit });
    }
    None
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// Where the `.dwo` named `name` may be, in order, without repeats.
fn dwo_candidates(name: &str, comp_dir: Option<&str>, object: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let name_path = Path::new(name);
    let object_dir = object.parent().unwrap_or(Path::new("."));
    if name_path.is_absolute() {
        out.push(name_path.to_path_buf());
    } else {
        if let Some(dir) = comp_dir {
            let dir = Path::new(dir);
            out.push(dir.join(name_path));
            if dir.is_relative() {
                out.push(object_dir.join(dir).join(name_path));
            }
        }
        out.push(object_dir.join(name_path));
    }
    if let Some(base) = name_path.file_name() {
        out.push(object_dir.join(base));
    }
    let mut seen: Vec<PathBuf> = Vec::new();
    out.retain(|p| {
        if seen.contains(p) {
            false
        } else {
            seen.push(p.clone());
            true
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::dwo_candidates;
    use std::path::{Path, PathBuf};

    #[test]
    fn candidates_in_gdbs_order() {
        let c = dwo_candidates("t.dwo", Some("/build"), Path::new("/opt/bin/t"));
        assert_eq!(
            c,
            vec![
                PathBuf::from("/build/t.dwo"),
                PathBuf::from("/opt/bin/t.dwo")
            ]
        );
        // (`/opt/bin/./obj/t.dwo` and `/opt/bin/obj/t.dwo` are one path.)
        let c = dwo_candidates("obj/t.dwo", Some("."), Path::new("/opt/bin/t"));
        assert_eq!(
            c,
            vec![
                PathBuf::from("./obj/t.dwo"),
                PathBuf::from("/opt/bin/./obj/t.dwo"),
                PathBuf::from("/opt/bin/t.dwo"),
            ]
        );
        let c = dwo_candidates("/b/t.dwo", Some("/x"), Path::new("t"));
        assert_eq!(c, vec![PathBuf::from("/b/t.dwo"), PathBuf::from("t.dwo")]);
    }
}
