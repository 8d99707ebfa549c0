//! Kernel frames' names: `/proc/kallsyms` read once at record time, and
//! only the functions the profile's kernel addresses fall in kept in the
//! recording (trace record `K`), so that a report needs no `/proc/kallsyms`
//! and names them right on any machine.

use std::io;

/// One kernel function of a profile: where it starts and ends, its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSymbol {
    /// Its first address.
    pub start: u64,
    /// The address past its end (the next kernel symbol's start, as far
    /// as `/proc/kallsyms` tells).
    pub end: u64,
    /// Its name, as `/proc/kallsyms` gives it (without the module).
    pub name: String,
}

/// `/proc/kallsyms`' text symbols: the file's bytes, and (address, offset
/// of the name in the bytes) sorted by address. No string per symbol: the
/// file has over 100,000 lines and a profile needs a few hundred (only
/// the names kept are checked to be UTF-8).
pub(crate) struct Kallsyms {
    text: Vec<u8>,
    index: Vec<(u64, u32)>,
}

impl Kallsyms {
    /// Indexes the text of a `/proc/kallsyms` file: lines
    /// `ffffffff81000000 T _stext [module]`; text symbols (`t T w W`) only.
    /// (A recording's end reads it: a byte scan, where lines as `str`
    /// cost the recorder of a whole host a third of the file's reading.)
    pub(crate) fn parse(text: Vec<u8>) -> Kallsyms {
        let mut index = Vec::with_capacity(text.len() / 40);
        let mut at = 0usize;
        while at < text.len() {
            let end = memchr::memchr(b'\n', &text[at..]).map_or(text.len(), |i| at + i);
            if let Some(a) = text_symbol(&text[at..end]) {
                index.push((a, (at + 19) as u32));
            }
            at = end + 1;
        }
        // The kernel's own symbols come sorted; its modules' after them.
        if !index.is_sorted() {
            index.sort_unstable();
        }
        Kallsyms { text, index }
    }

    /// Whether it holds no symbol (the file's addresses hidden).
    pub(crate) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The symbol `addr` falls in: its start, end (the next symbol's start;
    /// `addr + 1` after the last one) and name.
    pub(crate) fn lookup(&self, addr: u64) -> Option<(u64, u64, &str)> {
        let i = self.index.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (start, at) = self.index[i];
        let end = self.index[i + 1..]
            .iter()
            .map(|s| s.0)
            .find(|&a| a > start)
            .unwrap_or(addr + 1);
        let rest = &self.text[at as usize..];
        let len = rest
            .iter()
            .position(|c| c.is_ascii_whitespace())
            .unwrap_or(rest.len());
        let name = std::str::from_utf8(&rest[..len]).ok()?;
        Some((start, end, name))
    }
}

/// The address of `line` of `/proc/kallsyms` when it is a text symbol's
/// (`t T w W`) and shown (not 0); the name starts at byte 19.
pub(crate) fn text_symbol(line: &[u8]) -> Option<u64> {
    let ok = line.len() > 19
        && line[16] == b' '
        && line[18] == b' '
        && matches!(line[17], b't' | b'T' | b'w' | b'W');
    if !ok {
        return None;
    }
    crate::sys::maps::parse_hex(&line[..16]).filter(|&a| a != 0)
}

/// The kernel functions that `addrs` fall in, from this machine's
/// `/proc/kallsyms`, sorted by start, one per function. What a recorder
/// stores in its profile ([`super::Profile::kernel_symbols`]) so that its
/// kernel frames are named wherever the recording is read.
///
/// Errors when `/proc/kallsyms` cannot be read or hides its addresses
/// (`kptr_restrict`; root reads them).
///
/// The file read is kept for the next call, up to a minute and
/// while `/proc/modules` stays the same: a recording that writes a profile
/// every few seconds (`record --rotate`) would otherwise have the kernel
/// format its 100,000 lines each time (some 40 ms of CPU here). And the
/// kernel's own functions are kept on disk for the boot
/// ([`super::kernel_cache`]): when every address falls in them, the file
/// is not read at all.
pub fn kernel_symbols_for(addrs: impl IntoIterator<Item = u64>) -> io::Result<Vec<KernelSymbol>> {
    /// The file parsed, when, and `/proc/modules` then.
    type Kept = Option<(std::sync::Arc<Kallsyms>, std::time::Instant, Vec<u8>)>;
    static KEPT: std::sync::Mutex<Kept> = std::sync::Mutex::new(None);
    let addrs: Vec<u64> = addrs.into_iter().collect();
    let modules = std::fs::read("/proc/modules").unwrap_or_default();
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    let k = match &*kept {
        Some((k, at, m)) if at.elapsed() < KALLSYMS_KEPT && *m == modules => k.clone(),
        _ => {
            let core = super::kernel_cache::core_symbols();
            if let Some(core) = &core {
                if addrs.iter().all(|&a| core.settles(a)) {
                    return Ok(symbols_of(&core.syms, addrs));
                }
            }
            let text = std::fs::read("/proc/kallsyms")?;
            if core.is_none() {
                super::kernel_cache::store(&text);
            }
            let k = std::sync::Arc::new(Kallsyms::parse(text));
            if k.is_empty() {
                *kept = None;
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "/proc/kallsyms hides its addresses (kernel.kptr_restrict)",
                ));
            }
            *kept = Some((k.clone(), std::time::Instant::now(), modules));
            k
        }
    };
    drop(kept);
    Ok(symbols_of(&k, addrs))
}

