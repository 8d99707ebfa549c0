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
//! `user_regs_struct` (27 words on x86-64, 34 on AArch64: x0-x30, sp, pc,
//! pstate), the layout `NT_PRSTATUS` and `PTRACE_GETREGS` use, so that the
//! helper reads them with the same code as a core's registers.

use super::fmt::Buf;

/// First line of the context block.
pub(crate) const BEGIN_CONTEXT: &str = "*** callstack: crash context ***\n";
/// Last line of the context block.
pub(crate) const END_CONTEXT: &str = "*** end of crash context ***\n";

/// Room for the context block (27 or 34 words and a path).
pub(crate) const CONTEXT_BYTES: usize = 8 * 1024;

/// What the handler knows of a crash, for [`write_context`].
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
    let mut words = [0u64; 34];
    if let Some((arch, n)) = user_regs(ctx, &mut words) {
        w.str("regs: ").str(arch);
        for v in &words[..n] {
            w.str(" ").hex(*v, 1);
        }
        w.str("\n");
    }
    w.str(END_CONTEXT);
    if w.truncated() {
        0
    } else {
        w.len()
    }
}

/// The interrupted general registers of a signal context as the words of
/// the architecture's `user_regs_struct`; returns the architecture's name
/// and the word count.
fn user_regs(ctx: &libc::ucontext_t, out: &mut [u64; 34]) -> Option<(&'static str, usize)> {
    #[cfg(target_arch = "x86_64")]
    {
        use libc::*;
        let g = &ctx.uc_mcontext.gregs;
        let r = |i: i32| g[i as usize] as u64;
        // csgsfs packs cs (bits 0-15), gs (16-31) and fs (32-47).
        let csgsfs = r(REG_CSGSFS);
        let words = [
            r(REG_R15),
            r(REG_R14),
            r(REG_R13),
            r(REG_R12),
            r(REG_RBP),
            r(REG_RBX),
            r(REG_R11),
            r(REG_R10),
            r(REG_R9),
            r(REG_R8),
            r(REG_RAX),
            r(REG_RCX),
            r(REG_RDX),
            r(REG_RSI),
            r(REG_RDI),
            u64::MAX, // orig_rax: no system call was interrupted
            r(REG_RIP),
            csgsfs & 0xffff,
            r(REG_EFL),
            r(REG_RSP),
            0x2b, // ss of user mode on x86-64 Linux
            0,    // fs_base (not in the signal frame)
            0,    // gs_base
            0,    // ds
            0,    // es
            (csgsfs >> 32) & 0xffff,
            (csgsfs >> 16) & 0xffff,
        ];
        out[..words.len()].copy_from_slice(&words);
        Some(("x86_64", words.len()))
    }
    #[cfg(target_arch = "aarch64")]
    {
        let m = &ctx.uc_mcontext;
        out[..31].copy_from_slice(&m.regs);
        out[31] = m.sp;
        out[32] = m.pc;
        out[33] = m.pstate;
        Some(("aarch64", 34))
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (ctx, out);
        None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_round_trips_and_bad_blocks_are_refused() {
        // SAFETY: an all-zero ucontext is a valid value to read registers
        // from.
        let mut uc: libc::ucontext_t = unsafe { core::mem::zeroed() };
        #[cfg(target_arch = "x86_64")]
        {
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] = 0x1234;
            uc.uc_mcontext.gregs[libc::REG_RSP as usize] = 0x7ff0;
        }
        #[cfg(target_arch = "aarch64")]
        {
            uc.uc_mcontext.pc = 0x1234;
            uc.uc_mcontext.sp = 0x7ff0;
        }
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
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            let (arch, words) = c.regs.clone().unwrap();
            let m = if arch == "x86_64" {
                crate::arch::Machine::X86_64
            } else {
                crate::arch::Machine::Aarch64
            };
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let regs = m.registers_from_user_regs(&bytes).unwrap();
            assert_eq!(regs.pc(), Some(0x1234));
            assert_eq!(regs.sp(), Some(0x7ff0));
        }
        // Truncations and corruptions: no context or a partial one, never
        // a panic.
        for cut in 0..text.len() {
            let _ = parse_context(&text[..cut]);
        }
        assert!(parse_context(&text.replace("pid: 10", "pid: x")).is_none());
        assert!(parse_context(&text.replace("signal: 11 -6 0xdead", "signal: 11")).is_none());
        assert!(parse_context("no block").is_none());
        // Too small a buffer: nothing rather than half a block.
        assert_eq!(write_context(&mut [0u8; 40], &f, &uc), 0);
    }
}
