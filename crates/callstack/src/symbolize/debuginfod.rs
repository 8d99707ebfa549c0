//! A debuginfod client: debug files and executables fetched by build-id
//! from the servers of `DEBUGINFOD_URLS`, kept in the cache that elfutils'
//! client (and so gdb) uses.
//!
//! The [`Symbolizer`](super::Symbolizer) asks for a module's debug file
//! (`/buildid/<id>/debuginfo`) when none is found on this machine, and for
//! the object itself (`/buildid/<id>/executable`) when the file at the
//! module's path is missing or of another build. Each URL is tried in
//! order; the first answer whose build-id is the one asked for is kept.
//!
//! ## Environment (elfutils' names and meanings)
//! - `DEBUGINFOD_URLS`: the servers, separated by spaces. Unset or empty:
//!   no client ([`Debuginfod::from_env`] gives `None`), as in gdb.
//! - `DEBUGINFOD_CACHE_PATH`: the cache directory; by default
//!   `$XDG_CACHE_HOME/debuginfod_client`, else
//!   `$HOME/.cache/debuginfod_client` (or `$HOME/.debuginfod_client_cache`
//!   when that older directory exists).
//! - `DEBUGINFOD_TIMEOUT`: seconds to connect, and at most between two
//!   reads of an answer (90 by default).
//! - `DEBUGINFOD_PROGRESS`: set and not `0`, a progress line on standard
//!   error even when it is not a terminal (on a terminal it is always
//!   shown).
//!
//! ## The cache
//! `<cache>/<build-id in hex>/debuginfo` and `.../executable`, written
//! whole under a temporary name and renamed into place. An empty file
//! there is a negative hit: every server answered 404 less than
//! `cache_miss_s` seconds ago (the number in `<cache>/cache_miss_s`, 600
//! when absent), and no request is made until it expires. Failures other
//! than "not found" (a refused connection, a timeout) are not cached.
//! The first fetch of a client cleans the cache when
//! `cache_clean_interval_s` (a day) has passed since the last cleaning:
//! files unused for `max_unused_age_s` (a week) go
//! ([`Debuginfod::clean_cache`]).
//!
//! ## Failures
//! None is fatal: the module keeps the names it has without the file.
//! Each is recorded once and [`Debuginfod::take_warnings`] gives them as
//! lines (one per server and kind of failure). A server that refuses a
//! connection or times out is not asked again by the same client, and
//! after the client's total deadline ([`Debuginfod::set_deadline`], two
//! minutes by default) no new request is made.
//!
//! The client does blocking network and file I/O and starts threads: never
//! use it from a crash handler or a signal handler.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// What is fetched for a build-id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Artifact {
    /// The separate debug file (`/buildid/<id>/debuginfo`).
    Debuginfo,
    /// The object itself (`/buildid/<id>/executable`), for a module whose
    /// file is not on this machine.
    Executable,
}

impl Artifact {
    /// The name of the artifact in URLs and in the cache.
    pub fn name(self) -> &'static str {
        match self {
            Artifact::Debuginfo => "debuginfo",
            Artifact::Executable => "executable",
        }
    }
}

/// How long a connection or a read may wait, by default (elfutils' 90 s).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);
/// The client's total time for requests, by default.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);
/// How long a negative hit stands when `cache_miss_s` is absent.
const DEFAULT_CACHE_MISS: Duration = Duration::from_secs(600);
/// How often the cache is cleaned when `cache_clean_interval_s` is absent
/// (elfutils' day).
const DEFAULT_CLEAN_INTERVAL: Duration = Duration::from_secs(86_400);
/// How long an unused file stays when `max_unused_age_s` is absent
/// (elfutils' week).
const DEFAULT_MAX_UNUSED: Duration = Duration::from_secs(604_800);
/// The most files fetched at once.
const MAX_PARALLEL: usize = 8;

/// A debuginfod client: servers, cache, timeouts, and what went wrong.
///
/// Shared between threads and symbolizers behind an `Arc`; its answers are
/// remembered, so a build-id is asked for at most once per client.
#[derive(Debug)]
pub struct Debuginfod {
    urls: Vec<String>,
    cache: PathBuf,
    timeout: Duration,
    deadline: Duration,
    progress: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Every answer given, by what was asked.
    memo: HashMap<(Vec<u8>, Artifact), Option<PathBuf>>,
    /// Servers that refused a connection or timed out, and which.
    dead: Vec<(String, String)>,
    /// (server, what went wrong, about what), in order, each once.
    failures: Vec<(String, String, String)>,
    /// HTTP requests sent.
    requests: u64,
    /// Whether the cache was looked at for cleaning (once per client).
    cleaned: bool,
    /// When the first request was sent (the deadline counts from there).
    started: Option<Instant>,
}

