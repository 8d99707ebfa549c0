//! Live processes: stop every thread with `PTRACE_SEIZE` + `PTRACE_INTERRUPT`,
//! copy its registers and the live part of its stack, detach, and only then
//! unwind and symbolize, so the target is stopped for as short a time as
//! possible (see [`LiveProcess::stopped_for`]).

use std::path::Path;
use std::time::{Duration, Instant};

use super::files::{self, Lookup};
use super::ptrace;
use super::{Machine, Mapping, Module, RemoteError, Snapshot, Thread};
use crate::unwind::{Memory, ReadError};

/// How many bytes of each thread's stack are copied while it is stopped,
/// from its stack pointer up (the rest is read live after detaching).
pub const STACK_COPY: u64 = 512 * 1024;
/// Bytes below the stack pointer copied too (the x86-64 red zone).
const RED_ZONE: u64 = 128;
const PTRACE_EVENT_STOP: i32 = 128;

/// How long the threads may take to report their stops: past it, a thread
/// that has neither stopped nor exited is left out (with a warning), so a
/// target killed or stuck mid-capture never hangs the capture.
const STOP_DEADLINE: Duration = Duration::from_secs(3);

/// A process whose threads were captured and released.
pub struct LiveProcess {
    pid: u32,
    /// A thread of the process that was alive when captured: its memory and
    /// files are read through it (the leader's are gone once it exits, even
    /// while other threads still run).
    mm_tid: u32,
    snapshot: Snapshot,
    /// (start address, bytes) of each thread's copied stack, sorted.
    stacks: Vec<(u64, Vec<u8>)>,
    stopped_for: Duration,
}

fn proc_path(pid: u32, rest: &str) -> String {
    format!("/proc/{pid}/{rest}")
}

/// The most bytes of executable memory in no file (JIT code) a snapshot of
/// a live process reads for its unwinder.
const ANON_CODE_MAX: u64 = 64 << 20;

fn read_maps(pid: u32, mm_tid: u32) -> Result<Vec<(Mapping, bool)>, RemoteError> {
    let path = proc_path(pid, &format!("task/{mm_tid}/maps"));
    let text = std::fs::read_to_string(&path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => RemoteError::NoSuchProcess(pid),
        Some(libc::EACCES) | Some(libc::EPERM) => {
            RemoteError::Permission(pid, permission_hint(pid))
        }
        _ => RemoteError::Io(path.clone().into(), e),
    })?;
    Ok(text.lines().filter_map(parse_maps_line).collect())
}

/// One line of a `/proc/PID/maps` file: the mapping, and whether it is
/// writable. `None` for a line that does not parse, and for a file mapped
/// shared, read-only and not executable: a read of the file (a symbolizer's, such as
/// the recorder's own of the libraries it names, mapped a few MiB from
/// their loaded images), never a segment of a loaded image, which the
/// loader maps private. Taken for one, it moved the image's start to it.
pub(crate) fn parse_maps_line(line: &str) -> Option<(Mapping, bool)> {
    let mut it = line.split_whitespace();
    let (range, perms, off) = (it.next()?, it.next()?, it.next()?);
    let (_dev, _inode) = (it.next(), it.next());
    let path: String = it.collect::<Vec<_>>().join(" ");
    let p = perms.as_bytes();
    if p.get(3) == Some(&b's')
        && p.get(1) != Some(&b'w')
        && p.get(2) != Some(&b'x')
        && path.starts_with('/')
    {
        return None;
    }
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    let file_offset = u64::from_str_radix(off, 16).ok()?;
    let writable = perms.as_bytes().get(1) == Some(&b'w');
    Some((
        Mapping {
            start,
            end,
            file_offset,
            path,
            executable: Some(perms.as_bytes().get(2) == Some(&b'x')),
        },
        writable,
    ))
}

