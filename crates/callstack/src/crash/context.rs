//! The crash context the handler sends its helper after the raw report, on
//! the helper's standard input only (never on stderr or the report file):
//! what the helper needs to write a minidump of the crashed process, which
//! it cannot learn by reading that process (the crashing thread's registers
//! at the fault are in the signal frame, not in the registers `ptrace`
//! shows: those are the handler's, waiting for the helper).
//!
//! The format is text, one field a line, between two marker lines:
//!
//! ```text
//! *** callstack: crash context ***
//! pid: 1234
//! tid: 1240
//! signal: 11 1 0x0              (number, si_code, si_addr)
//! symbolize: 1                  (0: write the minidump only)
//! minidump-dir: /var/crash      (the rest of the line; absent: no dump)
//! regs: x86_64 0x... 0x...      (the kernel's user_regs_struct, word by word)
//! *** end of crash context ***
//! ```
//!
//! The `regs` words are in the order of the architecture's
//! `user_regs_struct` (27 words on x86-64; 34 on AArch64: x0-x30, sp, pc,
//! pstate; 32 on RISC-V 64: pc, x1-x31), the layout `NT_PRSTATUS` and
//! `PTRACE_GETREGS` use, so that the helper reads them with the same code
//! as a core's registers. They come from the architecture's
//! `arch/<name>/context.rs` (`user_regs`), which also gives the crash
//! handler and [`crate::capture_from_context`] their registers.

#[cfg(target_os = "linux")]
use super::fmt::Buf;

/// First line of the context block.
pub(crate) const BEGIN_CONTEXT: &str = "*** callstack: crash context ***\n";
/// Last line of the context block.
pub(crate) const END_CONTEXT: &str = "*** end of crash context ***\n";

/// Room for the context block (at most 34 words and a path).
#[cfg(target_os = "linux")]
pub(crate) const CONTEXT_BYTES: usize = 8 * 1024;

/// What the handler knows of a crash, for [`write_context`].
#[cfg(target_os = "linux")]
pub(crate) struct Fields<'a> {
    pub(crate) pid: i32,
    pub(crate) tid: i32,
    pub(crate) signal: i32,
    pub(crate) code: i32,
    pub(crate) address: u64,
    pub(crate) symbolize: bool,
    /// The minidump directory, or empty for none.
    pub(crate) minidump_dir: &'a [u8],
}

/// Writes the context block of a crash into `out`; returns its length, 0
/// if it did not fit. Async-signal-safe: no allocation, no system call.
#[cfg(target_os = "linux")]
pub(crate) fn write_context(out: &mut [u8], f: &Fields<'_>, ctx: &libc::ucontext_t) -> usize {
    let mut w = Buf::new(out);
    w.str(BEGIN_CONTEXT);
    w.str("pid: ").dec(f.pid as u64).str("\n");
    w.str("tid: ").dec(f.tid as u64).str("\n");
    w.str("signal: ")
        .dec_i(f.signal as i64)
        .str(" ")
        .dec_i(f.code as i64)
        .str(" ")
        .hex(f.address, 1)
        .str("\n");
    w.str("symbolize: ")
        .str(if f.symbolize { "1" } else { "0" })
        .str("\n");
    if !f.minidump_dir.is_empty() {
        w.str("minidump-dir: ").bytes(f.minidump_dir).str("\n");
    }
    #[cfg(callstack_native)]
    {
        use crate::arch::Arch;
        let words = crate::arch::native::context::user_regs(ctx);
        w.str("regs: ").str(crate::arch::NativeArch::NAME);
        for v in &words {
            w.str(" ").hex(*v, 1);
        }
        w.str("\n");
    }
    #[cfg(not(callstack_native))]
    let _ = ctx;
    w.str(END_CONTEXT);
    if w.truncated() {
        0
    } else {
        w.len()
    }
}

/// A parsed context block (the helper's side).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrashContext {
    /// The crashed process.
    pub pid: u32,
    /// The thread that crashed.
    pub tid: u32,
    /// The signal number.
    pub signal: i32,
    /// Its `si_code`.
    pub code: i32,
    /// Its `si_addr` (the fault address; 0 for a signal sent by a process).
    pub address: u64,
    /// Whether the helper should also print the symbolized report.
    pub symbolize: bool,
    /// Where to write the minidump, if anywhere.
    pub minidump_dir: Option<std::path::PathBuf>,
    /// The architecture name and the `user_regs_struct` words, if sent.
    pub regs: Option<(String, Vec<u64>)>,
    /// Windows: the exception's code and where the crashed process keeps
    /// its `EXCEPTION_RECORD` and `CONTEXT` (line `exception: CODE RECORD
    /// CONTEXT`), which the helper reads with `ReadProcessMemory`.
    pub exception: Option<(u32, u64, u64)>,
}

