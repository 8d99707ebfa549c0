//! CPython frames in a `callstack record` profile.
//!
//! A perf sample is read from its ring milliseconds after it was taken,
//! and from 3.11 CPython keeps its frames in heap memory, not on the C
//! stack the sample copied: the Python stack must be read from the running
//! process near the sample's time. [`PythonRecorder`] does it as py-spy's
//! non-blocking mode does: a thread of the recorder reads every thread's
//! Python stack of each python process recorded, at the recording's rate,
//! without stopping it (`process_vm_readv`; [`super::Sampler`] keeps what
//! it read of code objects, and reads again first, in one call, where its
//! last read looked: a warm read is one system call), and stamps each read
//! with CLOCK_MONOTONIC, the clock of the perf
//! samples' times. Each sample whose native chain runs
//! `_PyEval_EvalFrameDefault` then takes its thread's Python stack read
//! nearest its time, and its Python frames replace the evaluation loop's
//! frames, as `pstack` merges them ([`super::eval_run`]).
//!
//! In the profile, a Python frame is an address of the pseudo-module
//! [`PYTHON_MODULE`] (from [`PYTHON_BASE`]), one per (function, file,
//! line), named by the profile itself ([`Profile::named_frames`], the `Y`
//! records of the trace file) and marked exact.

use super::{eval_run, Interpreter, Sampler};
use crate::profile::{FrameName, Profile};
use crate::remote::files;
use crate::remote::perf::SampleHook;
use crate::remote::process::RunningMemory;
use crate::remote::{Lookup, Mapping};
use crate::tracefile::ModuleRecord;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The path of the module record of Python frames.
pub const PYTHON_MODULE: &str = "[python]";
/// The first address of Python frames in a profile: `PYTHON_BASE + i` is
/// the `i`th (function, file, line) seen.
pub const PYTHON_BASE: u64 = 0x6000_0000_0000_0000;

/// Stacks read longer ago than this before the newest are dropped (the
/// rings are drained every 50 ms or so: their samples are younger).
const HISTORY_NS: u64 = 2_000_000_000;
/// At most this many stacks kept per thread.
const MAX_HISTORY: usize = 8192;
/// How often a process that maps a python file but was not found to run
/// Python yet (its libpython not mapped yet) is looked at again: the first
/// wait, doubled each time up to the last, this many times; after that,
/// as one that maps none, only when it maps one ([`SampleHook::mapped`])
/// or its program changes (an exec, or seen once a `LAST_RETRY`).
const FIRST_RETRY: Duration = Duration::from_millis(5);
const LAST_RETRY: Duration = Duration::from_secs(1);
const MAX_TRIES: u32 = 16;
/// In a whole-host recording, how often each python process's share of a
/// CPU (its samples per period) is measured again, to set how often it is
/// read: every `SAMPLES_PER_READ/share` periods, rounded to a power of two
/// (processes of like shares are then read at the same wake-up), at most
/// every `IDLE_EVERY`th. A process
/// is read every period until the first tally after it was found, so the
/// tallies come often: at 1 s, the first second of a 20-process recording
/// read each python process ten times as often as its samples came, a
/// tenth of the recorder's CPU time over 20 s. A process with a tenth of
/// a CPU gets about 25 samples in a tally at 999 Hz.
const TALLY_NS: u64 = 250_000_000;
const IDLE_EVERY: u32 = 32;
/// In a whole-host recording, a python process is read once per this many
/// of its samples (an off-CPU sample counts as this many: each block
/// takes the stack read during it), in its own running time: about 500
/// reads a second of its CPU time at 999 Hz, five times py-spy's default
/// rate. Its samples
/// between two reads take the nearer one (a stack read while the process
/// waited for a CPU holds until it runs again, see [`super::ran`]). One
/// read per sample cost the recorder a tenth more CPU time on
/// `benches/record_all.sh`'s workload.
const SAMPLES_PER_READ: u64 = 2;
/// The sampler sleeps at most this long (new processes wake it at once).
const MAX_SLEEP: Duration = Duration::from_millis(50);
/// A process whose last this many reads failed is read as an idle one.
const MAX_FAILS: u32 = 50;

