//! The debuginfod options every command that names frames shares.

use callstack::symbolize::Debuginfod;
use std::sync::Arc;

/// `--no-debuginfod` and `--debuginfod-urls`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DebuginfodArgs {
    /// Do not fetch missing debug files and executables from debuginfod
    /// servers (by default they are, from the servers of DEBUGINFOD_URLS
    /// when it is set and not empty).
    #[arg(long)]
    pub no_debuginfod: bool,
    /// The debuginfod servers to ask, separated by spaces, instead of
    /// DEBUGINFOD_URLS's (empty: none).
    #[arg(long, value_name = "URLS")]
    pub debuginfod_urls: Option<String>,
}

impl DebuginfodArgs {
    /// The client these options ask for, if any.
    pub fn client(&self) -> Option<Arc<Debuginfod>> {
        if self.no_debuginfod {
            return None;
        }
        match &self.debuginfod_urls {
            Some(urls) if urls.trim().is_empty() => None,
            Some(urls) => Some(Arc::new(Debuginfod::new(urls.split_whitespace()))),
            None => Debuginfod::from_env().map(Arc::new),
        }
    }
}

/// Prints what `client` could not fetch (each once), as warnings.
pub fn warn(client: Option<&Arc<Debuginfod>>) {
    for w in client.map(|c| c.take_warnings()).unwrap_or_default() {
        eprintln!("callstack: warning: {w}");
    }
}
