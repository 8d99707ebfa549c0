//! `callstack crash-report [FILE]`: symbolizes raw crash reports.
//!
//! Two uses:
//! - by a person: `callstack crash-report crash.txt` reads the raw reports
//!   saved in a report file (or `-`/nothing for standard input) and prints
//!   them symbolized on standard output;
//! - as the helper of a crashing process (it sets
//!   `CALLSTACK_CRASH_SYMBOLIZE=1`): the raw report comes on standard input,
//!   the symbolized report goes to standard error and is appended to
//!   `$CALLSTACK_CRASH_REPORT`.

use std::io::Read;
use std::path::PathBuf;

/// Arguments of `callstack crash-report`.
#[derive(clap::Args)]
pub struct Args {
    /// A file holding raw crash reports; `-` or nothing reads standard input.
    file: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<(), String> {
    let stdin = args.file.as_deref().is_none_or(|f| f.as_os_str() == "-");
    if stdin && std::env::var_os(callstack::crash::SYMBOLIZE_ENV).is_some_and(|v| v == "1") {
        std::process::exit(callstack::crash::run_helper());
    }
    let mut bytes = Vec::new();
    match &args.file {
        Some(f) if !stdin => {
            bytes = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
        }
        _ => {
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|e| format!("standard input: {e}"))?;
        }
    }
    let text = callstack::crash::symbolize_report(&String::from_utf8_lossy(&bytes));
    if text.is_empty() {
        return Err(
            "no raw crash report found (looked for \"*** callstack: crash report (raw) ***\")"
                .into(),
        );
    }
    print!("{text}");
    Ok(())
}
