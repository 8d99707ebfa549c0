//! `perf_event_open` and its ring buffer: the only unsafe code of the
//! recorder.

use std::io;

/// `PERF_FLAG_FD_CLOEXEC`.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `PERF_TYPE_SOFTWARE`.
const PERF_TYPE_SOFTWARE: u32 = 1;
/// `PERF_COUNT_SW_CPU_CLOCK`.
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
/// `PERF_COUNT_SW_CONTEXT_SWITCHES`.
const PERF_COUNT_SW_CONTEXT_SWITCHES: u64 = 3;
/// `PERF_EVENT_IOC_SET_OUTPUT`: `_IO('$', 5)`.
const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;

pub(crate) const SAMPLE_IP: u64 = 1 << 0;
pub(crate) const SAMPLE_TID: u64 = 1 << 1;
pub(crate) const SAMPLE_TIME: u64 = 1 << 2;
pub(crate) const SAMPLE_CALLCHAIN: u64 = 1 << 5;
pub(crate) const SAMPLE_REGS_USER: u64 = 1 << 12;
pub(crate) const SAMPLE_STACK_USER: u64 = 1 << 13;

// Bits of the attr's flag word.
const DISABLED: u64 = 1 << 0;
const INHERIT: u64 = 1 << 1;
const EXCLUDE_KERNEL: u64 = 1 << 5;
const EXCLUDE_HV: u64 = 1 << 6;
const MMAP: u64 = 1 << 8;
const COMM: u64 = 1 << 9;
const ENABLE_ON_EXEC: u64 = 1 << 12;
const TASK: u64 = 1 << 13;
const WATERMARK: u64 = 1 << 14;
const SAMPLE_ID_ALL: u64 = 1 << 18;
const MMAP2: u64 = 1 << 23;
const COMM_EXEC: u64 = 1 << 24;
const USE_CLOCKID: u64 = 1 << 25;
const EXCLUDE_CALLCHAIN_USER: u64 = 1 << 22;
const CONTEXT_SWITCH: u64 = 1 << 26;

/// `struct perf_event_attr` (version 7 layout, 128 bytes).
#[repr(C)]
#[derive(Default)]
struct Attr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period_or_freq: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events_or_watermark: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
    aux_sample_size: u32,
    reserved_3: u32,
    sig_data: u64,
}

/// What to open.
pub(crate) struct EventSpec {
    pub hz: u32,
    pub regs_mask: u64,
    pub stack_bytes: u32,
    /// Start disabled, enabled when the task calls exec.
    pub enable_on_exec: bool,
    /// Ask the kernel for its own frames (`PERF_SAMPLE_CALLCHAIN` without
    /// the user part, which we unwind ourselves) and sample in kernel mode
    /// too; else count user time only (`exclude_kernel`, what
    /// `perf_event_paranoid` 2 allows an unprivileged user).
    pub kernel_callchain: bool,
    /// Every task of each CPU (pid -1): nothing to inherit.
    pub system_wide: bool,
}

/// Which event [`Event::open`] opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum EventKind {
    /// cpu-clock, sampled at `hz`, with the task's mmap, comm and fork
    /// records.
    CpuClock,
    /// context-switches, every one sampled (in the kernel, as the task
    /// leaves the CPU: the sample's user registers and stack are where it
    /// blocked), with `PERF_RECORD_SWITCH` records of its switches out and
    /// in. Needs kernel samples (root or `perf_event_paranoid` <= 1).
    Switches,
}

/// An open cpu-clock sampling event with its ring buffer.
pub(crate) struct Event {
    fd: i32,
    base: *mut u8,
    len: usize,
    data_size: u64,
}

