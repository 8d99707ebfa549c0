//! Profiles: stacks with counted values, as a sampling profiler or a
//! memory tracker produces them, and the writers that turn them into the
//! formats the tools of the field read.
//!
//! A [`Profile`] holds the modules of the profiled process, its
//! deduplicated stacks (raw addresses, symbolizable elsewhere) and, per
//! stack, one value for each of its [`ValueType`]s: `samples/count` and
//! `cpu/nanoseconds` for a CPU profile; `alloc_objects/count`,
//! `alloc_space/bytes`, `inuse_objects/count`, `inuse_space/bytes` for a
//! heap profile. It also keeps the sampling period, the duration, the
//! number of lost samples and the thread names.
//!
//! - Stored in the callstack trace file (`docs/trace-format.md`, records
//!   `P`, `T`, `V`, `E` beside the `M` and `S` records): [`Profile::write_trace`],
//!   [`Profile::read_trace`]. Readers that predate profiles still see the
//!   modules and stacks.
//! - Names: [`Names`] maps every address of a profile to its functions
//!   (with the `symbolize` feature, [`Names::symbolize`] does it from the
//!   modules' files; [`Names::resolve`] takes any resolver).
//! - Writers: folded stacks ([`write_folded`], what `inferno` and
//!   `flamegraph.pl` read), pprof protobuf ([`pprof::encode`], gzip'd with
//!   [`pprof::write_gzip`] under the `pprof` feature, what `go tool pprof`,
//!   Pyroscope and Parca read) and a top-N table ([`top`]).
//!
//! ```
//! use callstack::profile::{Profile, Names, write_folded};
//! let mut p = Profile::cpu(1000);
//! p.add(&[0x1000, 0x2000], true, None, &[1, 1_000_000]);
//! p.add(&[0x1000, 0x2000], true, None, &[1, 1_000_000]);
//! assert_eq!(p.stacks.len(), 1);
//! assert_eq!(p.stacks[0].values, vec![2, 2_000_000]);
//! let names = Names::resolve(&p, |addr, _exact| {
//!     vec![callstack::profile::FrameName::function(format!("f{addr:x}"))]
//! });
//! let mut out = Vec::new();
//! write_folded(&p, &names, 0, &mut out).unwrap();
//! assert_eq!(String::from_utf8(out).unwrap(), "f2000;f1000 2\n");
//! ```

mod file;
mod kernel;
mod kernel_cache;
pub mod pprof;

pub use kernel::{kernel_symbols_for, KernelSymbol};

use crate::tracefile::ModuleRecord;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

/// The path of the module record that stands for the kernel: its frames
/// are named from the profile's [`Profile::kernel_symbols`] (read from
/// `/proc/kallsyms` when recording), or, for a recording without them,
/// from `/proc/kallsyms` of the machine that reports; `_[k]` is appended
/// to their names, as perf's flamegraphs do.
pub const KERNEL_MODULE: &str = "[kernel.kallsyms]";

/// What one value of a sample counts: a name and a unit, as in pprof
/// (`samples`/`count`, `cpu`/`nanoseconds`, `alloc_space`/`bytes`...).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValueType {
    /// What is counted (`samples`, `cpu`, `alloc_objects`, `inuse_space`...).
    pub name: String,
    /// Its unit (`count`, `nanoseconds`, `bytes`).
    pub unit: String,
}

impl ValueType {
    /// A value type from its name and unit.
    pub fn new(name: impl Into<String>, unit: impl Into<String>) -> Self {
        ValueType {
            name: name.into(),
            unit: unit.into(),
        }
    }
}

/// The process a thread belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadProcess {
    /// The process id.
    pub pid: u32,
    /// The process's name (`/proc/PID/comm`: the program's name cut at 15
    /// bytes), empty when unknown.
    pub name: String,
}

/// One distinct stack of a profile and its values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileStack {
    /// The addresses, innermost first; return addresses except `frames[0]`
    /// when `first_is_exact` and the frames `exact` lists.
    pub frames: Vec<usize>,
    /// Whether `frames[0]` is an exact pc (an interrupted instruction).
    pub first_is_exact: bool,
    /// The indices (ascending, each above 0) of the other frames that are
    /// exact pcs: a sample's interrupted user pc after its kernel frames,
    /// a pc found through a signal frame. Looked up as is, not as the
    /// byte before (see [`ProfileStack::is_exact`]).
    pub exact: Vec<u32>,
    /// The thread the stack was seen on, when the profile keeps threads
    /// apart (`None`: all threads together).
    pub thread: Option<u32>,
    /// One value per [`Profile::sample_types`] entry.
    pub values: Vec<i64>,
}

impl ProfileStack {
    /// Whether `frames[i]` is an exact pc (looked up as is) rather than a
    /// return address (looked up at the byte before: the call).
    pub fn is_exact(&self, i: usize) -> bool {
        if i == 0 {
            self.first_is_exact
        } else {
            u32::try_from(i).is_ok_and(|i| self.exact.binary_search(&i).is_ok())
        }
    }
}