fn parse_num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Finds the context block in what the helper read on standard input (the
/// last one, if several); `None` if there is none or it is malformed.
pub fn parse_context(text: &str) -> Option<CrashContext> {
    let begin = text.rfind(BEGIN_CONTEXT.trim_end())?;
    let body = &text[begin + BEGIN_CONTEXT.len() - 1..];
    let end = body.find(END_CONTEXT.trim_end())?;
    let mut c = CrashContext::default();
    let (mut pid, mut tid, mut sig) = (false, false, false);
    for line in body[..end].lines() {
        let Some((key, value)) = line.split_once(": ") else {
            continue;
        };
        match key {
            "pid" => {
                c.pid = value.parse().ok()?;
                pid = true;
            }
            "tid" => {
                c.tid = value.parse().ok()?;
                tid = true;
            }
            "signal" => {
                let mut it = value.split(' ');
                c.signal = it.next()?.parse().ok()?;
                c.code = it.next()?.parse().ok()?;
                c.address = parse_num(it.next()?)?;
                sig = true;
            }
            "symbolize" => c.symbolize = value == "1",
            "exception" => {
                let mut it = value.split(' ').map(parse_num);
                let (code, record, context) = (it.next()??, it.next()??, it.next()??);
                c.exception = Some((u32::try_from(code).ok()?, record, context));
            }
            "minidump-dir" if !value.is_empty() => c.minidump_dir = Some(value.into()),
            "regs" => {
                let mut it = value.split(' ');
                let arch = it.next()?.to_string();
                let words = it.map(parse_num).collect::<Option<Vec<u64>>>()?;
                c.regs = Some((arch, words));
            }
            _ => {}
        }
    }
    (pid && tid && sig).then_some(c)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn context_round_trips_and_bad_blocks_are_refused() {
        // SAFETY: an all-zero ucontext is a valid value to read registers
        // from.
        #[cfg_attr(not(callstack_native), allow(unused_mut))]
        let mut uc: libc::ucontext_t = unsafe { core::mem::zeroed() };
        #[cfg(callstack_native)]
        crate::arch::native::context::set_pc_sp(&mut uc, 0x1234, 0x7ff0);
        let mut buf = [0u8; CONTEXT_BYTES];
        let f = Fields {
            pid: 10,
            tid: 11,
            signal: 11,
            code: -6,
            address: 0xdead,
            symbolize: true,
            minidump_dir: b"/tmp/a dir",
        };
        let n = write_context(&mut buf, &f, &uc);
        assert!(n > 0);
        let text = format!("raw\n{}", std::str::from_utf8(&buf[..n]).unwrap());
        let c = parse_context(&text).unwrap();
        assert_eq!((c.pid, c.tid, c.signal, c.code), (10, 11, 11, -6));
        assert_eq!(c.address, 0xdead);
        assert!(c.symbolize);
        assert_eq!(c.minidump_dir.as_deref(), Some("/tmp/a dir".as_ref()));
        #[cfg(callstack_native)]
        {
            use crate::arch::{native::context, Arch, NativeArch};
            let (arch, words) = c.regs.clone().unwrap();
            assert_eq!(arch, NativeArch::NAME);
            let words: [u64; context::USER_REGS_WORDS] = words.try_into().unwrap();
            let r = context::regs_from_user_regs(&words);
            assert_eq!((r.pc, r.sp), (0x1234, 0x7ff0));
            // The helper reads them as a core's registers.
            if let Some(m) = crate::arch::NATIVE_MACHINE {
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                let regs = m.registers_from_user_regs(&bytes).unwrap();
                assert_eq!(regs.pc(), Some(0x1234));
                assert_eq!(regs.sp(), Some(0x7ff0));
            }
        }
        // Truncations and corruptions: no context or a partial one, never
        // a panic.
        for cut in 0..text.len() {
            let _ = parse_context(&text[..cut]);
        }
        assert!(parse_context(&text.replace("pid: 10", "pid: x")).is_none());
        assert!(parse_context(&text.replace("signal: 11 -6 0xdead", "signal: 11")).is_none());
        assert!(parse_context("no block").is_none());
        // The Windows line.
        let win = text.replace("symbolize: 1", "exception: 0xc0000005 0x10 0x20");
        assert_eq!(
            parse_context(&win).unwrap().exception,
            Some((0xc000_0005, 0x10, 0x20))
        );
        assert!(parse_context(&text.replace("symbolize: 1", "exception: 0x1 0x2")).is_none());
        // Too small a buffer: nothing rather than half a block.
        assert_eq!(write_context(&mut [0u8; 40], &f, &uc), 0);
    }
}
