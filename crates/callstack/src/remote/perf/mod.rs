//! Sampling any program with `perf_event_open`: a cpu-clock event on the
//! target (inherited by the threads and processes it creates), each sample
//! carrying the user registers and a copy of the top of the user stack,
//! unwound as it arrives by [`RemoteUnwinder`] with the target's CFI read
//! from its files (the copied stack is the unwinder's memory: the same
//! problem as a core file's thread). Modules come from `/proc/PID/maps` and
//! the kernel's mmap events.
//!
//! A module's compiled CFI table is shared by every process that maps the
//! same file (`remote/step.rs`, `shared_tables`: build-id, else path, size
//! and time); [`RecordOptions::memory_budget`] bounds that state and the
//! processes' module maps, dropping the least recently used
//! ([`Recorded::evicted`], the period profiles' comments).
//!
//! On x86-64 and AArch64: the registers asked for and their numbering are
//! the host architecture's `arch/<arch>/perf_regs.rs`, selected once
//! (`arch::NATIVE_MACHINE`); elsewhere [`record`] returns
//! [`RecordError::Unsupported`]. AArch64 samples are unit-tested from
//! qemu-user cores (`sample_tests.rs`): qemu-user cannot run perf events.
//!
//! ```no_run
//! use callstack::remote::perf::{record, Control, RecordOptions, Target};
//! let control = Control::new();
//! let opts = RecordOptions::new(Target::Command(vec!["./app".into()]));
//! let done = record(&opts, &control, &mut |p| eprint!("\r{} samples", p.samples))?;
//! done.profile.write_trace(std::fs::File::create("callstack.data")?)?;
//! // How the command ended (its exit code, or the signal that ended it).
//! println!("{:?}", done.status);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod canon;
#[cfg(test)]
mod sample_tests;
mod sys;

use super::{
    files, Lookup, Machine, Mapping, Module, Registers, RemoteUnwinder, Snapshot, Thread, Unwound,
};
use crate::profile::Profile;
use crate::tracefile::ModuleRecord;
use crate::unwind::{Memory, Method, ReadError};
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::mem::ManuallyDrop;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// What to record.
#[derive(Clone, Debug)]
pub enum Target {
    /// A running process (its threads now and later).
    Pid(u32),
    /// A command to start; recording ends when it exits.
    Command(Vec<OsString>),
    /// Every process of the host, those running and those started during
    /// the recording (one event per CPU); narrowed by
    /// [`RecordOptions::pid_filter`] and [`RecordOptions::comm_filter`].
    /// Needs root (or `CAP_PERFMON`, or `perf_event_paranoid` <= 0).
    /// Recording ends with the duration or [`Control::stop`].
    All,
}

/// How to record.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    /// What to sample.
    pub target: Target,
    /// Samples per second of CPU time per thread (off the beat of the
    /// kernel's timer tick): by default 999 for a command or a process,
    /// 99 for [`Target::All`], the rate of always-on whole-host profilers
    /// (`perf record -F 99 -a`; parca-agent samples at 19 Hz). Each sample
    /// interrupts the program it hits: on the 2-CPU VM of BENCHMARKS.md,
    /// 999 Hz over the whole host costs a busy program about 2% of its run
    /// time (perf's own `-a` as much), 99 Hz under 1%.
    pub hz: u32,
    /// Bytes of user stack copied per sample at the start (default 8192;
    /// at most 65528). The kernel's copy is what sampling costs the
    /// program, so it starts small; see [`RecordOptions::stack_bytes_max`].
    pub stack_bytes: u32,
    /// How far the copy may grow (default 61440: the kernel's 64 KiB
    /// bound on a sample less room for its registers and kernel frames).
    /// When more than 3% of a window's samples (at least 50 samples and
    /// 0.1 s, at most a second) are cut, the unwinder having run off the
    /// end of the copy before the thread's first frame, the events are
    /// opened again with a copy twice as large, up to this. Each change is
    /// in [`Recorded::stack_growth`]. Equal to
    /// [`RecordOptions::stack_bytes`] (or below it): a fixed size.
    pub stack_bytes_max: u32,
    /// How far the copy may shrink (default 8192, the start: it does not
    /// shrink; at least 1024). Below the start, when no sample was cut
    /// for ten windows in a row and the whole chains read at most a
    /// quarter of the copy, it shrinks to twice what they read (in
    /// 512-byte steps, not below this; never back to a size found too
    /// small). On the VM of BENCHMARKS.md a CPU-bound program with shallow
    /// stacks paid about 0.4 points less of its run time with a 2 KiB
    /// copy than with 8 KiB. The cost: a rare deep frame met after the
    /// shrink is cut, such as the loader's lazy binding
    /// (`_dl_runtime_resolve_xsavec` saves the vector registers on the
    /// stack, 1-3 KiB), until the copy has grown again.
    pub stack_bytes_min: u32,
    /// Stop after this long (default: when the target ends or
    /// [`Control::stop`] is called).
    pub duration: Option<Duration>,
    /// Where to find the target's files.
    pub lookup: Lookup,
    /// Kernel frames too, where `perf_event_paranoid` allows (default
    /// true; recording goes on without them when refused).
    pub kernel: bool,
    /// Cut the recording into profiles of this long each (default: one
    /// profile for the whole recording); see [`record_rotating`].
    pub rotate: Option<Duration>,
    /// Also record the time threads spend blocked (off the CPU, not
    /// preempted), with the stack where they blocked, as a third sample
    /// type `off_cpu`/`nanoseconds` (default false). Every context switch
    /// is sampled: needs kernel samples (root, or `perf_event_paranoid`
    /// <= 1), else [`RecordError::PerfRefused`].
    pub off_cpu: bool,
    /// With [`Target::All`]: keep only the samples of these processes
    /// (empty: every process). With [`RecordOptions::off_cpu`], only the
    /// context switches of their threads (and of the threads they create)
    /// are sampled, not every task's.
    pub pid_filter: Vec<u32>,
    /// With [`Target::All`]: keep only the samples of processes with one
    /// of these names (`/proc/PID/comm`, the first 15 bytes of the
    /// program's name; empty: every name).
    pub comm_filter: Vec<String>,
    /// A bound, in bytes, on the per-module state the recorder keeps
    /// (compiled unwind tables, shared by every process mapping the same
    /// file; each process's module map and function bounds), checked
    /// after each pass over the rings. Over it, the least recently used
    /// modules' tables are dropped (not those of the last sample; a
    /// dropped table is rebuilt when a sample needs it again), then the
    /// module maps of the processes sampled least recently (rebuilt at
    /// their next sample). Each drop is listed in [`Recorded::evicted`]
    /// and in the comments of the profile of its period. `None`: no
    /// bound (the default; the CLI's default is 512 MB).
    pub memory_budget: Option<usize>,
    /// Rewrites each sample's frames (default `None`): the CPython
    /// recorder (`crate::python::record`) puts the Python frames an
    /// interpreter ran in place of its evaluation loop's frames.
    pub sample_hook: Option<std::sync::Arc<dyn SampleHook>>,
}

/// What a recording calls for each sample, to put other frames in place
/// of some native ones (an interpreter's functions in place of its
/// evaluation loop), and to complete each profile with what names them.
/// Called from the recording's thread; an implementation that samples
/// the target on threads of its own shares its state behind a lock.
pub trait SampleHook: Send + Sync + std::fmt::Debug {
    /// `pid` is recorded from now: the `-p` process, or the command before
    /// it execs its program.
    fn started(&self, pid: u32);
    /// Process `pid` exec'd a new program (seen in the ring, some
    /// milliseconds after).
    fn exec(&self, _pid: u32) {}
    /// Process `pid` mapped the code of the file `path` (seen in the ring,
    /// some milliseconds after).
    fn mapped(&self, _pid: u32, _path: &str) {}
    /// One sample of thread `tid` of process `pid`, taken at `time`
    /// (CLOCK_MONOTONIC, nanoseconds): `frames` innermost first (kernel
    /// frames, then user ones from index `user`, moved into their files'
    /// ranges of the recording), `user_pcs` the user frames' addresses in
    /// the process (`user_pcs[i]` is `frames[user + i]` before the move),
    /// `exact` the ascending indices past 0 of the frames that are exact
    /// pcs. May replace frames, keeping `exact` in step.
    #[allow(clippy::too_many_arguments)]
    fn sample(
        &self,
        pid: u32,
        tid: u32,
        time: u64,
        user: usize,
        user_pcs: &[u64],
        frames: &mut Vec<usize>,
        exact: &mut Vec<u32>,
    );
    /// Completes a profile of the recording (the whole one, or one
    /// period's): the module records and frame names of the frames it put
    /// in.
    fn finish(&self, profile: &mut Profile);
    /// Thread `tid` of process `pid` left its CPU at `time` with its stack
    /// sampled ([`RecordOptions::off_cpu`]; seen in the ring, some
    /// milliseconds after): [`SampleHook::off_cpu_sample`] gives the
    /// stack once the thread runs again, if it was blocked, not
    /// preempted.
    fn left_cpu(&self, _pid: u32, _tid: u32, _time: u64) {}
    /// An off-CPU sample ([`RecordOptions::off_cpu`]): thread `tid` of
    /// process `pid` left its CPU blocked at `off.start` with these frames
    /// (as in [`SampleHook::sample`]) and ran again at `off.end`, so its
    /// stack was the same all that time. Called once the thread runs
    /// again (or at the end of the recording), before the time is added.
    /// The default takes it as a sample at `off.start`.
    #[allow(clippy::too_many_arguments)]
    fn off_cpu_sample(
        &self,
        pid: u32,
        tid: u32,
        off: std::ops::Range<u64>,
        user: usize,
        user_pcs: &[u64],
        frames: &mut Vec<usize>,
        exact: &mut Vec<u32>,
    ) {
        self.sample(pid, tid, off.start, user, user_pcs, frames, exact);
    }
}

/// The user stack copy resized during a recording: grown (`to > from`)
/// when samples were cut at its end, shrunk when whole chains used far
/// less of it.
#[derive(Clone, Debug, PartialEq)]
pub struct StackGrowth {
    /// When, since the recording started.
    pub at: Duration,
    /// The copy before and after, in bytes.
    pub from: u32,
    /// See `from`.
    pub to: u32,
    /// The share of the last window's user samples that were cut (0-100).
    pub cut_percent: f64,
    /// When it shrank (`to < from`): the most bytes of the copy a whole
    /// chain read in the ten windows before (a second or so); 0 when it
    /// grew.
    pub used: u32,
}

/// Sizes the user stack copy from window to window (see
/// [`RecordOptions::stack_bytes_max`] and
/// [`RecordOptions::stack_bytes_min`]): twice as large when more than 3%
/// of a window's samples were cut at its end; down to twice what the
/// whole chains read (in 512-byte steps, not below the least size) when
/// none was cut for [`CopySizer::QUIET_WINDOWS`] windows in a row and that
/// is half the copy or less. Never back down to a size found too small: after growing
/// from `n` bytes, not below `2n`.
#[derive(Debug)]
struct CopySizer {
    max: u32,
    /// The smallest size it may shrink to.
    floor: u32,
    /// Windows in a row with no sample cut, and the most bytes whole
    /// chains read in each of the last [`CopySizer::QUIET_WINDOWS`]
    /// (window `i` at `i % QUIET_WINDOWS`): the deep stacks of a
    /// program's start (the dynamic loader's) age out.
    quiet: u32,
    recent: [u32; CopySizer::QUIET_WINDOWS as usize],
    /// The most of those at the last shrink.
    used: u32,
}

impl CopySizer {
    /// Windows (each 0.1 s and 50 samples at least) with no sample cut
    /// before a shrink.
    const QUIET_WINDOWS: u32 = 10;
    /// The smallest copy it ever shrinks to.
    const MIN_BYTES: u32 = 1024;
    /// A shrunk copy is a multiple of this.
    const STEP: u32 = 512;