/// A profile: modules, deduplicated stacks and their values. See the
/// [module documentation](self).
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// What each value of a stack counts (at least one).
    pub sample_types: Vec<ValueType>,
    /// The index in `sample_types` that viewers show by default.
    pub default_sample_type: usize,
    /// What the sampling period counts (`cpu`/`nanoseconds` for a CPU
    /// profile), if the profile is sampled.
    pub period_type: Option<ValueType>,
    /// The sampling period, in `period_type` units (0: not sampled).
    pub period: i64,
    /// When profiling started, nanoseconds since the Unix epoch (0: unknown).
    pub start_time_ns: u64,
    /// How long profiling lasted, in nanoseconds (0: unknown).
    pub duration_ns: u64,
    /// Samples that were taken but could not be kept (a full ring, a
    /// stack that could not be read, records the kernel dropped).
    pub lost: u64,
    /// The modules of the profiled process, in the order they were added.
    pub modules: Vec<ModuleRecord>,
    /// Thread names by thread id.
    pub threads: BTreeMap<u32, String>,
    /// The distinct stacks with their values.
    pub stacks: Vec<ProfileStack>,
    /// The kernel functions the stacks' kernel frames fall in (those of
    /// the [`KERNEL_MODULE`] range), sorted by start: stored by the
    /// recorder so that a report names them on any machine. Empty when the
    /// profile has no kernel frames or predates them.
    pub kernel_symbols: Vec<KernelSymbol>,
    /// The process of each thread (by thread id), for a recording of
    /// several processes (`callstack record -a`): pprof's `pid` and
    /// `comm` labels of its samples.
    pub thread_processes: BTreeMap<u32, ThreadProcess>,
    /// Free-text notes on the profile (pprof's `comment`: `go tool pprof
    /// -comments`), such as what a recorder dropped to stay under its
    /// memory budget (`C` records of the trace file).
    pub comments: Vec<String>,
    /// Addresses the profile names itself, not from any file: frames of
    /// interpreted code put in place of their interpreter's (the CPython
    /// frames of `callstack record`, `python::record`), in a pseudo-module
    /// of their own; and JIT code (addresses in no module) named by the
    /// recorder from the processes' jitdump files and perf maps while they
    /// were there ([`Profile::name_jit_code`]), so that a report names it
    /// after the files are gone, or on another machine. Stored as `Y`
    /// records.
    pub named_frames: BTreeMap<u64, FrameName>,
    /// Stack hash -> indices in `stacks` with that hash.
    index: HashMap<u64, Vec<u32>, std::hash::BuildHasherDefault<KeyHasher>>,
}

