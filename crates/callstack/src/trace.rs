//! `Trace<N>`: a captured stack stored inline, without allocation.

use core::fmt;

/// A call stack of at most `N` addresses, stored inline.
///
/// Capturing into a `Trace` allocates nothing and is async-signal-safe.
/// The trace remembers whether its first address is an exact pc (from
/// [`Trace::capture_from_context`]) or, like every other, a return address,
/// so that [`Trace::symbolize`] looks each one up right.
///
/// The common case, in two lines:
///
/// ```
/// let t = callstack::Trace::<64>::capture_exact(0);
/// println!("{}", t.symbolize());
/// ```
///
/// Capture now, symbolize later (or never):
///
/// ```
/// let t = callstack::Trace::<32>::capture_fast(0);
/// for addr in &t {
///     let _ = addr; // a return address; symbolize it later
/// }
/// let key = t.hash(); // group equal stacks
/// # let _ = key;
/// ```
#[derive(Clone, Copy)]
pub struct Trace<const N: usize> {
    len: usize,
    first_is_exact: bool,
    frames: [usize; N],
}

impl<const N: usize> Trace<N> {
    /// An empty trace.
    pub const fn new() -> Self {
        Trace {
            len: 0,
            first_is_exact: false,
            frames: [0; N],
        }
    }

    /// Captures the current stack with [`crate::capture_fast`]: the first
    /// entry is inside the function that calls `Trace::capture_fast`.
    #[inline(always)]
    pub fn capture_fast(skip: usize) -> Self {
        let mut t = Self::new();
        t.len = crate::capture_fast(skip, &mut t.frames);
        t
    }

    /// Captures the current stack with [`crate::capture_exact`] (DWARF CFI):
    /// the first entry is inside the function that calls
    /// `Trace::capture_exact`.
    #[inline(always)]
    pub fn capture_exact(skip: usize) -> Self {
        let mut t = Self::new();
        t.len = crate::capture_exact(skip, &mut t.frames);
        t
    }

    /// Captures the code a signal interrupted, from the handler's third
    /// argument, with [`crate::capture_from_context`]: the first entry is the
    /// interrupted pc itself. Async-signal-safe.
    #[cfg(all(target_os = "linux", callstack_native))]
    pub fn capture_from_context(ctx: &libc::ucontext_t) -> Self {
        let mut t = Self::new();
        t.len = crate::capture_from_context(ctx, &mut t.frames);
        t.first_is_exact = t.len > 0;
        t
    }

    /// Builds a trace from return addresses; keeps the first `N`.
    pub fn from_frames(frames: &[usize]) -> Self {
        let mut t = Self::new();
        let n = frames.len().min(N);
        t.frames[..n].copy_from_slice(&frames[..n]);
        t.len = n;
        t
    }

    /// Builds a trace from addresses whose first is an exact pc (a signal's
    /// interrupted pc, `out[0]` of [`crate::capture_from_context`]) when
    /// `first_is_exact`; keeps the first `N`.
    pub fn from_frames_with_pc(frames: &[usize], first_is_exact: bool) -> Self {
        let mut t = Self::from_frames(frames);
        t.first_is_exact = first_is_exact && t.len > 0;
        t
    }

    /// Whether the first address is an exact pc rather than a return
    /// address.
    #[inline]
    pub fn first_is_exact(&self) -> bool {
        self.first_is_exact
    }

    /// Names every address (function, file, line, inlined functions) with
    /// the process's shared symbolizer; the result prints one line per
    /// level. Takes a lock and allocates: not for signal handlers (capture
    /// there, symbolize afterwards).
    ///
    /// ```
    /// #[inline(never)]
    /// fn here() -> callstack::Trace<64> {
    ///     callstack::Trace::capture_exact(0)
    /// }
    /// let s = here().symbolize();
    /// let f = s.frames[0].1.frames.last().unwrap();
    /// assert!(f.function.as_deref().unwrap().ends_with("here"));
    /// ```
    #[cfg(feature = "symbolize")]
    pub fn symbolize(&self) -> crate::symbolize::SymbolizedTrace {
        crate::symbolize::SymbolizedTrace::new(self.as_slice(), self.first_is_exact)
    }

    /// The captured addresses, innermost first.
    #[inline]
    pub fn as_slice(&self) -> &[usize] {
        &self.frames[..self.len]
    }

    /// Number of captured frames.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no frame was captured.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Iterates over the addresses, innermost first.
    pub fn iter(&self) -> core::iter::Copied<core::slice::Iter<'_, usize>> {
        self.as_slice().iter().copied()
    }

    /// A 64-bit hash of the addresses, for deduplication; see [`crate::hash_frames`].
    #[inline]
    pub fn hash(&self) -> u64 {
        crate::hash_frames(self.as_slice())
    }
}

impl<const N: usize> Default for Trace<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> PartialEq for Trace<N> {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice() && self.first_is_exact == other.first_is_exact
    }
}
impl<const N: usize> Eq for Trace<N> {}

impl<const N: usize> core::hash::Hash for Trace<N> {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(Trace::hash(self));
    }
}

impl<'a, const N: usize> IntoIterator for &'a Trace<N> {
    type Item = usize;
    type IntoIter = core::iter::Copied<core::slice::Iter<'a, usize>>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<const N: usize> fmt::Debug for Trace<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Hex(usize);
        impl fmt::Debug for Hex {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
        f.debug_list().entries(self.iter().map(Hex)).finish()
    }
}
