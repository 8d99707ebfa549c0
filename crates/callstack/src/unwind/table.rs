//! Compiled unwind tables: every CFI row of a module, compiled ahead into a
//! sorted array of `(address, rule)`, so that finding the rule of an address
//! is a binary search and applying it is two or three loads.
//!
//! A table is built from section bytes and their addresses
//! ([`UnwindTable::from_sections`]), from an ELF file or image
//! ([`UnwindTable::from_elf_file`], [`UnwindTable::from_elf_bytes`]), or, in
//! this process, from a loaded module's memory. Its addresses are those of
//! the file (SVMA); look up `avma - bias`.

use std::path::Path;

use crate::arch::Arch;
use crate::unwind::cfi::{self, CfiSections, FdeAt, RowStats};
use crate::unwind::NativeArch;

/// Why a table could not be built.
#[derive(Debug)]
pub enum TableError {
    /// The file could not be read.
    Io(std::io::Error),
    /// The bytes are not an ELF image `object` can parse.
    Elf(String),
    /// The image has neither `.eh_frame` nor `.debug_frame`.
    NoCfi,
    /// The module spans more than 4 GiB of code.
    TooLarge,
}

impl core::fmt::Display for TableError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TableError::Io(e) => write!(f, "cannot read the ELF file: {e}"),
            TableError::Elf(e) => write!(f, "not a readable ELF image: {e}"),
            TableError::NoCfi => write!(f, "the image has no .eh_frame or .debug_frame"),
            TableError::TooLarge => write!(f, "the CFI covers more than 4 GiB of addresses"),
        }
    }
}

impl std::error::Error for TableError {}

/// Section bytes a table keeps for the rows it evaluates directly: borrowed
/// from mapped memory of a loaded module, or owned (read from a file).
#[derive(Debug)]
enum Bytes {
    Static(&'static [u8]),
    Owned(Box<[u8]>),
}

impl Bytes {
    fn get(&self) -> &[u8] {
        match self {
            Bytes::Static(s) => s,
            Bytes::Owned(b) => b,
        }
    }
}

/// The compiled unwind rules of one module.
///
/// `A` is the architecture ([`crate::arch::x86_64::X86_64`] or
/// [`crate::arch::aarch64::Aarch64`]); it defaults to the host's.
#[derive(Debug)]
pub struct UnwindTable<A: Arch = NativeArch> {
    base: u64,
    end: u64,
    addrs: Box<[u32]>,
    /// Rules packed in 16 bits ([`Arch::pack`]); 0 for the rare rule that
    /// does not pack, which is then in `extra`.
    packed: Box<[u16]>,
    /// `(row index, rule)` of the rows whose rule does not pack, sorted.
    extra: Box<[(u32, A::Rule)]>,
    /// FDEs with rows that must be evaluated: (start, end, where), sorted.
    eval_fdes: Box<[(u32, u32, FdeAt)]>,
    eh_frame_hdr: Option<(Bytes, u64)>,
    eh_frame: Option<(Bytes, u64)>,
    debug_frame: Option<Bytes>,
    text: u64,
    got: u64,
    stats: RowStats,
    cfi_bytes: usize,
}

/// Facts about a compiled table, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableStats {
    /// FDEs compiled.
    pub fdes: usize,
    /// CFI rows read from the FDEs.
    pub cfi_rows: usize,
    /// Rows of the compiled table (after merging equal neighbours).
    pub rows: usize,
    /// Rows that are evaluated directly from the CFI.
    pub evaluated_rows: usize,
    /// FDEs that could not be parsed and were skipped.
    pub bad_fdes: usize,
    /// Bytes of the compiled table (addresses and rules).
    pub table_bytes: usize,
    /// Bytes of the CFI sections it was compiled from.
    pub cfi_bytes: usize,
}

/// The sections to compile a table from, owned or `'static`.
#[derive(Debug, Default)]
pub struct SectionsInput {
    /// `.eh_frame_hdr` bytes and address.
    pub eh_frame_hdr: Option<(Vec<u8>, u64)>,
    /// `.eh_frame` bytes and address.
    pub eh_frame: Option<(Vec<u8>, u64)>,
    /// `.debug_frame` bytes.
    pub debug_frame: Option<Vec<u8>>,
    /// `.text` address.
    pub text: u64,
    /// `.got` address.
    pub got: u64,
}

