//! Reading `/proc/self/maps` without allocating, for use in signal handlers.

/// Finds the mapping that contains `addr` in `/proc/self/maps`.
///
/// Async-signal-safe: `open`, `read` and `close` only, a 4 KiB buffer on the
/// stack, no allocation. Returns `(start, end)` of the mapping.
#[cfg(test)]
pub fn mapping_containing(addr: usize) -> Option<(usize, usize)> {
    let mut found = None;
    for_each_mapping(|start, end| {
        if start <= addr && addr < end {
            found = Some((start, end));
            false
        } else {
            true
        }
    });
    found
}

/// Finds the mapping that contains `addr` if it can hold a stack: readable,
/// writable and private (`rw?p`). A `PROT_NONE` guard page, `[vsyscall]`,
/// `[vvar]`, read-only or shared mappings give `None`: reading anywhere in
/// the range returned cannot fault (as long as it stays mapped).
///
/// Async-signal-safe, like [`mapping_containing`].
pub fn stack_mapping_containing(addr: usize) -> Option<(usize, usize)> {
    let mut found = None;
    for_each_line(|line| match parse_range(line) {
        Some((start, end)) if start <= addr && addr < end => {
            if perms_allow_stack(line) {
                found = Some((start, end));
            }
            false
        }
        _ => true,
    });
    found
}

/// The executable mappings (`x` in their permissions), `(start, end)` in
/// file order. Allocates: not for signal handlers.
pub fn executable_mappings() -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for_each_line(|line| {
        if let Some(r) = parse_range(line) {
            let perms = line
                .iter()
                .position(|&b| b == b' ')
                .and_then(|s| line.get(s + 1..s + 5));
            if perms.is_some_and(|p| p[2] == b'x') {
                out.push(r);
            }
        }
        true
    });
    out
}

/// Whether the permissions field of a maps line reads `rw?p`.
fn perms_allow_stack(line: &[u8]) -> bool {
    let Some(space) = line.iter().position(|&b| b == b' ') else {
        return false;
    };
    matches!(line.get(space + 1..space + 5), Some([b'r', b'w', _, b'p']))
}

/// Calls `f(start, end)` for each mapping of `/proc/self/maps` until it
/// returns `false`.
#[cfg(test)]
pub fn for_each_mapping(mut f: impl FnMut(usize, usize) -> bool) {
    for_each_line(|line| match parse_range(line) {
        Some((lo, hi)) => f(lo, hi),
        None => true,
    });
}

/// Calls `f(line)` for each line of `/proc/self/maps` (without its newline)
/// until it returns `false`.
///
/// Async-signal-safe: `open`, `read` and `close` only, a 4 KiB buffer on the
/// stack, no allocation. Lines are handed over as they stream in, so any
/// number of mappings costs no more memory than the buffer; a line longer
/// than the buffer (a huge path) is skipped whole.
pub fn for_each_line(mut f: impl FnMut(&[u8]) -> bool) {
    const PATH: &[u8] = b"/proc/self/maps\0";
    // SAFETY: PATH is NUL-terminated; open is async-signal-safe.
    let fd = unsafe { libc::open(PATH.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 4096];
    let mut filled = 0usize;
    // Inside the tail of a line that did not fit in the buffer.
    let mut skipping = false;
    'outer: loop {
        // SAFETY: the destination is the unused tail of `buf`.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().add(filled).cast(), buf.len() - filled) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            break;
        }
        let eof = n == 0;
        filled += n as usize;
        let mut start = 0;
        while let Some(nl) = buf[start..filled].iter().position(|&b| b == b'\n') {
            if !skipping && !f(&buf[start..start + nl]) {
                break 'outer;
            }
            skipping = false;
            start += nl + 1;
        }
        if eof {
            break;
        }
        // Keep the partial line at the front of the buffer.
        buf.copy_within(start..filled, 0);
        filled -= start;
        if filled == buf.len() {
            filled = 0;
            skipping = true;
        }
    }
    // SAFETY: fd was opened above and is closed once.
    unsafe { libc::close(fd) };
}

fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Parses the `start-end` hex range at the front of a maps line.
pub fn parse_range(line: &[u8]) -> Option<(usize, usize)> {
    let dash = line.iter().position(|&b| b == b'-')?;
    let space = line.iter().position(|&b| b == b' ')?;
    if space <= dash {
        return None;
    }
    Some((
        parse_hex(&line[..dash])? as usize,
        parse_hex(&line[dash + 1..space])? as usize,
    ))
}

/// Up to 16 hex digits (no prefix) as a number, without allocating (for
/// `/proc` text read in signal handlers too); `None` for anything else.
pub(crate) fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | d as u64;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_maps_line() {
        let line = b"7ffeba3f2000-7ffeba413000 rw-p 00000000 00:00 0    [stack]";
        assert_eq!(parse_range(line), Some((0x7ffeba3f2000, 0x7ffeba413000)));
        assert_eq!(parse_range(b"zz-1 r"), None);
        assert_eq!(parse_range(b""), None);
        assert!(perms_allow_stack(line));
        assert!(!perms_allow_stack(
            b"7ffeba3f2000-7ffeba413000 ---p 00000000 00:00 0"
        ));
        assert!(!perms_allow_stack(
            b"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]"
        ));
        assert!(!perms_allow_stack(
            b"7f0000000000-7f0000001000 r--p 00000000 00:00 0 [vvar]"
        ));
        assert!(!perms_allow_stack(
            b"7f0000000000-7f0000001000 rw-s 00000000 00:05 7 /dev/zero"
        ));
        assert!(!perms_allow_stack(b"7f0000000000-7f0000001000"));
    }

    #[test]
    fn finds_the_mapping_of_a_stack_variable() {
        let x = 5u64;
        let a = &x as *const u64 as usize;
        let (lo, hi) = mapping_containing(a).expect("stack mapping");
        assert!(lo <= a && a < hi);
        assert_eq!(stack_mapping_containing(a), Some((lo, hi)));
    }

    #[test]
    fn a_prot_none_page_is_no_stack() {
        // SAFETY: a fresh private mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                4096,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let a = p as usize + 64;
        assert!(mapping_containing(a).is_some());
        assert_eq!(stack_mapping_containing(a), None);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, 4096) };
    }
}