/// Why tracing `pid` is not permitted, in words a user can act on.
pub fn permission_hint(pid: u32) -> String {
    let status = std::fs::read_to_string(proc_path(pid, "status")).unwrap_or_default();
    if let Some(tracer) = status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .map(str::trim)
        .filter(|t| *t != "0")
    {
        return format!("it is already being traced by process {tracer} (a debugger?)");
    }
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    match scope {
        Some(1) => "kernel.yama.ptrace_scope is 1: only a parent may trace its children; run as root or set `sysctl kernel.yama.ptrace_scope=0`".into(),
        Some(2) => "kernel.yama.ptrace_scope is 2: only root (CAP_SYS_PTRACE) may trace; run as root".into(),
        Some(3) => "kernel.yama.ptrace_scope is 3: tracing is disabled until reboot".into(),
        _ => "it belongs to another user or is not dumpable; run as its owner or as root (CAP_SYS_PTRACE)".into(),
    }
}

/// The state letter of thread `tid` of `pid` (`R`, `S`, `Z`, ...), or `None`
/// when it is gone.
fn task_state(pid: u32, tid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(proc_path(pid, &format!("task/{tid}/stat"))).ok()?;
    stat.rsplit_once(')')
        .and_then(|(_, r)| r.trim_start().chars().next())
}

/// Whether thread `tid` of `pid` has exited (a zombie, dead, or gone).
fn task_gone(pid: u32, tid: u32) -> bool {
    matches!(task_state(pid, tid), None | Some('Z') | Some('X'))
}

/// A thread of `pid` that has not exited: the leader if it is alive, else
/// the first live one (a leader that called `pthread_exit` is a zombie while
/// the other threads run on). `Zombie` when none is left.
fn live_thread(pid: u32) -> Result<u32, RemoteError> {
    if !task_gone(pid, pid) {
        return Ok(pid);
    }
    tasks(pid)?
        .into_iter()
        .find(|&t| !task_gone(pid, t))
        .ok_or(RemoteError::Zombie(pid))
}