/// The hasher of [`Profile`]'s index, whose keys are hashes already
/// ([`stack_key`]): mixed once more, not hashed again (a recorder adds
/// every sample through it).
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, k: u64) {
        // The high half folded into the low: hashbrown takes its bucket
        // from the low bits and its tag from the high ones.
        let m = (k ^ (k >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        self.0 = m ^ (m >> 32);
    }
}

fn stack_key(frames: &[usize], first_is_exact: bool, exact: &[u32], thread: Option<u32>) -> u64 {
    let mut h = crate::hash_frames(frames);
    for &i in exact {
        h = (h ^ u64::from(i)).wrapping_mul(0x100_0000_01b3);
    }
    let t = thread.map_or(0, |t| t as u64 + 1);
    h ^ (first_is_exact as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ t.wrapping_mul(0xc4ce_b9fe_1a85_ec53)
}

impl Profile {
    /// An empty profile counting `sample_types` (default: the first).
    pub fn new(sample_types: Vec<ValueType>) -> Self {
        Profile {
            sample_types,
            ..Default::default()
        }
    }

    /// An empty CPU profile sampled at `hz`: values `samples/count` and
    /// `cpu/nanoseconds` (default), period `1e9 / hz` `cpu/nanoseconds`.
    pub fn cpu(hz: u32) -> Self {
        let mut p = Profile::new(vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
        ]);
        p.default_sample_type = 1;
        p.period_type = Some(ValueType::new("cpu", "nanoseconds"));
        p.period = 1_000_000_000 / hz.max(1) as i64;
        p
    }

    /// An empty heap profile: values `alloc_objects/count`,
    /// `alloc_space/bytes`, `inuse_objects/count`, `inuse_space/bytes`
    /// (default: `inuse_space`), as Go's heap profiles.
    pub fn heap() -> Self {
        let mut p = Profile::new(vec![
            ValueType::new("alloc_objects", "count"),
            ValueType::new("alloc_space", "bytes"),
            ValueType::new("inuse_objects", "count"),
            ValueType::new("inuse_space", "bytes"),
        ]);
        p.default_sample_type = 3;
        p.period_type = Some(ValueType::new("space", "bytes"));
        p
    }

    /// The index of the sample type named `name` (e.g. `cpu`, `inuse_space`).
    pub fn sample_type_index(&self, name: &str) -> Option<usize> {
        self.sample_types.iter().position(|t| t.name == name)
    }

    /// Adds `values` (one per sample type; missing ones count 0, extra
    /// ones are ignored) to the stack `frames` of `thread`, creating the
    /// stack on first sight. Returns the stack's index in `stacks`.
    pub fn add(
        &mut self,
        frames: &[usize],
        first_is_exact: bool,
        thread: Option<u32>,
        values: &[i64],
    ) -> usize {
        self.add_exact(frames, first_is_exact, &[], thread, values)
    }

    /// [`Profile::add`] for a stack with exact pcs past its first frame:
    /// `exact`, their indices (see [`ProfileStack::exact`]; sorted here,
    /// index 0 and indices past the frames dropped).
    pub fn add_exact(
        &mut self,
        frames: &[usize],
        first_is_exact: bool,
        exact: &[u32],
        thread: Option<u32>,
        values: &[i64],
    ) -> usize {
        // The exact frames' indices, sorted, once each, past the first
        // (copied only when they are not so already, or for a new stack).
        let normal = exact.windows(2).all(|w| w[0] < w[1])
            && exact.iter().all(|&i| i > 0 && (i as usize) < frames.len());
        let owned: Vec<u32>;
        let exact: &[u32] = if normal {
            exact
        } else {
            let mut v: Vec<u32> = exact
                .iter()
                .copied()
                .filter(|&i| i > 0 && (i as usize) < frames.len())
                .collect();
            v.sort_unstable();
            v.dedup();
            owned = v;
            &owned
        };
        let key = stack_key(frames, first_is_exact, exact, thread);
        let n = self.sample_types.len();
        let slot = self.index.entry(key).or_default();
        let found = slot.iter().map(|&i| i as usize).find(|&i| {
            let s = &self.stacks[i];
            s.frames == frames
                && s.first_is_exact == first_is_exact
                && s.exact == exact
                && s.thread == thread
        });
        let i = match found {
            Some(i) => i,
            None => {
                let i = self.stacks.len();
                slot.push(i as u32);
                self.stacks.push(ProfileStack {
                    frames: frames.to_vec(),
                    first_is_exact,
                    exact: exact.to_vec(),
                    thread,
                    values: vec![0; n],
                });
                i
            }
        };
        let s = &mut self.stacks[i];
        s.values.resize(n, 0);
        for (v, &add) in s.values.iter_mut().zip(values) {
            *v = v.wrapping_add(add);
        }
        i
    }

    /// Adds one module record per object loaded in this process (call it
    /// from the profiled process, not from a signal handler).
    pub fn add_loaded_modules(&mut self) {
        for m in crate::modules::loaded_modules() {
            if m.is_vdso {
                continue;
            }
            let (start, end) = m.range();
            self.modules.push(ModuleRecord {
                path: m.path.clone(),
                build_id: m.build_id.clone(),
                start: start as u64,
                end: end as u64,
                bias: m.bias as u64,
            });
        }
    }

    /// The sum of sample type `i` over all stacks.
    pub fn total(&self, i: usize) -> i64 {
        self.stacks
            .iter()
            .map(|s| s.values.get(i).copied().unwrap_or(0))
            .fold(0i64, i64::wrapping_add)
    }

    /// Merges the stacks of all threads (`thread` becomes `None`).
    pub fn merge_threads(&mut self) {
        let stacks = std::mem::take(&mut self.stacks);
        self.index.clear();
        for s in stacks {
            self.add_exact(&s.frames, s.first_is_exact, &s.exact, None, &s.values);
        }
    }

    /// The module record containing `addr`, the last one added wins.
    pub fn module_of(&self, addr: u64) -> Option<&ModuleRecord> {
        self.modules
            .iter()
            .rev()
            .find(|m| m.start <= addr && addr < m.end)
    }

    /// Names the stacks' JIT code (addresses in no module, or in
    /// anonymous memory) from the recorded processes' jitdump files and
    /// perf maps, now, while they are there, and keeps the names in
    /// [`Profile::named_frames`]: what a recorder calls before it writes a
    /// profile. Addresses already named are not looked up again.
    #[cfg(feature = "symbolize")]
    pub fn name_jit_code(&mut self) {
        // Each address once, then each module's over them (a whole-host
        // profile has hundreds of modules and a million frames): those in
        // no module or in anonymous memory are wanted.
        let mut all: Vec<(u64, bool)> = self
            .stacks
            .iter()
            .flat_map(|s| {
                s.frames
                    .iter()
                    .enumerate()
                    .map(move |(i, &a)| (a as u64, s.is_exact(i)))
            })
            .filter(|(a, _)| !self.named_frames.contains_key(a))
            .collect();
        all.sort_unstable();
        all.dedup();
        // The last module added that holds an address wins, as in
        // `module_of`.
        let mut owner: Vec<Option<usize>> = vec![None; all.len()];
        for (k, m) in self.modules.iter().enumerate() {
            let lo = all.partition_point(|&(a, _)| a < m.start);
            let hi = all.partition_point(|&(a, _)| a < m.end);
            owner[lo..hi.max(lo)].fill(Some(k));
        }
        let wanted: Vec<(u64, bool)> = all
            .into_iter()
            .zip(owner)
            .filter(|(_, o)| o.is_none_or(|k| is_anonymous(&self.modules[k])))
            .map(|(w, _)| w)
            .collect();
        if wanted.is_empty() {
            return;
        }
        let sources = jit_sources(self);
        if sources.is_empty() {
            return;
        }
        for (addr, exact) in wanted {
            let probe = if exact { addr } else { addr.wrapping_sub(1) };
            if self.named_frames.contains_key(&addr) {
                continue;
            }
            if let Some(f) = sources.iter().find_map(|s| s.lookup(probe)) {
                self.named_frames.insert(
                    addr,
                    FrameName {
                        function: f.name,
                        file: f.file,
                        line: f.line,
                        inlined: false,
                    },
                );
            }
        }
    }
}

/// One function at an address (an inlined function or the real one).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FrameName {
    /// The function's name (or `module+0xoffset` / `0xaddress` when
    /// nothing names it).
    pub function: String,
    /// Its source file, if known.
    pub file: Option<String>,
    /// The line, if known.
    pub line: Option<u32>,
    /// Whether it is inlined into the next name of the address.
    pub inlined: bool,
}

