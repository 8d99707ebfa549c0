//! The signal handler: raw report, symbolizing helper, then the death the
//! process would have died without us.
//!
//! Everything reachable from [`on_signal`] is async-signal-safe: system
//! calls, reads of static storage prepared at install time, and the
//! unwinder (which allocates nothing and locks nothing). The report is
//! formatted into a static buffer owned by whichever thread holds the crash
//! lock ([`CRASHING`]).

use super::context::{self, CONTEXT_BYTES};
use super::fmt::Buf;
use super::helper::{self, Outcome, Plan};
use super::signals::{self, Origin};
use super::snapshot::{self, MapsScratch};
use super::sys::{self, SyncCell};
use core::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};

/// Most frames written to a report.
pub(crate) const MAX_FRAMES: usize = 256;
const REPORT_BYTES: usize = 96 * 1024;

/// Install-time settings the handler reads.
pub(crate) struct Config {
    /// NUL-terminated report file path, or empty.
    pub(crate) report_path: Vec<u8>,
    /// The helper plan, if symbolizing or writing a minidump.
    pub(crate) plan: Option<Plan>,
    /// Whether the helper prints the symbolized report.
    pub(crate) symbolize: bool,
    /// The minidump directory (no NUL, no newline), or empty for none.
    pub(crate) minidump_dir: Vec<u8>,
}

pub(crate) static CONFIG: AtomicPtr<Config> = AtomicPtr::new(core::ptr::null_mut());

/// The previous action of each signal, saved at install time.
pub(crate) static PREVIOUS: SyncCell<[Option<libc::sigaction>; 65]> = SyncCell::new([None; 65]);

/// Thread id of the thread writing a report, 0 if none.
static CRASHING: AtomicI32 = AtomicI32::new(0);

/// Size of the report stack.
const REPORT_STACK_SIZE: usize = 256 * 1024;

/// Top of the report stack (mapped at install time), 0 if none. The
/// report runs on it whatever stack the signal landed on (the thread's own,
/// ours, or a small alternate stack such as the 8 KiB one Rust's standard
/// library gives its threads), so the unwinder and the helper spawn have
/// room. Used only by the holder of the crash lock.
static REPORT_STACK: AtomicUsize = AtomicUsize::new(0);

/// Maps the report stack (once; with a guard page below it).
pub(crate) fn prepare_report_stack() -> std::io::Result<()> {
    if REPORT_STACK.load(Ordering::Acquire) != 0 {
        return Ok(());
    }
    // SAFETY: sysconf has no preconditions.
    let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize).max(4096);
    // SAFETY: a fresh private anonymous mapping, never freed (it must stay
    // valid for any later crash).
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            REPORT_STACK_SIZE + page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the lowest page of our own mapping becomes a guard page.
    unsafe { libc::mprotect(base, page, libc::PROT_NONE) };
    let top = (base as usize + page + REPORT_STACK_SIZE) & !15;
    if REPORT_STACK
        .compare_exchange(0, top, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // SAFETY: another install won the race; this mapping is unused.
        unsafe { libc::munmap(base, REPORT_STACK_SIZE + page) };
    }
    Ok(())
}

struct ReportArgs {
    sig: i32,
    info: *const libc::siginfo_t,
    ctx: *const libc::ucontext_t,
    tid: i32,
}

unsafe extern "C" fn report_trampoline(p: *mut libc::c_void) {
    // SAFETY: `p` is the ReportArgs of `report_on_report_stack`, whose
    // pointers are the kernel's siginfo and ucontext; the caller holds the
    // crash lock, so the scratch is ours.
    unsafe {
        let a = &*(p as *const ReportArgs);
        report(a.sig, &*a.info, &*a.ctx, a.tid, &mut *SCRATCH.get());
    }
}