fn tasks(pid: u32) -> Result<Vec<u32>, RemoteError> {
    let dir =
        std::fs::read_dir(proc_path(pid, "task")).map_err(|_| RemoteError::NoSuchProcess(pid))?;
    let mut v: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

struct Stopped {
    tid: u32,
    /// Signal to deliver when detaching (a signal-delivery-stop we consumed).
    signal: i32,
    alive: bool,
}

/// Waits, without blocking on any one thread, until every thread in
/// `stopped` marked alive has reported its stop (or exited: then it is
/// marked dead), or `deadline` passes: the threads still silent then are
/// marked dead and returned.
///
/// One thread at a time with a blocking `waitpid` can wait forever: when a
/// multi-threaded target is killed, the leader's exit is reported only after
/// every other thread has been reaped, and traced threads are reaped by
/// their tracer, so all are polled in turn, and a thread that has become a
/// zombie (or vanished) without a report counts as exited.
fn wait_for_stops(pid: u32, stopped: &mut [Stopped], deadline: Instant) -> Vec<u32> {
    let mut pending: Vec<usize> = (0..stopped.len()).filter(|&i| stopped[i].alive).collect();
    let mut pause = Duration::from_micros(20);
    let mut polls = 0u32;
    while !pending.is_empty() {
        pending.retain(|&i| {
            let s = &mut stopped[i];
            match ptrace::wait_nohang(s.tid as i32) {
                Ok(Some(st)) if libc::WIFSTOPPED(st) => {
                    let sig = libc::WSTOPSIG(st);
                    let event = st >> 16;
                    if event != PTRACE_EVENT_STOP && sig != libc::SIGTRAP {
                        s.signal = sig; // a signal-delivery-stop: hand it back at detach
                    }
                    false
                }
                // Exited, killed, or no longer ours to wait for.
                Ok(Some(_)) | Err(_) => {
                    s.alive = false;
                    false
                }
                Ok(None) => true,
            }
        });
        if pending.is_empty() {
            break;
        }
        polls += 1;
        // Now and then, and before giving up: threads gone without a report.
        if polls % 16 == 0 || Instant::now() >= deadline {
            pending.retain(|&i| {
                let gone = task_gone(pid, stopped[i].tid);
                if gone {
                    stopped[i].alive = false;
                }
                !gone
            });
        }
        if Instant::now() >= deadline {
            return pending
                .into_iter()
                .map(|i| {
                    stopped[i].alive = false;
                    stopped[i].tid
                })
                .collect();
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
    Vec::new()
}

/// Work on a live target's memory while all its threads are stopped, so
/// that what it reads is of the same instant as the copied stacks (a
/// language runtime's own frames: `callstack::python`).
pub trait WhileStopped {
    /// Whether the module mapped from `path` is needed by [`prepare`](Self::prepare).
    fn wants(&self, path: &str) -> bool;
    /// Before the threads are stopped: the modules [`wants`](Self::wants)
    /// chose, their files found and load biases known. False: nothing to
    /// do while stopped.
    fn prepare(&mut self, pid: u32, modules: &[Module]) -> bool;
    /// While stopped, after the registers and stacks are copied: `mem`
    /// reads the process, `tids` are its stopped threads.
    fn stopped(&mut self, mem: &dyn super::ReadTarget, tids: &[u32]);
}

/// A live process's memory read directly (`process_vm_readv`, else
/// `/proc/PID/mem`).
struct RawMemory {
    pid: u32,
    tid: u32,
}

impl super::ReadTarget for RawMemory {
    fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
        matches!(ptrace::read_remote(self.tid as i32, addr, buf), Ok(n) if n == buf.len())
            || read_proc_mem(self.pid, self.tid, addr, buf)
    }
}

/// A running process's memory read without stopping it
/// (`process_vm_readv` alone): what a sampler of a running interpreter
/// reads (`python::record`). Reads race with the process's writes.
pub struct RunningMemory {
    /// The process read.
    pub pid: u32,
}

impl super::ReadTarget for RunningMemory {
    fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
        matches!(ptrace::read_remote(self.pid as i32, addr, buf), Ok(n) if n == buf.len())
    }

    fn read_each(&self, reqs: &mut [(u64, &mut [u8])], ok: &mut [bool]) {
        let mut done = 0;
        while done < reqs.len() {
            // The kernel copies the ranges in order and stops at the first
            // it cannot read: those before it are whole, that one is read
            // alone (it fails), and the rest again together.
            let end = (done + ptrace::MAX_IOV).min(reqs.len());
            let batch = &mut reqs[done..end];
            let mut n = ptrace::read_remote_each(self.pid as i32, batch).unwrap_or(0);
            let mut whole = 0;
            for (_, buf) in batch.iter() {
                if n < buf.len() {
                    break;
                }
                n -= buf.len();
                whole += 1;
            }
            ok[done..done + whole].fill(true);
            done += whole;
            if done < reqs.len() {
                let (addr, buf) = &mut reqs[done];
                ok[done] = self.read_bytes(*addr, buf);
                done += 1;
            }
        }
    }
}

impl LiveProcess {
    /// Stops every thread of `pid`, copies registers and stacks, and lets
    /// them go. Unwinding happens afterwards, on the copies.
    pub fn capture(pid: u32, lookup: &Lookup) -> Result<LiveProcess, RemoteError> {
        Self::capture_with(pid, lookup, None)
    }

    /// [`capture`](Self::capture), running `hook` on the process's memory
    /// while its threads are stopped (it lengthens the stop by its reads).
    pub fn capture_with(
        pid: u32,
        lookup: &Lookup,
        mut hook: Option<&mut dyn WhileStopped>,
    ) -> Result<LiveProcess, RemoteError> {
        if pid == 0 || std::fs::metadata(proc_path(pid, "")).is_err() {
            return Err(RemoteError::NoSuchProcess(pid));
        }
        let mm_tid = live_thread(pid)?;
        if pid == std::process::id() {
            return Err(RemoteError::Ptrace(
                pid,
                "cannot trace callstack itself; use capture_exact in-process".into(),
            ));
        }
        // From here on, a process that disappears died while we looked.
        let vanished = |e: RemoteError| match e {
            RemoteError::NoSuchProcess(p) => RemoteError::Vanished(p),
            e => e,
        };
        let maps = read_maps(pid, mm_tid).map_err(vanished)?;
        let exe = proc_path(pid, &format!("task/{mm_tid}/exe"));
        let arch = files::map_file(Path::new(&exe))
            .ok()
            .and_then(|d| {
                // EI_CLASS: 2 is ELFCLASS64 (EM_RISCV names RV32 and RV64).
                let is_64 = d.get(4) == Some(&2);
                files::load_segments(&d).map(|(m, _)| (m, is_64))
            })
            .and_then(|(m, is_64)| Machine::from_elf(m, is_64))
            // An unreadable executable: the process is taken to be of this
            // host's architecture.
            .unwrap_or(crate::arch::NATIVE_MACHINE.unwrap_or(Machine::X86_64));

        // The hook's modules, found before anything is stopped.
        let exe_link = std::fs::read_link(&exe)
            .ok()
            .map(|p| p.display().to_string());
        if let Some(h) = hook.as_deref_mut() {
            let wanted: Vec<Mapping> = maps
                .iter()
                .map(|(m, _)| m)
                .filter(|m| m.path.starts_with('/') && h.wants(&m.path))
                .cloned()
                .collect();
            let mut mods = files::group_mappings(&wanted);
            let mut ignored = Vec::new();
            let exe_arg = exe_link.as_deref().map(|n| (Path::new(&exe), n));
            files::resolve_files(&mut mods, lookup, exe_arg, &mut ignored);
            if !h.prepare(pid, &mods) {
                hook = None;
            }
        }

        // Attach (no stop yet), re-listing until no new thread appears.
        let mut seized: Vec<u32> = Vec::new();
        for _round in 0..8 {
            let now = tasks(pid).map_err(vanished)?;
            // Threads that have exited (a zombie leader) cannot be seized and
            // have nothing to show.
            let new: Vec<u32> = now
                .iter()
                .copied()
                .filter(|t| !seized.contains(t) && !task_gone(pid, *t))
                .collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                match ptrace::seize(tid as i32) {
                    Ok(()) => seized.push(tid),
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                    // The thread exited since it was listed.
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) && task_gone(pid, tid) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                        for &t in &seized {
                            let _ = ptrace::detach(t as i32, 0);
                        }
                        if live_thread(pid).is_err() {
                            return Err(RemoteError::Zombie(pid));
                        }
                        return Err(RemoteError::Permission(pid, permission_hint(pid)));
                    }
                    Err(e) => {
                        for &t in &seized {
                            let _ = ptrace::detach(t as i32, 0);
                        }
                        return Err(RemoteError::Ptrace(
                            pid,
                            format!("PTRACE_SEIZE of thread {tid}: {e}"),
                        ));
                    }
                }
            }
        }
        if seized.is_empty() {
            return Err(match live_thread(pid) {
                Ok(_) => RemoteError::Vanished(pid),
                Err(e) => vanished(e),
            });
        }

        // Stop all, copy, release.
        let t0 = Instant::now();
        let mut stopped: Vec<Stopped> = Vec::with_capacity(seized.len());
        for &tid in &seized {
            let alive = ptrace::interrupt(tid as i32).is_ok();
            stopped.push(Stopped {
                tid,
                signal: 0,
                alive,
            });
        }
        let timed_out = wait_for_stops(pid, &mut stopped, t0 + STOP_DEADLINE);
        let mut threads = Vec::with_capacity(stopped.len());
        let mut stacks = Vec::with_capacity(stopped.len());
        let mut warnings = Vec::new();
        for tid in &timed_out {
            warnings.push(format!(
                "thread {tid} did not stop within {} s: left out",
                STOP_DEADLINE.as_secs()
            ));
        }
        let mut buf = [0u8; 1024];
        for s in stopped.iter().filter(|s| s.alive) {
            let regs = ptrace::get_regset(s.tid as i32, &mut buf)
                .ok()
                .and_then(|n| arch.registers_from_user_regs(&buf[..n]));
            let Some(registers) = regs else {
                warnings.push(format!("thread {}: could not read its registers", s.tid));
                continue;
            };
            let mut stack_end = None;
            if let Some(sp) = registers.sp() {
                if let Some((m, _)) = maps.iter().find(|(m, w)| *w && sp >= m.start && sp < m.end) {
                    stack_end = Some(m.end);
                    let lo = sp.saturating_sub(RED_ZONE).max(m.start);
                    let hi = m.end.min(sp.saturating_add(STACK_COPY));
                    let mut bytes = vec![0u8; (hi - lo) as usize];
                    if let Ok(n) = ptrace::read_remote(mm_tid as i32, lo, &mut bytes) {
                        bytes.truncate(n);
                        stacks.push((lo, bytes));
                    }
                }
            }
            threads.push(Thread {
                tid: s.tid,
                name: None,
                registers,
                stack_end,
            });
        }
        if let Some(h) = hook {
            let tids: Vec<u32> = threads.iter().map(|t: &Thread| t.tid).collect();
            h.stopped(&RawMemory { pid, tid: mm_tid }, &tids);
        }
        for s in &stopped {
            let _ = ptrace::detach(s.tid as i32, s.signal);
        }
        let stopped_for = t0.elapsed();
        for s in stopped
            .iter()
            .filter(|s| !s.alive && !timed_out.contains(&s.tid))
        {
            warnings.push(format!("thread {} exited while being stopped", s.tid));
        }
        if threads.is_empty() {
            // Killed, or exited, while we stopped it.
            return Err(RemoteError::Vanished(pid));
        }

        // Everything below runs with the target running again.
        for t in threads.iter_mut() {
            t.name = std::fs::read_to_string(format!("/proc/{pid}/task/{}/comm", t.tid))
                .ok()
                .map(|s| s.trim_end_matches('\n').to_string());
        }
        // gdb's numbering: the main thread first, then by creation (tid)
        // (gdb's `thread apply all bt` prints them last to first).
        threads.sort_by_key(|t| (t.tid != pid, t.tid));
        stacks.sort_by_key(|s| s.0);
        let mut live = LiveProcess {
            pid,
            mm_tid,
            snapshot: Snapshot {
                arch,
                pid,
                process_name: std::fs::read_to_string(proc_path(pid, "comm"))
                    .ok()
                    .map(|s| s.trim_end().to_string()),
                threads,
                modules: Vec::new(),
                warnings: Vec::new(),
                anon_code: Vec::new(),
            },
            stacks,
            stopped_for,
        };
        let vdso = maps
            .iter()
            .find(|(m, _)| m.path == "[vdso]")
            .map(|(m, _)| m.clone());
        // Executable memory that is no file's: JIT code (named by a perf
        // map), trampolines. Read once, up to ANON_CODE_MAX bytes in all,
        // so that the unwinder can read the code it walks through.
        let mut anon_budget = ANON_CODE_MAX;
        for (m, _) in &maps {
            let len = m.end.saturating_sub(m.start);
            let anon = m.path.is_empty() || !(m.path.starts_with('/') || m.path.starts_with('['));
            if m.executable != Some(true) || !anon || len == 0 || len > anon_budget {
                continue;
            }
            let mut bytes = vec![0u8; len as usize];
            if live.memory().read_bytes(m.start, &mut bytes) {
                anon_budget -= len;
                live.snapshot
                    .anon_code
                    .push((m.start, std::sync::Arc::new(bytes)));
            }
        }
        let file_maps: Vec<Mapping> = maps
            .into_iter()
            .map(|(m, _)| m)
            .filter(|m| m.path.starts_with('/'))
            .collect();
        let mut mods = files::group_mappings(&file_maps);
        for m in mods.iter_mut() {
            let mut page = vec![0u8; 4096];
            if live.memory().read_bytes(m.start, &mut page) {
                m.build_id = files::build_id(&page);
            }
        }
        let exe_target = std::fs::read_link(&exe)
            .ok()
            .map(|p| p.display().to_string());
        let exe_arg = exe_target.as_deref().map(|n| (Path::new(&exe), n));
        files::resolve_files(&mut mods, lookup, exe_arg, &mut warnings);
        // The vDSO has no file: its image is read from the process.
        if let Some(v) = vdso {
            let mut image = vec![0u8; (v.end - v.start) as usize];
            if live.memory().read_bytes(v.start, &mut image) {
                mods.push(files::image_module(v, std::sync::Arc::new(image)));
                mods.sort_by_key(|m| m.start);
            }
        }
        live.snapshot.modules = mods;
        live.snapshot.warnings = warnings;
        Ok(live)
    }

    /// The threads, modules and warnings.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// How long the target was stopped: from the first `PTRACE_INTERRUPT`
    /// to the last `PTRACE_DETACH`.
    pub fn stopped_for(&self) -> Duration {
        self.stopped_for
    }

    /// A reader of the target's memory: the stack copies first, then the
    /// live process.
    pub fn memory(&self) -> ProcessMemory<'_> {
        ProcessMemory { live: self }
    }
}