/// The CPython frames of a recording: a [`SampleHook`] for
/// [`crate::remote::perf::RecordOptions::sample_hook`]. See the [module
/// documentation](self).
#[derive(Debug)]
pub struct PythonRecorder {
    shared: Arc<Shared>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    /// The sampling period.
    period: Duration,
    /// A sample takes a stack read at most this far from its time.
    tolerance_ns: u64,
    /// Read the processes not sampled for a while less often.
    throttle: bool,
    lookup: Lookup,
    stop: AtomicBool,
    state: Mutex<State>,
    /// Wakes the sampler: processes to look at, or the end.
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Processes given to the sampler, not yet taken by it.
    new_pids: Vec<u32>,
    /// Every process seen.
    seen: HashSet<u32>,
    /// The evaluation loop's ranges in each process found to run Python.
    eval: HashMap<u32, Vec<(u64, u64)>>,
    /// Per thread, its Python stacks read, oldest first.
    stacks: HashMap<u32, VecDeque<Snap>>,
    /// Per thread, when it last ran again after blocking (the end of its
    /// last off-CPU sample).
    ran_again: HashMap<u32, u64>,
    /// Per python process, its samples since the last tally: in a
    /// whole-host recording, a process that holds a CPU a tenth of the
    /// time is read every 16th period (see [`State::tally`]).
    samples: HashMap<u32, u64>,
    /// Per python process, read every this many periods (1 when absent).
    read_every: HashMap<u32, u32>,
    /// Every distinct (function, file, line) seen, by index.
    table: Vec<FrameName>,
    index: HashMap<(String, String, Option<u32>), u32>,
    /// What could not be read (no size of the evaluation loop), once each.
    warnings: Vec<String>,
    /// Per process not found to run a supported Python, why (a version
    /// not supported...).
    errors: HashMap<u32, String>,
    /// Reads of stacks done and failed (a thread changing its frames
    /// during the read), and those not done: the process had not run
    /// since the last ([`super::ran`]).
    reads: u64,
    failed: u64,
    skipped: u64,
}

/// One Python stack read: when (CLOCK_MONOTONIC ns: from `time` to
/// `until`, the same stack read again, or known unchanged because the
/// process did not run, see [`super::ran`]), and its frames innermost
/// first, as (index in the table, outermost frame of its evaluation call).
#[derive(Debug)]
struct Snap {
    time: u64,
    until: u64,
    frames: Vec<(u32, bool)>,
    /// How many evaluation calls run them ([`eval_run`]'s groups).
    evals: usize,
}

