//! Whether a python process can have run since its stacks were last read.
//!
//! A process's memory changes only while one of its threads runs, so a
//! process that has not run since the last read has the same Python stacks:
//! reading them again is a `process_vm_readv` (the kernel pins every page
//! it reads) and a walk for nothing. On a host with more busy processes
//! than CPUs, or with idle interpreters, most reads are of such processes
//! (three in four in `benches/record_all.sh`'s workload). [`RunCheck`]
//! tells them apart for the price of a few small reads:
//!
//! - each thread the last read found: `/proc/PID/task/TID/schedstat` (time
//!   run, time waited, times put on a CPU), kept open and read again with
//!   `pread`;
//! - the whole process's CPU clock (`clock_getcpuclockid`), which also
//!   counts threads the last read did not know (a thread started since
//!   that runs Python while the known ones wait).
//!
//! A thread put on a CPU counts one more switch; one taken off adds the
//! time it ran. A thread that runs all along changes neither until the
//! scheduler's tick, which the kernel gives a running thread every 10 ms
//! or more often (`CONFIG_HZ` 100 to 1000). So the figures unchanged over
//! [`WINDOW_NS`] (10 ms) or more mean that no thread ran in that time. A
//! CPU in `nohz_full` mode running one task alone may skip ticks; perf's
//! sampling events keep its tick for the recording, and a switch or the
//! next tick ends a wrong "idle" there.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Figures unchanged this long: no thread ran (see the module
/// documentation).
pub(super) const WINDOW_NS: u64 = 10_000_000;
/// Processes with more threads than this are read without a check (a
/// check would cost about as much as the read).
const MAX_WATCHED: usize = 16;

/// The figures of a process's running, watched from read to read. See the
/// [module documentation](self).
#[derive(Debug)]
pub(super) struct RunCheck {
    pid: u32,
    /// The process's CPU clock, when the kernel gives one.
    clock: Option<libc::clockid_t>,
    /// The watched threads, sorted, with their open `schedstat`; empty
    /// when the last read found too many (or none known by id).
    threads: Vec<(u32, File)>,
    /// The figures last seen, and since when (CLOCK_MONOTONIC ns) they
    /// are those; `None` before the first look or after one failed.
    seen: Option<(Vec<u8>, u64)>,
}

impl RunCheck {
    /// A check of process `pid`, watching no thread yet.
    pub(super) fn new(pid: u32) -> RunCheck {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: clock_getcpuclockid writes the clock id it is given.
        let ok = unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } == 0;
        RunCheck {
            pid,
            clock: ok.then_some(clock),
            threads: Vec::new(),
            seen: None,
        }
    }

    /// Watches `tids`, the threads the last read found (at `now`); a set
    /// other than the last one starts the figures again.
    pub(super) fn watch(&mut self, tids: &[u32], now: u64) {
        let mut want: Vec<u32> = tids.to_vec();
        want.sort_unstable();
        want.dedup();
        if want.len() > MAX_WATCHED {
            want.clear();
        }
        if want.iter().eq(self.threads.iter().map(|t| &t.0)) {
            return;
        }
        self.threads = want
            .into_iter()
            .filter_map(|tid| {
                let path = format!("/proc/{}/task/{tid}/schedstat", self.pid);
                File::open(path).ok().map(|f| (tid, f))
            })
            .collect();
        self.seen = self.figures().map(|f| (f, now));
    }

    /// The threads watched.
    pub(super) fn tids(&self) -> impl Iterator<Item = u32> + '_ {
        self.threads.iter().map(|t| t.0)
    }

    /// Whether no thread of the process ran since the figures were last
    /// seen to change, [`WINDOW_NS`] or more before `now`: its stacks are
    /// then those of the last read, if that read came after the change
    /// (it does: a change is followed by a read). Looks at the figures.
    pub(super) fn idle(&mut self, now: u64) -> bool {
        if self.threads.is_empty() || self.clock.is_none() {
            return false;
        }
        let Some(now_figures) = self.figures() else {
            self.seen = None;
            return false;
        };
        match &self.seen {
            Some((f, since)) if *f == now_figures => now.saturating_sub(*since) >= WINDOW_NS,
            _ => {
                self.seen = Some((now_figures, now));
                false
            }
        }
    }

    /// The process's CPU time, then each watched thread's `schedstat`, as
    /// bytes to compare; `None` when one could not be read (a thread or
    /// the process gone).
    fn figures(&self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(16 + 48 * self.threads.len());
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given; a clock
        // of a process gone gives an error, not a fault.
        if unsafe { libc::clock_gettime(self.clock?, &mut ts) } != 0 {
            return None;
        }
        out.extend_from_slice(&ts.tv_sec.to_le_bytes());
        out.extend_from_slice(&ts.tv_nsec.to_le_bytes());
        let mut buf = [0u8; 96];
        for (_, f) in &self.threads {
            let n = f.read_at(&mut buf, 0).ok().filter(|&n| n > 0)?;
            out.extend_from_slice(&buf[..n]);
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::record::monotonic_ns;
    use std::process::{Child, Command};
    use std::time::Duration;

    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A process asleep is idle once the figures have stood for the
    /// window, not before; a process that spins is not (it may wait for a
    /// CPU on a loaded machine: it must run within ten windows); a process
    /// gone is not idle.
    #[test]
    fn a_sleeping_process_is_idle_and_a_spinning_one_is_not() {
        let mut sleeper = Kill(Command::new("sleep").arg("30").spawn().unwrap());
        let pid = sleeper.0.id();
        // Let it reach its sleep.
        std::thread::sleep(Duration::from_millis(100));
        let mut c = RunCheck::new(pid);
        let t0 = monotonic_ns();
        c.watch(&[pid], t0);
        assert_eq!(c.tids().collect::<Vec<_>>(), [pid]);
        // A millisecond after (told, not waited: under qemu-user the calls
        // themselves may take longer).
        assert!(!c.idle(t0 + 1_000_000), "idle before the window");
        std::thread::sleep(Duration::from_millis(15));
        assert!(c.idle(monotonic_ns()), "asleep, yet not idle");
        std::thread::sleep(Duration::from_millis(15));
        assert!(c.idle(monotonic_ns()));
        let _ = sleeper.0.kill();
        let _ = sleeper.0.wait();
        assert!(!c.idle(monotonic_ns()), "gone, yet idle");

        let spinner = Kill(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap(),
        );
        let pid = spinner.0.id();
        let mut c = RunCheck::new(pid);
        c.watch(&[pid], monotonic_ns());
        let ran = (0..10).any(|_| {
            std::thread::sleep(Duration::from_millis(15));
            !c.idle(monotonic_ns())
        });
        assert!(ran, "spinning, yet idle in ten windows");
    }

    /// More threads than are watched: no check, every read done.
    #[test]
    fn too_many_threads_are_not_watched() {
        let me = std::process::id();
        let mut c = RunCheck::new(me);
        let tids: Vec<u32> = (0..=MAX_WATCHED as u32).map(|i| me + i).collect();
        c.watch(&tids, monotonic_ns());
        assert_eq!(c.tids().count(), 0);
        std::thread::sleep(Duration::from_millis(15));
        assert!(!c.idle(monotonic_ns()));
    }
}