    /// A copy of `size` bytes that may grow up to `max` and shrink down to
    /// `min`; `min <= size <= max`, else (`size >= max`) a fixed size.
    fn new(size: u32, min: u32, max: u32) -> CopySizer {
        CopySizer {
            max,
            floor: if max > size {
                min.max(Self::MIN_BYTES)
            } else {
                u32::MAX
            },
            quiet: 0,
            recent: [0; Self::QUIET_WINDOWS as usize],
            used: 0,
        }
    }

    /// The size to reopen the events with after a window of `user`
    /// samples, `cut` of them cut, whose whole chains read at most `used`
    /// bytes of the copy of `size`; `None` to keep it.
    fn next(&mut self, size: u32, user: u64, cut: u64, used: u32) -> Option<u32> {
        if user >= 50 && cut * 100 > user * 3 {
            self.quiet = 0;
            return (size < self.max).then(|| (size * 2).min(self.max));
        }
        if cut > 0 || user < 50 {
            self.quiet = 0;
            return None;
        }
        self.recent[(self.quiet % Self::QUIET_WINDOWS) as usize] = used;
        self.quiet = self.quiet.saturating_add(1);
        if self.quiet < Self::QUIET_WINDOWS {
            return None;
        }
        self.used = self.recent.iter().copied().max().unwrap_or(0);
        let to = (self.used.max(8) * 2)
            .next_multiple_of(Self::STEP)
            .max(self.floor);
        (to <= size / 2).then_some(to)
    }

    /// The events were opened again with a copy of `to` bytes (from
    /// `from`).
    fn changed(&mut self, from: u32, to: u32) {
        if to > from {
            self.floor = self.floor.max(from.saturating_mul(2));
        }
        self.quiet = 0;
    }

    /// The events could not be opened again: the copy stays.
    fn fixed(&mut self) {
        self.max = 0;
        self.floor = u32::MAX;
    }
}

/// State dropped to stay under [`RecordOptions::memory_budget`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evicted {
    /// The module whose compiled unwind table was dropped, or
    /// `[maps of PID (COMM)]` for a process's module map.
    pub what: String,
    /// The memory it held (estimated), in bytes.
    pub bytes: usize,
}

impl RecordOptions {
    /// The sampling rate [`RecordOptions::new`] gives `target` (see
    /// [`RecordOptions::hz`]): 99 for [`Target::All`], else 999.
    pub fn default_hz(target: &Target) -> u32 {
        if matches!(target, Target::All) {
            99
        } else {
            999
        }
    }

    /// The defaults for `target`.
    pub fn new(target: Target) -> Self {
        RecordOptions {
            hz: RecordOptions::default_hz(&target),
            target,
            stack_bytes: 8192,
            stack_bytes_max: 61440,
            stack_bytes_min: 8192,
            duration: None,
            lookup: Lookup::default(),
            kernel: true,
            rotate: None,
            off_cpu: false,
            pid_filter: Vec::new(),
            comm_filter: Vec::new(),
            memory_budget: None,
            sample_hook: None,
        }
    }
}

/// How a recording is going, given to the progress callback a few times a
/// second.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// Samples kept.
    pub samples: u64,
    /// Samples lost (the kernel's ring was full, or no user stack).
    pub lost: u64,
    /// Threads seen.
    pub threads: usize,
    /// Time since recording started.
    pub elapsed: Duration,
    /// The recorder's estimate of its per-module state (unwind tables,
    /// module maps), in bytes, at the last budget check (0 without
    /// [`RecordOptions::memory_budget`]).
    pub state_bytes: usize,
}

/// How a recording is steered from outside while it runs (from a signal
/// handler: every method is an atomic store, async-signal-safe).
#[derive(Debug, Default)]
pub struct Control {
    stop: AtomicBool,
    signal: AtomicI32,
}

impl Control {
    /// A control that asks nothing yet.
    pub const fn new() -> Self {
        Control {
            stop: AtomicBool::new(false),
            signal: AtomicI32::new(0),
        }
    }

    /// Ends the recording now; a command started for it is killed.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Sends signal `sig` to the recorded command (as `perf record` passes
    /// on SIGINT and SIGTERM), recording on until the command ends; for a
    /// recorded running process (`Target::Pid`), ends the recording
    /// instead (the process is not ours to signal).
    pub fn forward(&self, sig: i32) {
        self.signal.store(sig, Ordering::Relaxed);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// What a recording gives.
#[derive(Debug)]
pub struct Recorded {
    /// The profile: stacks by thread, values `samples/count` and
    /// `cpu/nanoseconds`, the modules of every process seen, thread
    /// names, lost samples.
    pub profile: Profile,
    /// How the command ended, for a [`Target::Command`] that ended by
    /// itself (an exit, a signal, including one passed on by
    /// [`Control::forward`]); `None` for a running process, and for a
    /// command the recording ended (a duration, [`Control::stop`]).
    pub status: Option<ExitStatus>,
    /// Each time the user stack copy grew or shrank
    /// ([`RecordOptions::stack_bytes_max`]).
    pub stack_growth: Vec<StackGrowth>,
    /// The user stack copy at the end, in bytes.
    pub stack_bytes: u32,
    /// What was dropped to stay under [`RecordOptions::memory_budget`],
    /// in the order it was (a module dropped, needed again and dropped
    /// again is listed each time).
    pub evicted: Vec<Evicted>,
}

/// Why recording failed.
#[derive(Debug)]
pub enum RecordError {
    /// `perf_event_open` was refused (the text says why and what to try).
    PerfRefused(std::io::Error),
    /// The command could not be started.
    Spawn(String, std::io::Error),
    /// No such process.
    NoSuchProcess(u32),
    /// Recording is not implemented for this architecture (x86-64 and
    /// AArch64 are), or an option is out of range.
    Unsupported(&'static str),
    /// Another system failure.
    Sys(&'static str, std::io::Error),
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::PerfRefused(e) => write!(
                f,
                "perf_event_open refused: {e} (see /proc/sys/kernel/perf_event_paranoid; \
                 run as root, or lower it to 1 or less)"
            ),
            RecordError::Spawn(cmd, e) => write!(f, "cannot start {cmd}: {e}"),
            RecordError::NoSuchProcess(p) => write!(f, "no process with id {p}"),
            RecordError::Unsupported(what) => write!(f, "not supported: {what}"),
            RecordError::Sys(what, e) => write!(f, "{what}: {e}"),
        }
    }
}

impl std::error::Error for RecordError {}

// Record types of the ring buffer.
const RECORD_MMAP: u32 = 1;
const RECORD_LOST: u32 = 2;
const RECORD_COMM: u32 = 3;
const RECORD_EXIT: u32 = 4;
const RECORD_FORK: u32 = 7;
const RECORD_SAMPLE: u32 = 9;
/// `PERF_RECORD_SWITCH`: the task left (`MISC_SWITCH_OUT`) or took a CPU.
const RECORD_SWITCH: u32 = 14;
/// `PERF_RECORD_SWITCH_CPU_WIDE`: the same, from an event of a whole CPU
/// (`record -a`), which first names the other task of the switch (the
/// next one of a switch out, the previous one of a switch in).
const RECORD_SWITCH_CPU_WIDE: u32 = 15;
/// `PERF_RECORD_MISC_SWITCH_OUT`.
const MISC_SWITCH_OUT: u16 = 1 << 13;
/// `PERF_RECORD_MISC_SWITCH_OUT_PREEMPT`: it left runnable (preempted).
const MISC_SWITCH_OUT_PREEMPT: u16 = 1 << 14;
const RECORD_MMAP2: u32 = 10;
/// `PERF_RECORD_MISC_MMAP_BUILD_ID`: an mmap2 record with a build-id in
/// place of device and inode.
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;
/// `PERF_RECORD_MISC_COMM_EXEC`: a comm record for an exec.
const MISC_COMM_EXEC: u16 = 1 << 13;

/// `PERF_SAMPLE_REGS_ABI_64`: the sample's registers are a 64-bit task's.
const REGS_ABI_64: u64 = 2;

/// The architecture recorded: this host's (its sample registers are in
/// `arch/<arch>/perf_regs.rs`), `None` where recording is not implemented.
const RECORDED_MACHINE: Option<Machine> = crate::arch::NATIVE_MACHINE;

/// The copied top of a thread's stack, as the unwinder's memory.
struct CopiedStack<'a> {
    base: u64,
    data: &'a [u8],
    /// Whether a read went past the copy's end (the stack goes on there,
    /// uncopied, when the copy was full).
    past_end: bool,
    /// How far into the copy the reads went, in bytes.
    used: u64,
}

impl Memory for CopiedStack<'_> {
    fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
        let off = addr.wrapping_sub(self.base);
        if addr < self.base || off + 8 > self.data.len() as u64 {
            if addr >= self.base {
                self.past_end = true;
            }
            return Err(ReadError::OutOfBounds(addr));
        }
        let o = off as usize;
        self.used = self.used.max(off + 8);
        Ok(u64::from_le_bytes(self.data[o..o + 8].try_into().unwrap()))
    }
}

/// A snapshot and the unwinder that borrows it, owned together: dropped
/// (unwinder first) when the process's mappings change and a new one is
/// built.
struct OwnedUnwinder {
    unwinder: ManuallyDrop<RemoteUnwinder<'static>>,
    snap: NonNull<Snapshot>,
}

impl OwnedUnwinder {
    fn new(snap: Snapshot) -> Self {
        let snap = NonNull::from(Box::leak(Box::new(snap)));
        // SAFETY: the snapshot is freed only in `drop`, after the unwinder
        // that borrows it; it is never moved nor written to meanwhile, and
        // `get` lends the unwinder no longer than `self`.
        let unwinder = RemoteUnwinder::new(unsafe { snap.as_ref() });
        OwnedUnwinder {
            unwinder: ManuallyDrop::new(unwinder),
            snap,
        }
    }

    fn get(&self) -> &RemoteUnwinder<'static> {
        &self.unwinder
    }

    fn get_mut(&mut self) -> &mut RemoteUnwinder<'static> {
        &mut self.unwinder
    }
}

impl Drop for OwnedUnwinder {
    fn drop(&mut self) {
        // SAFETY: the unwinder is dropped once, here, and before the
        // snapshot it borrows; the snapshot came from `Box::leak` in `new`
        // and nothing refers to it any more.
        unsafe {
            ManuallyDrop::drop(&mut self.unwinder);
            drop(Box::from_raw(self.snap.as_ptr()));
        }
    }
}