impl<A: Arch> UnwindTable<A> {
    /// Compiles a table from owned section bytes at their addresses.
    ///
    /// ```no_run
    /// use callstack::unwind::{SectionsInput, UnwindTable};
    /// let secs = SectionsInput {
    ///     eh_frame: Some((std::fs::read("eh_frame.bin")?, 0x2000)),
    ///     ..Default::default()
    /// };
    /// let table: UnwindTable = UnwindTable::from_sections(secs)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_sections(s: SectionsInput) -> Result<Self, TableError> {
        Self::build(
            s.eh_frame_hdr.map(|(b, a)| (Bytes::Owned(b.into()), a)),
            s.eh_frame.map(|(b, a)| (Bytes::Owned(b.into()), a)),
            s.debug_frame.map(|b| Bytes::Owned(b.into())),
            s.text,
            s.got,
        )
    }

    /// A table without rows: every address is [`Arch::NO_CFI`] (a module
    /// without CFI, unwound with the frame-pointer rule).
    pub fn empty() -> Result<Self, TableError> {
        Self::build(None, None, Some(Bytes::Owned(Box::new([]))), 0, 0)
    }

    /// Compiles a table from sections that stay mapped for the life of the
    /// process (a loaded module's `.eh_frame`). Used for this process.
    pub fn from_static_sections(
        eh_frame_hdr: Option<(&'static [u8], u64)>,
        eh_frame: Option<(&'static [u8], u64)>,
    ) -> Result<Self, TableError> {
        Self::build(
            eh_frame_hdr.map(|(b, a)| (Bytes::Static(b), a)),
            eh_frame.map(|(b, a)| (Bytes::Static(b), a)),
            None,
            0,
            0,
        )
    }

    /// Reads an ELF file and compiles its `.eh_frame` (and `.debug_frame`,
    /// which binaries built with `-g` but without unwind tables only have).
    pub fn from_elf_file(path: impl AsRef<Path>) -> Result<Self, TableError> {
        let data = std::fs::read(path).map_err(TableError::Io)?;
        Self::from_elf_bytes(&data)
    }

    /// Compiles the CFI of an ELF image held in memory.
    pub fn from_elf_bytes(data: &[u8]) -> Result<Self, TableError> {
        use object::{Object, ObjectSection};
        let file = object::File::parse(data).map_err(|e| TableError::Elf(e.to_string()))?;
        let sec = |name: &str| -> Result<Option<(Vec<u8>, u64)>, TableError> {
            match file.section_by_name(name) {
                Some(s) if s.kind() != object::SectionKind::UninitializedData => {
                    let d = crate::elf_section::data(&s)
                        .map_err(|e| TableError::Elf(format!("{name}: {e}")))?;
                    Ok(Some((d.into_owned(), s.address())))
                }
                _ => Ok(None),
            }
        };
        let input = SectionsInput {
            eh_frame_hdr: sec(".eh_frame_hdr")?,
            eh_frame: sec(".eh_frame")?,
            debug_frame: sec(".debug_frame")?.map(|x| x.0),
            text: file
                .section_by_name(".text")
                .map(|s| s.address())
                .unwrap_or(0),
            got: file
                .section_by_name(".got")
                .map(|s| s.address())
                .unwrap_or(0),
        };
        if input.eh_frame.is_none() && input.debug_frame.is_none() {
            return Err(TableError::NoCfi);
        }
        Self::from_sections(input)
    }

    fn build(
        eh_frame_hdr: Option<(Bytes, u64)>,
        eh_frame: Option<(Bytes, u64)>,
        debug_frame: Option<Bytes>,
        text: u64,
        got: u64,
    ) -> Result<Self, TableError> {
        if eh_frame.is_none() && debug_frame.is_none() {
            return Err(TableError::NoCfi);
        }
        let cfi_bytes = eh_frame.as_ref().map(|x| x.0.get().len()).unwrap_or(0)
            + debug_frame.as_ref().map(|x| x.get().len()).unwrap_or(0);
        let secs = CfiSections {
            eh_frame_hdr: eh_frame_hdr.as_ref().map(|(b, a)| (b.get(), *a)),
            eh_frame: eh_frame.as_ref().map(|(b, a)| (b.get(), *a)),
            debug_frame: debug_frame.as_ref().map(|b| b.get()),
            text,
            got,
        };
        let mut raw: Vec<(u64, u64, A::Rule, FdeAt)> = Vec::new();
        let stats = cfi::for_each_row::<A>(&secs, |s, e, r, at| {
            if e > s {
                raw.push((s, e, r, at))
            }
        })
        .unwrap_or_default();
        // Stable sort: for overlapping FDEs, the later one in the section wins
        // ties the same way each time.
        raw.sort_by_key(|r| r.0);
        let base = raw.first().map(|r| r.0).unwrap_or(0);
        let end = raw.iter().map(|r| r.1).max().unwrap_or(0);
        if end - base > u32::MAX as u64 {
            return Err(TableError::TooLarge);
        }
        let mut addrs: Vec<u32> = Vec::with_capacity(raw.len());
        let mut rules: Vec<A::Rule> = Vec::with_capacity(raw.len());
        let mut eval: Vec<(u32, u32, FdeAt)> = Vec::new();
        let mut covered_to = base;
        for &(s, e, rule, at) in &raw {
            // A gap between FDEs is code without CFI, unless it is only the
            // alignment padding before a 16-byte aligned function (then the
            // rule before it runs on: padding is never executed and no
            // return address points into it).
            let padding = s > covered_to && (covered_to + 15) & !15 == s;
            if s > covered_to && !padding && rules.last() != Some(&A::NO_CFI) {
                addrs.push((covered_to - base) as u32);
                rules.push(A::NO_CFI);
            }
            let off = (s - base) as u32;
            if rules.last() == Some(&rule) && (s <= covered_to || padding) && rule != A::EVALUATE {
                // Same rule as the row before and contiguous: merge.
            } else if addrs.last() == Some(&off) {
                *rules.last_mut().unwrap() = rule;
            } else {
                addrs.push(off);
                rules.push(rule);
            }
            if rule == A::EVALUATE {
                let es = (s - base) as u32;
                let ee = (e - base) as u32;
                match eval.last_mut() {
                    Some(l) if l.2 == at => l.1 = l.1.max(ee),
                    _ => eval.push((es, ee, at)),
                }
            }
            covered_to = covered_to.max(e);
        }
        addrs.push((end - base) as u32);
        rules.push(A::NO_CFI);
        eval.sort_by_key(|x| x.0);
        let mut extra = Vec::new();
        let packed: Vec<u16> = rules
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let p = A::pack(r);
                if p == 0 {
                    extra.push((i as u32, r));
                }
                p
            })
            .collect();
        Ok(UnwindTable {
            base,
            end,
            addrs: addrs.into_boxed_slice(),
            packed: packed.into_boxed_slice(),
            extra: extra.into_boxed_slice(),
            eval_fdes: eval.into_boxed_slice(),
            eh_frame_hdr,
            eh_frame,
            debug_frame,
            text,
            got,
            stats,
            cfi_bytes,
        })
    }

    /// The rule of the address `svma` (a lookup address: a return address
    /// minus one, or an exact pc). Addresses outside the table are
    /// [`Arch::NO_CFI`].
    #[inline]
    pub fn lookup(&self, svma: u64) -> A::Rule {
        if svma < self.base || svma >= self.end {
            return A::NO_CFI;
        }
        let off = (svma - self.base) as u32;
        let i = self.addrs.partition_point(|&a| a <= off);
        // `addrs[0] == 0 <= off`, so i >= 1.
        self.rule_at(i - 1)
    }

    #[inline]
    fn rule_at(&self, i: usize) -> A::Rule {
        match self.packed[i] {
            0 => match self.extra.binary_search_by_key(&(i as u32), |x| x.0) {
                Ok(k) => self.extra[k].1,
                Err(_) => A::EVALUATE,
            },
            p => A::unpack(p),
        }
    }

    /// The first and one-past-last address the table covers.
    pub fn range(&self) -> (u64, u64) {
        (self.base, self.end)
    }

    /// The CFI sections the table was built from.
    pub fn sections(&self) -> CfiSections<'_> {
        CfiSections {
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|(b, a)| (b.get(), *a)),
            eh_frame: self.eh_frame.as_ref().map(|(b, a)| (b.get(), *a)),
            debug_frame: self.debug_frame.as_ref().map(|b| b.get()),
            text: self.text,
            got: self.got,
        }
    }

    /// Where the FDE of an [`Arch::EVALUATE`] row at `svma` is.
    pub fn fde_for_evaluation(&self, svma: u64) -> FdeAt {
        if svma < self.base {
            return FdeAt::Search;
        }
        let off = (svma - self.base).min(u32::MAX as u64) as u32;
        let i = self.eval_fdes.partition_point(|x| x.0 <= off);
        if i > 0 {
            let (s, e, at) = self.eval_fdes[i - 1];
            if s <= off && off < e {
                return at;
            }
        }
        FdeAt::Search
    }

    /// Iterates over the compiled rows: `(start address, rule)`, sorted.
    pub fn rows(&self) -> impl Iterator<Item = (u64, A::Rule)> + '_ {
        self.addrs
            .iter()
            .enumerate()
            .map(move |(i, &a)| (self.base + a as u64, self.rule_at(i)))
    }

    /// The memory the table holds, in bytes: its rows and the CFI it
    /// keeps a copy of (cheap: no walk over the rows, unlike
    /// [`UnwindTable::stats`]).
    pub fn heap_bytes(&self) -> usize {
        let owned = |b: &Bytes| match b {
            Bytes::Owned(b) => b.len(),
            Bytes::Static(_) => 0,
        };
        core::mem::size_of::<Self>()
            + self.addrs.len() * 4
            + self.packed.len() * 2
            + self.extra.len() * core::mem::size_of::<(u32, A::Rule)>()
            + self.eval_fdes.len() * core::mem::size_of::<(u32, u32, FdeAt)>()
            + self.eh_frame_hdr.as_ref().map_or(0, |(b, _)| owned(b))
            + self.eh_frame.as_ref().map_or(0, |(b, _)| owned(b))
            + self.debug_frame.as_ref().map_or(0, owned)
    }

    /// Counters and sizes of the table.
    pub fn stats(&self) -> TableStats {
        TableStats {
            fdes: self.stats.fdes,
            cfi_rows: self.stats.rows,
            rows: self.addrs.len(),
            evaluated_rows: (0..self.addrs.len())
                .filter(|&i| self.rule_at(i) == A::EVALUATE)
                .count(),
            bad_fdes: self.stats.bad_fdes,
            table_bytes: self.addrs.len() * 4
                + self.packed.len() * 2
                + self.extra.len() * core::mem::size_of::<(u32, A::Rule)>()
                + self.eval_fdes.len() * core::mem::size_of::<(u32, u32, FdeAt)>(),
            cfi_bytes: self.cfi_bytes,
        }
    }
}