/// Writes the report (and runs the helper) on the report stack.
///
/// # Safety
/// The caller holds the crash lock; `info` and `ctx` are the kernel's.
unsafe fn report_on_report_stack(
    sig: i32,
    info: *const libc::siginfo_t,
    ctx: *const libc::ucontext_t,
    tid: i32,
) {
    let mut args = ReportArgs {
        sig,
        info,
        ctx,
        tid,
    };
    let p = (&mut args as *mut ReportArgs).cast::<libc::c_void>();
    let top = REPORT_STACK.load(Ordering::Acquire);
    #[cfg(callstack_native)]
    if top != 0 {
        // SAFETY: the report stack is ours while we hold the crash lock.
        unsafe { crate::arch::native::switch::call_on_stack(p, report_trampoline, top) };
        return;
    }
    let _ = top;
    // SAFETY: as above, on the current stack.
    unsafe { report_trampoline(p) };
}

struct Scratch {
    report: [u8; REPORT_BYTES],
    /// The crash context sent to the helper after the raw report.
    context: [u8; CONTEXT_BYTES],
    frames: [usize; MAX_FRAMES],
    maps: MapsScratch,
}

// Owned by the holder of CRASHING.
static SCRATCH: SyncCell<Scratch> = SyncCell::new(Scratch {
    report: [0; REPORT_BYTES],
    context: [0; CONTEXT_BYTES],
    frames: [0; MAX_FRAMES],
    maps: MapsScratch::new(),
});

pub(crate) use super::env::{BEGIN_RAW, END_RAW};

/// The handler installed for every crash signal.
pub(crate) extern "C" fn on_signal(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let saved_errno = sys::errno();
    let tid = sys::gettid();
    let mut reported = false;
    match CRASHING.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            // SAFETY: we hold the crash lock; the kernel passes a valid
            // siginfo and ucontext to an SA_SIGINFO handler.
            unsafe { report_once(sig, info, ctx.cast(), tid) };
            reported = true;
        }
        Err(owner) if owner == tid => {
            // A crash inside our own report (or inside the handler we chain
            // to, such as Rust's stack-overflow handler calling abort()).
            let mut b = [0u8; 160];
            let mut w = Buf::new(&mut b);
            w.str("*** callstack: ")
                .str(signals::signal_name(sig))
                .str(" while handling a crash on this thread (in the report or the handler chained to); no second report ***\n");
            sys::write_all(2, w.as_bytes());
        }
        Err(_) => {
            // Another thread is reporting: wait for it (it usually ends the
            // process), then report this one.
            while CRASHING
                .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                sys::sleep_ns(10_000_000);
            }
            // SAFETY: as in the first arm.
            unsafe { report_once(sig, info, ctx.cast(), tid) };
            reported = true;
        }
    }
    // SAFETY: forwarding the kernel's arguments unchanged.
    unsafe { chain(sig, info, ctx) };
    if reported {
        CRASHING.store(0, Ordering::Release);
    }
    sys::set_errno(saved_errno);
}

/// The last fault reported: (thread, signal, pc). Written by the holder of
/// the crash lock.
static LAST_TID: AtomicI32 = AtomicI32::new(0);
static LAST_SIG: AtomicI32 = AtomicI32::new(0);
static LAST_PC: AtomicUsize = AtomicUsize::new(0);

/// Reports, unless this is the same fault as the last report: a previous
/// handler that returns without fixing the cause makes the instruction
/// fault again and again; it is reported once, then only chained to.
///
/// # Safety
/// As [`report_on_report_stack`].
unsafe fn report_once(
    sig: i32,
    info: *const libc::siginfo_t,
    ctx: *const libc::ucontext_t,
    tid: i32,
) {
    // SAFETY: the kernel's ucontext.
    let (pc, _, _) = context_registers(unsafe { &*ctx });
    if LAST_TID.load(Ordering::Relaxed) == tid
        && LAST_SIG.load(Ordering::Relaxed) == sig
        && LAST_PC.load(Ordering::Relaxed) == pc
    {
        return;
    }
    LAST_TID.store(tid, Ordering::Relaxed);
    LAST_SIG.store(sig, Ordering::Relaxed);
    LAST_PC.store(pc, Ordering::Relaxed);
    // SAFETY: forwarded from our caller.
    unsafe { report_on_report_stack(sig, info, ctx, tid) };
}

