//! The options `pstack` and `core` share for writing a minidump.

use std::path::{Path, PathBuf};
use std::time::Duration;

use callstack::minidump::{WriteOptions, WriteStats};
use callstack::remote::Lookup;

use crate::stacks;

/// `--minidump OUT` and its companions.
#[derive(clap::Args)]
pub struct MinidumpArgs {
    /// Write a minidump to this file instead of printing the stacks (a
    /// line on stderr says what was written).
    #[arg(long, value_name = "OUT")]
    pub minidump: Option<PathBuf>,
    /// Include the environment in the minidump (MD_LINUX_ENVIRON); left
    /// out by default, since environments hold secrets.
    #[arg(long, requires = "minidump")]
    pub minidump_environ: bool,
    /// KiB of each thread's stack kept in the minidump, from its stack
    /// pointer up.
    #[arg(long, value_name = "KIB", requires = "minidump")]
    pub minidump_stack_kib: Option<u64>,
}

impl MinidumpArgs {
    /// The writer's options.
    pub fn options(&self) -> WriteOptions {
        let mut o = WriteOptions {
            environ: self.minidump_environ,
            ..WriteOptions::default()
        };
        if let Some(k) = self.minidump_stack_kib {
            o.stack_limit = k.saturating_mul(1024);
        }
        o
    }
}

/// Where to find the target's files: the report's, without debuginfod (a
/// minidump takes its build-ids from the target, and needs no file).
pub fn lookup(report: &stacks::ReportArgs) -> Lookup {
    let l = report.lookup();
    Lookup {
        debuginfod: None,
        ..l
    }
}

/// The line on stderr after a dump is written.
pub fn note(out: &Path, s: &WriteStats, took: Option<Duration>) {
    let took = took
        .map(|d| format!(" in {:.3} ms", d.as_secs_f64() * 1e3))
        .unwrap_or_default();
    for w in &s.warnings {
        eprintln!("callstack: warning: {w}");
    }
    eprintln!(
        "callstack: wrote {} ({} threads, {} modules, {} bytes){took}",
        out.display(),
        s.threads,
        s.modules,
        s.bytes
    );
}