/// The time of a record other than a sample, from its `sample_id` trailer
/// (pid, tid, time: the event's sample type has TID and TIME), 0 when the
/// record is too short to have one.
fn trailer_time(rec: &[u8]) -> u64 {
    rec.len()
        .checked_sub(8)
        .filter(|&at| at >= 8 + 16)
        .and_then(|at| rec.get(at..))
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// A module record of a snapshot's module (the vDSO keeps its name: no
/// file to symbolize from, but its frames read `[vdso]+0xoffset`).
fn module_record(m: &Module) -> ModuleRecord {
    ModuleRecord {
        path: m.file.clone().unwrap_or_else(|| m.name.clone().into()),
        build_id: m.build_id.clone(),
        start: m.start,
        end: m.end,
        bias: m.bias,
    }
}

/// One process's address space: its mappings, and the snapshot and
/// unwinder made from them (rebuilt when the mappings change).
#[derive(Default)]
struct Space {
    /// The process's name (`/proc/PID/comm`, or its comm records), once
    /// known: for [`RecordOptions::comm_filter`].
    comm: Option<String>,
    mappings: Vec<Mapping>,
    maps_read: bool,
    dirty: bool,
    /// The time of its last exec applied (0 before any): the records of
    /// an earlier exec and of that program's mappings, drained late from
    /// another CPU's ring, are stale (a shell that exec'd a program on
    /// another CPU would otherwise end with the shell's mappings, named
    /// as its program).
    exec_time: u64,
    /// The time of its fork record (0 when none was seen): an exit record
    /// older than that, drained late from another CPU's ring, is of an
    /// earlier process that had the same pid.
    born: u64,
    unwinder: Option<OwnedUnwinder>,
    /// The modules of the snapshots replaced so far (once each): samples
    /// unwound with them may hold their addresses. The snapshots
    /// themselves (open files, compiled tables) are freed.
    retired: Vec<ModuleRecord>,
    /// Per module of the current snapshot, once placed in the recording's
    /// ranges ([`canon::Canon`]): what to add to its addresses, and the
    /// record of the range they move into. Empty until then.
    placed: Vec<(u64, ModuleRecord)>,
    /// The current snapshot's mappings, `(start, end, module index)`
    /// sorted by start: [`Space::moved`]'s search (a frame at a time).
    ranges: Vec<(u64, u64, usize)>,
    /// [`Recording::tick`] of its last sample.
    last_used: u64,
}

impl Space {
    fn add(&mut self, m: Mapping) {
        // A new mapping replaces whatever it overlaps, and the mappings of
        // another load of the same file: those copied at a fork and left
        // by an exec whose record (drained from another CPU's ring) has
        // not come yet. One load's mappings are a few MiB apart at most
        // in `start - file offset`; two loads', wherever address
        // randomization put them.
        let load = m.start.wrapping_sub(m.file_offset);
        self.mappings.retain(|x| {
            (x.end <= m.start || x.start >= m.end)
                && (x.path != m.path
                    || x.start.wrapping_sub(x.file_offset).abs_diff(load) < 64 << 20)
        });
        self.mappings.push(m);
        self.dirty = true;
    }

    #[inline(never)]
    fn read_proc_maps(&mut self, pid: u32) {
        self.maps_read = true;
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            return;
        };
        for (m, _) in text
            .lines()
            .filter_map(crate::remote::process::parse_maps_line)
        {
            if !(m.path.starts_with('/') || m.path == "[vdso]") {
                continue;
            }
            if self
                .mappings
                .iter()
                .any(|x| x.start == m.start && x.end == m.end && x.path == m.path)
            {
                continue;
            }
            self.add(m);
        }
    }

    /// The unwinder for the current mappings, rebuilt when they changed
    /// (modules mapped: a handful of times per process); the one it
    /// replaces is freed, its modules kept in `retired`.
    fn unwinder(&mut self, lookup: &Lookup, pid: u32, arch: Machine) -> &RemoteUnwinder<'static> {
        if self.dirty || self.unwinder.is_none() {
            self.rebuild(lookup, pid, arch);
        }
        self.unwinder.as_ref().unwrap().get()
    }

    /// [`Space::unwinder`]'s rebuild, out of line: the sample's path keeps
    /// a small frame (a whole-host recording unwinds its own samples from
    /// the 8 KiB of stack the kernel copies).
    #[inline(never)]
    fn rebuild(&mut self, lookup: &Lookup, pid: u32, arch: Machine) {
        self.dirty = false;
        self.retire();
        let snap = snapshot_of(&self.mappings, lookup, pid, arch);
        self.unwinder = Some(OwnedUnwinder::new(snap));
    }

    /// Places the current snapshot's modules in `canon`, once per
    /// snapshot.
    fn place(&mut self, canon: &mut canon::Canon, pid: u32) {
        let Some(u) = &self.unwinder else {
            return;
        };
        if self.placed.len() != u.get().snapshot().modules.len() {
            self.place_all(canon, pid);
        }
    }

    /// [`Space::place`]'s work, out of line (see [`Space::rebuild`]).
    #[inline(never)]
    fn place_all(&mut self, canon: &mut canon::Canon, pid: u32) {
        let Some(u) = &self.unwinder else {
            return;
        };
        let modules = &u.get().snapshot().modules;
        self.placed = modules.iter().map(|m| canon.place(m, pid)).collect();
        self.ranges = modules
            .iter()
            .enumerate()
            .flat_map(|(i, m)| {
                m.mappings
                    .iter()
                    .filter(move |x| x.start >= m.start && x.end <= m.end)
                    .map(move |x| (x.start, x.end, i))
            })
            .collect();
        self.ranges.sort_unstable();
        if self.ranges.windows(2).any(|w| w[1].0 < w[0].1) {
            self.ranges.clear();
        }
    }

    /// `pc` (a frame's address in this process; `exact`: not a return
    /// address) moved into its file's range of the recording.
    fn moved(&self, pc: u64, exact: bool) -> u64 {
        let Some(u) = &self.unwinder else {
            return pc;
        };
        let probe = if exact { pc } else { pc.wrapping_sub(1) };
        // The module holding it, as `module_at` finds, by a binary search
        // where the mappings do not overlap (else `module_at`'s walk).
        let found = if self.ranges.is_empty() {
            u.get().snapshot().module_at(probe).map(|(i, _)| i)
        } else {
            let i = self.ranges.partition_point(|r| r.0 <= probe);
            i.checked_sub(1)
                .map(|i| self.ranges[i])
                .filter(|r| probe < r.1)
                .map(|r| r.2)
        };
        match found {
            Some(i) => self
                .placed
                .get(i)
                .map_or(pc, |(delta, _)| pc.wrapping_add(*delta)),
            None => pc,
        }
    }

    /// The current snapshot's module records: where its addresses are
    /// moved to once placed, else its own.
    fn current_records(&self) -> Vec<ModuleRecord> {
        let Some(u) = &self.unwinder else {
            return Vec::new();
        };
        let modules = &u.get().snapshot().modules;
        if self.placed.len() == modules.len() {
            self.placed.iter().map(|(_, r)| r.clone()).collect()
        } else {
            modules.iter().map(module_record).collect()
        }
    }

    /// The process exec'd: its mappings are gone (those of the new program
    /// come in the kernel's records), its snapshot retired.
    fn exec(&mut self) {
        self.retire();
        self.mappings.clear();
        // Its maps are read again at its next sample, for the segments
        // the kernel's records leave out (not executable).
        self.maps_read = false;
        self.dirty = true;
    }

    /// Frees the snapshot, its modules' records kept in `retired`.
    fn retire(&mut self) {
        for rec in self.current_records() {
            if !self.retired.contains(&rec) {
                self.retired.push(rec);
            }
        }
        self.unwinder = None;
        self.placed.clear();
        self.ranges.clear();
    }

    /// The memory of its module map (mappings, the snapshot's modules
    /// and code map), estimated in bytes; compiled tables not included
    /// (shared, counted once by key).
    fn bytes(&self) -> usize {
        let maps: usize = self
            .mappings
            .iter()
            .map(|m| std::mem::size_of::<Mapping>() + m.path.len())
            .sum();
        maps + self.unwinder.as_ref().map_or(0, |u| {
            let u = u.get();
            u.code_bytes() + u.snapshot().modules.len() * std::mem::size_of::<Module>()
        })
    }

    /// Drops the snapshot (rebuilt at the next sample), its modules kept in
    /// `retired`; the bytes it held.
    fn drop_unwinder(&mut self) -> usize {
        let before = self.bytes();
        self.retire();
        self.dirty = true;
        before - self.bytes()
    }

    /// The records of every module unwound with so far, once each: the
    /// retired ones, then the current snapshot's.
    fn module_records(&self) -> Vec<ModuleRecord> {
        let mut out = self.retired.clone();
        for rec in self.current_records() {
            if !out.contains(&rec) {
                out.push(rec);
            }
        }
        out
    }
}

/// This process's vDSO image: the kernel maps the same one into every
/// process, so a target's vDSO unwinds with ours.
/// (Found once: every process's snapshot asks for it; each gets its own
/// copy of the few KiB, freed with it.)
fn own_vdso() -> Option<std::sync::Arc<Vec<u8>>> {
    static IMAGE: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    IMAGE
        .get_or_init(crate::modules::vdso_image)
        .clone()
        .map(std::sync::Arc::new)
}

fn snapshot_of(mappings: &[Mapping], lookup: &Lookup, pid: u32, arch: Machine) -> Snapshot {
    let files: Vec<Mapping> = mappings
        .iter()
        .filter(|m| m.path.starts_with('/'))
        .cloned()
        .collect();
    let mut mods = files::group_mappings(&files);
    let mut warnings = Vec::new();
    files::resolve_files(&mut mods, lookup, None, &mut warnings);
    // Our own vDSO stands for the target's only when both run here.
    let vdso = mappings
        .iter()
        .find(|m| m.path == "[vdso]")
        .filter(|_| crate::arch::NATIVE_MACHINE == Some(arch));
    if let Some(v) = vdso {
        if let Some(image) = own_vdso().filter(|i| i.len() as u64 == v.end - v.start) {
            mods.push(files::image_module(v.clone(), image));
            mods.sort_by_key(|m| m.start);
        }
    }
    Snapshot {
        arch,
        pid,
        process_name: None,
        threads: Vec::new(),
        modules: mods,
        warnings,
        anon_code: Vec::new(),
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn u64(&mut self) -> Option<u64> {
        let (h, t) = self.b.split_at_checked(8)?;
        self.b = t;
        Some(u64::from_le_bytes(h.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        let (h, t) = self.b.split_at_checked(4)?;
        self.b = t;
        Some(u32::from_le_bytes(h.try_into().ok()?))
    }
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (h, t) = self.b.split_at_checked(n)?;
        self.b = t;
        Some(h)
    }
    fn cstr(&mut self) -> String {
        let end = self.b.iter().position(|&c| c == 0).unwrap_or(self.b.len());
        String::from_utf8_lossy(&self.b[..end]).into_owned()
    }
}

/// The fields of a `PERF_RECORD_SAMPLE` the recorder asked for
/// (`sys::Event::open`: ip, tid, time, the kernel callchain when asked,
/// user registers, user stack), borrowed from the record.
#[derive(Debug)]
struct SampleRecord<'a> {
    ip: u64,
    pid: u32,
    tid: u32,
    /// The perf clock's time of the sample, in nanoseconds.
    time: u64,
    /// The kernel callchain's words (empty when not asked for).
    callchain: &'a [u8],
    /// The user registers; `None` when the sample has none (a kernel
    /// thread) or they are not a 64-bit task's.
    regs: Option<Registers>,
    /// The copied user stack from the sampled sp (its valid part).
    stack: &'a [u8],
    /// Whether the copy is as long as the kernel meant it (it did not stop
    /// at unmapped memory: the stack's top is further up).
    full: bool,
}

/// Parses a sample's body (after the 8-byte header): `kernel` is whether
/// the event asked for the callchain, `regs_mask` the `sample_regs_user`
/// of `machine` it asked for (its registers come in increasing bit
/// order). `None` when the record is cut short.
#[inline(never)]
fn parse_sample(
    b: &[u8],
    kernel: bool,
    machine: Machine,
    regs_mask: u64,
) -> Option<SampleRecord<'_>> {
    let mut r = Reader { b };
    let ip = r.u64()?;
    let pid = r.u32()?;
    let tid = r.u32()?;
    let time = r.u64()?;
    let callchain = if kernel {
        let n = usize::try_from(r.u64()?).ok()?;
        r.bytes(n.checked_mul(8)?)?
    } else {
        &[]
    };
    let abi = r.u64()?;
    let mut regs = None;
    if abi != 0 {
        // The words are there for any ABI: skipped when not 64-bit.
        let mut words = [0u64; 64];
        let n = (regs_mask.count_ones() as usize).min(words.len());
        for w in &mut words[..n] {
            *w = r.u64()?;
        }
        if abi == REGS_ABI_64 {
            regs = machine.registers_from_perf(&words[..n]);
        }
    }
    let size = usize::try_from(r.u64()?).ok()?;
    let data = r.bytes(size)?;
    let dyn_size = if size > 0 { r.u64()? as usize } else { 0 };
    Some(SampleRecord {
        ip,
        pid,
        tid,
        time,
        callchain,
        regs,
        stack: &data[..dyn_size.min(size)],
        full: size > 0 && dyn_size >= size,
    })
}