impl Event {
    /// Opens a cpu-clock event on task `pid` while it runs on `cpu`,
    /// inherited by the threads and processes it creates, and maps `pages`
    /// data pages (a power of two); or, with `into` (an event of the same
    /// CPU, kind and spec), writes its records into `into`'s ring and maps
    /// none, as perf shares a ring per CPU among a process's threads. One
    /// per CPU: the kernel refuses to map an inherited event of every CPU.
    pub(crate) fn open(
        pid: i32,
        cpu: i32,
        spec: &EventSpec,
        kind: EventKind,
        pages: usize,
        into: Option<&Event>,
    ) -> io::Result<Event> {
        let switches = kind == EventKind::Switches;
        let mut attr = Attr {
            type_: PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<Attr>() as u32,
            config: PERF_COUNT_SW_CPU_CLOCK,
            // cpu-clock counts nanoseconds: a fixed period, not a frequency.
            sample_period_or_freq: 1_000_000_000 / spec.hz.max(1) as u64,
            sample_type: SAMPLE_IP
                | SAMPLE_TID
                | SAMPLE_TIME
                | SAMPLE_REGS_USER
                | SAMPLE_STACK_USER
                | if spec.kernel_callchain {
                    SAMPLE_CALLCHAIN
                } else {
                    0
                },
            flags: INHERIT
                | EXCLUDE_HV
                | if spec.kernel_callchain {
                    0
                } else {
                    EXCLUDE_KERNEL
                }
                | MMAP
                | COMM
                | TASK
                | WATERMARK
                | SAMPLE_ID_ALL
                | MMAP2
                | COMM_EXEC
                // Times on CLOCK_MONOTONIC, the clock the recorder's own
                // readings of the target (Python stacks) are stamped with.
                | USE_CLOCKID
                | if spec.kernel_callchain {
                    EXCLUDE_CALLCHAIN_USER
                } else {
                    0
                }
                | if spec.enable_on_exec {
                    DISABLED | ENABLE_ON_EXEC
                } else {
                    0
                },
            // Wake the reader when a quarter of the buffer is full.
            wakeup_events_or_watermark: (pages * page_size() / 4) as u32,
            sample_regs_user: spec.regs_mask,
            sample_stack_user: spec.stack_bytes,
            clockid: libc::CLOCK_MONOTONIC,
            ..Default::default()
        };
        if spec.system_wide {
            attr.flags &= !INHERIT;
        }
        if switches {
            attr.config = PERF_COUNT_SW_CONTEXT_SWITCHES;
            attr.sample_period_or_freq = 1;
            // Taken in the kernel (the scheduler); the task's records come
            // with the cpu-clock event.
            attr.flags &= !(EXCLUDE_KERNEL | MMAP | COMM | TASK | MMAP2 | COMM_EXEC);
            attr.flags |= CONTEXT_SWITCH;
        }
        // SAFETY: perf_event_open with a valid, fully initialized attr.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const Attr,
                pid,
                cpu,
                -1i32,
                PERF_FLAG_FD_CLOEXEC,
            )
        } as i32;
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(into) = into {
            // SAFETY: both fds are perf events of ours.
            let r = unsafe { libc::ioctl(fd, PERF_EVENT_IOC_SET_OUTPUT, into.fd) };
            if r != 0 {
                let e = io::Error::last_os_error();
                // SAFETY: our fd.
                unsafe { libc::close(fd) };
                return Err(e);
            }
            return Ok(Event {
                fd,
                base: std::ptr::null_mut(),
                len: 0,
                data_size: 0,
            });
        }
        let len = (pages + 1) * page_size();
        // SAFETY: mapping the event's ring buffer as perf_event_open(2) says.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: our fd.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(Event {
            fd,
            base: base.cast(),
            len,
            data_size: (pages * page_size()) as u64,
        })
    }

    /// The file descriptor (for poll).
    pub(crate) fn fd(&self) -> i32 {
        self.fd
    }

    /// Hands every complete record of the ring (with its 8-byte header)
    /// to `each`, then frees their space. A record is read where the
    /// kernel wrote it; only one that wraps around the ring's end is
    /// copied (into `scratch`) to be whole. Samples are large (the user
    /// stack copy): copying each one out first was a sixth of a
    /// whole-host recording's CPU.
    pub(crate) fn drain(&self, scratch: &mut Vec<u8>, mut each: impl FnMut(&[u8])) {
        if self.base.is_null() {
            return; // its records are in another event's ring
        }
        // SAFETY: the metadata page is mapped; data_head (offset 1024) is
        // written by the kernel, read with acquire ordering; data_tail (1032)
        // is ours. Data pages follow the metadata page. The kernel writes
        // only outside [tail, head) until we store a new tail, so the
        // slices handed out stay unchanged while `each` reads them.
        unsafe {
            let head_p = self.base.add(1024) as *const std::sync::atomic::AtomicU64;
            let tail_p = self.base.add(1032) as *const std::sync::atomic::AtomicU64;
            let head = (*head_p).load(std::sync::atomic::Ordering::Acquire);
            let tail = (*tail_p).load(std::sync::atomic::Ordering::Relaxed);
            let data = self.base.add(page_size());
            let ring = self.data_size as usize;
            let mut pos = tail;
            while pos < head {
                let at = |p: u64| data.add((p % self.data_size) as usize);
                let mut hdr = [0u8; 8];
                for (i, b) in hdr.iter_mut().enumerate() {
                    *b = *at(pos + i as u64);
                }
                let size = u16::from_le_bytes([hdr[6], hdr[7]]) as usize;
                if size < 8 || pos + size as u64 > head {
                    break;
                }
                let start = (pos % self.data_size) as usize;
                let first = (ring - start).min(size);
                if first == size {
                    each(std::slice::from_raw_parts(at(pos), size));
                } else {
                    scratch.clear();
                    scratch.extend_from_slice(std::slice::from_raw_parts(at(pos), first));
                    scratch.extend_from_slice(std::slice::from_raw_parts(data, size - first));
                    each(scratch);
                }
                pos += size as u64;
                // Freed record by record: the kernel may write again
                // while the next ones are handled.
                (*tail_p).store(pos, std::sync::atomic::Ordering::Release);
            }
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: our mapping and fd.
        unsafe {
            if !self.base.is_null() {
                libc::munmap(self.base.cast(), self.len);
            }
            libc::close(self.fd);
        }
    }
}

// SAFETY: the mapping is owned by the Event; only `drain` touches it.
unsafe impl Send for Event {}

/// The CPUs that may run the target (0..n).
pub(crate) fn cpus() -> i32 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).max(1) as i32
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Waits until one of `fds` is readable or `ms` pass.
pub(crate) fn poll(fds: &[i32], ms: i32) {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: a valid pollfd array.
    unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
}