/// Passes the signal on: to the previous handler if there was one, else to
/// the default action, so the process ends as it would have without us.
///
/// # Safety
/// The kernel's arguments of the current handler call.
unsafe fn chain(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: PREVIOUS is written only at install time, before the handler
    // is installed.
    let prev = unsafe { (*PREVIOUS.get()).get(sig as usize).copied().flatten() };
    // SAFETY: `info` is the kernel's siginfo.
    let code = unsafe { (*info).si_code };
    let handler = prev.map(|p| p.sa_sigaction).unwrap_or(libc::SIG_DFL);
    if handler == libc::SIG_IGN {
        if signals::origin(code) == Origin::Process || sig == libc::SIGABRT || sig == libc::SIGTRAP
        {
            return; // ignored, as without us (abort() then forces SIG_DFL itself)
        }
        // A synchronous fault cannot be ignored: the kernel forces the
        // default action; do the same.
    } else if handler != libc::SIG_DFL {
        let p = prev.unwrap();
        if p.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the previous handler was installed with SA_SIGINFO, so
            // it has this signature.
            let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { core::mem::transmute(handler) };
            f(sig, info, ctx);
        } else {
            // SAFETY: a plain handler takes the signal number only.
            let f: extern "C" fn(i32) = unsafe { core::mem::transmute(handler) };
            f(sig);
        }
        return;
    }
    // Default action: restore it, then let the signal happen again.
    // SAFETY: installing SIG_DFL for `sig` with a zeroed sigaction.
    unsafe {
        let mut dfl: libc::sigaction = core::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        libc::sigaction(sig, &dfl, core::ptr::null_mut());
    }
    let refaults = signals::origin(code) == Origin::Fault
        && matches!(
            sig,
            libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE
        )
        || (sig == libc::SIGSEGV && signals::origin(code) == Origin::Kernel);
    if !refaults {
        // Raised by a process (abort, raise, kill) or a trap whose pc is past
        // the instruction: send it again to this thread. It is blocked while
        // we run and is delivered, with the default action, on return.
        // SAFETY: plain system call.
        unsafe { libc::syscall(libc::SYS_tgkill, sys::getpid(), sys::gettid(), sig) };
    }
    // Otherwise returning re-executes the faulting instruction, which
    // faults again under the default action: same exit status, same core.
}

/// Registers of the interrupted code: (pc, sp, frame pointer).
fn context_registers(ctx: &libc::ucontext_t) -> (usize, usize, usize) {
    #[cfg(callstack_native)]
    {
        let r = crate::arch::native::context::regs_from_ucontext(ctx);
        (r.pc as usize, r.sp as usize, r.fp as usize)
    }
    #[cfg(not(callstack_native))]
    {
        let _ = ctx;
        (0, 0, 0)
    }
}

/// Unwinds the interrupted code of a signal context into `out`: `out[0]` is
/// the interrupted pc, the rest return addresses. The crash handler's one
/// unwinding call.
///
/// [`crate::capture_from_context`] (DWARF CFI, per-frame frame-pointer
/// fallback; no allocation, no lock) first; if it gets no further than the
/// pc (no CFI for it and no usable frame record), a bounded frame-pointer
/// walk from the interrupted frame pointer, reading only inside the
/// interrupted thread's stack (after a stack overflow, sp is in the guard
/// area below it: the frame pointer's stack is used if it starts just
/// above sp).
pub(crate) fn unwind_context(ctx: &libc::ucontext_t, out: &mut [usize]) -> usize {
    if out.is_empty() {
        return 0;
    }
    let n = crate::capture_from_context(ctx, out);
    if n > 1 {
        return n;
    }
    let (pc, sp, fp) = context_registers(ctx);
    out[0] = pc;
    #[cfg(callstack_native)]
    {
        let bounds = match crate::stack::bounds_for(sp) {
            Some(b) if b.contains(fp) => Some((sp, b.hi)),
            _ => crate::stack::bounds_for(fp)
                .filter(|b| b.lo >= sp && b.lo - sp <= 1 << 20)
                .map(|b| (b.lo, b.hi)),
        };
        let Some((lo, hi)) = bounds else {
            return 1;
        };
        // The interrupted frame's caller from the record at its frame
        // pointer (the crashing function's, or its caller's if it had not
        // set one up), then the loop over the records from there.
        match crate::fast::record_caller(fp, lo, hi) {
            Some(caller) => 1 + crate::fast::walk_records(caller, false, lo, hi, 0, &mut out[1..]),
            None => 1,
        }
    }
    #[cfg(not(callstack_native))]
    {
        let _ = (sp, fp);
        1
    }
}

