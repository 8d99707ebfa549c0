//! Names of JIT code from perf map files: `/tmp/perf-PID.map`, which JIT
//! runtimes write for perf (`node --perf-basic-prof`, the JVM's
//! perf-map-agent, .NET with `DOTNET_PerfMapEnabled=1`, CPython 3.12+ with
//! `-X perf`, LuaJIT, V8 embedders).
//!
//! The format is one function per line: the start address and the size in
//! hexadecimal (with or without `0x`), then the name, which runs to the end
//! of the line and may hold spaces:
//!
//! ```text
//! 7f2a1c0040a0 38 LazyCompile:~fib /app/fib.js:1
//! 0x7f2a1c004200 0x1c py::work:/app/prog.py
//! ```
//!
//! The file only grows while the program runs; a runtime that moves or
//! recompiles a function writes a new line for the new code, and may reuse
//! an old address. [`PerfMap`] keeps every line and answers with the last
//! line written that covers an address, as the code there was last
//! described.
//!
//! ```
//! use callstack::symbolize::perfmap::PerfMap;
//! let map = PerfMap::parse("1000 20 jit_a\n1020 10 Baseline: jit b\n").unwrap();
//! assert_eq!(map.lookup(0x1024), Some("Baseline: jit b"));
//! assert_eq!(map.lookup(0x1030), None);
//! ```

use std::path::{Path, PathBuf};

/// Why a perf map could not be read.
#[derive(Debug)]
pub enum PerfMapError {
    /// The file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A line is not `START SIZE NAME` in hexadecimal.
    Line {
        /// Its number, from 1.
        line: usize,
        /// What is wrong with it.
        what: &'static str,
    },
}

impl std::fmt::Display for PerfMapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PerfMapError::Io { path, source } => {
                write!(f, "cannot read the perf map {}: {source}", path.display())
            }
            PerfMapError::Line { line, what } => write!(f, "perf map line {line}: {what}"),
        }
    }
}

impl std::error::Error for PerfMapError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PerfMapError::Io { source, .. } => Some(source),
            PerfMapError::Line { .. } => None,
        }
    }
}

/// One function of a perf map.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    start: u64,
    end: u64,
    /// The line's place in the file: later lines win.
    seq: u32,
    name: Box<str>,
}

/// The functions of one perf map file, looked up by address.
#[derive(Clone, Debug, Default)]
pub struct PerfMap {
    /// Sorted by start, then by line.
    entries: Vec<Entry>,
    /// The largest size of any entry: how far back a lookup looks.
    max_size: u64,
}

/// Where a runtime writes the perf map of process `pid`.
pub fn path_for_pid(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

fn hex(s: &str) -> Option<u64> {
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

impl PerfMap {
    /// Parses the text of a perf map. Blank lines are skipped; any other
    /// line must be `START SIZE NAME` with a non-empty name, and the range
    /// must not wrap.
    pub fn parse(text: &str) -> Result<PerfMap, PerfMapError> {
        let mut entries = Vec::new();
        let mut max_size = 0;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let bad = |what| PerfMapError::Line { line: i + 1, what };
            let mut parts = line.trim_start().splitn(3, [' ', '\t']);
            let start = parts
                .next()
                .and_then(hex)
                .ok_or_else(|| bad("the start is not a hexadecimal address"))?;
            let size = parts
                .next()
                .and_then(hex)
                .ok_or_else(|| bad("the size is not a hexadecimal number"))?;
            let name = parts.next().map(str::trim).unwrap_or("");
            if name.is_empty() {
                return Err(bad("no function name"));
            }
            let end = start
                .checked_add(size)
                .ok_or_else(|| bad("start + size wraps around"))?;
            if size == 0 {
                continue;
            }
            max_size = max_size.max(size);
            entries.push(Entry {
                start,
                end,
                seq: u32::try_from(entries.len()).unwrap_or(u32::MAX),
                name: name.into(),
            });
        }
        entries.sort_by_key(|e| (e.start, e.seq));
        Ok(PerfMap { entries, max_size })
    }

    /// Reads and parses the perf map file at `path`.
    pub fn from_file(path: &Path) -> Result<PerfMap, PerfMapError> {
        let text = std::fs::read(path).map_err(|source| PerfMapError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        PerfMap::parse(&String::from_utf8_lossy(&text))
    }

    /// The perf map of process `pid` (`/tmp/perf-PID.map`): `None` when
    /// there is no such file, an error when it is there but unreadable or
    /// malformed.
    pub fn for_pid(pid: u32) -> Option<Result<PerfMap, PerfMapError>> {
        let path = path_for_pid(pid);
        if !path.exists() {
            return None;
        }
        Some(PerfMap::from_file(&path))
    }

    /// The name of the function whose code holds `addr`: the last line of
    /// the file that covers it.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let hi = self.entries.partition_point(|e| e.start <= addr);
        let lo_start = addr.saturating_sub(self.max_size);
        self.entries[..hi]
            .iter()
            .rev()
            .take_while(|e| e.start >= lo_start)
            .filter(|e| addr < e.end)
            .max_by_key(|e| e.seq)
            .map(|e| &*e.name)
    }

    /// How many functions the map names.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map names no function.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_runtimes_write() {
        let m = PerfMap::parse(
            "7f2a1c0040a0 38 LazyCompile:~fib /app/fib.js:1\n\
             0x7f2a1c004200 0x1c py::work:/app/prog.py\r\n\
             \n\
             7F2A1C005000\t10\tStub:\tCEntry\n",
        )
        .unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(
            m.lookup(0x7f2a1c0040a0),
            Some("LazyCompile:~fib /app/fib.js:1")
        );
        assert_eq!(
            m.lookup(0x7f2a1c0040d7),
            Some("LazyCompile:~fib /app/fib.js:1")
        );
        assert_eq!(m.lookup(0x7f2a1c0040d8), None);
        assert_eq!(m.lookup(0x7f2a1c00420f), Some("py::work:/app/prog.py"));
        assert_eq!(m.lookup(0x7f2a1c005001), Some("Stub:\tCEntry"));
        assert_eq!(m.lookup(0), None);
        assert_eq!(m.lookup(u64::MAX), None);
    }

    #[test]
    fn the_last_line_for_reused_code_wins() {
        // A big function, then a small one written later over its middle.
        let m = PerfMap::parse("1000 100 old_big\n1040 10 new_small\n2000 10 other\n").unwrap();
        assert_eq!(m.lookup(0x1044), Some("new_small"));
        assert_eq!(m.lookup(0x1020), Some("old_big"));
        assert_eq!(m.lookup(0x1080), Some("old_big"));
        // Recompiled at the same address: the newer name.
        let m = PerfMap::parse("1000 10 first\n1000 10 second\n").unwrap();
        assert_eq!(m.lookup(0x1008), Some("second"));
    }

    #[test]
    fn bad_lines_are_errors_that_say_where() {
        for (text, line) in [
            ("zz 10 f\n", 1),
            ("1000 10 f\n1000 xyz f\n", 2),
            ("1000 10\n", 1),
            ("ffffffffffffffff 10 f\n", 1),
            ("10000000000000000 10 f\n", 1),
        ] {
            match PerfMap::parse(text) {
                Err(PerfMapError::Line { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let e = PerfMap::from_file(Path::new("/nonexistent/perf-1.map")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/perf-1.map"), "{e}");
    }
}
