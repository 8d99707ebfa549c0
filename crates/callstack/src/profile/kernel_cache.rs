//! The kernel's own functions, kept on disk for the boot.
//!
//! Reading `/proc/kallsyms` has the kernel format each of its 100,000 or
//! more lines: some 40 ms of CPU, a twentieth of what a 30 s whole-host
//! recording costs the recorder. Most of the file, the kernel's own
//! symbols, cannot change until the next boot (KASLR places them once);
//! what can are its modules', BPF programs' and trampolines' symbols,
//! which lie outside the kernel's text. So the first recording of a boot
//! that reads the whole file writes the kernel's text symbols to
//! `$XDG_CACHE_HOME/callstack/kallsyms-BOOT_ID` (else
//! `$HOME/.cache/callstack`; mode 0600: they are the kernel's addresses),
//! and later ones name kernel frames from it when every address to name
//! lies in the kernel's own text (from its first symbol up to `_etext`);
//! any other address (a module, a BPF program) has the whole file read, as
//! before. perf keeps a copy of `/proc/kallsyms` per kernel build-id in
//! `~/.debug` for the same reason.
//!
//! The file is trusted only while the first 4 KiB of `/proc/kallsyms`,
//! read again for each use (the kernel formats some hundred lines for
//! it), are those it was made from: the same kernel at the same place, and
//! addresses still shown (`kptr_restrict`). `CALLSTACK_KALLSYMS_CACHE=0`
//! turns it off.

use super::kernel::Kallsyms;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The first line of a cache file.
const MAGIC: &[u8] = b"callstack kallsyms 1\n";
/// How much of `/proc/kallsyms`' start is compared.
const HEAD: usize = 4096;
/// A head shorter than this (a read cut short) proves nothing.
const MIN_HEAD: usize = 256;

/// The kernel's own text symbols, from the boot's cache file.
pub(super) struct CoreSymbols {
    /// The symbols, indexed as [`Kallsyms`] indexes the whole file.
    pub(super) syms: Kallsyms,
    /// The first symbol's address and `_etext` (else the last symbol's):
    /// an address in `[start, end)` falls in the same function here as in
    /// the whole file.
    start: u64,
    end: u64,
    /// The start of `/proc/kallsyms` the file was made from.
    head: Vec<u8>,
}