impl FrameName {
    /// A name with no file or line.
    pub fn function(name: impl Into<String>) -> Self {
        FrameName {
            function: name.into(),
            file: None,
            line: None,
            inlined: false,
        }
    }
}

/// The names of every address of a profile: for each (address, exact),
/// its functions innermost (inlined) first, the real function last (never
/// empty).
#[derive(Clone, Debug, Default)]
pub struct Names {
    map: HashMap<(usize, bool), Vec<FrameName>>,
}

impl Names {
    /// Names every address of `profile` with `resolve(address, exact)`
    /// (innermost first; an empty answer becomes `module+0xoffset`), but
    /// for those the profile names itself ([`Profile::named_frames`]).
    pub fn resolve(
        profile: &Profile,
        mut resolve: impl FnMut(usize, bool) -> Vec<FrameName>,
    ) -> Names {
        let mut map = HashMap::new();
        for s in &profile.stacks {
            for (i, &a) in s.frames.iter().enumerate() {
                let exact = s.is_exact(i);
                map.entry((a, exact)).or_insert_with(|| {
                    if let Some(n) = profile.named_frames.get(&(a as u64)) {
                        return vec![n.clone()];
                    }
                    let v = resolve(a, exact);
                    if v.is_empty() {
                        vec![FrameName::function(unknown_name(profile, a))]
                    } else {
                        v
                    }
                });
            }
        }
        Names { map }
    }

    /// Names every address `module+0xoffset` (or `0xaddress`), without
    /// reading any file.
    pub fn unresolved(profile: &Profile) -> Names {
        Names::resolve(profile, |_, _| Vec::new())
    }

    /// Names every address from the modules' files and debug info
    /// ([`crate::Symbolizer`]), found as `callstack symbolize` finds them:
    /// at the recorded path (under `sysroot` first), checked by build-id,
    /// else under `debug_dirs`' `.build-id/`.
    #[cfg(feature = "symbolize")]
    pub fn symbolize(
        profile: &Profile,
        sysroot: Option<&std::path::Path>,
        debug_dirs: &[std::path::PathBuf],
    ) -> Names {
        let mut sym = Names::symbolizer(profile, sysroot, debug_dirs);
        Names::symbolize_with(profile, &mut sym)
    }

    /// The [`crate::Symbolizer`] [`Names::symbolize`] uses for `profile`'s
    /// modules: keep it to name the next profile of the same modules with
    /// [`Names::symbolize_with`] (a recording cut into periods) without
    /// reading their files again.
    #[cfg(feature = "symbolize")]
    pub fn symbolizer(
        profile: &Profile,
        sysroot: Option<&std::path::Path>,
        debug_dirs: &[std::path::PathBuf],
    ) -> crate::Symbolizer {
        let modules = Names::module_infos(profile, sysroot);
        let mut sym = crate::Symbolizer::from_modules(modules);
        for d in debug_dirs {
            sym.add_debug_dir(d.clone());
        }
        sym
    }

    /// `profile`'s modules as a symbolizer takes them (each path under
    /// `sysroot` first, when there): for [`crate::Symbolizer::set_modules`],
    /// which gives the symbolizer of one period the modules of the next,
    /// keeping the files it has open.
    #[cfg(feature = "symbolize")]
    pub fn module_infos(
        profile: &Profile,
        sysroot: Option<&std::path::Path>,
    ) -> Vec<crate::symbolize::ModuleInfo> {
        profile
            .modules
            .iter()
            .map(|m| crate::symbolize::ModuleInfo {
                path: match sysroot {
                    Some(root) => {
                        let p = root.join(m.path.strip_prefix("/").unwrap_or(&m.path));
                        if p.exists() {
                            p
                        } else {
                            m.path.clone()
                        }
                    }
                    None => m.path.clone(),
                },
                build_id: m.build_id.clone(),
                start: m.start as usize,
                end: m.end as usize,
                bias: Some(m.bias as usize),
            })
            .collect()
    }