impl PythonRecorder {
    /// A recorder of the Python stacks of the processes recorded, read
    /// every `1/hz` second; its sampling thread starts now. `lookup` finds
    /// the python files of the targets. `whole_host`: the recording is of
    /// every process (`record -a`), where each python process is read
    /// once per two of its samples: every `2/share` periods (a power of
    /// two near it), where `share` is the part of a CPU it took in the
    /// last quarter second (its samples per period), and every 32nd period
    /// when idle. A read then comes as often, in the process's own running
    /// time, as at half rate on a process that holds a CPU, so that its
    /// samples take a stack near theirs while idle interpreters, and
    /// those that wait for a CPU among many, cost little. A process that
    /// starts running again is read at its old rate for up to a quarter
    /// second (its first samples may then keep the evaluation loop's
    /// frames).
    ///
    /// With [`crate::remote::perf::RecordOptions::off_cpu`], give 1000 or
    /// more whatever the sampling rate: an off-CPU sample takes the stack
    /// read while its thread was blocked, and a block shorter than the
    /// period may have none (its sample then takes the stack read
    /// nearest the moment it blocked, on either side: at 100 Hz, a third
    /// of the time of 3 to 7 ms blocks went to the wrong function).
    pub fn new(hz: u32, lookup: Lookup, whole_host: bool) -> PythonRecorder {
        let period = Duration::from_nanos(1_000_000_000 / u64::from(hz.max(1)));
        let shared = Arc::new(Shared {
            period,
            tolerance_ns: 2 * period.as_nanos() as u64 + 5_000_000,
            throttle: whole_host,
            lookup,
            stop: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name("python-sampler".into())
            .spawn(move || run(&s))
            .ok();
        PythonRecorder {
            shared,
            worker: Mutex::new(worker),
        }
    }

    /// Stops the sampling thread (also done when dropped).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake.notify_one();
        if let Some(w) = self.worker.lock().ok().and_then(|mut w| w.take()) {
            let _ = w.join();
        }
    }

    /// What kept Python frames from being read, once each (a version not
    /// supported, a python file not found).
    pub fn warnings(&self) -> Vec<String> {
        let st = self.lock();
        let mut w = st.warnings.clone();
        for e in st.errors.values() {
            if !w.contains(e) {
                w.push(e.clone());
            }
        }
        w
    }

    /// Stacks read, and those whose read failed (the thread changed its
    /// frames meanwhile).
    pub fn reads(&self) -> (u64, u64) {
        let s = self.lock();
        (s.reads, s.failed)
    }

    /// Reads not done because the process had not run since its last one
    /// (its stacks were known unchanged).
    pub fn skipped(&self) -> u64 {
        self.lock().skipped
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for PythonRecorder {
    fn drop(&mut self) {
        self.stop();
    }
}

impl State {
    fn register(&mut self, pid: u32) {
        // Never this process (a whole-host recording samples it too).
        if pid != me() && self.seen.insert(pid) {
            self.new_pids.push(pid);
        }
    }

    /// The stack of `tid` read nearest `time` among those within
    /// `tolerance` that have `evals` evaluation calls, as many as the
    /// sample's native chain has frames of the evaluation loop (a stack
    /// read while the thread was in another function may have another
    /// depth); else the nearest with more (the native chain may have been
    /// cut short: the outermost Python frames then go last, as `pstack`
    /// puts them). `None` when no stack read fits: a stack with fewer
    /// calls than the native chain is of another moment.
    fn nearest(&self, tid: u32, time: u64, tolerance: u64, evals: usize) -> Option<&Snap> {
        let q = self.stacks.get(&tid)?;
        let lo = q.partition_point(|s| s.until.saturating_add(tolerance) < time);
        let hi = q.partition_point(|s| s.time <= time.saturating_add(tolerance));
        let near = || q.range(lo..hi);
        // How far from `time` a stack was known.
        let off = |s: &&Snap| {
            s.time
                .saturating_sub(time)
                .max(time.saturating_sub(s.until))
        };
        near()
            .filter(|s| s.evals == evals)
            .min_by_key(off)
            .or_else(|| near().filter(|s| s.evals > evals).min_by_key(off))
    }

    /// The stack of `tid` read while it was off the CPU, from `off.start`
    /// to `off.end` (a read whose span meets that one: its stack was the
    /// same throughout), chosen by `evals` as in [`State::nearest`]; else,
    /// when no read fell in that time, the last one while it ran up to
    /// the block (since `ran`, when it last ran again after a block, and
    /// within `tolerance`); else none. A stack read before `ran` is of its
    /// last block or earlier, one read after the block may be of its next:
    /// in a thread that blocks in two functions in turn, either is of the
    /// other function.
    fn while_off(
        &self,
        tid: u32,
        off: &std::ops::Range<u64>,
        ran: Option<u64>,
        tolerance: u64,
        evals: usize,
    ) -> Option<&Snap> {
        let q = self.stacks.get(&tid)?;
        let lo = q.partition_point(|s| s.until < off.start);
        let hi = q.partition_point(|s| s.time <= off.end);
        let during = || q.range(lo..hi.max(lo));
        // The first read in that time.
        let first = |s: &&Snap| s.time.max(off.start);
        let since = ran.unwrap_or(0).max(off.start.saturating_sub(tolerance));
        let before = || q.range(..lo).rev().take_while(|s| s.until >= since);
        during()
            .filter(|s| s.evals == evals)
            .min_by_key(first)
            .or_else(|| during().filter(|s| s.evals > evals).min_by_key(first))
            .or_else(|| before().find(|s| s.evals == evals))
            .or_else(|| before().find(|s| s.evals > evals))
    }
}

/// When a sample's stack was the thread's: at one time, or all the time
/// it was off the CPU.
enum When {
    At(u64),
    Off(std::ops::Range<u64>),
}

impl SampleHook for PythonRecorder {
    fn started(&self, pid: u32) {
        self.lock().register(pid);
        self.shared.wake.notify_one();
    }

    fn exec(&self, pid: u32) {
        // Its interpreter, if any, is another one now: found again.
        let mut st = self.lock();
        if pid == me() {
            return;
        }
        st.seen.insert(pid);
        st.eval.remove(&pid);
        st.new_pids.push(pid);
        self.shared.wake.notify_one();
    }

    fn mapped(&self, pid: u32, path: &str) {
        // A python file mapped (libpython, loaded by its program or by an
        // embedding one): looked at again, unless already read.
        if super::is_python_file(path) {
            let mut st = self.lock();
            if pid != me() && !st.eval.contains_key(&pid) {
                st.seen.insert(pid);
                st.new_pids.push(pid);
                self.shared.wake.notify_one();
            }
        }
    }

    fn sample(
        &self,
        pid: u32,
        tid: u32,
        time: u64,
        user: usize,
        user_pcs: &[u64],
        frames: &mut Vec<usize>,
        exact: &mut Vec<u32>,
    ) {
        self.merge(pid, tid, When::At(time), user, user_pcs, frames, exact);
    }

    fn left_cpu(&self, pid: u32, _tid: u32, _time: u64) {
        // A read per two samples on the CPU, per block off it (each block
        // takes the stack read during it).
        self.count(&mut self.lock(), pid, SAMPLES_PER_READ);
    }

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
        self.merge(pid, tid, When::Off(off), user, user_pcs, frames, exact);
    }

    fn finish(&self, profile: &mut Profile) {
        let st = self.lock();
        let end = PYTHON_BASE + st.table.len() as u64;
        let used: BTreeSet<u64> = profile
            .stacks
            .iter()
            .flat_map(|s| s.frames.iter().map(|&a| a as u64))
            .filter(|a| (PYTHON_BASE..end).contains(a))
            .collect();
        if used.is_empty() {
            return;
        }
        profile.modules.push(ModuleRecord {
            path: PYTHON_MODULE.into(),
            build_id: None,
            start: PYTHON_BASE,
            end,
            bias: 0,
        });
        for a in used {
            profile
                .named_frames
                .insert(a, st.table[(a - PYTHON_BASE) as usize].clone());
        }
    }
}

impl PythonRecorder {
    /// Counts `n` samples of process `pid` toward its next tally (see
    /// [`State::tally`]); `false` when it is not known to run Python (it
    /// is looked at, the first time).
    fn count(&self, st: &mut State, pid: u32, n: u64) -> bool {
        if !st.eval.contains_key(&pid) {
            if !st.seen.contains(&pid) {
                st.register(pid);
                self.shared.wake.notify_one();
            }
            return false;
        }
        *st.samples.entry(pid).or_default() += n;
        true
    }

    /// [`SampleHook::sample`] and [`SampleHook::off_cpu_sample`]: the
    /// thread's Python stack read `when` the sample's stack was its own
    /// replaces the evaluation loop's frames.
    #[allow(clippy::too_many_arguments)]
    fn merge(
        &self,
        pid: u32,
        tid: u32,
        when: When,
        user: usize,
        user_pcs: &[u64],
        frames: &mut Vec<usize>,
        exact: &mut Vec<u32>,
    ) {
        let mut st = self.lock();
        // An off-CPU sample was counted as its thread left the CPU.
        let n = u64::from(matches!(when, When::At(_)));
        if !self.count(&mut st, pid, n) {
            return;
        }
        let every = u64::from(st.read_every.get(&pid).copied().unwrap_or(1));
        let tolerance = self.shared.tolerance_ns + (every - 1) * self.shared.period_ns();
        let ranges = &st.eval[&pid];
        let is_exact = |i: usize| i == 0 || exact.binary_search(&(i as u32)).is_ok();
        // Whether frame `i` is in the evaluation loop, by its address in
        // the process.
        let in_eval = |i: usize| {
            let Some(&a) = i.checked_sub(user).and_then(|k| user_pcs.get(k)) else {
                return false;
            };
            let probe = if is_exact(i) { a } else { a.wrapping_sub(1) };
            ranges.iter().any(|&(lo, hi)| lo <= probe && probe < hi)
        };
        let evals: Vec<bool> = (0..frames.len()).map(in_eval).collect();
        if !evals.contains(&true) {
            return;
        }
        let n_evals = evals.iter().filter(|&&e| e).count();
        let ran = match &when {
            When::At(_) => None,
            // Off-CPU samples come in time order per thread.
            When::Off(off) => st.ran_again.insert(tid, off.end),
        };
        let snap = match &when {
            When::At(time) => st.nearest(tid, *time, tolerance, n_evals),
            When::Off(off) => st.while_off(tid, off, ran, tolerance, n_evals),
        };
        let Some(snap) = snap else {
            return;
        };
        let mut out = Vec::with_capacity(frames.len() + snap.frames.len());
        let mut out_exact = Vec::with_capacity(exact.len() + snap.frames.len());
        let mut py = &snap.frames[..];
        let push_py = |out: &mut Vec<usize>, out_exact: &mut Vec<u32>, id: u32| {
            out_exact.push(out.len() as u32);
            out.push((PYTHON_BASE + u64::from(id)) as usize);
        };
        for (i, &a) in frames.iter().enumerate() {
            if evals[i] && !py.is_empty() {
                // The evaluation loop's frame: the Python frames it runs.
                let n = eval_run(py, |f| f.1);
                for &(id, _) in &py[..n] {
                    push_py(&mut out, &mut out_exact, id);
                }
                py = &py[n..];
                continue;
            }
            if i > 0 && is_exact(i) {
                out_exact.push(out.len() as u32);
            }
            out.push(a);
        }
        // Python frames whose evaluation loop's frame was not reached (the
        // native walk ended early): outermost, as `pstack` puts them.
        for &(id, _) in py {
            push_py(&mut out, &mut out_exact, id);
        }
        out_exact.retain(|&i| i > 0);
        *frames = out;
        *exact = out_exact;
    }
}

impl Shared {
    fn period_ns(&self) -> u64 {
        self.period.as_nanos() as u64
    }
}

impl State {
    /// How many periods apart to read each python process:
    /// [`SAMPLES_PER_READ`] of its samples counted since the last tally
    /// (`periods` periods ago), as a power of two from 1 to
    /// [`IDLE_EVERY`]; the counts start again.
    fn tally(&mut self, periods: u64) {
        let pids: Vec<u32> = self.eval.keys().copied().collect();
        for pid in pids {
            let n = self.samples.remove(&pid).unwrap_or(0);
            let every = (periods * SAMPLES_PER_READ)
                .checked_div(n)
                .map_or(IDLE_EVERY, |k| {
                    power_of_two_near(k).clamp(1, u64::from(IDLE_EVERY)) as u32
                });
            self.read_every.insert(pid, every);
        }
    }
}

/// The power of two nearest `k` by ratio (1 for 0).
fn power_of_two_near(k: u64) -> u64 {
    if k <= 1 {
        return 1;
    }
    let lo = 1u64 << (63 - k.leading_zeros());
    // k/lo against 2lo/k.
    if u128::from(k) * u128::from(k) < 2 * u128::from(lo) * u128::from(lo) {
        lo
    } else {
        lo * 2
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
pub(super) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A process the sampler looks at.
struct Proc {
    pid: u32,
    sampler: Option<Sampler>,
    tries: u32,
    next_try: Instant,
    /// The last reason it was not found to run Python.
    error: Option<String>,
    /// Its program (`/proc/PID/exe`) when last looked at.
    exe: Option<std::path::PathBuf>,
    /// The period of its next read, counted from the sampler's start.
    next_read: u64,
    /// Reads failed in a row.
    fails: u32,
    /// Whether it ran since its last read ([`super::ran`]).
    ran: Option<super::ran::RunCheck>,
}

/// This process's id, asked of the kernel once (a whole-host recording
/// compares every sample's process with it).
fn me() -> u32 {
    static ME: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ME.get_or_init(std::process::id)
}

/// The program process `pid` runs now (`None`: gone).
fn exe_of(pid: u32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// What a look at a process found.
#[derive(Debug)]
enum Look {
    /// Its interpreter.
    Found(Interpreter),
    /// No python file among its code (or it is gone): looked at again
    /// only when it maps one or execs (see [`SampleHook::mapped`]).
    NoPython,
    /// A python file, but no interpreter read yet (its libpython not
    /// mapped yet), or one refused (why): looked at again soon.
    NotYet(Option<String>),
}

/// The interpreter of process `pid`, from its modules now.
fn find(pid: u32, lookup: &Lookup) -> Look {
    // Gone (or not ours to read): nothing to say about it.
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Look::NoPython;
    };
    let mut maps: Vec<Mapping> = text
        .lines()
        .filter_map(crate::remote::process::parse_maps_line)
        .map(|(m, _)| m)
        .filter(|m| m.path.starts_with('/'))
        .collect();
    // Files the process runs code of: a python file only mapped to be
    // read (a profiler's, reading its symbols) is no interpreter.
    let runs: HashSet<String> = maps
        .iter()
        .filter(|m| m.executable == Some(true))
        .map(|m| m.path.clone())
        .collect();
    maps.retain(|m| runs.contains(&m.path));
    if !maps.iter().any(|m| super::is_python_file(&m.path)) {
        return Look::NoPython;
    }
    let mut mods = files::group_mappings(&maps);
    let mut warnings = Vec::new();
    files::resolve_files(&mut mods, lookup, None, &mut warnings);
    match Interpreter::find_in(&mods) {
        Ok(Some(i)) => Look::Found(i),
        Ok(None) => Look::NotYet(None),
        Err(e) => Look::NotYet(Some(e.to_string())),
    }
}

/// The sampling thread: looks for the interpreter of each process given,
/// and reads the Python stacks of those that have one every period.
fn run(shared: &Shared) {
    let mut procs: Vec<Proc> = Vec::new();
    let start = Instant::now();
    let period = shared.period.max(Duration::from_micros(10));
    let mut prune_at = start;
    let mut tally_at = monotonic_ns() + TALLY_NS;
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // The period this is.
        let tick = (now - start).as_nanos() as u64 / period.as_nanos() as u64;
        {
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            for pid in std::mem::take(&mut st.new_pids) {
                // Given again: it exec'd.
                procs.retain(|p| p.pid != pid);
                procs.push(Proc {
                    pid,
                    sampler: None,
                    tries: 0,
                    next_try: now,
                    error: None,
                    exe: None,
                    next_read: 0,
                    fails: 0,
                    ran: None,
                });
            }
        }
        let mut gone = Vec::new();
        for (k, p) in procs.iter_mut().enumerate() {
            match &mut p.sampler {
                None if p.tries >= MAX_TRIES && now >= p.next_try => {
                    // Given up: looked at again when it execs, forgotten
                    // when it is gone.
                    p.next_try = now + LAST_RETRY;
                    match exe_of(p.pid) {
                        None => gone.push(k),
                        Some(e) if p.exe.as_ref() != Some(&e) => p.tries = 0,
                        Some(_) => {}
                    }
                }
                None if now >= p.next_try => {
                    p.tries += 1;
                    p.exe = exe_of(p.pid);
                    let wait = FIRST_RETRY
                        .saturating_mul(1 << p.tries.min(16))
                        .min(LAST_RETRY);
                    p.next_try = now + wait;
                    match find(p.pid, &shared.lookup) {
                        Look::Found(i) => {
                            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                            st.eval.insert(p.pid, i.eval_ranges.clone());
                            // Read every period until its first tally.
                            st.read_every.remove(&p.pid);
                            if i.eval_ranges.is_empty() {
                                st.warnings.push(format!(
                                    "{}: no size of {} in its symbol table: its samples keep the evaluation loop's frames",
                                    i.module,
                                    super::EVAL_FUNCTION
                                ));
                            }
                            p.sampler = Some(Sampler::new(i, p.pid));
                            p.ran = Some(super::ran::RunCheck::new(p.pid));
                        }
                        // Not a python process (most of a host's): no
                        // more looks until it maps a python file or execs
                        // (a whole-host recording sees thousands of
                        // short-lived processes). Forgotten till then
                        // (`seen` keeps its samples from registering it
                        // again; the hooks do not ask `seen`).
                        Look::NoPython => {
                            p.tries = MAX_TRIES;
                            gone.push(k);
                        }
                        Look::NotYet(e) => p.error = e,
                    }
                    // Why it is not read, said at the end unless found
                    // since (a python whose libpython is not mapped yet is
                    // refused for a moment).
                    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                    match (&p.sampler, p.error.take()) {
                        (Some(_), _) => {
                            st.errors.remove(&p.pid);
                        }
                        (None, Some(e)) => {
                            st.errors.insert(p.pid, e);
                        }
                        (None, None) => {}
                    }
                }
                None => {}
                Some(s) => {
                    // In a whole-host recording, read as often as it is
                    // sampled (State::tally). Failing again and again (a
                    // zombie, whose memory is gone): read as seldom as an
                    // idle one.
                    let every = if p.fails >= MAX_FAILS {
                        IDLE_EVERY
                    } else if shared.throttle {
                        let st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                        st.read_every.get(&p.pid).copied().unwrap_or(1)
                    } else {
                        1
                    };
                    if tick < p.next_read {
                        continue;
                    }
                    // The next multiple of `every`: processes read as
                    // often are read at the same wake-up.
                    let every = u64::from(every.max(1));
                    p.next_read = (tick / every + 1) * every;
                    let t0 = monotonic_ns();
                    let idle = p.ran.as_mut().is_some_and(|r| r.idle(t0));
                    if let (true, Some(ran)) = (idle, &p.ran) {
                        // Not run since the last read: each thread's last
                        // stack is still its stack now.
                        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                        st.skipped += 1;
                        for tid in ran.tids() {
                            if let Some(s) = st.stacks.get_mut(&tid).and_then(|q| q.back_mut()) {
                                s.until = s.until.max(t0);
                            }
                        }
                        continue;
                    }
                    let mem = RunningMemory { pid: p.pid };
                    let read = s.threads(&mem);
                    let t1 = monotonic_ns();
                    let time = t0 + (t1 - t0) / 2;
                    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                    st.reads += 1;
                    let Ok(threads) = read else {
                        st.failed += 1;
                        p.fails = p.fails.saturating_add(1);
                        match exe_of(p.pid) {
                            None => gone.push(k),
                            // Another program (an exec whose record was
                            // missed): looked at again.
                            Some(e) if p.exe.as_ref() != Some(&e) => {
                                st.eval.remove(&p.pid);
                                p.sampler = None;
                                p.tries = 0;
                                p.fails = 0;
                            }
                            Some(_) => {}
                        }
                        continue;
                    };
                    p.fails = 0;
                    if let Some(ran) = p.ran.as_mut() {
                        let tids: Vec<u32> = threads
                            .iter()
                            .filter_map(|t| u32::try_from(t.native_tid?).ok())
                            .collect();
                        ran.watch(&tids, t0);
                    }
                    for t in threads {
                        let Some(tid) = t.native_tid.and_then(|t| u32::try_from(t).ok()) else {
                            continue;
                        };
                        let frames: Vec<(u32, bool)> = t
                            .frames
                            .into_iter()
                            .map(|f| {
                                let entry = f.entry;
                                let n = st.table.len() as u32;
                                let key = (f.function, f.file, f.line);
                                let id = match st.index.get(&key) {
                                    Some(&id) => id,
                                    None => {
                                        st.table.push(FrameName {
                                            function: key.0.clone(),
                                            file: Some(key.1.clone()),
                                            line: key.2,
                                            inlined: false,
                                        });
                                        st.index.insert(key, n);
                                        n
                                    }
                                };
                                (id, entry)
                            })
                            .collect();
                        let q = st.stacks.entry(tid).or_default();
                        if let Some(last) = q.back_mut().filter(|s| s.frames == frames) {
                            // The same stack as at the last read: one
                            // stack, known from then to now.
                            last.until = time;
                            continue;
                        }
                        while q
                            .front()
                            .is_some_and(|s| s.until + HISTORY_NS < time || q.len() >= MAX_HISTORY)
                        {
                            q.pop_front();
                        }
                        let mut evals = 0;
                        let mut rest = &frames[..];
                        while !rest.is_empty() {
                            rest = &rest[eval_run(rest, |f| f.1)..];
                            evals += 1;
                        }
                        q.push_back(Snap {
                            time,
                            until: time,
                            frames,
                            evals,
                        });
                    }
                }
            }
        }
        for k in gone.into_iter().rev() {
            procs.remove(k);
        }
        let t = monotonic_ns();
        if shared.throttle && t >= tally_at {
            let periods = (TALLY_NS + t - tally_at) / shared.period_ns().max(1);
            tally_at = t + TALLY_NS;
            shared
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .tally(periods);
        }
        if now >= prune_at {
            // Threads that ended (or stopped being read): their stacks go.
            prune_at = now + Duration::from_secs(1);
            let t = monotonic_ns();
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.stacks
                .retain(|_, q| q.back().is_some_and(|s| s.until + HISTORY_NS >= t));
            let State {
                stacks, ran_again, ..
            } = &mut *st;
            ran_again.retain(|tid, _| stacks.contains_key(tid));
        }
        // Sleep until the next read due, or the next look at a process not
        // yet found to run Python, or till new processes come.
        let mut wake = Instant::now() + MAX_SLEEP;
        for p in &procs {
            let due = match p.sampler {
                Some(_) => start + period * p.next_read.min(u64::from(u32::MAX)) as u32,
                None => p.next_try,
            };
            wake = wake.min(due);
        }
        let st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if wake > now && st.new_pids.is_empty() && !shared.stop.load(Ordering::Relaxed) {
            drop(shared.wake.wait_timeout(st, wake - now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder(tolerance_ns: u64) -> PythonRecorder {
        PythonRecorder {
            shared: Arc::new(Shared {
                period: Duration::from_millis(1),
                tolerance_ns,
                throttle: false,
                lookup: Lookup::default(),
                stop: AtomicBool::new(true),
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
            }),
            worker: Mutex::new(None),
        }
    }

    fn snap(time: u64, frames: &[(u32, bool)]) -> Snap {
        let mut evals = 0;
        let mut rest = frames;
        while !rest.is_empty() {
            rest = &rest[eval_run(rest, |f| f.1)..];
            evals += 1;
        }
        Snap {
            time,
            until: time,
            frames: frames.to_vec(),
            evals,
        }
    }

    /// A stack known from one time to another (read again the same, or
    /// its process idle meanwhile) serves every sample in that span, and
    /// is as near as its nearer end to one outside it.
    #[test]
    fn a_stack_known_over_a_span_serves_the_samples_in_it() {
        let r = recorder(10);
        {
            let mut st = r.lock();
            st.eval.insert(1, vec![(0x1000, 0x2000)]);
            let q = st.stacks.entry(7).or_default();
            let mut s = snap(100, &[(0, true)]);
            s.until = 300;
            q.push_back(s);
            q.push_back(snap(330, &[(1, true)]));
        }
        let b = PYTHON_BASE as usize;
        let at = |time: u64| {
            let mut frames = vec![0x1100usize];
            let mut exact = vec![];
            r.sample(1, 7, time, 0, &[0x1100], &mut frames, &mut exact);
            frames
        };
        assert_eq!(at(200), [b]);
        assert_eq!(at(305), [b]);
        assert_eq!(at(320), [b + 1]);
        // Too far from both.
        assert_eq!(at(80), [0x1100]);
    }

    /// An off-CPU sample takes the stack read while its thread was
    /// blocked, however near the moment it blocked another read was; with
    /// none read in that time, the last read while it ran up to the block;
    /// none read then either, no Python frames (the eval loop's stay).
    #[test]
    fn an_off_cpu_sample_takes_the_stack_read_while_blocked() {
        let r = recorder(10);
        {
            let mut st = r.lock();
            st.eval.insert(1, vec![(0x1000, 0x2000)]);
            let q = st.stacks.entry(7).or_default();
            let mut push = |time: u64, until: u64, id: u32| {
                let mut s = snap(time, &[(id, true)]);
                s.until = until;
                q.push_back(s);
            };
            // Blocks (off the CPU) 100..108, 113..120, 124..130, 131..135.
            push(90, 99, 0); // running, just before the first block
            push(103, 106, 1); // the first block
            push(112, 112, 2); // running
            push(121, 123, 3); // running
            push(137, 137, 4); // running, after the last block
        }
        let b = PYTHON_BASE as usize;
        let off = |from: u64, to: u64| {
            let mut frames = vec![0x1100usize];
            let mut exact = vec![];
            r.off_cpu_sample(1, 7, from..to, 0, &[0x1100], &mut frames, &mut exact);
            frames
        };
        // Read while blocked, though a read at 99 was nearer its start.
        assert_eq!(off(100, 108), [b + 1]);
        // None read while blocked: the read at 112, since it ran at 108.
        assert_eq!(off(113, 120), [b + 2]);
        assert_eq!(off(124, 130), [b + 3]);
        // Nothing read since it ran at 130: the read at 123 was before
        // its last block, the one at 137 after this one.
        assert_eq!(off(131, 135), [0x1100]);
        // As a sample at one time, 100 takes the nearer read.
        let mut frames = vec![0x1100usize];
        r.sample(1, 7, 100, 0, &[0x1100], &mut frames, &mut vec![]);
        assert_eq!(frames, [b]);
    }

    /// Each evaluation-loop frame of a sample (a return address inside
    /// `_PyEval_EvalFrameDefault`) gets the Python frames of its call, from
    /// the stack read nearest in time with as many calls as the native
    /// chain has; the frames after keep their exact marks, shifted.
    #[test]
    fn eval_frames_replaced_by_the_matching_stack() {
        let r = recorder(10);
        {
            let mut st = r.lock();
            st.eval.insert(1, vec![(0x1000, 0x2000)]);
            let q = st.stacks.entry(7).or_default();
            // Nearest, but one call only: read while the thread was
            // elsewhere.
            q.push_back(snap(100, &[(0, false), (1, true)]));
            q.push_back(snap(104, &[(2, true), (0, false), (1, true)]));
            // Too far.
            q.push_back(snap(200, &[(3, true), (0, false), (1, true)]));
        }
        let b = PYTHON_BASE as usize;
        // leaf, eval (return address), C helper (exact: through a signal
        // frame), eval, main.
        // The profile's addresses are the process's moved by 0x10000 (the
        // file's range of the recording): the process's say which are the
        // evaluation loop's.
        let pcs = [0x5000, 0x1100, 0x6000, 0x1200, 0x7000];
        let mut frames: Vec<usize> = pcs.iter().map(|&a| a as usize + 0x10000).collect();
        let mut exact = vec![2];
        r.sample(1, 7, 101, 0, &pcs, &mut frames, &mut exact);
        assert_eq!(frames, [0x15000, b + 2, 0x16000, b, b + 1, 0x17000]);
        assert_eq!(exact, [1, 2, 3, 4]);
        // A kernel frame below: the user frames start at 1.
        let mut frames = vec![0xffff_0000, 0x5000, 0x1100];
        let mut exact = vec![1];
        r.sample(1, 7, 99, 1, &[0x5000, 0x1100], &mut frames, &mut exact);
        assert_eq!(frames, [0xffff_0000, 0x5000, b, b + 1]);
        assert_eq!(exact, [1, 2, 3]);

        // A return address just past the function's end is inside it;
        // one at its start is not.
        let mut frames = vec![0x5000, 0x2000, 0x1000];
        let mut exact = vec![];
        r.sample(
            1,
            7,
            99,
            0,
            &[0x5000, 0x2000, 0x1000],
            &mut frames,
            &mut exact,
        );
        assert_eq!(frames, [0x5000, b, b + 1, 0x1000]);

        // No stack read near enough, or none deep enough: native frames kept.
        for time in [150, 101] {
            let mut frames = vec![0x1100, 0x1200, 0x1300];
            let mut exact = vec![];
            r.sample(
                1,
                7,
                time,
                0,
                &[0x1100, 0x1200, 0x1300],
                &mut frames,
                &mut exact,
            );
            assert_eq!(frames, [0x1100, 0x1200, 0x1300], "{time}");
        }
        // Another process: untouched, and given to the sampler.
        let mut frames = vec![0x1100];
        r.sample(2, 8, 101, 0, &[0x1100], &mut frames, &mut exact);
        assert_eq!(frames, [0x1100]);
        assert_eq!(r.lock().new_pids, [2]);

        // The profile gets the module and the names of the frames it uses.
        {
            let mut st = r.lock();
            for f in ["f0", "f1", "f2", "f3"] {
                st.table.push(FrameName::function(f));
            }
        }
        let mut p = Profile::cpu(100);
        p.add(&[0x5000, b + 2, b + 1], true, Some(7), &[1, 1]);
        r.finish(&mut p);
        assert_eq!(p.modules.last().unwrap().path.to_str(), Some(PYTHON_MODULE));
        let named: Vec<&str> = p
            .named_frames
            .values()
            .map(|n| n.function.as_str())
            .collect();
        assert_eq!(named, ["f1", "f2"]);
    }
}

#[cfg(test)]
mod find_tests {
    /// A python file a process maps only to read it (a profiler reading
    /// its symbols: `record -a` samples itself too) is no interpreter of
    /// that process; the first version took this process's read-only map
    /// of python3.11 for one and read garbage at every period.
    /// The tally: once per two samples, as a power of two of periods;
    /// processes not sampled (idle) every 32nd period; counts start again.
    #[test]
    fn tally_reads_once_per_two_samples_in_powers_of_two() {
        use super::{power_of_two_near, State, IDLE_EVERY};
        assert_eq!(
            (0..=9).map(power_of_two_near).collect::<Vec<_>>(),
            [1, 1, 2, 4, 4, 4, 8, 8, 8, 8]
        );
        assert_eq!(power_of_two_near(20), 16);
        assert_eq!(power_of_two_near(23), 32);
        let mut st = State::default();
        for (pid, samples) in [(1, 250), (2, 25), (3, 0), (4, 2)] {
            st.eval.insert(pid, Vec::new());
            st.samples.insert(pid, samples);
        }
        st.tally(250);
        assert_eq!(st.read_every[&1], 2, "a CPU held: every other period");
        assert_eq!(st.read_every[&2], 16, "a tenth of a CPU: 20 → 16");
        assert_eq!(st.read_every[&3], IDLE_EVERY);
        assert_eq!(st.read_every[&4], IDLE_EVERY, "250 → at most 32");
        assert!(st.samples.is_empty());
    }

    #[test]
    fn python_file_mapped_to_be_read_is_no_interpreter() {
        let path = std::path::Path::new("/usr/bin/python3.11");
        let Ok(file) = std::fs::File::open(path) else {
            eprintln!("skipped: no {}", path.display());
            return;
        };
        // SAFETY: a read-only map of a file nobody writes during the test.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert!(map.len() > 4096);
        let found = super::find(std::process::id(), &super::Lookup::default());
        assert!(matches!(found, super::Look::NoPython), "{found:?}");
        drop(map);
    }
}