/// What one server said to one request.
#[cfg_attr(not(feature = "debuginfod"), allow(dead_code))]
enum Answer {
    Got(PathBuf),
    NotFound,
    /// A failure; `true` when the server is to be asked no more.
    Failed(String, bool),
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The cache directory elfutils' client would use in this environment.
pub fn default_cache_dir() -> PathBuf {
    if let Some(p) = env_nonempty("DEBUGINFOD_CACHE_PATH") {
        return PathBuf::from(p);
    }
    let home = env_nonempty("HOME").map(PathBuf::from);
    if let Some(h) = &home {
        let old = h.join(".debuginfod_client_cache");
        if old.is_dir() {
            return old;
        }
    }
    match (env_nonempty("XDG_CACHE_HOME"), home) {
        (Some(x), _) => PathBuf::from(x).join("debuginfod_client"),
        (None, Some(h)) => h.join(".cache").join("debuginfod_client"),
        (None, None) => std::env::temp_dir().join("debuginfod_client"),
    }
}

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The GNU build-id of the object at `path`, if it is one.
fn file_build_id(path: &Path) -> Option<Vec<u8>> {
    use object::Object;
    let f = std::fs::File::open(path).ok()?;
    // SAFETY: mapped read-only for the duration of this parse; a file of
    // the cache truncated meanwhile could fault, as with every mapped file.
    let map = unsafe { memmap2::Mmap::map(&f) }.ok()?;
    let obj = object::File::parse(&*map).ok()?;
    obj.build_id().ok().flatten().map(<[u8]>::to_vec)
}

impl Debuginfod {
    /// A client of the servers in `DEBUGINFOD_URLS`, with the cache and
    /// timeout of the environment; `None` when the variable is unset or
    /// empty, or when the crate is built without the `debuginfod` feature.
    pub fn from_env() -> Option<Debuginfod> {
        if !cfg!(feature = "debuginfod") {
            return None;
        }
        let urls = env_nonempty("DEBUGINFOD_URLS")?;
        Some(Debuginfod::new(urls.split_whitespace()))
    }

    /// A client of `urls` (tried in order), with the cache and timeout of
    /// the environment (`DEBUGINFOD_CACHE_PATH`, `DEBUGINFOD_TIMEOUT`,
    /// `DEBUGINFOD_PROGRESS`). Without the `debuginfod` feature, every
    /// fetch fails (and says so once).
    pub fn new<S: AsRef<str>>(urls: impl IntoIterator<Item = S>) -> Debuginfod {
        let urls = urls
            .into_iter()
            .map(|u| u.as_ref().trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect();
        let timeout = env_nonempty("DEBUGINFOD_TIMEOUT")
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&t| t > 0)
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_TIMEOUT);
        let progress = env_nonempty("DEBUGINFOD_PROGRESS").is_some_and(|v| v.trim() != "0")
            || std::io::stderr().is_terminal();
        Debuginfod {
            urls,
            cache: default_cache_dir(),
            timeout,
            deadline: DEFAULT_DEADLINE,
            progress,
            state: Mutex::new(State::default()),
        }
    }

    /// The servers, in the order they are asked.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The cache directory.
    pub fn cache_dir(&self) -> &Path {
        &self.cache
    }

    /// Uses `dir` as the cache directory instead of the environment's.
    pub fn set_cache_dir(&mut self, dir: impl Into<PathBuf>) {
        self.cache = dir.into();
    }

    /// How long a connection, or a wait between two reads, may take.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The total time this client spends on requests, counted from the
    /// first: past it, nothing more is asked (two minutes by default).
    pub fn set_deadline(&mut self, deadline: Duration) {
        self.deadline = deadline;
    }

    /// Whether a progress line is written on standard error.
    pub fn set_progress(&mut self, on: bool) {
        self.progress = on;
    }

