//! Small wrappers over the operating system, each with its `unsafe` kept here.
//!
//! One module per operating system: Linux's `/proc` readers (`maps`), and
//! everything Windows-specific under `windows/` (the thread's stack from its
//! TEB, the loader's module list, the Win64 ABI's naked entries).

#[cfg(not(windows))]
pub mod maps;
#[cfg(windows)]
pub mod windows;

/// This process's executable mappings, `(start, end)`: `/proc/self/maps`'
/// `x` lines, or the executable sections of Windows' loaded modules.
/// Allocates: not for signal handlers.
#[cfg(not(windows))]
pub use maps::executable_mappings;
/// This process's executable mappings, `(start, end)`: `/proc/self/maps`'
/// `x` lines, or the executable sections of Windows' loaded modules.
/// Allocates: not for signal handlers.
#[cfg(windows)]
pub use windows::loader::executable_mappings;
