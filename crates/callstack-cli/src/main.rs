//! `callstack`: the command-line tool of the callstack toolkit.
//!
//! One file per subcommand; `main` only parses arguments and dispatches.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod crash;
mod demo;

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
    /// Symbolize raw crash reports (from a report file, or standard input;
    /// also the helper a crashing program runs).
    CrashReport(crash::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::CrashReport(args) => crash::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("callstack: {e}");
            ExitCode::FAILURE
        }
    }
}