    /// How many HTTP requests this client has sent.
    pub fn requests(&self) -> u64 {
        self.lock().requests
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The failures recorded since the last call, as lines to show (one
    /// per server and kind of failure, naming what was not fetched).
    pub fn take_warnings(&self) -> Vec<String> {
        let failures = std::mem::take(&mut self.lock().failures);
        let mut groups: Vec<((String, String), Vec<String>)> = Vec::new();
        for (url, what, item) in failures {
            let key = (url, what);
            match groups.iter_mut().find(|g| g.0 == key) {
                Some(g) => g.1.push(item),
                None => groups.push((key, vec![item])),
            }
        }
        groups
            .into_iter()
            .map(|((url, what), items)| {
                let shown: Vec<&str> = items.iter().take(3).map(String::as_str).collect();
                let more = match items.len().saturating_sub(3) {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                };
                let n = items.len();
                let files = if n == 1 { "file" } else { "files" };
                format!(
                    "debuginfod: {url}: {what}: {n} {files} not fetched ({}{more})",
                    shown.join(", ")
                )
            })
            .collect()
    }

    fn fail(&self, url: &str, what: String, id: &[u8], kind: Artifact) {
        let item = format!("{} {}", kind.name(), hex(id));
        let mut st = self.lock();
        let entry = (url.to_string(), what, item);
        if !st.failures.contains(&entry) {
            st.failures.push(entry);
        }
    }

    /// The file of `kind` for `build_id`: from the cache, else from the
    /// first server that has it (written to the cache). `None` when no
    /// server has it or none could be asked; why is kept for
    /// [`Debuginfod::take_warnings`].
    pub fn fetch(&self, build_id: &[u8], kind: Artifact) -> Option<PathBuf> {
        let key = (build_id.to_vec(), kind);
        if let Some(v) = self.lock().memo.get(&key) {
            return v.clone();
        }
        let shown = self.progress && self.cached(build_id, kind).is_none();
        if shown {
            eprint!(
                "\rdebuginfod: fetching {} {}\x1b[K",
                kind.name(),
                hex(build_id)
            );
        }
        let got = self.fetch_uncached(build_id, kind);
        if shown {
            eprint!("\r\x1b[K");
        }
        self.lock().memo.insert(key, got.clone());
        got
    }

    /// [`Debuginfod::fetch`] of each of `wants`, several at once (the
    /// modules of a core or a process), with a progress line on a
    /// terminal. The answers are in the order of `wants`.
    pub fn fetch_all(&self, wants: &[(Vec<u8>, Artifact)]) -> Vec<Option<PathBuf>> {
        let mut out: Vec<Option<PathBuf>> = vec![None; wants.len()];
        if wants.is_empty() {
            return out;
        }
        let next = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let results = Mutex::new(&mut out);
        let total = wants.len();
        let workers = total.min(MAX_PARALLEL);
        let show = self.progress;
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((id, kind)) = wants.get(i) else {
                        break;
                    };
                    let got = self.fetch_quiet(id, *kind);
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = got;
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if show {
                        eprint!("\rdebuginfod: {n}/{total} files\x1b[K");
                    }
                });
            }
        });
        if show {
            eprint!("\r\x1b[K");
        }
        out
    }

    /// [`Debuginfod::fetch`] without its own progress line.
    fn fetch_quiet(&self, build_id: &[u8], kind: Artifact) -> Option<PathBuf> {
        let key = (build_id.to_vec(), kind);
        if let Some(v) = self.lock().memo.get(&key) {
            return v.clone();
        }
        let got = self.fetch_uncached(build_id, kind);
        self.lock().memo.insert(key, got.clone());
        got
    }

    /// Where the cache keeps `kind` of `build_id`.
    pub fn cache_path(&self, build_id: &[u8], kind: Artifact) -> PathBuf {
        self.cache.join(hex(build_id)).join(kind.name())
    }

    /// A setting of the cache: the seconds in `<cache>/<name>`.
    fn setting(&self, name: &str, default: Duration) -> Duration {
        std::fs::read_to_string(self.cache.join(name))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(default)
    }

    /// How long a negative hit stands: `<cache>/cache_miss_s`.
    fn cache_miss(&self) -> Duration {
        self.setting("cache_miss_s", DEFAULT_CACHE_MISS)
    }

    /// Cleans the cache as elfutils' client does, at most once per
    /// `cache_clean_interval_s` (the file's modification time is the last
    /// cleaning; it is written when absent): files not used for
    /// `max_unused_age_s`, and negative hits past `cache_miss_s`, are
    /// removed, then their emptied build-id directories. Only what this
    /// layout holds is touched (a directory named by a hex build-id, and
    /// in it `debuginfo` or `executable`), whatever else the directory has.
    pub fn clean_cache(&self) {
        let stamp = self.cache.join("cache_clean_interval_s");
        let interval = self.setting("cache_clean_interval_s", DEFAULT_CLEAN_INTERVAL);
        let age = |m: &std::fs::Metadata, used: bool| {
            let t = if used {
                m.accessed().or_else(|_| m.modified())
            } else {
                m.modified()
            };
            t.ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .unwrap_or_default()
        };
        match std::fs::metadata(&stamp) {
            Ok(m) if age(&m, false) < interval => return,
            Ok(_) => {}
            Err(_) => {
                // First use of this cache: the interval's file, as elfutils
                // writes it; the next cleaning is an interval away.
                if std::fs::create_dir_all(&self.cache).is_ok() {
                    let _ = std::fs::write(&stamp, format!("{}\n", interval.as_secs()));
                }
                return;
            }
        }
        let max_unused = self.setting("max_unused_age_s", DEFAULT_MAX_UNUSED);
        let miss = self.cache_miss();
        let Ok(dirs) = std::fs::read_dir(&self.cache) else {
            return;
        };
        for d in dirs.flatten() {
            let name = d.file_name();
            let is_id = name
                .to_str()
                .is_some_and(|n| n.len() >= 4 && n.bytes().all(|b| b.is_ascii_hexdigit()));
            if !is_id || !d.path().is_dir() {
                continue;
            }
            for kind in [Artifact::Debuginfo, Artifact::Executable] {
                let f = d.path().join(kind.name());
                let Ok(m) = std::fs::symlink_metadata(&f) else {
                    continue;
                };
                let stale = if m.len() == 0 {
                    age(&m, false) >= miss
                } else {
                    age(&m, true) >= max_unused
                };
                if m.is_file() && stale {
                    let _ = std::fs::remove_file(&f);
                }
            }
            // Removed only when empty.
            let _ = std::fs::remove_dir(d.path());
        }
        // Touch the stamp: the cleaning is done.
        let _ = std::fs::write(&stamp, format!("{}\n", interval.as_secs()));
    }

    /// The cache's answer: `Some(Some(path))` a file, `Some(None)` a live
    /// negative hit, `None` nothing (an expired negative hit is removed).
    fn cached(&self, build_id: &[u8], kind: Artifact) -> Option<Option<PathBuf>> {
        let path = self.cache_path(build_id, kind);
        let meta = std::fs::metadata(&path).ok()?;
        if meta.len() > 0 {
            return Some(Some(path));
        }
        let age = meta
            .modified()
            .ok()
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .unwrap_or_default();
        if age < self.cache_miss() {
            return Some(None);
        }
        let _ = std::fs::remove_file(&path);
        None
    }

    fn fetch_uncached(&self, build_id: &[u8], kind: Artifact) -> Option<PathBuf> {
        if build_id.is_empty() {
            return None;
        }
        let clean = !std::mem::replace(&mut self.lock().cleaned, true);
        if clean {
            self.clean_cache();
        }
        match self.cached(build_id, kind) {
            Some(Some(p)) => {
                if file_build_id(&p).as_deref() == Some(build_id) {
                    return Some(p);
                }
                // Not what its name says (written by hand?): fetched again.
                let _ = std::fs::remove_file(&p);
            }
            Some(None) => return None,
            None => {}
        }
        let target = self.cache_path(build_id, kind);
        let mut all_not_found = !self.urls.is_empty();
        for url in &self.urls {
            let dead = self.lock().dead.iter().find(|d| d.0 == *url).cloned();
            if let Some((_, why)) = dead {
                // Named with the others that this server's failure cost.
                all_not_found = false;
                self.fail(url, why, build_id, kind);
                continue;
            }
            let remaining = {
                let mut st = self.lock();
                let started = *st.started.get_or_insert_with(Instant::now);
                let left = self.deadline.saturating_sub(started.elapsed());
                if !left.is_zero() {
                    st.requests += 1;
                }
                left
            };
            if remaining.is_zero() {
                self.fail(url, "the total deadline passed".into(), build_id, kind);
                return None;
            }
            match self.request(url, build_id, kind, &target, remaining) {
                Answer::Got(p) => return Some(p),
                Answer::NotFound => {}
                Answer::Failed(why, dead) => {
                    all_not_found = false;
                    if dead {
                        self.lock().dead.push((url.clone(), why.clone()));
                    }
                    self.fail(url, why, build_id, kind);
                }
            }
        }
        if all_not_found {
            // Every server said 404: a negative hit, as elfutils writes it.
            if std::fs::create_dir_all(target.parent().unwrap_or(&self.cache)).is_ok() {
                let _ = std::fs::File::create(&target);
            }
            let url = self.urls.join(" ");
            self.fail(&url, "not found".into(), build_id, kind);
        }
        None
    }

    /// One request to one server; the answer written under `target`.
    #[cfg(feature = "debuginfod")]
    fn request(
        &self,
        url: &str,
        build_id: &[u8],
        kind: Artifact,
        target: &Path,
        remaining: Duration,
    ) -> Answer {
        let full = format!("{url}/buildid/{}/{}", hex(build_id), kind.name());
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(self.timeout.min(remaining))
            .timeout_read(self.timeout)
            .timeout(remaining)
            .user_agent(concat!("callstack/", env!("CARGO_PKG_VERSION")))
            .build();
        let resp = match agent.get(&full).call() {
            Ok(r) => r,
            Err(ureq::Error::Status(404, _)) => return Answer::NotFound,
            Err(ureq::Error::Status(code, _)) => {
                return Answer::Failed(format!("HTTP status {code}"), false)
            }
            Err(ureq::Error::Transport(t)) => return transport_failure(&t),
        };
        let dir = target.parent().unwrap_or(&self.cache);
        if let Err(e) = std::fs::create_dir_all(dir) {
            return Answer::Failed(format!("cache {}: {e}", dir.display()), false);
        }
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let tmp = dir.join(format!(
            ".{}.tmp{}-{}",
            kind.name(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            std::io::copy(&mut resp.into_reader(), &mut f)?;
            f.sync_all()
        });
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            let timed_out = e.kind() == std::io::ErrorKind::TimedOut
                || e.kind() == std::io::ErrorKind::WouldBlock;
            let why = if timed_out {
                "timed out".to_string()
            } else {
                format!("reading the answer: {e}")
            };
            return Answer::Failed(why, timed_out);
        }
        match file_build_id(&tmp) {
            Some(have) if have == build_id => {}
            have => {
                let _ = std::fs::remove_file(&tmp);
                let have = have.map(|h| hex(&h)).unwrap_or_else(|| "none".into());
                return Answer::Failed(format!("sent a file whose build-id is {have}"), false);
            }
        }
        match std::fs::rename(&tmp, target) {
            Ok(()) => Answer::Got(target.to_path_buf()),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Answer::Failed(format!("cache {}: {e}", target.display()), false)
            }
        }
    }

    /// Without the `debuginfod` feature there is no HTTP client.
    #[cfg(not(feature = "debuginfod"))]
    fn request(&self, _: &str, _: &[u8], _: Artifact, _: &Path, _: Duration) -> Answer {
        Answer::Failed("built without the debuginfod feature".into(), true)
    }
}

