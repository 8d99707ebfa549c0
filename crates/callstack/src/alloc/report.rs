//! Text reports of a [`HeapSnapshot`]: top sites and leaks, symbolized.

use super::{HeapSnapshot, SiteStats};
use crate::symbolize::{ModuleInfo, Symbolizer};
use std::fmt::Write;

/// Leading frames inside the allocator itself (ours, Rust's allocation
/// plumbing, the C allocator's entry points): left out of a site's stack.
/// Names starting with one of these...
const PLUMBING_PREFIXES: &[&str] = &[
    "callstack::capture_fast",
    "callstack::capture_exact",
    "callstack::alloc::",
    "<callstack::alloc::",
    "callstack_preload::",
    "__rustc::",
    "__rust_alloc",
    "__rust_realloc",
    "__rg_",
    "__rdl_",
    "alloc::alloc::",
    "<alloc::alloc::",
    "std::alloc::",
    "<std::alloc::",
    "alloc::raw_vec::",
    "<alloc::raw_vec::",
    "operator new(",
    "operator new[](",
];

/// ...or equal to one of these.
const PLUMBING_NAMES: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
    "operator new",
    "operator new[]",
];

fn is_plumbing(name: &str) -> bool {
    PLUMBING_NAMES.contains(&name) || PLUMBING_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// One frame of a site, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteFrame {
    /// The function (inlined functions have their own entries), or `??`.
    pub function: String,
    /// `file:line` or `module+0xoffset`.
    pub location: String,
}

impl HeapSnapshot {
    /// A symbolizer for the modules of a recording read with
    /// [`HeapSnapshot::read_from`], or for this process when it has none.
    pub fn symbolizer(&self) -> Symbolizer {
        if self.modules.is_empty() {
            return Symbolizer::new();
        }
        Symbolizer::from_modules(self.modules.iter().map(|m| ModuleInfo {
            path: m.path.clone(),
            build_id: m.build_id.clone(),
            start: m.start as usize,
            end: m.end as usize,
            bias: Some(m.bias as usize),
        }))
    }

    /// The frames of `site`, innermost first, with the allocator's own
    /// leading frames (malloc, `operator new`, Rust's `__rust_alloc` and
    /// `RawVec`, this module) left out; inlined functions expanded.
    pub fn site_frames(&self, sym: &mut Symbolizer, site: &SiteStats) -> Vec<SiteFrame> {
        let mut out = Vec::new();
        for &ra in &site.frames {
            let s = sym.symbolize_return(ra);
            if s.frames.is_empty() {
                let module = s
                    .module
                    .as_ref()
                    .map(|m| m.path.display().to_string())
                    .unwrap_or_else(|| "??".into());
                out.push(SiteFrame {
                    function: "??".into(),
                    location: format!("{module}+{:#x}", s.offset),
                });
                continue;
            }
            for f in &s.frames {
                let location = match (&f.file, f.line) {
                    (Some(file), Some(line)) => format!("{file}:{line}"),
                    (Some(file), None) => file.to_string(),
                    _ => format!(
                        "{}+{:#x}",
                        s.module
                            .as_ref()
                            .map(|m| m.path.display().to_string())
                            .unwrap_or_default(),
                        s.offset
                    ),
                };
                out.push(SiteFrame {
                    function: f.function.as_deref().unwrap_or("??").to_string(),
                    location,
                });
            }
        }
        let lead = out.iter().take_while(|f| is_plumbing(&f.function)).count();
        if lead < out.len() {
            out.drain(..lead);
        }
        out
    }

    /// The text report: totals, the top `top` sites by live bytes and by
    /// number of allocations, each with its stack.
    pub fn report(&self, sym: &mut Symbolizer, top: usize) -> String {
        let mut o = String::new();
        self.totals_text(&mut o);
        let mut by_live: Vec<&SiteStats> =
            self.sites.iter().filter(|s| s.live_bytes() > 0).collect();
        by_live.sort_by(|a, b| {
            b.live_bytes()
                .cmp(&a.live_bytes())
                .then(b.allocs.cmp(&a.allocs))
        });
        let _ = writeln!(o, "\ntop sites by live bytes:");
        for s in by_live.iter().take(top) {
            self.site_text(&mut o, sym, s);
        }
        let mut by_count: Vec<&SiteStats> = self.sites.iter().collect();
        by_count.sort_by(|a, b| {
            b.allocs
                .cmp(&a.allocs)
                .then(b.alloc_bytes.cmp(&a.alloc_bytes))
        });
        let _ = writeln!(o, "\ntop sites by allocations:");
        for s in by_count.iter().take(top) {
            self.site_text(&mut o, sym, s);
        }
        o
    }

    /// The leak report: every site with live blocks (the top `top` by
    /// bytes printed with stacks), meant for the end of the process.
    pub fn leak_report(&self, sym: &mut Symbolizer, top: usize) -> String {
        let mut o = String::new();
        let mut leaks: Vec<&SiteStats> = self.sites.iter().filter(|s| s.live_bytes() > 0).collect();
        leaks.sort_by(|a, b| {
            b.live_bytes()
                .cmp(&a.live_bytes())
                .then(b.allocs.cmp(&a.allocs))
        });
        let bytes: u64 = leaks.iter().map(|s| s.live_bytes()).sum();
        let blocks: u64 = leaks.iter().map(|s| s.leaked_blocks()).sum();
        let _ = writeln!(
            o,
            "leaks: {bytes} bytes in {blocks} blocks from {} sites",
            leaks.len()
        );
        if self.sample_bytes != 0 {
            let _ = writeln!(
                o,
                "(sampled one allocation per {} bytes: estimates)",
                self.sample_bytes
            );
        }
        for s in leaks.iter().take(top) {
            self.site_text(&mut o, sym, s);
        }
        o
    }

    fn totals_text(&self, o: &mut String) {
        let (allocs, abytes, frees, fbytes) = self.totals();
        let _ = writeln!(
            o,
            "heap: {allocs} allocations, {abytes} bytes; {frees} frees, {fbytes} bytes; live {} bytes in {} blocks; {} sites ({:?} capture)",
            abytes.saturating_sub(fbytes),
            self.sites.iter().map(|s| s.leaked_blocks()).sum::<u64>(),
            self.sites.len(),
            self.capture
        );
        if self.sample_bytes != 0 {
            let _ = writeln!(
                o,
                "sampled: about one allocation per {} bytes recorded; every figure is an estimate",
                self.sample_bytes
            );
        }
        let c = &self.counters;
        if c.overflow_site_allocs + c.live_overflow + c.unknown_frees + c.dropped > 0 {
            let _ = writeln!(
                o,
                "not recorded: {} allocations in the overflow site, {} live-table overflows, {} frees of unknown blocks, {} dropped",
                c.overflow_site_allocs, c.live_overflow, c.unknown_frees, c.dropped
            );
        }
    }

    fn site_text(&self, o: &mut String, sym: &mut Symbolizer, s: &SiteStats) {
        let _ = writeln!(
            o,
            "  {} bytes live in {} blocks (peak {}), {} allocations of {} bytes, {} frees",
            s.live_bytes(),
            s.leaked_blocks(),
            s.peak_bytes,
            s.allocs,
            s.alloc_bytes,
            s.frees
        );
        if s.frames.is_empty() {
            let _ = writeln!(o, "      (stack unknown: site table full)");
        }
        for f in self.site_frames(sym, s).iter().take(12) {
            let _ = writeln!(o, "      {} at {}", f.function, f.location);
        }
    }
}