/// How long [`kernel_symbols_for`] uses a `/proc/kallsyms` read again
/// (what changes without a module loaded, BPF programs' and ftrace
/// trampolines' symbols, is then at most this old).
const KALLSYMS_KEPT: std::time::Duration = std::time::Duration::from_secs(60);

pub(crate) fn symbols_of(k: &Kallsyms, addrs: impl IntoIterator<Item = u64>) -> Vec<KernelSymbol> {
    let mut addrs: Vec<u64> = addrs.into_iter().collect();
    addrs.sort_unstable();
    addrs.dedup();
    let mut out: Vec<KernelSymbol> = Vec::new();
    for a in addrs {
        let Some((start, end, name)) = k.lookup(a) else {
            continue;
        };
        match out.last_mut() {
            // Sorted addresses: a function's addresses come together.
            Some(last) if last.start == start => last.end = last.end.max(end),
            _ => out.push(KernelSymbol {
                start,
                end,
                name: name.to_string(),
            }),
        }
    }
    out
}

/// The symbol of `syms` (sorted by start) that `addr` falls in.
#[cfg(any(test, feature = "symbolize"))]
pub(crate) fn find(syms: &[KernelSymbol], addr: u64) -> Option<&KernelSymbol> {
    let i = syms.partition_point(|s| s.start <= addr).checked_sub(1)?;
    Some(&syms[i]).filter(|s| addr < s.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
ffffffff81000000 T _stext
ffffffff81000000 T startup_64
ffffffff81000100 t helper
ffffffff81000200 D some_data
ffffffff81000300 T do_syscall_64
0000000000000000 T hidden
ffffffffc0001000 t ext4_fn\t[ext4]
ffffffff81000400 W weak_fn
";

    #[test]
    fn lookup_finds_the_function_and_its_end() {
        let k = Kallsyms::parse(TEXT.as_bytes().to_vec());
        assert_eq!(
            k.lookup(0xffffffff81000010),
            Some((0xffffffff81000000, 0xffffffff81000100, "startup_64"))
        );
        // Data symbols do not end functions.
        assert_eq!(
            k.lookup(0xffffffff81000250),
            Some((0xffffffff81000100, 0xffffffff81000300, "helper"))
        );
        assert_eq!(
            k.lookup(0xffffffffc0001010),
            Some((0xffffffffc0001000, 0xffffffffc0001011, "ext4_fn"))
        );
        assert_eq!(k.lookup(0xffffffff80000000), None);
    }

    #[test]
    fn symbols_of_keeps_one_per_function() {
        let k = Kallsyms::parse(TEXT.as_bytes().to_vec());
        let syms = symbols_of(
            &k,
            [
                0xffffffff81000310,
                0xffffffff81000110,
                0xffffffff81000120,
                0xffffffff81000310,
                0x1000,
            ],
        );
        let names: Vec<&str> = syms.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["helper", "do_syscall_64"]);
        assert_eq!(syms[1].end, 0xffffffff81000400);
        assert_eq!(
            find(&syms, 0xffffffff81000300).map(|s| s.name.as_str()),
            Some("do_syscall_64")
        );
        assert_eq!(find(&syms, 0xffffffff81000400), None);
        assert_eq!(
            find(&syms, 0xffffffff81000200).map(|s| s.name.as_str()),
            Some("helper")
        );
    }
}