/// The state of a recording.
struct Recording<'o> {
    opts: &'o RecordOptions,
    /// The architecture of the samples' registers.
    machine: Machine,
    /// The `sample_regs_user` mask asked for (`machine`'s).
    regs_mask: u64,
    spaces: HashMap<u32, Space>,
    profile: Profile,
    threads: HashSet<u32>,
    samples: u64,
    frames: Vec<usize>,
    /// The indices of `frames` past the first that are exact pcs.
    exact: Vec<u32>,
    /// A sample's user frames as unwound, and their pcs for the sample
    /// hook (buffers used again from sample to sample).
    unwound: Unwound,
    /// The thread of the sample being unwound: its registers written here,
    /// not into a local (the unwinding of the recorder's own samples needs
    /// the loop's frames small).
    thread: Thread,
    pcs: Vec<u64>,
    /// Whether samples carry a kernel callchain.
    kernel: bool,
    /// Lowest and highest kernel address seen.
    kernel_range: Option<(u64, u64)>,
    /// The process recorded (the command's, or `-p`'s).
    root_pid: u32,
    /// The program of `root_pid`: the file of its latest exec (the first
    /// executable mapping after it), or `/proc/PID/exe` of a running
    /// process. Its module goes first in the profile.
    main_exe: Option<String>,
    /// Whether `root_pid` exec'd and its program's mapping is yet to come.
    exe_pending: bool,
    /// Off-CPU records not yet matched, from every CPU's ring (whose
    /// drains are not in time order): handled in time order once older
    /// than the newest time seen by a margin ([`Recording::match_switches`]).
    off_events: Vec<OffEvent>,
    /// Per thread: where and when it last blocked (stack, exact indices,
    /// time out; `None` until its switch out is seen or when preempted).
    blocked: HashMap<u32, Blocked>,
    /// The newest perf-clock time seen.
    latest: u64,
    /// Module records of processes that exited (their spaces freed), for
    /// the profile of the period they ended in.
    exited_modules: Vec<ModuleRecord>,
    /// Processes whose exit record came in this pass over the rings, with
    /// its time: their spaces go at the pass's end ([`Recording::end_pass`]),
    /// once the samples they left in other CPUs' rings are unwound (a
    /// process that ran on one CPU and exited on another left samples in
    /// a ring drained after its exit's).
    exits: Vec<(u32, u64)>,
    /// One address range per file for every process recorded: where
    /// sampled addresses are moved to.
    canon: canon::Canon,
    /// Samples left out by the filters or taken in the idle task.
    pub(crate) skipped: u64,
    /// Counts samples: the recency of modules and processes.
    tick: u64,
    /// Drops made to stay under the budget: all, and this period's.
    evicted: Vec<Evicted>,
    period_evicted: Vec<Evicted>,
    /// The last estimate of the state under the budget.
    state_bytes: usize,
    /// User samples unwound, and those cut at the end of a full stack
    /// copy, since the last look ([`RecordOptions::stack_bytes_max`]).
    window_user: u64,
    window_cut: u64,
    /// The most bytes of the copy a whole chain read since the last look.
    window_used: u32,
}

/// A record of the context-switch event.
enum OffEvent {
    /// The stack sampled as thread `tid` left the CPU.
    Sample {
        time: u64,
        tid: u32,
        stack: OffStack,
    },
    /// Thread `tid` left the CPU (`out`; `preempt`: runnable) or took it.
    Switch {
        time: u64,
        tid: u32,
        out: bool,
        preempt: bool,
    },
}

impl OffEvent {
    fn time(&self) -> u64 {
        match self {
            OffEvent::Sample { time, .. } | OffEvent::Switch { time, .. } => *time,
        }
    }
}

/// The stack of a thread leaving the CPU, as [`SampleHook::sample`] takes
/// it: the hook sees it once the thread's time off the CPU is known.
struct OffStack {
    pid: u32,
    /// The index of the first user frame.
    user: usize,
    /// The user frames' addresses in the process (empty without a hook).
    pcs: Vec<u64>,
    frames: Vec<usize>,
    exact: Vec<u32>,
}

/// A thread off the CPU.
struct Blocked {
    stack: OffStack,
    /// When it left the CPU blocked (`None`: the sample came, the switch
    /// record not yet; or it was preempted).
    since: Option<u64>,
}

impl<'o> Recording<'o> {
    /// [`Recording::new`] into a new profile starting now, on the heap,
    /// built in a frame of its own (not in the recording loop's, which
    /// must stay small: see [`open_target`]).
    #[inline(never)]
    fn boxed(opts: &'o RecordOptions, machine: Machine, regs_mask: u64) -> Box<Self> {
        let mut profile = new_profile(opts);
        profile.start_time_ns = now_ns();
        Box::new(Self::new(opts, machine, regs_mask, profile))
    }

    /// A recording of samples of `machine`, whose events ask for the user
    /// registers of `regs_mask`, into `profile`.
    fn new(opts: &'o RecordOptions, machine: Machine, regs_mask: u64, profile: Profile) -> Self {
        Recording {
            opts,
            machine,
            regs_mask,
            spaces: HashMap::new(),
            profile,
            threads: HashSet::new(),
            samples: 0,
            frames: Vec::with_capacity(256),
            exact: Vec::new(),
            unwound: Unwound::default(),
            thread: Thread {
                tid: 0,
                name: None,
                registers: Registers::new(machine),
                stack_end: None,
            },
            pcs: Vec::new(),
            kernel: false,
            kernel_range: None,
            root_pid: 0,
            main_exe: None,
            exe_pending: false,
            off_events: Vec::new(),
            blocked: HashMap::new(),
            latest: 0,
            exited_modules: Vec::new(),
            exits: Vec::new(),
            canon: canon::Canon::default(),
            skipped: 0,
            tick: 0,
            evicted: Vec::new(),
            period_evicted: Vec::new(),
            state_bytes: 0,
            window_user: 0,
            window_cut: 0,
            window_used: 0,
        }
    }
}