    /// [`Names::symbolize`] with `sym`, made by [`Names::symbolizer`] for a
    /// profile of the same modules (or given them since with
    /// [`crate::Symbolizer::set_modules`]).
    #[cfg(feature = "symbolize")]
    pub fn symbolize_with(profile: &Profile, sym: &mut crate::Symbolizer) -> Names {
        use crate::symbolize::{Address, Symbolizer};
        // The vDSO has no file: named from this process's own image when
        // its build-id is the recorded one (same kernel).
        // Every process's vDSO (a whole-host recording has one per process,
        // each at its own address) with this kernel's build-id.
        let mut vdso = crate::modules::vdso_image()
            .and_then(|image| Symbolizer::for_bytes(image).ok())
            .and_then(|s| {
                let id = s.modules().next().and_then(|x| x.build_id.clone())?;
                let ranges: Vec<&ModuleRecord> = profile
                    .modules
                    .iter()
                    .filter(|m| m.path.as_os_str() == "[vdso]" && m.build_id.as_ref() == Some(&id))
                    .collect();
                (!ranges.is_empty()).then_some((ranges, s))
            });
        // Kernel frames: from the symbols stored in the recording, else
        // (an older recording) from this machine's /proc/kallsyms.
        let kernel = profile
            .modules
            .iter()
            .find(|m| m.path.as_os_str() == KERNEL_MODULE)
            .map(|m| {
                let syms = if profile.kernel_symbols.is_empty() {
                    let probes = profile.stacks.iter().flat_map(|s| {
                        s.frames.iter().enumerate().filter_map(|(i, &a)| {
                            let a = a as u64;
                            let exact = s.is_exact(i);
                            (m.start <= a && a < m.end).then(|| a - u64::from(!exact))
                        })
                    });
                    std::borrow::Cow::Owned(kernel::kernel_symbols_for(probes).unwrap_or_default())
                } else {
                    std::borrow::Cow::Borrowed(&profile.kernel_symbols[..])
                };
                (m.start, m.end, syms)
            });
        // JIT code (in no module): named from the perf maps of the
        // recorded processes (`/tmp/perf-PID.map`), read when the first
        // such address comes, if the files are still there.
        // The names the recorder kept ([`Profile::named_frames`]) come
        // first (`Names::resolve`); else the files, if still there.
        let mut jit: Option<Vec<crate::symbolize::jit::JitSources>> = None;
        Names::resolve(profile, |a, exact| {
            if profile.module_of(a as u64).is_none_or(is_anonymous) {
                let sources = jit.get_or_insert_with(|| jit_sources(profile));
                let probe = if exact {
                    a as u64
                } else {
                    (a as u64).wrapping_sub(1)
                };
                return sources
                    .iter()
                    .find_map(|s| s.lookup(probe))
                    .map(|f| {
                        vec![FrameName {
                            function: f.name,
                            file: f.file,
                            line: f.line,
                            inlined: false,
                        }]
                    })
                    .unwrap_or_default();
            }
            if let Some((lo, hi, syms)) = &kernel {
                if *lo <= a as u64 && (a as u64) < *hi {
                    let probe = if exact { a as u64 } else { a as u64 - 1 };
                    return match kernel::find(syms, probe) {
                        Some(s) => vec![FrameName::function(format!("{}_[k]", s.name))],
                        None => Vec::new(),
                    };
                }
            }
            let addr = if exact {
                Address::Exact(a)
            } else {
                Address::Return(a)
            };
            let in_vdso = vdso.as_mut().and_then(|(ranges, s)| {
                let m = ranges
                    .iter()
                    .find(|m| m.start <= a as u64 && (a as u64) < m.end)?;
                Some((m.bias, s))
            });
            let r = match in_vdso {
                Some((bias, s)) => {
                    let link = (a as u64).wrapping_sub(bias) as usize;
                    s.symbolize(if exact {
                        Address::Exact(link)
                    } else {
                        Address::Return(link)
                    })
                }
                None => sym.symbolize(addr),
            };
            r.frames
                .iter()
                .filter_map(|f| {
                    Some(FrameName {
                        function: f.function.as_deref()?.to_string(),
                        file: f.file.as_deref().map(str::to_string),
                        line: f.line,
                        inlined: f.inlined,
                    })
                })
                .collect()
        })
    }

    /// Only the addresses the profile names itself
    /// ([`Profile::named_frames`]: interpreted and JIT code), the others
    /// left for a server to name from the modules' files by build-id:
    /// what `record --no-symbolize` writes.
    pub fn own(profile: &Profile) -> Names {
        let mut map = HashMap::new();
        for s in &profile.stacks {
            for (i, &a) in s.frames.iter().enumerate() {
                if let Some(n) = profile.named_frames.get(&(a as u64)) {
                    map.insert((a, s.is_exact(i)), vec![n.clone()]);
                }
            }
        }
        Names { map }
    }

    /// Whether no address is named (`Names::default()`).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The names of `addr` (innermost first), if the profile had it.
    pub fn get(&self, addr: usize, exact: bool) -> Option<&[FrameName]> {
        self.map.get(&(addr, exact)).map(Vec::as_slice)
    }

    fn of(&self, addr: usize, exact: bool) -> &[FrameName] {
        self.get(addr, exact).unwrap_or(&[])
    }

    /// The function names of a stack, outermost (root) first, inlined
    /// functions expanded.
    pub fn stack_names<'a>(&'a self, s: &ProfileStack) -> Vec<&'a str> {
        let mut out = Vec::with_capacity(s.frames.len());
        for (i, &a) in s.frames.iter().enumerate().rev() {
            let exact = s.is_exact(i);
            for f in self.of(a, exact).iter().rev() {
                out.push(f.function.as_str());
            }
        }
        out
    }
}

/// Whether a module record is anonymous executable memory (the kernel's
/// `//anon` of a perf `MMAP` record, a named `[anon:...]` region): JIT
/// code, named by perf maps rather than by a file.
#[cfg(feature = "symbolize")]
fn is_anonymous(m: &ModuleRecord) -> bool {
    let p = m.path.as_os_str().to_string_lossy();
    p == "//anon" || p.starts_with("[anon")
}

/// The JIT sources of the processes a profile recorded (of each process of
/// a whole-host recording, else of each thread id: a process's main thread
/// has its pid): each one's perf map, and the jitdump files among the
/// profile's modules (a runtime maps its `jit-PID.dump` for perf to find).
#[cfg(feature = "symbolize")]
fn jit_sources(profile: &Profile) -> Vec<crate::symbolize::jit::JitSources> {
    use crate::symbolize::jit::{is_jitdump, JitSources};
    let mut pids: Vec<u32> = profile.thread_processes.values().map(|p| p.pid).collect();
    pids.extend(profile.threads.keys().copied());
    pids.extend(profile.stacks.iter().filter_map(|s| s.thread));
    pids.sort_unstable();
    pids.dedup();
    let dumps: Vec<&std::path::Path> = profile
        .modules
        .iter()
        .map(|m| m.path.as_path())
        .filter(|p| is_jitdump(p))
        .collect();
    pids.into_iter()
        .map(|pid| {
            let own = format!("jit-{pid}.dump");
            let mine = dumps
                .iter()
                .copied()
                .filter(|p| p.file_name().is_some_and(|n| n == own.as_str()));
            JitSources::for_process(pid, mine, &mut |w| eprintln!("callstack: warning: {w}"))
        })
        .filter(|s| !s.is_empty())
        .collect()
}