/// The AArch64 rule forms the in-process rule cache and its hot loop apply
/// (`arch/aarch64/rule.rs`), checked on real CFI: tables of cross-built
/// fixtures (here, not in `arch`, which may not import `unwind`).
#[cfg(test)]
mod aarch64_rule_forms {
    use super::UnwindTable;
    use crate::arch::aarch64::{decode_fast, decode_wide, fast_form, wide_word, Aarch64};
    use crate::arch::Arch;

    /// The return addresses of the named functions of an AArch64 ELF: the
    /// address after each `bl`/`blr` inside them.
    fn return_addresses(elf: &[u8], prefix: &str) -> Vec<(String, u64)> {
        use object::{Object, ObjectSection, ObjectSymbol};
        let file = object::File::parse(elf).unwrap();
        let text = file.section_by_name(".text").unwrap();
        let (base, data) = (text.address(), text.data().unwrap());
        let mut v = Vec::new();
        for s in file.symbols() {
            let Ok(name) = s.name() else { continue };
            if !name.starts_with(prefix) || s.size() == 0 {
                continue;
            }
            for a in (s.address()..s.address() + s.size()).step_by(4) {
                let i = (a - base) as usize;
                let w = u32::from_le_bytes(data[i..i + 4].try_into().unwrap());
                if w & 0xfc00_0000 == 0x9400_0000 || w & 0xffff_fc1f == 0xd63f_0000 {
                    v.push((name.to_string(), a + 4));
                }
            }
        }
        v.sort();
        v
    }