impl Recording<'_> {
    fn handle(&mut self, rec: &[u8], kind: sys::EventKind) {
        let ty = u32::from_le_bytes(rec[0..4].try_into().unwrap());
        let misc = u16::from_le_bytes(rec[4..6].try_into().unwrap());
        let mut r = Reader { b: &rec[8..] };
        match ty {
            RECORD_SAMPLE => {
                let _ = self.sample(&mut r, kind);
            }
            RECORD_SWITCH | RECORD_SWITCH_CPU_WIDE => {
                // A whole CPU's record names the other task first
                // (next_prev_pid, next_prev_tid), not needed here.
                if ty == RECORD_SWITCH_CPU_WIDE && r.u64().is_none() {
                    return;
                }
                // The sample_id trailer: pid, tid, time.
                let (Some(pid), Some(tid), Some(time)) = (r.u32(), r.u32(), r.u64()) else {
                    return;
                };
                self.latest = self.latest.max(time);
                if pid == 0 {
                    // The idle task, which a whole CPU's event switches to
                    // and from.
                    return;
                }
                self.off_events.push(OffEvent::Switch {
                    time,
                    tid,
                    out: misc & MISC_SWITCH_OUT != 0,
                    preempt: misc & MISC_SWITCH_OUT_PREEMPT != 0,
                });
            }
            RECORD_MMAP | RECORD_MMAP2 => {
                let (Some(pid), Some(_tid), Some(addr), Some(len), Some(pgoff)) =
                    (r.u32(), r.u32(), r.u64(), r.u64(), r.u64())
                else {
                    return;
                };
                // Of a program the process has since left by an exec
                // already applied: stale.
                if self
                    .spaces
                    .get(&pid)
                    .is_some_and(|s| trailer_time(rec) < s.exec_time)
                {
                    return;
                }
                let mut prot = libc::PROT_EXEC as u32;
                if ty == RECORD_MMAP2 {
                    // maj, min, ino, ino_generation (or the build-id form:
                    // the same 24 bytes), prot, flags.
                    let _ = misc & MISC_MMAP_BUILD_ID;
                    if r.bytes(24).is_none() {
                        return;
                    }
                    prot = r.u32().unwrap_or(prot);
                    let _flags = r.u32();
                }
                let path = r.cstr();
                if prot & libc::PROT_EXEC as u32 == 0 || !path.starts_with('/') {
                    return;
                }
                // The kernel maps the program before its interpreter.
                if pid == self.root_pid && self.exe_pending {
                    self.exe_pending = false;
                    self.main_exe = Some(path.clone());
                }
                if let Some(h) = &self.opts.sample_hook {
                    h.mapped(pid, &path);
                }
                let space = self.spaces.entry(pid).or_default();
                space.add(Mapping {
                    start: addr,
                    end: addr + len,
                    file_offset: pgoff,
                    path,
                    executable: Some(true),
                });
            }
            RECORD_COMM => {
                let (Some(pid), Some(tid)) = (r.u32(), r.u32()) else {
                    return;
                };
                if misc & MISC_COMM_EXEC != 0 && tid == pid {
                    // A space made now if none is there: a fork record
                    // drained after this one (from another CPU's ring)
                    // must not give it its parent's mappings.
                    let space = self.spaces.entry(pid).or_default();
                    let time = trailer_time(rec);
                    if time < space.exec_time {
                        // An earlier exec than one applied, drained late
                        // from another CPU's ring: its program is gone.
                        return;
                    }
                    space.exec_time = time;
                    // A new program: the old one's mappings (copied at its
                    // fork, or its own) are gone; the new ones' records
                    // follow this one. Its modules stay reported.
                    space.exec();
                    if pid == self.root_pid {
                        self.exe_pending = true;
                    }
                }
                if let (Some(h), true) = (&self.opts.sample_hook, misc & MISC_COMM_EXEC != 0) {
                    h.exec(pid);
                }
                let name = r.cstr();
                if tid == pid {
                    if let Some(space) = self.spaces.get_mut(&pid) {
                        space.comm = Some(name.clone());
                    }
                    // An exec renames the process: its threads' later
                    // samples carry the new name (those before the cut of
                    // a period keep the last one seen).
                    for tp in self.profile.thread_processes.values_mut() {
                        if tp.pid == pid {
                            tp.name = name.clone();
                        }
                    }
                }
                self.profile.threads.insert(tid, name);
            }
            RECORD_EXIT => {
                let (Some(pid), Some(_ppid), Some(tid)) = (r.u32(), r.u32(), r.u32()) else {
                    return;
                };
                // A process of a whole-host recording is gone: its modules
                // stay in the profile, its open files and tables go at the
                // end of this pass over the rings.
                let time = trailer_time(rec);
                if matches!(self.opts.target, Target::All)
                    && pid == tid
                    && self.spaces.get(&pid).is_some_and(|s| s.born <= time)
                {
                    self.exits.push((pid, time));
                }
            }
            RECORD_FORK => {
                let (Some(pid), Some(ppid)) = (r.u32(), r.u32()) else {
                    return;
                };
                if pid == ppid {
                    return;
                }
                let time = trailer_time(rec);
                // The pid of a process that exited in this pass, given
                // again: the old process's space goes now.
                if let Some(k) = self.exits.iter().position(|&(p, t)| p == pid && t <= time) {
                    self.exits.swap_remove(k);
                    self.forget(pid);
                }
                if !self.spaces.contains_key(&pid) {
                    let maps = self
                        .spaces
                        .get(&ppid)
                        .map(|s| s.mappings.clone())
                        .unwrap_or_default();
                    let s = self.spaces.entry(pid).or_default();
                    s.mappings = maps;
                    s.dirty = true;
                    s.born = time;
                }
            }
            RECORD_LOST => {
                let (Some(_id), Some(n)) = (r.u64(), r.u64()) else {
                    return;
                };
                self.profile.lost += n;
            }
            _ => {}
        }
    }

    /// The end of a pass over every ring: the spaces of the processes that
    /// exited in it go (see [`Recording::exits`]).
    fn end_pass(&mut self) {
        for (pid, time) in std::mem::take(&mut self.exits) {
            if self.spaces.get(&pid).is_some_and(|s| s.born <= time) {
                self.forget(pid);
            }
        }
    }

    /// Frees the space of process `pid`, gone; its modules stay in the
    /// profile.
    fn forget(&mut self, pid: u32) {
        if let Some(space) = self.spaces.remove(&pid) {
            for rec in space.module_records() {
                if !self.exited_modules.contains(&rec) {
                    self.exited_modules.push(rec);
                }
            }
        }
    }

    fn sample(&mut self, r: &mut Reader<'_>, kind: sys::EventKind) -> Option<()> {
        let SampleRecord {
            ip,
            pid,
            tid,
            time,
            callchain,
            regs,
            stack: data,
            full,
        } = parse_sample(r.b, self.kernel, self.machine, self.regs_mask)?;
        self.latest = self.latest.max(time);
        if pid == 0 || !self.wanted(pid) {
            // The idle task, or a process the filters leave out.
            self.skipped += 1;
            return Some(());
        }
        if matches!(self.opts.target, Target::All) && !self.profile.threads.contains_key(&tid) {
            self.name_thread(pid, tid);
        }
        self.frames.clear();
        for a in callchain.chunks_exact(8).take(512) {
            let a = u64::from_le_bytes(a.try_into().ok()?);
            // Context markers (PERF_CONTEXT_KERNEL...) are the top 4095
            // values; kernel addresses sit in the upper half.
            if a >= (-4095i64) as u64 || a < (1 << 63) {
                continue;
            }
            self.frames.push(a as usize);
            let (lo, hi) = self.kernel_range.unwrap_or((a, a));
            self.kernel_range = Some((lo.min(a), hi.max(a)));
        }
        let Some(regs) = regs else {
            if kind == sys::EventKind::Switches {
                // A kernel thread leaving a CPU (whole-host recordings see
                // them all): its off-CPU time is not recorded.
                self.skipped += 1;
                return Some(());
            }
            // No user registers: a kernel thread (its kernel frames are
            // its stack), or a 32-bit task's, numbered otherwise.
            if self.frames.is_empty() {
                self.profile.lost += 1;
                return None;
            }
            self.note_process(pid, tid);
            let period = self.profile.period;
            self.profile
                .add_exact(&self.frames, true, &[], Some(tid), &[1, period]);
            self.samples += 1;
            return Some(());
        };
        self.threads.insert(tid);
        self.note_process(pid, tid);
        let sp = regs.sp().unwrap_or(0);
        self.thread.tid = tid;
        self.thread.registers = regs;
        self.thread.stack_end = Some(sp.saturating_add(data.len() as u64));
        let thread = &self.thread;
        let lookup = &self.opts.lookup;
        let space = self.spaces.entry(pid).or_default();
        if !space.maps_read {
            space.read_proc_maps(pid);
        }
        self.tick += 1;
        space.last_used = self.tick;
        space.unwinder(lookup, pid, self.machine);
        space.place(&mut self.canon, pid);
        let space = &*space;
        let unwinder = space.unwinder.as_ref().expect("just made").get();
        let mut mem = CopiedStack {
            base: sp,
            data,
            past_end: false,
            used: 0,
        };
        let mut unwound = std::mem::take(&mut self.unwound);
        unwinder.unwind_into(&mut mem, thread, 256, &mut unwound);
        // Cut: the walk stopped reading past the end of a full copy,
        // short of the thread's first frame.
        let cut = full && mem.past_end && unwound.stop.is_some();
        if kind == sys::EventKind::CpuClock {
            self.window_user += 1;
            self.window_cut += u64::from(cut);
        }
        if !cut {
            // Off-CPU samples too: their chains share the copy's size.
            self.window_used = self.window_used.max(mem.used as u32);
        }
        if self.opts.memory_budget.is_some() {
            // The modules this sample went through are the most recent.
            let mut last = (0, 0);
            for f in &unwound.frames {
                if f.pc < last.0 || f.pc >= last.1 {
                    last = unwinder.mark_used(f.pc, self.tick).unwrap_or((0, 0));
                }
            }
        }
        // The user frames' exact pcs: the interrupted one (the first user
        // frame, also after kernel frames: the kernel is entered by an
        // interrupt, a fault or a system call, never by a call) and those
        // found through signal frames. Looked up as they are, not at the
        // byte before like a return address: a fault taken at a
        // function's first instruction names that function, not the one
        // before it.
        let user = self.frames.len();
        self.exact.clear();
        // Each address moved into its file's range ([`canon`]).
        if unwound.frames.is_empty() {
            let pc = thread.registers.pc().unwrap_or(ip);
            self.frames.push(space.moved(pc, true) as usize);
            self.exact.push(user as u32);
        }
        for f in &unwound.frames {
            let exact = matches!(f.method, Method::Context | Method::SignalFrame);
            if exact {
                self.exact.push(self.frames.len() as u32);
            }
            self.frames.push(space.moved(f.pc, exact) as usize);
        }
        self.pcs.clear();
        if let Some(h) = &self.opts.sample_hook {
            // The user frames' addresses in the process, before the move.
            if unwound.frames.is_empty() {
                self.pcs.push(thread.registers.pc().unwrap_or(ip));
            } else {
                self.pcs.extend(unwound.frames.iter().map(|f| f.pc));
            }
            // An off-CPU sample goes to the hook once its thread runs
            // again ([`Recording::match_switches`]).
            if kind == sys::EventKind::Switches {
                h.left_cpu(pid, tid, time);
            } else {
                h.sample(
                    pid,
                    tid,
                    time,
                    user,
                    &self.pcs,
                    &mut self.frames,
                    &mut self.exact,
                );
            }
        }
        self.unwound = unwound;
        if kind == sys::EventKind::Switches {
            self.off_events.push(OffEvent::Sample {
                time,
                tid,
                stack: OffStack {
                    pid,
                    user,
                    pcs: self.pcs.clone(),
                    frames: self.frames.clone(),
                    exact: self.exact.clone(),
                },
            });
            return Some(());
        }
        let period = self.profile.period;
        // frames[0] (the kernel's interrupted pc, or the user one) is exact.
        self.profile
            .add_exact(&self.frames, true, &self.exact, Some(tid), &[1, period]);
        self.samples += 1;
        Some(())
    }

    /// Names thread `tid` of process `pid` from `/proc` (out of line: see
    /// [`Space::rebuild`]).
    #[inline(never)]
    fn name_thread(&mut self, pid: u32, tid: u32) {
        if let Ok(name) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")) {
            self.profile
                .threads
                .insert(tid, name.trim_end().to_string());
        }
    }

    /// Records the process of thread `tid` at its first sample (its name
    /// from the comm records seen, else `/proc/PID/comm`): the `pid` and
    /// `comm` labels of its samples.
    fn note_process(&mut self, pid: u32, tid: u32) {
        if self
            .profile
            .thread_processes
            .get(&tid)
            .is_some_and(|tp| tp.pid == pid)
        {
            return;
        }
        self.note_new_process(pid, tid);
    }

    /// [`Recording::note_process`] for a thread not noted yet, out of line
    /// (see [`Space::rebuild`]).
    #[inline(never)]
    fn note_new_process(&mut self, pid: u32, tid: u32) {
        let space = self.spaces.entry(pid).or_default();
        if space.comm.is_none() {
            space.comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .map(|s| s.trim_end().to_string());
        }
        // Gone already: the name its main thread had, if seen.
        let name = space
            .comm
            .clone()
            .or_else(|| self.profile.threads.get(&pid).cloned())
            .unwrap_or_default();
        self.profile
            .thread_processes
            .insert(tid, crate::profile::ThreadProcess { pid, name });
    }

    /// Whether the filters keep the samples of process `pid`.
    fn wanted(&mut self, pid: u32) -> bool {
        let o = self.opts;
        if !o.pid_filter.is_empty() && !o.pid_filter.contains(&pid) {
            return false;
        }
        if o.comm_filter.is_empty() {
            return true;
        }
        let space = self.spaces.entry(pid).or_default();
        if space.comm.is_none() {
            space.comm = Some(
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|s| s.trim_end().to_string())
                    .unwrap_or_default(),
            );
        }
        let comm = space.comm.as_deref().unwrap_or("");
        o.comm_filter.iter().any(|c| c == comm)
    }

    /// Matches the context-switch records older than `horizon` (all of
    /// them with `u64::MAX`, at the end), in time order: a thread's stack
    /// sampled as it left the CPU, its switch out (ignored when it was
    /// preempted: that is waiting for a CPU, not blocking), and its switch
    /// back in, whose distance is its off-CPU time, added to that stack
    /// (given first to [`SampleHook::off_cpu_sample`]). At the end, a
    /// thread still blocked counts up to the newest time.
    #[inline(never)]
    fn match_switches(&mut self, horizon: u64) {
        let mut events = std::mem::take(&mut self.off_events);
        events.sort_by_key(OffEvent::time);
        let keep = events.partition_point(|e| e.time() <= horizon);
        self.off_events = events.split_off(keep);
        for e in events {
            match e {
                OffEvent::Sample { tid, stack, .. } => {
                    self.blocked.insert(tid, Blocked { stack, since: None });
                }
                OffEvent::Switch {
                    time,
                    tid,
                    out: true,
                    preempt,
                } => {
                    if preempt {
                        self.blocked.remove(&tid);
                    } else if let Some(b) = self.blocked.get_mut(&tid) {
                        b.since.get_or_insert(time);
                    }
                }
                OffEvent::Switch { time, tid, .. } => {
                    if let Some(b) = self.blocked.remove(&tid) {
                        if let Some(since) = b.since {
                            self.add_off_cpu(b.stack, tid, since, time);
                        }
                    }
                }
            }
        }
        if horizon == u64::MAX {
            let end = self.latest;
            for (tid, b) in std::mem::take(&mut self.blocked) {
                if let Some(since) = b.since {
                    self.add_off_cpu(b.stack, tid, since, end.max(since));
                }
            }
        }
    }

    /// Thread `tid`'s time off the CPU from `from` to `to` (ns), added to
    /// the stack it left with.
    fn add_off_cpu(&mut self, mut stack: OffStack, tid: u32, from: u64, to: u64) {
        let ns = to.saturating_sub(from);
        if ns == 0 {
            return;
        }
        if let Some(h) = &self.opts.sample_hook {
            h.off_cpu_sample(
                stack.pid,
                tid,
                from..to,
                stack.user,
                &stack.pcs,
                &mut stack.frames,
                &mut stack.exact,
            );
        }
        self.profile.add_exact(
            &stack.frames,
            true,
            &stack.exact,
            Some(tid),
            &[0, 0, ns as i64],
        );
    }

    /// Keeps the per-module state under [`RecordOptions::memory_budget`]:
    /// drops the least recently used modules' compiled tables (from every
    /// process's snapshot: the table is freed), then the module maps of
    /// the processes sampled least recently, until the estimate is under
    /// the budget; never those of the last sample. Whether it was over.
    #[inline(never)]
    fn enforce_budget(&mut self) -> bool {
        let Some(budget) = self.opts.memory_budget else {
            return false;
        };
        // Function lists (shared by file) go with the module maps.
        let space_bytes: usize = self.spaces.values().map(Space::bytes).sum::<usize>()
            + super::step::shared_functions::live_bytes();
        let mut total = super::step::shared_tables::live_bytes() + space_bytes;
        self.state_bytes = total;
        if total <= budget {
            return false;
        }
        // The tables and lists kept for programs that may start again go
        // first; then the least recently used.
        super::step::kept::release_kept();
        total = super::step::shared_tables::live_bytes()
            + self.spaces.values().map(Space::bytes).sum::<usize>()
            + super::step::shared_functions::live_bytes();
        if total > budget {
            // Each table's last use by any process.
            let mut used: HashMap<&str, u64> = HashMap::new();
            for u in self.spaces.values().filter_map(|s| s.unwinder.as_ref()) {
                for (k, t) in u.get().used_ticks() {
                    let e = used.entry(k).or_default();
                    *e = (*e).max(t);
                }
            }
            let mut by_age: Vec<(u64, String, usize)> = super::step::shared_tables::live()
                .into_iter()
                .map(|(k, n)| (used.get(k.as_str()).copied().unwrap_or(0), k, n))
                .collect();
            drop(used);
            by_age.sort();
            for (used, key, bytes) in by_age {
                if total <= budget {
                    break;
                }
                if used == self.tick {
                    continue;
                }
                for space in self.spaces.values_mut() {
                    if let Some(u) = space.unwinder.as_mut() {
                        u.get_mut().forget_module(&key);
                    }
                }
                total = total.saturating_sub(bytes);
                self.note_evicted(Evicted {
                    what: super::step::shared_tables::path_of(&key).to_string(),
                    bytes,
                });
            }
        }
        if total > budget {
            let mut pids: Vec<(u64, u32)> = self
                .spaces
                .iter()
                .filter(|(_, s)| s.unwinder.is_some() && s.last_used != self.tick)
                .map(|(&p, s)| (s.last_used, p))
                .collect();
            pids.sort();
            for (_, pid) in pids {
                if total <= budget {
                    break;
                }
                let space = self.spaces.get_mut(&pid).expect("listed");
                let bytes = space.drop_unwinder();
                let comm = space.comm.clone().unwrap_or_else(|| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .map(|c| c.trim_end().to_string())
                        .unwrap_or_default()
                });
                total = total.saturating_sub(bytes);
                self.note_evicted(Evicted {
                    what: format!("[maps of {pid} ({comm})]"),
                    bytes,
                });
            }
        }
        // What is left, measured again (freed tables and lists are gone).
        self.state_bytes = super::step::shared_tables::live_bytes()
            + self.spaces.values().map(Space::bytes).sum::<usize>()
            + super::step::shared_functions::live_bytes();
        true
    }

    fn note_evicted(&mut self, e: Evicted) {
        self.period_evicted.push(e.clone());
        self.evicted.push(e);
    }

    /// Ends the profile of the period that started at its `start_time_ns`
    /// (its modules and kernel symbols filled in, its duration up to now)
    /// and starts the next one, empty, with the thread names known.
    #[inline(never)]
    fn cut(&mut self) -> Profile {
        let now = now_ns();
        let mut next = new_profile(self.opts);
        next.start_time_ns = now;
        next.threads = self.profile.threads.clone();
        next.thread_processes = self.profile.thread_processes.clone();
        self.profile.modules = self.modules();
        self.profile.kernel_symbols = self.kernel_symbols();
        self.profile.name_jit_code();
        self.profile.duration_ns = now.saturating_sub(self.profile.start_time_ns);
        self.profile
            .comments
            .extend(eviction_comments(&std::mem::take(&mut self.period_evicted)));
        if let Some(h) = &self.opts.sample_hook {
            h.finish(&mut self.profile);
        }
        self.exited_modules.clear();
        std::mem::replace(&mut self.profile, next)
    }

    /// The kernel functions the samples' kernel frames fall in, from
    /// `/proc/kallsyms` read once now: stored in the recording, so that it
    /// is named right on any machine (and a report needs no kallsyms).
    /// Empty (frames left unnamed) when kallsyms hides its addresses.
    #[inline(never)]
    fn kernel_symbols(&self) -> Vec<crate::profile::KernelSymbol> {
        let Some((lo, hi)) = self.kernel_range else {
            return Vec::new();
        };
        // The addresses a report looks up: the leaf's pc, the byte before
        // each return address.
        let probes = self.profile.stacks.iter().flat_map(|s| {
            s.frames.iter().enumerate().filter_map(move |(i, &a)| {
                let a = a as u64;
                let exact = s.is_exact(i);
                (lo <= a && a <= hi).then(|| a - u64::from(!exact))
            })
        });
        crate::profile::kernel_symbols_for(probes).unwrap_or_default()
    }

    /// Module records for the profile: the recorded program's first (a
    /// profile's first module is its program: pprof's main mapping), then
    /// every other module of every process seen (the recorded process's,
    /// then the others' by pid), and the kernel (`[kernel.kallsyms]`,
    /// named by [`Recording::kernel_symbols`]).
    #[inline(never)]
    fn modules(&self) -> Vec<ModuleRecord> {
        let mut pids: Vec<u32> = self.spaces.keys().copied().collect();
        pids.sort_by_key(|&p| (p != self.root_pid, p));
        let listed = self.exited_modules.iter().cloned().chain(
            pids.into_iter()
                .flat_map(|pid| self.spaces[&pid].module_records()),
        );
        // Each file once, as its range is now (it may have grown since a
        // record of it was kept).
        let mut out: Vec<ModuleRecord> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for rec in listed {
            let rec = self.canon.current(&rec);
            if seen.insert(rec.clone()) {
                out.push(rec);
            }
        }
        if let Some(exe) = &self.main_exe {
            let exe = std::path::Path::new(exe);
            let is_main = |r: &ModuleRecord| {
                r.path == exe
                    || std::fs::canonicalize(&r.path).ok().as_deref()
                        == std::fs::canonicalize(exe).ok().as_deref()
            };
            if let Some(i) = out.iter().position(is_main) {
                let main = out.remove(i);
                out.insert(0, main);
            }
        }
        if let Some((lo, hi)) = self.kernel_range {
            out.push(ModuleRecord {
                path: crate::profile::KERNEL_MODULE.into(),
                build_id: None,
                start: lo,
                end: hi + 1,
                bias: 0,
            });
        }
        out
    }
}

