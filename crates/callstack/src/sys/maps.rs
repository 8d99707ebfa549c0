//! Reading `/proc/self/maps` without allocating, for use in signal handlers.

/// Finds the mapping that contains `addr` in `/proc/self/maps`.
///
/// Async-signal-safe: `open`, `read` and `close` only, a 4 KiB buffer on the
/// stack, no allocation. Returns `(start, end)` of the mapping.
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

/// Calls `f(start, end)` for each mapping of `/proc/self/maps` until it
/// returns `false`.
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
        parse_hex(&line[..dash])?,
        parse_hex(&line[dash + 1..space])?,
    ))
}

fn parse_hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0usize;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | d as usize;
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
    }

    #[test]
    fn finds_the_mapping_of_a_stack_variable() {
        let x = 5u64;
        let a = &x as *const u64 as usize;
        let (lo, hi) = mapping_containing(a).expect("stack mapping");
        assert!(lo <= a && a < hi);
    }
}