/// Writes the header lines shared by crash and panic reports.
pub(crate) fn write_thread(w: &mut Buf<'_>, tid: i32) {
    let mut name = [0u8; 16];
    w.str("process: ").dec(sys::getpid() as u64).str("\n");
    w.str("thread: ")
        .dec(tid as u64)
        .str(" \"")
        .bytes(sys::thread_name(&mut name))
        .str("\"\n");
    w.str("time: ")
        .dec(sys::monotonic_ns())
        .str(" ns (CLOCK_MONOTONIC)\n");
}

/// Writes the frame lines of a raw report:
/// `  #N pc|ra 0xADDR in PATH +0xOFFSET (build-id HEX)` or `in ??`.
pub(crate) fn write_frames(
    w: &mut Buf<'_>,
    frames: &[usize],
    first_is_pc: bool,
    maps: &mut MapsScratch,
) {
    w.str("frames: ").dec(frames.len() as u64).str("\n");
    for (i, &a) in frames.iter().enumerate() {
        w.str("  #").dec(i as u64);
        w.str(if i == 0 && first_is_pc {
            " pc "
        } else {
            " ra "
        });
        w.hex(a as u64, 16);
        match snapshot::lookup(a, maps) {
            Some(f) => {
                w.str(" in ")
                    .bytes(f.path)
                    .str(" +")
                    .hex(f.offset as u64, 1);
                if !f.build_id.is_empty() {
                    w.str(" (build-id ").hex_bytes(f.build_id).str(")");
                }
            }
            None => {
                w.str(" in ??");
            }
        }
        w.str("\n");
    }
}

/// Sends a finished raw report to stderr and the report file.
fn emit(bytes: &[u8], cfg: Option<&Config>) {
    sys::write_all(2, bytes);
    if let Some(c) = cfg {
        if !c.report_path.is_empty() {
            let fd = sys::open(
                &c.report_path,
                libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            );
            if fd >= 0 {
                sys::write_all(fd, bytes);
                sys::close(fd);
            }
        }
    }
}