fn unknown_name(profile: &Profile, addr: usize) -> String {
    match profile.module_of(addr as u64) {
        Some(m) => {
            let base = m
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            format!("{base}+{:#x}", (addr as u64).wrapping_sub(m.bias))
        }
        None => format!("{addr:#x}"),
    }
}

/// Writes the profile as folded stacks for sample type `sample_type`:
/// one line per distinct call path, `root;caller;...;leaf VALUE`, sorted,
/// paths with a zero value left out. What `inferno-flamegraph` and
/// `flamegraph.pl` read. Semicolons in names become `:`.
pub fn write_folded(
    profile: &Profile,
    names: &Names,
    sample_type: usize,
    out: &mut impl Write,
) -> io::Result<()> {
    for (line, v) in folded(profile, names, sample_type) {
        writeln!(out, "{line} {v}")?;
    }
    Ok(())
}

/// The folded lines of [`write_folded`], as (path, value) sorted by path.
pub fn folded(profile: &Profile, names: &Names, sample_type: usize) -> BTreeMap<String, i64> {
    let mut lines: BTreeMap<String, i64> = BTreeMap::new();
    for s in &profile.stacks {
        let v = s.values.get(sample_type).copied().unwrap_or(0);
        if v == 0 {
            continue;
        }
        let mut line = String::new();
        for (k, n) in names.stack_names(s).into_iter().enumerate() {
            if k > 0 {
                line.push(';');
            }
            line.extend(n.chars().map(|c| if c == ';' { ':' } else { c }));
        }
        if line.is_empty() {
            line.push_str("[no frames]");
        }
        *lines.entry(line).or_insert(0) += v;
    }
    lines
}

/// One function of a [`top`] table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopEntry {
    /// The function.
    pub function: String,
    /// The value of the stacks where it is the innermost function.
    pub self_value: i64,
    /// The value of the stacks where it appears at all (once per stack,
    /// however often it recurses).
    pub total_value: i64,
}