/// The memory of a captured process, read by the unwinder.
pub struct ProcessMemory<'a> {
    live: &'a LiveProcess,
}

impl ProcessMemory<'_> {
    /// Copies target memory at `addr` into `buf`; false when it cannot be read.
    pub fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
        let stacks = &self.live.stacks;
        let i = stacks.partition_point(|s| s.0 <= addr);
        if let Some((start, bytes)) = i.checked_sub(1).and_then(|i| stacks.get(i)) {
            let rel = (addr - start) as usize;
            if let Some(src) = bytes.get(rel..rel + buf.len()) {
                buf.copy_from_slice(src);
                return true;
            }
        }
        let (pid, tid) = (self.live.pid, self.live.mm_tid);
        matches!(ptrace::read_remote(tid as i32, addr, buf), Ok(n) if n == buf.len())
            || read_proc_mem(pid, tid, addr, buf)
    }
}

fn read_proc_mem(pid: u32, tid: u32, addr: u64, buf: &mut [u8]) -> bool {
    use std::os::unix::fs::FileExt;
    std::fs::File::open(proc_path(pid, &format!("task/{tid}/mem")))
        .and_then(|f| f.read_exact_at(buf, addr))
        .is_ok()
}

impl super::ReadTarget for LiveProcess {
    fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.memory().read_bytes(addr, buf)
    }
}