fn report(sig: i32, info: &libc::siginfo_t, ctx: &libc::ucontext_t, tid: i32, s: &mut Scratch) {
    // SAFETY: CONFIG is published once at install (and never freed).
    let cfg = unsafe { CONFIG.load(Ordering::Acquire).as_ref() };
    let code = info.si_code;
    let (code_name, words) = signals::code_words(sig, code);
    let mut w = Buf::new(&mut s.report);
    w.str(BEGIN_RAW);
    w.str("signal: ")
        .str(signals::signal_name(sig))
        .str(": ")
        .str(words);
    let (_, sp, _) = context_registers(ctx);
    match signals::origin(code) {
        Origin::Fault => {
            // SAFETY: si_addr is valid for the fault signals with a
            // positive code.
            let addr = unsafe { info.si_addr() } as usize;
            if matches!(sig, libc::SIGSEGV | libc::SIGBUS) {
                w.str(", fault address ");
            } else {
                w.str(", at instruction ");
            }
            w.hex(addr as u64, 1);
            if sig == libc::SIGSEGV && addr.abs_diff(sp) < 64 * 1024 {
                w.str(" (next to the stack pointer: stack overflow)");
            }
        }
        Origin::Process => {
            // SAFETY: si_pid is valid for SI_USER / SI_TKILL / SI_QUEUE.
            let pid = unsafe { info.si_pid() };
            w.str(", from pid ").dec(pid as u64);
        }
        _ => {}
    }
    w.str(" (signal ")
        .dec(sig as u64)
        .str(", code ")
        .dec_i(code as i64);
    if !code_name.is_empty() {
        w.str(" ").str(code_name);
    }
    w.str(")\n");
    write_thread(&mut w, tid);
    let n = unwind_context(ctx, &mut s.frames);
    write_frames(&mut w, &s.frames[..n], true, &mut s.maps);
    if n == s.frames.len() {
        w.str("  ... (more frames not shown)\n");
    }
    w.str(END_RAW);
    if w.truncated() {
        // Keep the end marker even when the report did not fit.
        let keep = w.len().saturating_sub(END_RAW.len() + 16);
        w.truncate(keep);
        w.str("\n...\n").str(END_RAW);
    }
    let len = w.len();
    emit(&s.report[..len], cfg);
    if let Some((c, plan)) = cfg.and_then(|c| Some((c, c.plan.as_ref()?))) {
        // The context for the helper's minidump goes on its pipe only.
        let fields = context::Fields {
            pid: sys::getpid(),
            tid,
            signal: sig,
            code,
            address: match signals::origin(code) {
                // SAFETY: si_addr is valid for the fault signals.
                Origin::Fault => (unsafe { info.si_addr() }) as u64,
                _ => 0,
            },
            symbolize: c.symbolize,
            minidump_dir: &c.minidump_dir,
        };
        let clen = context::write_context(&mut s.context, &fields, ctx);
        // ptrace needs a dumpable process: a program that made itself
        // undumpable (PR_SET_DUMPABLE 0, or a set-id one) is made dumpable
        // while its helper writes the minidump, then put back.
        let undumpable = !c.minidump_dir.is_empty() && sys::dumpable() == Some(false);
        if undumpable {
            sys::set_dumpable(true);
        }
        symbolize(&s.report[..len], &s.context[..clen], plan);
        if undumpable {
            sys::set_dumpable(false);
        }
    }
}

/// Runs the helpers of `plan` in turn until one succeeds or time runs out,
/// feeding each the raw report then the crash context; says on stderr how
/// it went.
fn symbolize(raw: &[u8], crash_context: &[u8], plan: &Plan) {
    let start = sys::monotonic_ns();
    let deadline = start.saturating_add(plan.timeout_ns);
    let mut line = [0u8; 512];
    for c in &plan.candidates {
        let out = helper::run(c, &[raw, crash_context], deadline);
        let mut w = Buf::new(&mut line);
        w.str("*** callstack: symbolizing helper (")
            .bytes(c.label.as_bytes())
            .str(") ");
        let ok = match out {
            Outcome::Exited(0) => {
                w.str("finished");
                true
            }
            Outcome::Exited(st) => {
                w.str("failed with exit status ").dec(st as u64);
                false
            }
            Outcome::Signaled(s) => {
                w.str("was killed by ").str(signals::signal_name(s));
                false
            }
            Outcome::TimedOut => {
                w.str("timed out and was killed");
                false
            }
            Outcome::SpawnFailed(e) => {
                w.str("could not start, errno ").dec(e as u64);
                false
            }
            Outcome::ReapedElsewhere => {
                // Its output is out; only its exit status is lost.
                w.str("ended, exit status unknown (the program reaped it)");
                true
            }
        };
        w.str(" after ")
            .dec((sys::monotonic_ns() - start) / 1_000_000)
            .str(" ms ***\n");
        sys::write_all(2, w.as_bytes());
        if ok || sys::monotonic_ns() >= deadline {
            return;
        }
    }
}
