//! Keeping an in-process [`Symbolizer`] in step with the dynamic loader.
//!
//! After `dlclose`, another library may be loaded at the same addresses:
//! the cached modules and answers of the old one must not answer for it.
//! The loader counts the objects it has ever loaded and unloaded
//! (`dlpi_adds` / `dlpi_subs` of `dl_iterate_phdr`, glibc and musl); the
//! symbolizer reads the two counters on every cache miss (one callback of
//! `dl_iterate_phdr`, stopped at the first object: a small fraction of
//! resolving a new address) and, when they moved, lists the modules again:
//! an entry whose identity (path, range, bias, build-id) no longer matches
//! a loaded module is dropped with its opened file, and so are the cached
//! answers that named it or named no module. Where the counters are not
//! available, the list is re-read when an address falls outside every
//! known module.
//!
//! Cache hits are not checked (that would cost a loader lock per lookup):
//! an address already answered keeps its answer until the next miss
//! notices the change, or until [`Symbolizer::refresh_modules`].

use super::{Entry, ModuleInfo, Symbolizer};
use std::sync::Arc;

impl Symbolizer {
    /// Before resolving a missed address of this process: re-reads the
    /// module list if the loader's counters moved (or, without counters,
    /// if `probe` is outside every known module).
    pub(super) fn sync_with_loader(&mut self, probe: usize) {
        match crate::modules::loader_counters() {
            Some(g) if Some(g) == self.loader_generation => {}
            Some(g) => {
                self.loader_generation = Some(g);
                self.refresh_modules();
            }
            None => {
                if self.find_entry(probe).is_none() {
                    self.refresh_modules();
                }
            }
        }
    }

    /// Re-reads the modules of this process now: modules loaded since are
    /// added; modules unloaded (or replaced by another file at the same
    /// place) are dropped, with the cached answers that named them and
    /// those that named no module. In-process symbolizers do this by
    /// themselves on a cache miss after `dlopen`/`dlclose`; call it to make
    /// already cached addresses right at once after a `dlclose`. Does
    /// nothing for a symbolizer of another process or of a file.
    pub fn refresh_modules(&mut self) {
        if !self.in_process {
            return;
        }
        let now = ModuleInfo::loaded();
        let before = self.entries.len();
        self.entries.retain(|e| now.iter().any(|m| *m == *e.info));
        let dropped = self.entries.len() != before;
        for m in now {
            if !self.entries.iter().any(|e| *e.info == m) {
                self.entries.push(Entry {
                    info: Arc::new(m),
                    slot: None,
                });
            }
        }
        self.entries.sort_by_key(|e| e.info.start);
        self.close_unused();
        self.tail_cache.clear();
        let entries = &self.entries;
        let kept = |m: &Arc<ModuleInfo>| entries.iter().any(|e| Arc::ptr_eq(&e.info, m));
        if dropped {
            self.cache
                .retain(|_, s| s.module.as_ref().is_some_and(&kept));
        } else {
            // Only additions: addresses that were outside every module may
            // be in a new one.
            self.cache.retain(|_, s| s.module.is_some());
        }
    }
}
