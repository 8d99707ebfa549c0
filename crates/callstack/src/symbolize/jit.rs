//! The names of JIT code (in no module) for one process, from every source
//! a runtime writes for perf: the jitdump files it maps (`jit-PID.dump`,
//! with source lines; [`super::jitdump`]), then its perf map
//! (`/tmp/perf-PID.map`; [`super::perfmap`]). The one place `pstack`,
//! `core`, `record` and crash reports look JIT code up.

use super::jitdump::{JitDump, JitFrame};
use super::perfmap::PerfMap;
use std::path::{Path, PathBuf};

/// The JIT sources of one process.
#[derive(Clone, Debug, Default)]
pub struct JitSources {
    dumps: Vec<JitDump>,
    map: Option<PerfMap>,
}

/// Whether `path` names a jitdump file (`jit-PID.dump`, wherever the
/// runtime put it): a runtime maps its file executable for perf to find,
/// so it shows among the process's mappings.
pub fn is_jitdump(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("jit-") && n.ends_with(".dump"))
}

impl JitSources {
    /// The sources of process `pid`, whose mapped files are `mapped`
    /// (those that are jitdump files are read, while they are still
    /// there); `warn` hears of each file that is there and cannot be read
    /// (its frames are then left unnamed).
    pub fn for_process<'a>(
        pid: u32,
        mapped: impl IntoIterator<Item = &'a Path>,
        warn: &mut dyn FnMut(String),
    ) -> JitSources {
        let mut dumps = Vec::new();
        let mut seen: Vec<&Path> = Vec::new();
        for path in mapped {
            if !is_jitdump(path) || seen.contains(&path) {
                continue;
            }
            seen.push(path);
            match JitDump::from_file(path) {
                Ok(d) => dumps.push(d),
                Err(e) => warn(format!(
                    "{}: {e}; its JIT frames are left unnamed",
                    path.display()
                )),
            }
        }
        let map = match PerfMap::for_pid(pid) {
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                warn(format!("{e}; JIT frames are left unnamed"));
                None
            }
            None => None,
        };
        JitSources { dumps, map }
    }

    /// The sources of a running process `pid`: its jitdump files from
    /// `/proc/PID/maps`, and its perf map.
    pub fn for_live_process(pid: u32, warn: &mut dyn FnMut(String)) -> JitSources {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let paths: Vec<PathBuf> = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .map(PathBuf::from)
            .filter(|p| is_jitdump(p))
            .collect();
        JitSources::for_process(pid, paths.iter().map(PathBuf::as_path), warn)
    }

    /// Whether there is nothing to name JIT code with.
    pub fn is_empty(&self) -> bool {
        self.dumps.is_empty() && self.map.is_none()
    }

    /// What the jitdump files, then the perf map, say of the code at
    /// `addr` (looked up as is: pass a return address minus one).
    pub fn lookup(&self, addr: u64) -> Option<JitFrame> {
        if let Some(f) = self.dumps.iter().find_map(|d| d.lookup(addr)) {
            return Some(f);
        }
        let name = self.map.as_ref()?.lookup(addr)?;
        Some(JitFrame {
            name: name.to_string(),
            file: None,
            line: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbolize::jitdump::write;

    /// A jitdump file names an address before the perf map does, with its
    /// line; the perf map names the rest; a bad file is a warning.
    #[test]
    fn jitdump_first_then_the_perf_map() {
        let dir = std::env::temp_dir().join(format!("callstack-jit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A pid no process has (above pid_max's largest default): no perf
        // map of another test is read.
        let pid = 4_194_999;
        let map_path = crate::symbolize::perfmap::path_for_pid(pid);
        std::fs::write(&map_path, "1000 100 from_map\n5000 10 only_map\n").unwrap();
        let dump = dir.join(format!("jit-{pid}.dump"));
        let mut d = write::header(pid);
        // A runtime writes a function's lines before its code.
        write::lines(&mut d, 0x1000, &[(0x1000, 7, "/app/a.js")]);
        write::load(&mut d, 0x1000, &[0x90; 0x40], 1, "from_dump");
        std::fs::write(&dump, d).unwrap();
        let bad = dir.join("jit-1.dump");
        std::fs::write(&bad, b"not a jitdump").unwrap();
        let mut warnings = Vec::new();
        let s = JitSources::for_process(
            pid,
            [dump.as_path(), bad.as_path(), Path::new("/lib/libc.so.6")],
            &mut |w| warnings.push(w),
        );
        let _ = std::fs::remove_file(&map_path);
        let _ = std::fs::remove_dir_all(&dir);
        let f = s.lookup(0x1010).unwrap();
        assert_eq!(
            (f.name.as_str(), f.file.as_deref(), f.line),
            ("from_dump", Some("/app/a.js"), Some(7))
        );
        assert_eq!(s.lookup(0x1050).unwrap().name, "from_map");
        assert_eq!(s.lookup(0x5004).unwrap().name, "only_map");
        assert!(s.lookup(0x6000).is_none());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("jit-1.dump"), "{warnings:?}");
    }
}