/// A transport error as a failure: refused connections and timeouts put
/// the server aside.
#[cfg(feature = "debuginfod")]
fn transport_failure(t: &ureq::Transport) -> Answer {
    use std::error::Error as _;
    let mut io = None;
    let mut src = t.source();
    while let Some(e) = src {
        if let Some(e) = e.downcast_ref::<std::io::Error>() {
            io = Some(e.kind());
            break;
        }
        src = e.source();
    }
    match io {
        Some(std::io::ErrorKind::ConnectionRefused) => {
            Answer::Failed("connection refused".into(), true)
        }
        Some(std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) => {
            Answer::Failed("timed out".into(), true)
        }
        _ => {
            let dead = matches!(
                t.kind(),
                ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Dns | ureq::ErrorKind::Io
            );
            Answer::Failed(t.to_string(), dead)
        }
    }
}

/// The client a new symbolizer uses: [`Debuginfod::from_env`], shared.
pub(crate) fn from_env_shared() -> Option<Arc<Debuginfod>> {
    Debuginfod::from_env().map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of one server on a port of 127.0.0.1 nobody listens on,
    /// with its own cache.
    fn client(tag: &str) -> (Debuginfod, PathBuf) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cache = std::env::temp_dir().join(format!(
            "callstack-debuginfod-unit-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&cache);
        std::fs::create_dir_all(&cache).unwrap();
        let mut c = Debuginfod::new([format!("http://127.0.0.1:{port}/")]);
        c.set_cache_dir(&cache);
        c.set_progress(false);
        (c, cache)
    }

    #[test]
    fn cleaning_removes_old_entries_of_the_layout_only() {
        let (c, cache) = client("clean");
        // First use: the interval's file is written, nothing removed.
        let id_dir = cache.join("0011223344");
        std::fs::create_dir_all(&id_dir).unwrap();
        std::fs::write(id_dir.join("debuginfo"), b"x").unwrap();
        std::fs::write(cache.join("notes.txt"), b"mine").unwrap();
        c.clean_cache();
        assert!(cache.join("cache_clean_interval_s").is_file());
        assert!(id_dir.join("debuginfo").is_file());
        // Every interval passed, every file unused for too long.
        std::fs::write(cache.join("cache_clean_interval_s"), "0\n").unwrap();
        std::fs::write(cache.join("max_unused_age_s"), "0\n").unwrap();
        c.clean_cache();
        assert!(!id_dir.exists());
        assert!(cache.join("notes.txt").is_file());
        let _ = std::fs::remove_dir_all(cache);
    }

    #[test]
    fn urls_are_trimmed_and_empty_ones_dropped() {
        let c = Debuginfod::new(["http://a/ ", "", "https://b"]);
        assert_eq!(c.urls(), ["http://a", "https://b"]);
    }

    #[test]
    fn a_live_negative_hit_sends_no_request() {
        let (c, cache) = client("negative");
        let id = [0x12u8, 0x34, 0x56];
        let p = c.cache_path(&id, Artifact::Debuginfo);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::File::create(&p).unwrap();
        assert_eq!(c.fetch(&id, Artifact::Debuginfo), None);
        assert_eq!(c.requests(), 0);
        assert!(c.take_warnings().is_empty());
        // The other artifact of the same build-id is not covered by it.
        assert_eq!(c.fetch(&id, Artifact::Executable), None);
        assert_eq!(c.requests(), 1);
        let _ = std::fs::remove_dir_all(cache);
    }

    #[test]
    fn an_expired_negative_hit_is_asked_again() {
        let (c, cache) = client("expired");
        std::fs::write(cache.join("cache_miss_s"), "0\n").unwrap();
        let id = [0xabu8, 0xcd];
        let p = c.cache_path(&id, Artifact::Debuginfo);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::File::create(&p).unwrap();
        assert_eq!(c.fetch(&id, Artifact::Debuginfo), None);
        assert_eq!(c.requests(), 1);
        // The server could not be reached: nothing is cached for it.
        assert!(!p.exists());
        let _ = std::fs::remove_dir_all(cache);
    }

    #[test]
    fn a_refused_server_is_named_once_and_asked_once() {
        let (c, cache) = client("refused");
        let wants: Vec<(Vec<u8>, Artifact)> = (0u8..5)
            .map(|i| (vec![i, 1, 2, 3], Artifact::Debuginfo))
            .collect();
        let got = c.fetch_all(&wants);
        assert!(got.iter().all(Option::is_none));
        // Asked again: remembered, no request.
        let n = c.requests();
        assert_eq!(c.fetch(&[0, 1, 2, 3], Artifact::Debuginfo), None);
        assert_eq!(c.requests(), n);
        let w = c.take_warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("5 files not fetched"), "{w:?}");
        assert!(c.take_warnings().is_empty());
        let _ = std::fs::remove_dir_all(cache);
    }

    #[test]
    fn a_cached_file_of_another_build_is_not_used() {
        let (c, cache) = client("mismatch");
        let id = [0x55u8, 0x66, 0x77];
        let p = c.cache_path(&id, Artifact::Executable);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        // This test program: an object, but not of that build-id.
        std::fs::copy(std::env::current_exe().unwrap(), &p).unwrap();
        assert_eq!(c.fetch(&id, Artifact::Executable), None);
        assert!(!p.exists(), "the wrong file stayed in the cache");
        let _ = std::fs::remove_dir_all(cache);
    }
}