/// Records `opts.target` until it exits, `opts.duration` passes or
/// `control` stops it; calls `progress` about four times a second. Every
/// sample the kernel took is kept, up to the target's end however it ends
/// (`_exit`, a signal, SIGKILL): the rings are drained after it, and the
/// modules come from the kernel's mmap records, not only from its
/// `/proc/PID/maps`.
///
/// A command that cannot be started (not found, not executable) is
/// [`RecordError::Spawn`] with the `execvp` error, before anything is
/// recorded.
pub fn record(
    opts: &RecordOptions,
    control: &Control,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Recorded, RecordError> {
    record_rotating(opts, control, progress, &mut |_| {})
}

/// [`open_target`]'s events (each with its kind), the command's pid while
/// it runs, and the root process.
type Opened = (Vec<(sys::Event, sys::EventKind)>, Option<u32>, u32);

/// Opens the recording's events on its target (a command is started
/// held, then let exec): the events, the command's pid while it runs,
/// and the root process (0 for the whole host). Out of line: the
/// recording loop keeps a small frame (a whole-host recording unwinds
/// its own samples from the 8 KiB of stack the kernel copies).
#[inline(never)]
fn open_target(
    opts: &RecordOptions,
    rec: &mut Recording<'_>,
    spec: &mut sys::EventSpec,
    kinds: &[sys::EventKind],
    pages: usize,
) -> Result<Opened, RecordError> {
    let mut events = Vec::new();
    let mut child: Option<u32> = None;
    let root_pid;
    match &opts.target {
        Target::Pid(pid) => {
            root_pid = *pid;
            rec.root_pid = *pid;
            rec.main_exe = std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .map(|p| p.to_string_lossy().into_owned());
            let tids = threads_of(*pid);
            if tids.is_empty() {
                return Err(RecordError::NoSuchProcess(*pid));
            }
            let mut space = Space::default();
            space.read_proc_maps(*pid);
            rec.spaces.insert(*pid, space);
            for tid in &tids {
                if let Ok(name) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")) {
                    rec.profile
                        .threads
                        .insert(*tid as u32, name.trim_end().to_string());
                }
            }
            open_on_threads(&tids, spec, kinds, pages, &mut events)?;
        }
        Target::All => {
            root_pid = 0;
            events = open_whole_host(opts, spec, kinds, pages)?;
        }
        Target::Command(argv) => {
            let Some(prog) = argv.first() else {
                return Err(RecordError::Spawn(
                    String::new(),
                    std::io::ErrorKind::InvalidInput.into(),
                ));
            };
            let spawn_error = |e| RecordError::Spawn(prog.to_string_lossy().into_owned(), e);
            let (c, go, exec_result) = spawn_held(argv).map_err(spawn_error)?;
            root_pid = c;
            child = Some(c);
            rec.root_pid = c;
            // Its program is the one it execs (the event starts there).
            rec.exe_pending = true;
            for cpu in 0..sys::cpus() {
                for &kind in kinds {
                    match open_event(root_pid as i32, cpu, spec, kind, pages, None) {
                        Ok(e) => events.push((e, kind)),
                        Err(e) => {
                            if let Some(c) = child.take() {
                                end_child(c);
                            }
                            return Err(RecordError::PerfRefused(e));
                        }
                    }
                }
            }
            // Let the child exec: the event is enabled at the exec.
            drop(go);
            if let Some(errno) = exec_error(exec_result) {
                end_child(c);
                return Err(spawn_error(std::io::Error::from_raw_os_error(errno)));
            }
        }
    }
    Ok((events, child, root_pid))
}