impl CoreSymbols {
    /// Whether `addr`'s function is settled by these symbols alone (see
    /// [`CoreSymbols::end`]).
    pub(super) fn settles(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// `bytes` up to and with its last newline.
fn whole_lines(bytes: &[u8]) -> &[u8] {
    match memchr::memrchr(b'\n', bytes) {
        Some(i) => &bytes[..=i],
        None => &[],
    }
}

/// The lines of `/proc/kallsyms` text `text` that are the kernel's own
/// text symbols (no `\t[module]` after the name), with their addresses.
fn core_lines(text: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    text.split(|&c| c == b'\n')
        .filter(|b| !b.contains(&b'\t'))
        .filter_map(|b| super::kernel::text_symbol(b).map(|a| (a, b)))
}

/// The bytes of a cache file made from `text`, the whole of a
/// `/proc/kallsyms` read; `None` when it holds no kernel text symbol (its
/// addresses hidden).
pub(super) fn encode(text: &[u8]) -> Option<Vec<u8>> {
    let head = whole_lines(&text[..text.len().min(HEAD)]);
    if head.len() < MIN_HEAD {
        return None;
    }
    let (mut start, mut last, mut etext) = (u64::MAX, 0u64, None);
    let mut body = Vec::with_capacity(text.len() * 3 / 4);
    for (addr, line) in core_lines(text) {
        start = start.min(addr);
        last = last.max(addr);
        if &line[19..] == b"_etext" {
            etext = Some(addr);
        }
        body.extend_from_slice(line);
        body.push(b'\n');
    }
    if start == u64::MAX {
        return None;
    }
    let end = etext.filter(|&e| e > start).unwrap_or(last);
    let mut out = Vec::with_capacity(body.len() + head.len() + 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(format!("{}\n", head.len()).as_bytes());
    out.extend_from_slice(head);
    out.extend_from_slice(format!("{start:016x} {end:016x}\n").as_bytes());
    out.extend_from_slice(&body);
    Some(out)
}

/// The symbols of cache file `bytes`; `None` when it is not one.
pub(super) fn decode(mut bytes: Vec<u8>) -> Option<CoreSymbols> {
    let rest = bytes.strip_prefix(MAGIC)?;
    let nl = memchr::memchr(b'\n', rest)?;
    let head_len: usize = std::str::from_utf8(&rest[..nl]).ok()?.parse().ok()?;
    let rest = &rest[nl + 1..];
    let head = rest.get(..head_len)?.to_vec();
    let rest = &rest[head_len..];
    let nl = memchr::memchr(b'\n', rest)?;
    let range = std::str::from_utf8(&rest[..nl]).ok()?;
    let (start, end) = range.split_once(' ')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let body_at = bytes.len() - (rest.len() - nl - 1);
    bytes.drain(..body_at);
    let syms = Kallsyms::parse(bytes);
    (start < end && !syms.is_empty()).then_some(CoreSymbols {
        syms,
        start,
        end,
        head,
    })
}

/// Whether `live`, the first bytes read now of `/proc/kallsyms`, begins
/// as the file the cache was made from began.
fn same_start(cached: &[u8], live: &[u8]) -> bool {
    let live = whole_lines(live);
    live.len() >= MIN_HEAD && cached.starts_with(live)
}

/// The cache file of this boot, when there is a place for it.
fn cache_path() -> Option<PathBuf> {
    if std::env::var_os("CALLSTACK_KALLSYMS_CACHE").is_some_and(|v| v == "0") {
        return None;
    }
    let nonempty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let dir = match (nonempty("XDG_CACHE_HOME"), nonempty("HOME")) {
        (Some(x), _) => PathBuf::from(x).join("callstack"),
        (None, Some(h)) => PathBuf::from(h).join(".cache").join("callstack"),
        (None, None) => return None,
    };
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let boot = boot.trim();
    let ok = !boot.is_empty() && boot.bytes().all(|c| c.is_ascii_hexdigit() || c == b'-');
    ok.then(|| dir.join(format!("kallsyms-{boot}")))
}

/// The first bytes of `/proc/kallsyms`, in one read.
fn live_head() -> Option<Vec<u8>> {
    let mut f = std::fs::File::open("/proc/kallsyms").ok()?;
    let mut buf = vec![0u8; HEAD];
    let n = f.read(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// The kernel's own text symbols from this boot's cache, when it has one
/// that `/proc/kallsyms` still agrees with. Kept in memory once read.
pub(super) fn core_symbols() -> Option<Arc<CoreSymbols>> {
    core_symbols_at(&cache_path()?)
}

/// [`core_symbols`] from the cache file at `path`.
fn core_symbols_at(path: &Path) -> Option<Arc<CoreSymbols>> {
    static KEPT: Mutex<Option<(PathBuf, Arc<CoreSymbols>)>> = Mutex::new(None);
    let live = live_head()?;
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, c)) = &*kept {
        if p == path && same_start(&c.head, &live) {
            return Some(c.clone());
        }
    }
    if !ours(path, false) {
        return None;
    }
    let c = decode(std::fs::read(path).ok()?).filter(|c| same_start(&c.head, &live))?;
    let c = Arc::new(c);
    *kept = Some((path.to_path_buf(), c.clone()));
    Some(c)
}

/// Writes this boot's cache from `text`, a whole `/proc/kallsyms` read
/// (in place of one [`core_symbols`] found no good); removes other boots'
/// files. Best effort: a recording does not fail for its cache.
pub(super) fn store(text: &[u8]) {
    if let Some(path) = cache_path() {
        let _ = store_at(&path, text);
    }
}

/// [`store`] at `path`.
fn store_at(path: &Path, text: &[u8]) -> io::Result<()> {
    let bytes = encode(text).ok_or(io::ErrorKind::PermissionDenied)?;
    write_private(path, &bytes)
}

/// Writes `bytes` to `path` whole or not at all (a file of its own, then
/// renamed), readable by its owner only; other `kallsyms-*` files of the
/// directory (other boots) are removed.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().ok_or(io::ErrorKind::InvalidInput)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if !ours(dir, true) {
        return Err(io::ErrorKind::PermissionDenied.into());
    }
    let tmp = dir.join(format!(".kallsyms.{}", std::process::id()));
    // A new file, not one found there (nor where a link found there
    // points).
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = f.write_all(bytes).and_then(|_| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("kallsyms-") && e.path() != path {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(())
}

/// Whether `path` is a file (or with `dir`, a directory) of this user's
/// own, not a link, that no other user can write: a cache that another
/// user could plant or point elsewhere is not used.
fn ours(path: &Path, dir: bool) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return false;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let kind = if dir { m.is_dir() } else { m.is_file() };
    kind && m.uid() == me && m.mode() & 0o022 == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::kernel::symbols_of;

    /// Makes `dir`, writable by its owner alone whatever the umask.
    fn private_dir(dir: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }

    /// A `/proc/kallsyms` of a kernel with a module and a BPF program;
    /// long enough that its head is one.
    fn text() -> String {
        let mut t = String::new();
        for i in 0..40u64 {
            t += &format!("{:016x} T start_fn_{i}\n", 0xffffffff81000000u64 + i * 0x10);
        }
        t += "ffffffff81001000 t helper\n";
        t += "ffffffff81001100 D some_data\n";
        t += "ffffffff81002000 T do_syscall_64\n";
        t += "ffffffff81003000 T _etext\n";
        t += "ffffffff81004000 T _sinittext\n";
        t += "ffffffffc0001000 t ext4_fn\t[ext4]\n";
        t += "ffffffffc0002000 t bpf_prog_1234_f\t[bpf]\n";
        t
    }

    #[test]
    fn a_cache_names_the_kernels_functions_as_the_whole_file_does() {
        let text = text();
        let whole = Kallsyms::parse(text.as_bytes().to_vec());
        let core = decode(encode(text.as_bytes()).unwrap()).unwrap();
        let inside = [0xffffffff81000005, 0xffffffff81001050, 0xffffffff81002fff];
        for a in inside {
            assert!(core.settles(a), "{a:x}");
        }
        assert_eq!(
            symbols_of(&core.syms, inside),
            symbols_of(&whole, inside),
            "same functions, same ends"
        );
        // Past `_etext`, before the first symbol, a module, a BPF program:
        // left to the whole file.
        for a in [
            0xffffffff81003000,
            0xffffffff81004010,
            0xffffffff80ffffff,
            0xffffffffc0001010,
            0xffffffffc0002010,
        ] {
            assert!(!core.settles(a), "{a:x}");
        }
    }

    #[test]
    fn a_cache_is_trusted_only_while_the_file_begins_as_it_did() {
        let text = text();
        let core = decode(encode(text.as_bytes()).unwrap()).unwrap();
        assert!(same_start(&core.head, text.as_bytes()));
        // A read cut short, within a line: its whole lines still agree.
        assert!(same_start(&core.head, &text.as_bytes()[..300]));
        // Addresses hidden now (`kptr_restrict`), or another boot's.
        let hidden: String = text
            .lines()
            .map(|l| format!("0000000000000000{}\n", &l[16..]))
            .collect();
        assert!(!same_start(&core.head, hidden.as_bytes()));
        let moved = text.replace("ffffffff8100", "ffffffff8200");
        assert!(!same_start(&core.head, moved.as_bytes()));
        // Too little read to tell.
        assert!(!same_start(&core.head, &text.as_bytes()[..100]));
    }

    /// This machine's `/proc/kallsyms`, through a cache file written and
    /// read back: every kernel text symbol's function named as the whole
    /// file names it. Passes over a machine that hides the addresses.
    #[test]
    fn this_kernels_cache_agrees_with_its_kallsyms() {
        let Ok(text) = std::fs::read("/proc/kallsyms") else {
            return;
        };
        let whole = Kallsyms::parse(text.clone());
        let dir = std::env::temp_dir().join(format!("callstack-kcache-{}", std::process::id()));
        let path = dir.join("kallsyms-test");
        private_dir(&dir);
        std::fs::write(dir.join("kallsyms-another-boot"), b"old").unwrap();
        let stored = store_at(&path, &text);
        if whole.is_empty() {
            assert!(stored.is_err(), "addresses hidden, yet a cache");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        stored.unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "kernel addresses readable by others");
        assert!(
            !dir.join("kallsyms-another-boot").exists(),
            "another boot's file kept"
        );
        let core = core_symbols_at(&path).expect("this boot's cache refused");
        let addrs: Vec<u64> = core_lines(&text)
            .step_by(7)
            .flat_map(|(a, _)| [a, a + 1])
            .filter(|&a| core.settles(a))
            .collect();
        assert!(addrs.len() > 1000, "{} kernel addresses", addrs.len());
        assert_eq!(
            symbols_of(&core.syms, addrs.iter().copied()),
            symbols_of(&whole, addrs)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A directory others can write, or a link, is not used for a cache.
    #[test]
    fn a_cache_is_kept_only_where_no_one_else_can_write() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("callstack-kperm-{}", std::process::id()));
        let open = base.join("open");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(store_at(&open.join("kallsyms-x"), text().as_bytes()).is_err());
        let own = base.join("own");
        private_dir(&own);
        let link = base.join("link");
        std::os::unix::fs::symlink(&own, &link).unwrap();
        assert!(store_at(&link.join("kallsyms-x"), text().as_bytes()).is_err());
        store_at(&own.join("kallsyms-x"), text().as_bytes()).unwrap();
        assert!(ours(&own.join("kallsyms-x"), false));
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn bad_cache_files_are_not_used() {
        let good = encode(text().as_bytes()).unwrap();
        assert!(decode(Vec::new()).is_none());
        assert!(decode(b"callstack kallsyms 1\n99999\nshort".to_vec()).is_none());
        for cut in [10, MAGIC.len() + 2, good.len() / 2] {
            // A file cut anywhere decodes to nothing or to what it holds;
            // never a panic.
            let _ = decode(good[..cut].to_vec());
        }
        let mut other = good.clone();
        other[0] = b'X';
        assert!(decode(other).is_none());
        // Hidden addresses give no cache at all.
        let hidden: String = text()
            .lines()
            .map(|l| format!("0000000000000000{}\n", &l[16..]))
            .collect();
        assert!(encode(hidden.as_bytes()).is_none());
    }
}