/// The functions of the profile by self value of sample type
/// `sample_type`, highest first (ties by total, then name).
pub fn top(profile: &Profile, names: &Names, sample_type: usize) -> Vec<TopEntry> {
    let mut by: HashMap<&str, (i64, i64)> = HashMap::new();
    let mut seen: Vec<&str> = Vec::new();
    for s in &profile.stacks {
        let v = s.values.get(sample_type).copied().unwrap_or(0);
        if v == 0 {
            continue;
        }
        let path = names.stack_names(s);
        if let Some(&leaf) = path.last() {
            by.entry(leaf).or_default().0 += v;
        }
        seen.clear();
        for &n in &path {
            if !seen.contains(&n) {
                seen.push(n);
                by.entry(n).or_default().1 += v;
            }
        }
    }
    let mut v: Vec<TopEntry> = by
        .into_iter()
        .map(|(f, (s, t))| TopEntry {
            function: f.to_string(),
            self_value: s,
            total_value: t,
        })
        .collect();
    v.sort_by(|a, b| {
        b.self_value
            .cmp(&a.self_value)
            .then(b.total_value.cmp(&a.total_value))
            .then(a.function.cmp(&b.function))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Profile, Names) {
        let mut p = Profile::cpu(100);
        p.modules.push(ModuleRecord {
            path: "/bin/app".into(),
            build_id: Some(vec![0xab; 20]),
            start: 0x1000,
            end: 0x9000,
            bias: 0x1000,
        });
        p.threads.insert(7, "worker".into());
        p.thread_processes.insert(
            7,
            ThreadProcess {
                pid: 5,
                name: "app".into(),
            },
        );
        // main -> a -> hot (7), main -> b (3)
        for _ in 0..7 {
            p.add(&[0x1100, 0x1200, 0x1300], true, Some(7), &[1, 10_000_000]);
        }
        for _ in 0..3 {
            p.add(&[0x1400, 0x1300], true, Some(7), &[1, 10_000_000]);
        }
        p.lost = 2;
        p.duration_ns = 123;
        p.comments = vec!["one note".into(), "another".into()];
        p.kernel_symbols = vec![
            KernelSymbol {
                start: 0xffff_ffff_8100_0000,
                end: 0xffff_ffff_8100_0040,
                name: "k_one".into(),
            },
            KernelSymbol {
                start: 0xffff_ffff_8100_0100,
                end: 0xffff_ffff_8100_0180,
                name: "k_two".into(),
            },
        ];
        let names = Names::resolve(&p, |a, _| {
            let f = match a {
                0x1100 => "hot",
                0x1200 => "a",
                0x1300 => "main",
                _ => return Vec::new(),
            };
            vec![FrameName::function(f)]
        });
        (p, names)
    }

    #[test]
    fn dedup_folded_top() {
        let (p, names) = sample();
        assert_eq!(p.stacks.len(), 2);
        assert_eq!(p.total(0), 10);
        let mut out = Vec::new();
        write_folded(&p, &names, 0, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "main;a;hot 7\nmain;app+0x400 3\n"
        );
        let t = top(&p, &names, 0);
        assert_eq!(t[0].function, "hot");
        assert_eq!((t[0].self_value, t[0].total_value), (7, 7));
        assert_eq!(t[1].function, "app+0x400");
        let main = t.iter().find(|e| e.function == "main").unwrap();
        assert_eq!((main.self_value, main.total_value), (0, 10));
    }

    #[test]
    fn trace_round_trip() {
        let (p, _) = sample();
        let mut buf = Vec::new();
        p.write_trace(&mut buf).unwrap();
        let q = Profile::read_trace(&buf[..]).unwrap();
        assert_eq!(q.sample_types, p.sample_types);
        assert_eq!(q.default_sample_type, 1);
        assert_eq!(q.period, p.period);
        assert_eq!(q.period_type, p.period_type);
        assert_eq!(q.stacks, p.stacks);
        assert_eq!(q.modules, p.modules);
        assert_eq!(q.threads, p.threads);
        assert_eq!(q.thread_processes, p.thread_processes);
        assert_eq!(q.thread_processes[&7].name, "app");
        assert_eq!(q.comments, p.comments);
        assert_eq!((q.lost, q.duration_ns), (2, 123));
        assert_eq!(q.kernel_symbols, p.kernel_symbols);
        assert_eq!(q.kernel_symbols.len(), 2);
        // An old reader sees the modules and the stacks.
        let t = crate::tracefile::read_all(&buf[..]).unwrap();
        assert_eq!(t.stacks.len(), 2);
        assert_eq!(t.stacks[0].tag, Some(7));
        // Every truncation reads without error.
        for cut in 12..buf.len() {
            let _ = Profile::read_trace(&buf[..cut]).unwrap();
        }
    }

    /// Exact pcs past the first frame (`I` records) survive the file, keep
    /// stacks apart, and are what the names are looked up with.
    #[test]
    fn exact_frames_round_trip() {
        let mut p = Profile::cpu(100);
        let frames = [0xffff_ffff_8100_0010usize, 0x1000, 0x2000];
        p.add_exact(&frames, true, &[1], Some(3), &[1, 10]);
        p.add_exact(&frames, true, &[1, 0, 9], Some(3), &[1, 10]);
        p.add(&frames, true, Some(3), &[1, 10]);
        assert_eq!(p.stacks.len(), 2, "{:?}", p.stacks);
        assert_eq!(p.stacks[0].exact, [1]);
        assert!(p.stacks[0].is_exact(0) && p.stacks[0].is_exact(1));
        assert!(!p.stacks[0].is_exact(2) && !p.stacks[1].is_exact(1));
        assert_eq!(p.stacks[0].values, [2, 20]);
        let mut buf = Vec::new();
        p.write_trace(&mut buf).unwrap();
        let q = Profile::read_trace(&buf[..]).unwrap();
        assert_eq!(q.stacks, p.stacks);
        // The trace reader gives them with the stack.
        let t = crate::tracefile::read_all(&buf[..]).unwrap();
        assert_eq!(t.stacks.len(), 2);
        assert_eq!(t.stacks[0].exact, [1]);
        assert!(t.stacks[0].is_exact(1) && !t.stacks[1].is_exact(1));
        let mut asked = Vec::new();
        Names::resolve(&q, |a, exact| {
            asked.push((a, exact));
            Vec::new()
        });
        asked.sort();
        assert_eq!(
            asked,
            [
                (0x1000, false),
                (0x1000, true),
                (0x2000, false),
                (0xffff_ffff_8100_0010, true)
            ]
        );
    }

    /// Kernel frames are named from the symbols stored in the profile (at
    /// addresses no kernel has: /proc/kallsyms cannot be what names them).
    #[cfg(feature = "symbolize")]
    #[test]
    fn kernel_frames_named_from_stored_symbols() {
        let (mut p, _) = sample();
        p.modules.push(ModuleRecord {
            path: KERNEL_MODULE.into(),
            build_id: None,
            start: 0xffff_ffff_8100_0000,
            end: 0xffff_ffff_8100_0200,
            bias: 0,
        });
        // k_two (exact leaf) <- k_one (return address just past its start)
        // <- k_one's end (a return address: named by the byte before it).
        p.add(
            &[
                0xffff_ffff_8100_0110,
                0xffff_ffff_8100_0001,
                0xffff_ffff_8100_0040,
                0x1300,
            ],
            true,
            None,
            &[1, 1],
        );
        // Past the end of every stored symbol: module+address.
        p.add(&[0xffff_ffff_8100_0190, 0x1300], true, None, &[1, 1]);
        let mut buf = Vec::new();
        p.write_trace(&mut buf).unwrap();
        let q = Profile::read_trace(&buf[..]).unwrap();
        let names = Names::symbolize(&q, None, &[]);
        let s = q.stacks.iter().find(|s| s.frames.len() == 4).unwrap();
        assert_eq!(
            names.stack_names(s)[1..],
            ["k_one_[k]", "k_one_[k]", "k_two_[k]"]
        );
        let s = q
            .stacks
            .iter()
            .find(|s| s.frames[0] == 0xffff_ffff_8100_0190)
            .unwrap();
        assert_eq!(
            names.stack_names(s)[1],
            "[kernel.kallsyms]+0xffffffff81000190"
        );
    }

    #[cfg(feature = "symbolize")]
    #[inline(never)]
    fn marker_function() -> usize {
        std::hint::black_box(7)
    }

    /// A whole-host profile has one module record per process that maps a
    /// file (each at its own address): the file is opened once, and the
    /// addresses of every process are named from it.
    #[cfg(feature = "symbolize")]
    #[test]
    fn one_open_file_for_every_process_mapping_it() {
        let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
        let m = crate::modules::loaded_modules()
            .into_iter()
            .find(|m| std::fs::canonicalize(&m.path).ok().as_ref() == Some(&exe))
            .expect("the test program among the loaded modules");
        let (start, end) = m.range();
        let (start, end, bias) = (start as u64, end as u64, m.bias as u64);
        let mut p = Profile::cpu(100);
        // Three "processes": two map the test program at other addresses
        // (one with no build-id recorded: known by path, size and time).
        let shifts = [0u64, 0x1000_0000_0000, 0x2000_0000_0000];
        for (k, d) in shifts.iter().enumerate() {
            p.modules.push(ModuleRecord {
                path: exe.clone(),
                build_id: if k == 2 { None } else { m.build_id.clone() },
                start: start + d,
                end: end + d,
                bias: bias + d,
            });
        }
        let f = marker_function as *const () as u64;
        assert_eq!(marker_function(), 7);
        for d in shifts {
            p.add(&[(f + d) as usize], true, Some(d as u32), &[1, 1]);
        }
        let mut sym = Names::symbolizer(&p, None, &[]);
        let names = Names::symbolize_with(&p, &mut sym);
        for s in &p.stacks {
            let n = names.stack_names(s);
            assert!(n[0].ends_with("marker_function"), "{n:?}");
        }
        // The records with the build-id share one open file (before: one
        // per record); the one without is known by path, size and time.
        let open = sym.open_modules();
        assert_eq!(sym.debug_info().count(), open.len());
        let with_id = open.iter().filter(|o| o.ranges == 2).count();
        assert_eq!(with_id, usize::from(m.build_id.is_some()), "{open:?}");
        assert!(open.len() <= 2, "{open:?}");

        // Over a budget: the least recently used closed, and opened again
        // when an address needs it.
        let closed = sym.evict_to(0);
        assert_eq!(closed.len(), open.len());
        assert!(sym.open_modules().is_empty());
        assert!(
            closed.iter().all(|c| c.bytes > 0 && c.path == exe),
            "{closed:?}"
        );
        sym.clear_cache();
        let again = Names::symbolize_with(&p, &mut sym);
        for s in &p.stacks {
            assert!(again.stack_names(s)[0].ends_with("marker_function"));
        }
        // The next period's modules: the file stays open.
        let before = sym.open_modules();
        p.modules.truncate(1);
        sym.set_modules(Names::module_infos(&p, None));
        let after = sym.open_modules();
        assert_eq!(after.len(), 1, "{after:?}");
        assert!(before.iter().any(|b| b.path == after[0].path));
    }

    /// Frames the profile names itself (`Y` records: the Python frames
    /// of `record`) survive the file, name their addresses in every
    /// output whatever the resolver says, and leave older readers the
    /// stacks.
    #[test]
    fn named_frames_round_trip() {
        let mut p = Profile::cpu(100);
        let base = 0x6000_0000_0000_0000u64;
        p.modules.push(ModuleRecord {
            path: "[python]".into(),
            build_id: None,
            start: base,
            end: base + 2,
            bias: 0,
        });
        p.named_frames.insert(
            base,
            FrameName {
                function: "Worker.spin".into(),
                file: Some("/srv/app.py".into()),
                line: Some(12),
                inlined: false,
            },
        );
        p.named_frames.insert(
            base + 1,
            FrameName {
                function: "<module>".into(),
                file: None,
                line: None,
                inlined: false,
            },
        );
        p.add_exact(
            &[base as usize, base as usize + 1, 0x1300],
            true,
            &[1],
            Some(3),
            &[1, 10],
        );
        let mut buf = Vec::new();
        p.write_trace(&mut buf).unwrap();
        let q = Profile::read_trace(&buf[..]).unwrap();
        assert_eq!(q.named_frames, p.named_frames);
        let names = Names::resolve(&q, |_, _| vec![FrameName::function("main")]);
        assert_eq!(
            names.stack_names(&q.stacks[0]),
            ["main", "<module>", "Worker.spin"]
        );
        assert_eq!(names.get(base as usize, true).unwrap()[0].line, Some(12));
        let t = top(&q, &names, 0);
        assert_eq!(t[0].function, "Worker.spin");
        let t = crate::tracefile::read_all(&buf[..]).unwrap();
        assert_eq!(t.stacks.len(), 1);
        for cut in 12..buf.len() {
            let _ = Profile::read_trace(&buf[..cut]).unwrap();
        }
    }

    #[test]
    fn plain_trace_is_a_profile() {
        let mut w = crate::tracefile::TraceWriter::new(Vec::new()).unwrap();
        w.write_stack(&[1, 2], false).unwrap();
        w.write_stack(&[1, 2], false).unwrap();
        let bytes = w.finish().unwrap();
        let p = Profile::read_trace(&bytes[..]).unwrap();
        assert_eq!(p.stacks.len(), 1);
        assert_eq!(p.stacks[0].values, vec![2]);
        assert_eq!(p.sample_types[0].name, "samples");
    }
}
