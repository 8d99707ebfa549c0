//! The environment variables and the subcommand of the crash handler's
//! helper protocol (Linux and Windows alike).

/// Environment variable that turns [`super::install`] (and the C entry)
/// into the symbolizer: read a raw report on standard input, print the
/// symbolized report, exit.
pub const SYMBOLIZE_ENV: &str = "CALLSTACK_CRASH_SYMBOLIZE";
/// Environment variable naming the report file the helper appends to.
pub const REPORT_ENV: &str = "CALLSTACK_CRASH_REPORT";
/// Environment variable naming the helper program to run (overrides the
/// search; `none` disables the symbolizing step).
pub const HELPER_ENV: &str = "CALLSTACK_CRASH_HELPER";
/// Environment variable naming the directory crash minidumps are written
/// to, when [`super::Options::minidump_dir`] is not set.
pub const MINIDUMP_DIR_ENV: &str = "CALLSTACK_CRASH_MINIDUMP_DIR";
/// Environment variable overriding the helper's timeout, in milliseconds.
pub const TIMEOUT_ENV: &str = "CALLSTACK_CRASH_TIMEOUT_MS";
/// The subcommand a helper program is run with (the `callstack` binary
/// understands it; a program linked with callstack ignores it and switches
/// to symbolizer mode through [`SYMBOLIZE_ENV`]).
pub const HELPER_SUBCOMMAND: &str = "crash-report";

/// First line of a raw report.
pub(crate) const BEGIN_RAW: &str = "*** callstack: crash report (raw) ***\n";
/// Last line of a raw report.
pub(crate) const END_RAW: &str = "*** end of raw report ***\n";
