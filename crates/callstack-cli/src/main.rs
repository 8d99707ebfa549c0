//! `callstack`: the command-line tool of the callstack toolkit.
//!
//! One file per subcommand; `main` only parses arguments and dispatches.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod addr2line;
mod child;
mod core;
mod crash;
mod debuginfod;
mod demo;
mod mainfn;
mod memtrack;
mod minidump_args;
mod pstack;
mod record;
mod report;
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
    Demo(demo::Args),
    /// Every thread's backtrace from an ELF core file (like gdb's
    /// `thread apply all bt`).
    ///
    /// Names as gdb gives them: a symbol-table name covers only the
    /// addresses inside the symbol's size (up to the next symbol for a
    /// symbol without size); others are `??`.
    Core(core::Args),
    /// Every thread's backtrace from a live process, stopped only briefly.
    Pstack(pstack::Args),
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
    Record(record::Args),
    /// Summarize a profile (from `callstack record` or the in-process
    /// profiler): top functions, flamegraph SVG, pprof, folded stacks.
    Report(report::Args),
    /// Symbolize raw crash reports (from a report file, or standard input;
    /// also the helper a crashing program runs).
    CrashReport(crash::Args),
    /// Run a program recording every allocation by call stack (malloc,
    /// calloc, realloc, memalign, posix_memalign, aligned_alloc, valloc,
    /// pvalloc; C++ new/delete through them), then print to standard error
    /// the top sites by live bytes and by allocations, the leaks, and every
    /// process recorded. Exits with the program's status (128 + signal).
    Memtrack(memtrack::Args),
}

fn main() -> ExitCode {
    // A closed pipe (`callstack ... | head`) ends the process quietly, as
    // it does `cat` or `grep`, instead of failing a write with EPIPE and
    // reporting it. Every subcommand writes its output after it is done
    // with the target (a live process is already resumed), so nothing is
    // left half-done.
    // SAFETY: setting a signal's disposition to the default, before any
    // thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Core(args) => core::run(args),
        Command::Pstack(args) => pstack::run(args),
        Command::Addr2line(args) => addr2line::run(args),
        Command::Symbolize(args) => symbolize::run(args),
        Command::CrashReport(args) => crash::run(args),
        Command::Report(args) => report::run(args),
        Command::Record(args) => match record::run(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
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
