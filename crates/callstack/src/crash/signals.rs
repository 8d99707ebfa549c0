//! Signal names and the meaning of their `si_code` values, in words.
//!
//! Tables only: no allocation, usable in the signal handler.

/// The signals the crash handler catches by default.
pub const CRASH_SIGNALS: [i32; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
    libc::SIGTRAP,
];

/// The name of a signal (`"SIGSEGV"`), or `"signal"` for one we do not name.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGABRT => "SIGABRT",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => "signal",
    }
}

/// Who or what raised a signal, from `si_code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The CPU or kernel, for the instruction at the faulting pc (positive
    /// codes other than `SI_KERNEL`): `si_addr` is meaningful.
    Fault,
    /// The kernel, without a specific reason (`SI_KERNEL`).
    Kernel,
    /// A process: `kill`, `tgkill`, `raise`, `abort`, `sigqueue`.
    Process,
    /// Timers, message queues, asynchronous I/O.
    Other,
}

/// Classifies `si_code`.
pub fn origin(code: i32) -> Origin {
    match code {
        0x80 => Origin::Kernel,
        c if c > 0 => Origin::Fault,
        libc::SI_USER | libc::SI_TKILL | libc::SI_QUEUE => Origin::Process,
        _ => Origin::Other,
    }
}

/// `(symbolic name, words)` for the `si_code` of `sig`, such as
/// `("SEGV_MAPERR", "address not mapped")`.
pub fn code_words(sig: i32, code: i32) -> (&'static str, &'static str) {
    // Codes common to every signal first (they are <= 0, or SI_KERNEL).
    match code {
        libc::SI_USER => return ("SI_USER", "sent by kill()"),
        libc::SI_TKILL => return ("SI_TKILL", "sent by tgkill() (raise, abort, pthread_kill)"),
        libc::SI_QUEUE => return ("SI_QUEUE", "sent by sigqueue()"),
        -2 => return ("SI_TIMER", "POSIX timer expired"),
        -3 => return ("SI_MESGQ", "message queue state changed"),
        -4 => return ("SI_ASYNCIO", "asynchronous I/O completed"),
        -5 => return ("SI_SIGIO", "queued SIGIO"),
        0x80 => {
            return match sig {
                libc::SIGSEGV => (
                    "SI_KERNEL",
                    "general protection fault (non-canonical or privileged address; fault address not reported)",
                ),
                libc::SIGTRAP => ("SI_KERNEL", "breakpoint instruction (int3)"),
                _ => ("SI_KERNEL", "sent by the kernel"),
            }
        }
        _ => {}
    }
    let table: &[(&str, &str)] = match sig {
        libc::SIGSEGV => &[
            ("SEGV_MAPERR", "address not mapped"),
            ("SEGV_ACCERR", "invalid permissions for mapped object"),
            ("SEGV_BNDERR", "failed address bound checks"),
            ("SEGV_PKUERR", "access denied by memory protection keys"),
            ("SEGV_ACCADI", "ADI not enabled for mapped object"),
            ("SEGV_ADIDERR", "disrupting MCD error"),
            ("SEGV_ADIPERR", "precise MCD exception"),
            ("SEGV_MTEAERR", "asynchronous memory tag check fault"),
            ("SEGV_MTESERR", "synchronous memory tag check fault"),
            ("SEGV_CPERR", "control protection fault (shadow stack)"),
        ],
        libc::SIGBUS => &[
            ("BUS_ADRALN", "invalid address alignment"),
            (
                "BUS_ADRERR",
                "nonexistent physical address (access beyond the end of a mapped file?)",
            ),
            ("BUS_OBJERR", "object-specific hardware error"),
            (
                "BUS_MCEERR_AR",
                "hardware memory error consumed (action required)",
            ),
            (
                "BUS_MCEERR_AO",
                "hardware memory error detected (action optional)",
            ),
        ],
        libc::SIGILL => &[
            ("ILL_ILLOPC", "illegal opcode"),
            ("ILL_ILLOPN", "illegal operand"),
            ("ILL_ILLADR", "illegal addressing mode"),
            ("ILL_ILLTRP", "illegal trap"),
            ("ILL_PRVOPC", "privileged opcode"),
            ("ILL_PRVREG", "privileged register"),
            ("ILL_COPROC", "coprocessor error"),
            ("ILL_BADSTK", "internal stack error"),
            ("ILL_BADIADDR", "unimplemented instruction address"),
        ],
        libc::SIGFPE => &[
            ("FPE_INTDIV", "integer divide by zero"),
            ("FPE_INTOVF", "integer overflow"),
            ("FPE_FLTDIV", "floating-point divide by zero"),
            ("FPE_FLTOVF", "floating-point overflow"),
            ("FPE_FLTUND", "floating-point underflow"),
            ("FPE_FLTRES", "floating-point inexact result"),
            ("FPE_FLTINV", "floating-point invalid operation"),
            ("FPE_FLTSUB", "subscript out of range"),
            ("", ""),
            ("", ""),
            ("", ""),
            ("", ""),
            ("", ""),
            ("FPE_FLTUNK", "undiagnosed floating-point exception"),
            ("FPE_CONDTRAP", "trap on condition"),
        ],
        libc::SIGTRAP => &[
            ("TRAP_BRKPT", "process breakpoint"),
            ("TRAP_TRACE", "process trace trap"),
            ("TRAP_BRANCH", "process taken branch trap"),
            ("TRAP_HWBKPT", "hardware breakpoint or watchpoint"),
            ("TRAP_UNK", "undiagnosed trap"),
            ("TRAP_PERF", "perf event with sigtrap=1"),
        ],
        _ => &[],
    };
    match table.get((code as usize).wrapping_sub(1)) {
        Some(&(name, words)) if code > 0 && !name.is_empty() => (name, words),
        _ => ("", "unknown code"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_codes_of_each_signal() {
        assert_eq!(
            code_words(libc::SIGSEGV, 1),
            ("SEGV_MAPERR", "address not mapped")
        );
        assert_eq!(code_words(libc::SIGFPE, 1).0, "FPE_INTDIV");
        assert_eq!(code_words(libc::SIGFPE, 14).0, "FPE_FLTUNK");
        assert_eq!(code_words(libc::SIGFPE, 9).1, "unknown code");
        assert_eq!(code_words(libc::SIGILL, 2).0, "ILL_ILLOPN");
        assert_eq!(code_words(libc::SIGBUS, 2).0, "BUS_ADRERR");
        assert_eq!(code_words(libc::SIGTRAP, 1).0, "TRAP_BRKPT");
        assert_eq!(code_words(libc::SIGABRT, libc::SI_TKILL).0, "SI_TKILL");
        assert_eq!(code_words(libc::SIGSEGV, 0x80).0, "SI_KERNEL");
        assert_eq!(code_words(libc::SIGSEGV, 99).1, "unknown code");
        assert_eq!(code_words(libc::SIGSEGV, -99).1, "unknown code");
        assert_eq!(origin(1), Origin::Fault);
        assert_eq!(origin(libc::SI_TKILL), Origin::Process);
        assert_eq!(signal_name(libc::SIGILL), "SIGILL");
    }
}
