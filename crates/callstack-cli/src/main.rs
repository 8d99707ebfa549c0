//! `callstack`: the command-line tool of the callstack toolkit.
//!
//! One file per subcommand; `main` only parses arguments and dispatches.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod core;
mod demo;
mod pstack;
mod stacks;

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
    Core(core::Args),
    /// Every thread's backtrace from a live process, stopped only briefly.
    Pstack(pstack::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Core(args) => core::run(args),
        Command::Pstack(args) => pstack::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("callstack: {e}");
            ExitCode::FAILURE
        }
    }
}
