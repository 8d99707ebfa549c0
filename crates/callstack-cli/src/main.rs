//! `callstack`: the command-line tool of the callstack toolkit.
//!
//! One file per subcommand; `main` only parses arguments and dispatches.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod addr2line;
#[cfg(unix)]
mod child;
#[cfg(unix)]
mod core;
#[cfg(unix)]
mod crash;
mod debuginfod;
#[cfg(unix)]
mod demo;
#[cfg(unix)]
mod mainfn;
#[cfg(unix)]
mod memtrack;
#[cfg(unix)]
mod minidump;
#[cfg(unix)]
mod minidump_args;
#[cfg(unix)]
mod pstack;
#[cfg(unix)]
mod record;
#[cfg(unix)]
mod report;
#[cfg(unix)]
mod stacks;
mod symbolize;

#[derive(Parser)]
#[command(
    name = "callstack",
    version,
    about = "Capture, unwind and symbolize call stacks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Capture this program's own stack through a few named functions, print
    /// it, and time capture_fast against glibc backtrace().
    #[cfg(unix)]
    Demo(demo::Args),
    /// Every thread's backtrace from an ELF core file (like gdb's
    /// `thread apply all bt`).
    ///
    /// Names as gdb gives them: a symbol-table name covers only the
    /// addresses inside the symbol's size (up to the next symbol for a
    /// symbol without size); others are `??`.
    #[cfg(unix)]
    Core(core::Args),
    /// Every thread's backtrace from a live process, stopped only briefly.
    #[cfg(unix)]
    Pstack(pstack::Args),
    /// Every thread's backtrace from a minidump (Breakpad, Crashpad,
    /// sentry-native, minidump-writer), printed as `core` prints a core.
    #[cfg(unix)]
    Minidump(minidump::Args),
    /// Resolve addresses of an object file like binutils addr2line.
    ///
    /// Where no debug info covers an address, names come from the symbol
    /// tables as binutils gives them: the nearest preceding symbol of the
    /// section names the address even past that symbol's size (in a
    /// stripped object, a static function gets the name of the exported
    /// function before it). `callstack core` and `pstack` name as gdb does
    /// instead: an address past a symbol's size is `??`.
    Addr2line(addr2line::Args),
    /// Print the stacks of a callstack trace file (or `-` for stdin) resolved.
    Symbolize(symbolize::Args),
    /// Sample a program (started here, or running) with perf events and
    /// write a profile for `callstack report`.
    #[cfg(unix)]
    Record(record::Args),
    /// Summarize a profile (from `callstack record` or the in-process
    /// profiler): top functions, flamegraph SVG, pprof, folded stacks.
    #[cfg(unix)]
    Report(report::Args),
    /// Symbolize raw crash reports (from a report file, or standard input;
    /// also the helper a crashing program runs).
    #[cfg(unix)]
    CrashReport(crash::Args),
    /// Run a program recording every allocation by call stack (malloc,
    /// calloc, realloc, memalign, posix_memalign, aligned_alloc, valloc,
    /// pvalloc; C++ new/delete through them), then print to standard error
    /// the top sites by live bytes and by allocations, the leaks, and every
    /// process recorded. Exits with the program's status (128 + signal).
    #[cfg(unix)]
    Memtrack(memtrack::Args),
}

/// The command line, parsed apart from `main`: the parser's frame is gone
/// before a subcommand runs. `record -a` samples the recorder itself, whose
/// chains reach `main` only if its frames fit in the stack copied per
/// sample (8 KiB at first); the parse inlined into `main` made its frame
/// 4 KiB.
#[inline(never)]
fn parsed() -> Box<Cli> {
    Box::new(Cli::parse())
}

fn main() -> ExitCode {
    // A closed pipe (`callstack ... | head`) ends the process quietly, as
    // it does `cat` or `grep`, instead of failing a write with EPIPE and
    // reporting it. Every subcommand writes its output after it is done
    // with the target (a live process is already resumed), so nothing is
    // left half-done.
    // SAFETY: setting a signal's disposition to the default, before any
    // thread is started.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let result = match parsed().command {
        #[cfg(unix)]
        Command::Demo(args) => demo::run(args),
        #[cfg(unix)]
        Command::Core(args) => core::run(args),
        #[cfg(unix)]
        Command::Pstack(args) => pstack::run(args),
        #[cfg(unix)]
        Command::Minidump(args) => minidump::run(args),
        Command::Addr2line(args) => addr2line::run(args),
        Command::Symbolize(args) => symbolize::run(args),
        #[cfg(unix)]
        Command::CrashReport(args) => crash::run(args),
        #[cfg(unix)]
        Command::Report(args) => report::run(args),
        #[cfg(unix)]
        Command::Record(args) => match record::run(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        #[cfg(unix)]
        Command::Memtrack(args) => match memtrack::run(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("callstack: {e}");
            ExitCode::FAILURE
        }
    }
}