/// [`record`], handing a profile to `period` every `opts.rotate` (when
/// set): each holds the samples of its period only, with its start time,
/// duration, and the modules of every process seen (paths, build-ids and
/// file offsets, so that a server can symbolize it later). The last,
/// shorter period is handed over at the end too, and [`Recorded::profile`]
/// is then empty. Memory stays bounded over a long recording: a period's
/// stacks are dropped once handed over. Without `opts.rotate`, `period` is
/// never called and this is [`record`].
pub fn record_rotating(
    opts: &RecordOptions,
    control: &Control,
    progress: &mut dyn FnMut(&Progress),
    period: &mut dyn FnMut(Profile),
) -> Result<Recorded, RecordError> {
    let (Some(machine), Some(regs_mask)) = (
        RECORDED_MACHINE,
        RECORDED_MACHINE.and_then(Machine::perf_regs_mask),
    ) else {
        return Err(RecordError::Unsupported("recording on this architecture"));
    };
    if opts.hz == 0 || opts.hz > 100_000 {
        return Err(RecordError::Unsupported("a rate outside 1..=100000 Hz"));
    }
    // Programs that start and exit again and again (shells' commands,
    // build steps) keep their tables and function lists between runs: up
    // to 16 MiB of each (a sixteenth of a smaller budget), given back when
    // the recording ends.
    struct Keep;
    impl Drop for Keep {
        fn drop(&mut self) {
            super::step::kept::set_keep_bytes(0);
        }
    }
    super::step::kept::set_keep_bytes(
        opts.memory_budget
            .map_or(16 << 20, |b| (b / 16).min(16 << 20)),
    );
    let _keep = Keep;
    let mut spec = sys::EventSpec {
        kernel_callchain: opts.kernel,
        hz: opts.hz,
        regs_mask,
        stack_bytes: opts.stack_bytes.clamp(64, 65528) & !7,
        enable_on_exec: matches!(opts.target, Target::Command(_)),
        system_wide: matches!(opts.target, Target::All),
    };
    // Data pages per event: enough for ~100 ms of samples at the rate.
    let stack_max = (opts.stack_bytes_max.clamp(64, 65528) & !7).max(spec.stack_bytes);
    let pages_for = |stack_bytes: u32| {
        let per_sample = stack_bytes as usize + 256;
        let want = (opts.hz as usize / 8).max(16) * per_sample / sys::page_size();
        want.next_power_of_two().clamp(16, 512)
    };
    let pages = pages_for(spec.stack_bytes);
    let mut stack_growth = Vec::new();
    let mut sizer = CopySizer::new(
        spec.stack_bytes,
        opts.stack_bytes_min.clamp(64, 65528) & !7,
        stack_max,
    );
    // On the heap: the recorder's own samples (`record -a` samples it too)
    // are unwound from the stack the kernel copies, 8 KiB at first, and
    // its frames from `main` to the unwinder's must fit in it.
    let mut rec = Recording::boxed(opts, machine, regs_mask);
    let started = Instant::now();
    let kinds: &[sys::EventKind] = if opts.off_cpu {
        &[sys::EventKind::CpuClock, sys::EventKind::Switches]
    } else {
        &[sys::EventKind::CpuClock]
    };
    let (mut events, mut child, root_pid) = open_target(opts, &mut rec, &mut spec, kinds, pages)?;

    if let (Some(h), true) = (&opts.sample_hook, root_pid != 0) {
        h.started(root_pid);
    }
    rec.kernel = spec.kernel_callchain;
    let mut fds: Vec<i32> = events.iter().map(|(e, _)| e.fd()).collect();
    let mut last_window = Instant::now();
    // Where a record that wraps around its ring's end is made whole.
    let mut buf = Vec::with_capacity(1 << 16);
    let mut last_progress = Instant::now();
    let mut last_cut = Instant::now();
    let mut exited = false;
    // How the command ended, once reaped; whether the recording ended it.
    let mut status = None;
    let mut ended_by_us = false;
    let mut last_budget = Instant::now();
    let mut over_budget = false;
    loop {
        sys::poll(&fds, 50);
        for (e, kind) in &events {
            e.drain(&mut buf, |r| rec.handle(r, *kind));
        }
        rec.end_pass();
        if opts.off_cpu {
            // Every ring was drained just now: what is 200 ms older than
            // the newest record is complete.
            rec.match_switches(rec.latest.saturating_sub(200_000_000));
        }
        if over_budget || last_budget.elapsed() >= Duration::from_millis(250) {
            // State grows as processes start and modules are first met:
            // measured four times a second (summing it costs a walk over
            // every process and table), at every pass while over.
            last_budget = Instant::now();
            over_budget = rec.enforce_budget();
        }
        // A window: at least 50 user samples and 0.1 s (a second at most).
        let window = last_window.elapsed();
        if !exited
            && ((rec.window_user >= 50 && window >= Duration::from_millis(100))
                || window >= Duration::from_secs(1))
        {
            last_window = Instant::now();
            let (user, cut, used) = (rec.window_user, rec.window_cut, rec.window_used);
            rec.window_user = 0;
            rec.window_cut = 0;
            rec.window_used = 0;
            if let Some(to) = sizer.next(spec.stack_bytes, user, cut, used) {
                let from = spec.stack_bytes;
                let mut grown = sys::EventSpec {
                    stack_bytes: to,
                    enable_on_exec: false,
                    ..spec
                };
                let pages = pages_for(grown.stack_bytes);
                match reopen(opts, &rec, &mut grown, kinds, pages) {
                    Ok(new) => {
                        // The old rings' last records, then the new events.
                        for (e, kind) in &events {
                            e.drain(&mut buf, |r| rec.handle(r, *kind));
                        }
                        rec.end_pass();
                        events = new;
                        fds = events.iter().map(|(e, _)| e.fd()).collect();
                        spec = grown;
                        rec.kernel = spec.kernel_callchain;
                        // The old copy's samples just drained do not count
                        // against the new one.
                        rec.window_user = 0;
                        rec.window_cut = 0;
                        rec.window_used = 0;
                        stack_growth.push(StackGrowth {
                            at: started.elapsed(),
                            from,
                            to: spec.stack_bytes,
                            cut_percent: cut as f64 * 100.0 / user.max(1) as f64,
                            used: if to < from { sizer.used } else { 0 },
                        });
                        sizer.changed(from, to);
                    }
                    // Not to be opened again: the copy stays.
                    Err(_) => sizer.fixed(),
                }
            }
        }
        if opts.rotate.is_some_and(|d| last_cut.elapsed() >= d) && !exited {
            last_cut = Instant::now();
            period(rec.cut());
        }
        if last_progress.elapsed() >= Duration::from_millis(250) {
            last_progress = Instant::now();
            progress(&Progress {
                samples: rec.samples,
                lost: rec.profile.lost,
                threads: rec.threads.len(),
                elapsed: started.elapsed(),
                state_bytes: rec.state_bytes,
            });
        }
        if exited {
            break;
        }
        let sig = control.signal.swap(0, Ordering::Relaxed);
        if sig != 0 {
            match child {
                // SAFETY: our child, not yet reaped (`child` is cleared
                // when it is), so the pid is not reused.
                Some(c) => unsafe {
                    libc::kill(c as i32, sig);
                },
                None => ended_by_us = true,
            }
        }
        let done = if ended_by_us
            || control.stopped()
            || opts.duration.is_some_and(|d| started.elapsed() >= d)
        {
            ended_by_us = true;
            true
        } else {
            match child {
                Some(c) => match child_status(c) {
                    Some(st) => {
                        status = st;
                        child = None;
                        true
                    }
                    None => false,
                },
                // The whole host: until the duration or a stop.
                None if root_pid == 0 => false,
                // SAFETY: kill with signal 0 only checks that the process exists.
                None => (unsafe { libc::kill(root_pid as i32, 0) }) != 0,
            }
        };
        if done {
            // One more pass drains what the rings still hold.
            exited = true;
        }
    }
    if let Some(c) = child {
        // Stopped early (duration, stop): the command goes too.
        end_child(c);
    }
    progress(&Progress {
        samples: rec.samples,
        lost: rec.profile.lost,
        threads: rec.threads.len(),
        elapsed: started.elapsed(),
        state_bytes: rec.state_bytes,
    });
    let status = status.filter(|_| !ended_by_us);
    Ok(finish_recording(
        rec,
        opts,
        period,
        started,
        status,
        stack_growth,
        spec.stack_bytes,
    ))
}

/// The end of [`record_rotating`]: the last period, or the whole
/// recording's profile completed. Out of line (see [`open_target`]).
#[inline(never)]
fn finish_recording(
    mut rec: Box<Recording<'_>>,
    opts: &RecordOptions,
    period: &mut dyn FnMut(Profile),
    started: Instant,
    status: Option<std::process::ExitStatus>,
    stack_growth: Vec<StackGrowth>,
    stack_bytes: u32,
) -> Recorded {
    if opts.off_cpu {
        rec.match_switches(u64::MAX);
    }
    if opts.rotate.is_some() {
        period(rec.cut());
    } else {
        rec.profile.modules = rec.modules();
        rec.profile.kernel_symbols = rec.kernel_symbols();
        rec.profile.name_jit_code();
        rec.profile.duration_ns = started.elapsed().as_nanos() as u64;
        let comments = eviction_comments(&std::mem::take(&mut rec.period_evicted));
        rec.profile.comments.extend(comments);
        if let Some(h) = &opts.sample_hook {
            h.finish(&mut rec.profile);
        }
    }
    let rec = *rec;
    Recorded {
        profile: rec.profile,
        status,
        stack_growth,
        stack_bytes,
        evicted: rec.evicted,
    }
}

/// The sampling events opened again with `spec` (a larger stack copy) on
/// what is being recorded now: every CPU for the whole host; else every
/// thread of the recorded process and of the processes it started that
/// still run (each event inherited by what its thread creates from now
/// on). A thread created while this runs may be missed.
#[inline(never)]
fn reopen(
    opts: &RecordOptions,
    rec: &Recording<'_>,
    spec: &mut sys::EventSpec,
    kinds: &[sys::EventKind],
    pages: usize,
) -> Result<Vec<(sys::Event, sys::EventKind)>, RecordError> {
    if matches!(opts.target, Target::All) {
        return open_whole_host(opts, spec, kinds, pages);
    }
    let mut pids: Vec<u32> = rec.spaces.keys().copied().collect();
    pids.push(rec.root_pid);
    pids.sort_unstable();
    pids.dedup();
    let tids: Vec<i32> = pids
        .into_iter()
        .filter(|&pid| descends_from(pid, rec.root_pid))
        .flat_map(threads_of)
        .collect();
    let mut events = Vec::new();
    open_on_threads(&tids, spec, kinds, pages, &mut events)?;
    Ok(events)
}

/// The threads of process `pid` now (none if it is gone).
fn threads_of(pid: u32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .collect()
}

/// Opens `kinds` on each of `tids` on every CPU (each event inherited by
/// the threads it creates) into `events`, passing over the threads gone
/// meanwhile and the CPUs offline. The cpu-clock events share one ring
/// per CPU, as perf does: the first thread's event maps it, the others
/// write into it (a ring per thread and CPU cost 256 KiB or more each,
/// 100 MB for a process of 200 threads on 2 CPUs); a CPU yields at most
/// `hz` of their samples a second. The switch events keep a ring each:
/// one shared by 8 threads blocking every millisecond lost a third of
/// its samples.
fn open_on_threads(
    tids: &[i32],
    spec: &mut sys::EventSpec,
    kinds: &[sys::EventKind],
    pages: usize,
    events: &mut Vec<(sys::Event, sys::EventKind)>,
) -> Result<(), RecordError> {
    let mut rings: HashMap<(i32, sys::EventKind), usize> = HashMap::new();
    for &tid in tids {
        for cpu in 0..sys::cpus() {
            for &kind in kinds {
                // Switch samples come at every block, thousands a second
                // per thread: those keep a ring per thread.
                let into = (kind == sys::EventKind::CpuClock)
                    .then(|| rings.get(&(cpu, kind)).map(|&i| &events[i].0))
                    .flatten();
                let owner = into.is_none();
                match open_event(tid, cpu, spec, kind, pages, into) {
                    Ok(e) => {
                        if owner {
                            rings.insert((cpu, kind), events.len());
                        }
                        events.push((e, kind));
                    }
                    Err(e)
                        if matches!(e.raw_os_error(), Some(libc::ESRCH) | Some(libc::ENODEV)) =>
                    {
                        break
                    }
                    Err(e) => return Err(RecordError::PerfRefused(e)),
                }
            }
        }
    }
    Ok(())
}

/// The events of a whole-host recording: every kind on every CPU; but
/// with [`RecordOptions::pid_filter`], the context switches only of the
/// threads of those processes (each event inherited by the threads they
/// create), so that the kernel copies no stack at the switches of the
/// rest of the host. (`--comm` names processes yet to start: its
/// switches stay host-wide, filtered after the copy.)
#[inline(never)]
fn open_whole_host(
    opts: &RecordOptions,
    spec: &mut sys::EventSpec,
    kinds: &[sys::EventKind],
    pages: usize,
) -> Result<Vec<(sys::Event, sys::EventKind)>, RecordError> {
    let mut events = Vec::new();
    let narrowed = !opts.pid_filter.is_empty();
    for cpu in 0..sys::cpus() {
        for &kind in kinds {
            if narrowed && kind == sys::EventKind::Switches {
                continue;
            }
            match open_event(-1, cpu, spec, kind, pages, None) {
                Ok(e) => events.push((e, kind)),
                // A CPU that is offline.
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {}
                Err(e) => return Err(RecordError::PerfRefused(e)),
            }
        }
    }
    if narrowed && kinds.contains(&sys::EventKind::Switches) {
        // Per thread, inherited; the switch event takes no task records.
        let mut per_thread = sys::EventSpec {
            system_wide: false,
            ..*spec
        };
        // A process gone (or never there) has nothing to record.
        let tids: Vec<i32> = opts
            .pid_filter
            .iter()
            .flat_map(|&p| threads_of(p))
            .collect();
        open_on_threads(
            &tids,
            &mut per_thread,
            &[sys::EventKind::Switches],
            pages,
            &mut events,
        )?;
    }
    Ok(events)
}