    /// Real AArch64 CFI (gcc -O0/-O2, with and without frame pointers,
    /// frames from 16 bytes to 200 KiB, callee-saved registers kept across
    /// calls): every return address of the fixture has a rule the hot loop
    /// applies, narrow or wide, and the narrow forms cover the frames up to
    /// 8 KiB of the frame-record shape.
    #[test]
    fn real_cfi_packs_into_the_hot_loops_forms() {
        let cc = if cfg!(target_arch = "aarch64") {
            std::env::var("CALLSTACK_TEST_CC").unwrap_or_else(|_| "gcc".into())
        } else {
            "aarch64-linux-gnu-gcc".into()
        };
        if std::process::Command::new(&cc)
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("skipping: {cc} missing (run scripts/install-test-deps.sh)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("callstack-a64-rules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut src = String::from("typedef void (*cb_t)(void *);\n");
        let sizes = [16, 100, 300, 2600, 5000, 9000, 70000, 200000];
        for (i, n) in sizes.iter().enumerate() {
            let call = if i + 1 == sizes.len() {
                "cb(arg); int r = d;".to_string()
            } else {
                format!("int r = fx_{}(cb, arg, d + 1);", i + 1)
            };
            let keep = if i % 2 == 1 {
                "int k1 = d * 3, k2 = d * 5, k3 = d * 7, k4 = d * 11;"
            } else {
                "int k1 = 0, k2 = 0, k3 = 0, k4 = 0;"
            };
            src += &format!(
                "int fx_{}(cb_t cb, void *arg, int d);\n\
                 int fx_{i}(cb_t cb, void *arg, int d) {{ volatile char buf[{n}]; {keep} \
                 buf[0] = (char)d; {call} return r + buf[0] + k1 + k2 + k3 + k4; }}\n",
                i + 1
            );
        }
        src += "int fx_leafcall(cb_t cb, void *arg) { cb(arg); return 1; }\n";
        // Every callee-saved register kept across the call (x19-x28 and
        // d8-d15 saved with x29, x30: 20 rules in a row).
        src += "double fx_many(cb_t cb, void *arg, long *v, double *w) {\n\
                long a0 = v[0], a1 = v[1], a2 = v[2], a3 = v[3], a4 = v[4], a5 = v[5], \
                a6 = v[6], a7 = v[7], a8 = v[8], a9 = v[9];\n\
                double d0 = w[0], d1 = w[1], d2 = w[2], d3 = w[3], d4 = w[4], d5 = w[5], \
                d6 = w[6], d7 = w[7];\n\
                cb(arg);\n\
                return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 \
                + d0 * d1 + d2 * d3 + d4 * d5 + d6 * d7; }\n";
        let c = dir.join("a64_rules.c");
        std::fs::write(&c, src).unwrap();
        let (mut narrow, mut wide) = (0, 0);
        for flags in [
            &["-O0"][..],
            &["-O2", "-fomit-frame-pointer"],
            &["-O2", "-fno-omit-frame-pointer"],
        ] {
            let so = dir.join("liba64_rules.so");
            let st = std::process::Command::new(&cc)
                .args(flags)
                .args(["-fasynchronous-unwind-tables", "-shared", "-fPIC", "-o"])
                .arg(&so)
                .arg(&c)
                .status()
                .unwrap();
            assert!(st.success(), "{cc} {flags:?}");
            let elf = std::fs::read(&so).unwrap();
            let table = UnwindTable::<Aarch64>::from_elf_bytes(&elf).expect("the CFI");
            let ras = return_addresses(&elf, "fx_");
            // The in-process cold path (`cfi::rule_at`: the fast
            // interpreter, gimli for the rows it declines) gives the
            // table's rules, so that they are cached as the table's are.
            let file = object::File::parse(&*elf).unwrap();
            let sec = |n: &str| {
                use object::{Object, ObjectSection};
                file.section_by_name(n)
                    .map(|s| (s.data().unwrap(), s.address()))
            };
            let secs = crate::unwind::cfi::CfiSections {
                eh_frame_hdr: sec(".eh_frame_hdr"),
                eh_frame: sec(".eh_frame"),
                debug_frame: None,
                text: 0,
                got: 0,
            };
            let memo = Default::default();
            for (f, ra) in &ras {
                assert_eq!(
                    crate::unwind::cfi::rule_at::<Aarch64>(&secs, ra - 1, &memo),
                    table.lookup(ra - 1),
                    "{flags:?} {f} at {ra:#x}"
                );
            }
            assert!(ras.len() >= sizes.len() + 2, "{flags:?}: {ras:?}");
            for (f, ra) in ras {
                let rule = table.lookup(ra - 1);
                let p = Aarch64::pack(rule);
                let form = match p >> 14 {
                    1 | 2 => {
                        narrow += 1;
                        decode_fast(p)
                    }
                    0 => {
                        wide += 1;
                        wide_word(rule).map(decode_wide)
                    }
                    _ => None,
                };
                assert!(
                    form.is_some() && form == fast_form(rule),
                    "{flags:?} {f} at {ra:#x}: {rule:?} packs as {p:#x}"
                );
            }
        }
        // The big frames (over 8 KiB) are wide, the others narrow.
        assert!(narrow > wide && wide >= 3, "narrow {narrow}, wide {wide}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