impl Memory for ProcessMemory<'_> {
    fn read_u64(&mut self, addr: u64) -> Result<u64, ReadError> {
        let mut b = [0u8; 8];
        if self.read_bytes(addr, &mut b) {
            Ok(u64::from_le_bytes(b))
        } else {
            Err(ReadError::Unreadable(addr))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_maps_line;

    /// A file mapped shared, read-only and not executable (a
    /// symbolizer's read of it) is no segment of a loaded image; the
    /// image's own segments, writable shared memory and executable shared
    /// mappings (a JIT's double mapping) are kept.
    #[test]
    fn shared_read_of_a_file_is_no_image_segment() {
        let lib = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        assert!(
            parse_maps_line(&format!("7f00a000-7f0b0000 r--s 00000000 fe:00 12 {lib}")).is_none()
        );
        for line in [
            format!("7f682000-7f6a8000 r--p 00000000 fe:00 12 {lib}"),
            format!("7f6a8000-7f7fe000 r-xp 00026000 fe:00 12 {lib}"),
            "7f000000-7f001000 rw-s 00000000 00:01 7 /dev/zero (deleted)".to_string(),
            "7f100000-7f101000 r-xs 00000000 00:01 8 /memfd:jit (deleted)".to_string(),
            "7f200000-7f201000 rw-s 00000000 00:00 0 ".to_string(),
        ] {
            assert!(parse_maps_line(&line).is_some(), "{line}");
        }
    }
}