/// Whether process `pid` is `root` or one of its descendants (a pid seen
/// in the recording may have been reused since by another process).
fn descends_from(mut pid: u32, root: u32) -> bool {
    for _ in 0..64 {
        if pid == root {
            return true;
        }
        if pid <= 1 {
            return false;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parens.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
        else {
            return false;
        };
        pid = ppid;
    }
    false
}

/// The comments of a profile that name what was dropped to stay under
/// the memory budget: one per module, with the bytes and how many times.
pub fn eviction_comments(evicted: &[Evicted]) -> Vec<String> {
    let mut by: Vec<(&str, usize, usize)> = Vec::new();
    for e in evicted {
        match by.iter_mut().find(|b| b.0 == e.what) {
            Some(b) => {
                b.1 += e.bytes;
                b.2 += 1;
            }
            None => by.push((&e.what, e.bytes, 1)),
        }
    }
    by.into_iter()
        .map(|(what, bytes, n)| {
            format!(
                "callstack: evicted to stay under the memory budget: {what} ({:.2} MB, {n}x)",
                bytes as f64 / 1e6
            )
        })
        .collect()
}

/// An empty profile of `opts`' sample types: `samples`, `cpu`, and with
/// [`RecordOptions::off_cpu`], `off_cpu` (nanoseconds).
#[inline(never)]
fn new_profile(opts: &RecordOptions) -> Profile {
    let mut p = Profile::cpu(opts.hz);
    if opts.off_cpu {
        p.sample_types
            .push(crate::profile::ValueType::new("off_cpu", "nanoseconds"));
    }
    p
}

/// Now, in nanoseconds since the Unix epoch.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Starts `argv` held before its exec until the returned pipe end is
/// dropped (so that the event can be opened on it first). Forks by hand:
/// `std::process::Command::spawn` waits for the exec. The third value is
/// the read end of a close-on-exec pipe: it reaches its end at a
/// successful exec, and gives the `execvp` error (4 bytes) otherwise (see
/// [`exec_error`]).
#[inline(never)]
fn spawn_held(argv: &[OsString]) -> std::io::Result<(u32, std::fs::File, std::fs::File)> {
    use std::ffi::CString;
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let mut fds = [0i32; 2];
    let mut err_fds = [0i32; 2];
    // SAFETY: pipe2 writes two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 writes two fds.
    if unsafe { libc::pipe2(err_fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: our fds.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        return Err(e);
    }
    // SAFETY: fork; the child only calls async-signal-safe functions
    // (close, read, write, execvp, _exit) on memory prepared before the
    // fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: our fds.
        unsafe {
            for fd in fds.into_iter().chain(err_fds) {
                libc::close(fd);
            }
        }
        return Err(e);
    }
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            libc::close(fds[1]);
            libc::close(err_fds[0]);
            let mut b = [0u8; 1];
            // Blocks until the parent closes its end.
            while libc::read(fds[0], b.as_mut_ptr().cast(), 1) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
            libc::execvp(ptrs[0], ptrs.as_ptr());
            let errno = (*libc::__errno_location()).to_ne_bytes();
            libc::write(err_fds[1], errno.as_ptr().cast(), errno.len());
            libc::_exit(127);
        }
    }
    // SAFETY: our fds; the read end of the first and the write end of the
    // second are the child's.
    unsafe {
        libc::close(fds[0]);
        libc::close(err_fds[1]);
    }
    // SAFETY: fresh fds we own.
    let (wr, err) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[1]),
            std::fs::File::from_raw_fd(err_fds[0]),
        )
    };
    Ok((pid as u32, wr, err))
}

/// The `execvp` error of a child started by [`spawn_held`], from its error
/// pipe (read once the child is let go): `None` when it exec'd.
fn exec_error(mut pipe: std::fs::File) -> Option<i32> {
    use std::io::Read;
    let mut b = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match pipe.read(&mut b[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    (got == 4).then(|| i32::from_ne_bytes(b))
}

/// Opens an event (with a ring of its own, or writing into `into`'s);
/// when kernel frames are refused (EACCES/EPERM under
/// `perf_event_paranoid`), goes on without them.
#[inline(never)]
fn open_event(
    pid: i32,
    cpu: i32,
    spec: &mut sys::EventSpec,
    kind: sys::EventKind,
    pages: usize,
    into: Option<&sys::Event>,
) -> std::io::Result<sys::Event> {
    match sys::Event::open(pid, cpu, spec, kind, pages, into) {
        Err(e)
            if spec.kernel_callchain
                && kind == sys::EventKind::CpuClock
                && into.is_none()
                && matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) =>
        {
            spec.kernel_callchain = false;
            sys::Event::open(pid, cpu, spec, kind, pages, into)
        }
        r => r,
    }
}

/// How child `pid` ended, if it has (reaped then); `None` while it runs.
/// A child that cannot be waited for (reaped elsewhere) counts as ended,
/// with no status to give.
fn child_status(pid: u32) -> Option<Option<ExitStatus>> {
    let mut st = 0;
    loop {
        // SAFETY: waitpid on our child, without blocking.
        let r = unsafe { libc::waitpid(pid as i32, &mut st, libc::WNOHANG) };
        if r == pid as i32 {
            return Some(Some(ExitStatus::from_raw(st)));
        }
        if r == 0 {
            return None;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Some(None);
        }
    }
}

/// Kills and reaps child `pid` if it still runs.
fn end_child(pid: u32) {
    if child_status(pid).is_none() {
        // SAFETY: our child, not yet reaped.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
            let mut st = 0;
            while libc::waitpid(pid as i32, &mut st, 0) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// When a process's mappings change, the snapshot they were unwound
    /// with is freed (its vDSO image with it: nothing else holds it), and
    /// its modules are still reported: samples may hold their addresses.
    #[test]
    fn replaced_snapshot_is_freed_and_its_modules_kept() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let vdso = maps
            .lines()
            .filter_map(crate::remote::process::parse_maps_line)
            .map(|(m, _)| m)
            .find(|m| m.path == "[vdso]");
        // The test reads this process as a profiled one: it needs the
        // host's architecture among the remote unwinder's and a vDSO (the
        // one module whose image only a snapshot holds). qemu-user 7.2
        // maps no vDSO for its guests: there, and only there, there is
        // nothing to check.
        let (Some(vdso), Some(machine)) = (vdso, crate::arch::NATIVE_MACHINE) else {
            assert!(
                std::env::var_os("CALLSTACK_TEST_QEMU").is_some(),
                "no [vdso] mapping or no remote unwinder for this architecture"
            );
            eprintln!("no vDSO under qemu-user: nothing to check");
            return;
        };
        let exe = std::env::current_exe().unwrap();
        let lookup = Lookup::default();
        let pid = std::process::id();
        let mut space = Space::default();
        space.add(vdso.clone());
        let image = space
            .unwinder(&lookup, pid, machine)
            .snapshot()
            .modules
            .iter()
            .find(|m| m.name == "[vdso]")
            .and_then(|m| m.image.as_ref())
            .map(std::sync::Arc::downgrade)
            .expect("the vDSO module with its image");
        assert!(image.upgrade().is_some());

        // A file mapped over the vDSO's range: a new snapshot.
        space.add(Mapping {
            start: vdso.start,
            end: vdso.start + 0x1000,
            file_offset: 0,
            path: exe.to_string_lossy().into_owned(),
            executable: Some(true),
        });
        let now: Vec<String> = space
            .unwinder(&lookup, pid, machine)
            .snapshot()
            .modules
            .iter()
            .map(|m| m.name.clone())
            .collect();
        assert_eq!(now, [exe.to_string_lossy()]);
        assert!(
            image.upgrade().is_none(),
            "the replaced snapshot was not freed"
        );
        let recs = space.module_records();
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert_eq!(recs[0].path.as_os_str(), "[vdso]");
        assert_eq!(recs[1].path, exe);

        // Rebuilt again with the same modules: recorded once.
        space.dirty = true;
        space.unwinder(&lookup, pid, machine);
        assert_eq!(space.module_records(), recs);
    }
}

#[cfg(test)]
mod sizer_tests {
    use super::CopySizer;

    /// `n` windows of 200 samples, `cut` of each cut, whole chains
    /// reading `used` bytes: the sizes the sizer asked for.
    fn windows(s: &mut CopySizer, size: &mut u32, n: u32, cut: u64, used: u32) -> Vec<u32> {
        let mut asked = Vec::new();
        for _ in 0..n {
            if let Some(to) = s.next(*size, 200, cut, used) {
                s.changed(*size, to);
                *size = to;
                asked.push(to);
            }
        }
        asked
    }

    /// Grown when more than 3% are cut; shrunk to twice what whole chains
    /// read in the last ten quiet windows; grown again when that was too
    /// small, and never back below a size found too small.
    #[test]
    fn the_copy_grows_shrinks_and_settles() {
        let mut s = CopySizer::new(8192, 1024, 61440);
        let mut size = 8192;
        // The program's start read 5000 bytes: no shrink while that
        // window is one of the last ten.
        assert_eq!(windows(&mut s, &mut size, 1, 0, 5000), []);
        // 1008 bytes read: 2048 after ten such windows, not before.
        assert_eq!(windows(&mut s, &mut size, 9, 0, 1008), []);
        assert_eq!(windows(&mut s, &mut size, 1, 0, 1008), [2048]);
        // One cut sample in 200 (0.5%): no growth, and no shrink either.
        assert_eq!(windows(&mut s, &mut size, 20, 1, 100), []);
        // Deeper chains now: cut, grown to 4096; 2048 was too small, so
        // 4096 stays however little later chains read.
        assert_eq!(windows(&mut s, &mut size, 1, 50, 0), [4096]);
        assert_eq!(windows(&mut s, &mut size, 30, 0, 100), []);
        assert_eq!(size, 4096);
        // Up to the bound.
        assert_eq!(
            windows(&mut s, &mut size, 10, 100, 0),
            [8192, 16384, 32768, 61440]
        );
    }

    /// A fixed size (the bound at the start size) never changes; nor does
    /// one whose reopening failed. A small window (under 50 samples) says
    /// nothing.
    #[test]
    fn fixed_copies_and_small_windows() {
        let mut s = CopySizer::new(8192, 8192, 8192);
        let mut size = 8192;
        assert_eq!(windows(&mut s, &mut size, 30, 0, 100), []);
        assert_eq!(windows(&mut s, &mut size, 3, 100, 0), []);
        let mut s = CopySizer::new(8192, 1024, 61440);
        s.fixed();
        assert_eq!(windows(&mut s, &mut size, 30, 0, 100), []);
        assert_eq!(windows(&mut s, &mut size, 3, 100, 0), []);
        let mut s = CopySizer::new(16384, 1024, 61440);
        for _ in 0..30 {
            assert_eq!(s.next(8192, 49, 0, 100), None);
        }
        // 100 bytes read: 1 KiB, the least.
        assert_eq!(windows(&mut s, &mut size, 10, 0, 100), [1024]);
        // The default least size is the start: no shrink.
        let mut s = CopySizer::new(8192, 8192, 61440);
        let mut size = 8192;
        assert_eq!(windows(&mut s, &mut size, 30, 0, 100), []);
        // A least size of 4096: no lower.
        let mut s = CopySizer::new(8192, 4096, 61440);
        assert_eq!(windows(&mut s, &mut size, 30, 0, 100), [4096]);
    }
}
