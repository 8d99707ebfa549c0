//! The Windows helper's minidump: the crashed process read from outside
//! (`OpenProcess`, `ReadProcessMemory`, the threads suspended for
//! `GetThreadContext`), laid out by [`crate::minidump::windows`].
//!
//! The crashed process waits meanwhile: its crashed thread in the
//! unhandled-exception filter, its handler thread for this helper. The
//! crashed thread's registers are the exception's `CONTEXT` (read at the
//! address the crash context names), not what `GetThreadContext` says (the
//! filter's wait). The modules come from the loader's list in the crashed
//! process's PEB (the layout `sys/windows/loader.rs` reads in-process),
//! each with its PE header's timestamp, checksum and size and its CodeView
//! record (`RSDS`), the key symbol servers index PDBs by.

use std::path::{Path, PathBuf};

use super::context::CrashContext;
use crate::minidump::windows::{self as md, Dump, CONTEXT_SIZE};
use crate::sys::windows::api as w;
use crate::sys::windows::api::HANDLE;
use crate::sys::windows::loader::{
    ENTRY_DLL_BASE, ENTRY_FULL_NAME, ENTRY_SIZE_OF_IMAGE, LDR_IN_LOAD_ORDER, MAX_MODULES, PEB_LDR,
};

/// What the report says of a dump.
pub(crate) struct Stats {
    pub(crate) threads: usize,
    pub(crate) modules: usize,
    pub(crate) bytes: u64,
}

/// The crashed thread's stack kept at most.
const CRASH_STACK: usize = 16 << 20;
/// Another thread's.
const OTHER_STACK: usize = 1 << 20;

/// A handle closed on drop.
struct Owned(HANDLE);

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.0.is_null() && self.0 != w::INVALID_HANDLE_VALUE {
            // SAFETY: a handle this module opened and owns.
            unsafe { w::CloseHandle(self.0) };
        }
    }
}

/// Reads of the crashed process.
struct Process(Owned);

impl Process {
    /// `len` bytes at `addr`, or as many as are readable from there (down
    /// to none), by halving.
    fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        let mut want = len;
        while want > 0 {
            let mut got = 0usize;
            // SAFETY: `buf` holds `want` writable bytes.
            let ok = unsafe {
                w::ReadProcessMemory(
                    self.0 .0,
                    addr as usize as *const core::ffi::c_void,
                    buf.as_mut_ptr().cast(),
                    want,
                    &mut got,
                )
            };
            if ok != 0 || got > 0 {
                buf.truncate(if ok != 0 { want } else { got });
                return buf;
            }
            want /= 2;
        }
        Vec::new()
    }

    fn exact(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let b = self.read(addr, len);
        (b.len() == len).then_some(b)
    }

    fn u64(&self, addr: u64) -> Option<u64> {
        Some(u64::from_le_bytes(self.exact(addr, 8)?.try_into().ok()?))
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The loaded images of the process whose PEB is at `peb`.
fn modules(p: &Process, peb: u64) -> Vec<md::Module> {
    let mut out = Vec::new();
    let Some(ldr) = p.u64(peb + PEB_LDR as u64).filter(|&l| l != 0) else {
        return out;
    };
    let head = ldr + LDR_IN_LOAD_ORDER as u64;
    let mut e = p.u64(head).unwrap_or(0);
    for _ in 0..MAX_MODULES {
        if e == head || e == 0 {
            break;
        }
        let Some(entry) = p.exact(e, ENTRY_FULL_NAME + 16) else {
            break;
        };
        let base = u64_at(&entry, ENTRY_DLL_BASE).unwrap_or(0);
        let size = u32_at(&entry, ENTRY_SIZE_OF_IMAGE).unwrap_or(0);
        let name_len = u16_at(&entry, ENTRY_FULL_NAME).unwrap_or(0) as usize;
        let name_ptr = u64_at(&entry, ENTRY_FULL_NAME + 8).unwrap_or(0);
        let units: Vec<u16> = p
            .read(name_ptr, name_len)
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        if base != 0 && size != 0 {
            let mut m = md::Module {
                base,
                size,
                name: String::from_utf16_lossy(&units),
                ..Default::default()
            };
            pe_fields(p, &mut m);
            out.push(m);
        }
        e = u64_at(&entry, 0).unwrap_or(0);
    }
    out
}

/// A module's timestamp, checksum and CodeView record from its headers.
fn pe_fields(p: &Process, m: &mut md::Module) {
    let h = p.read(m.base, 0x1000);
    let Some(pe) = u32_at(&h, 0x3c).map(|v| v as usize) else {
        return;
    };
    if u16_at(&h, 0) != Some(0x5a4d) || u32_at(&h, pe) != Some(0x4550) {
        return;
    }
    m.timestamp = u32_at(&h, pe + 8).unwrap_or(0);
    let opt = pe + 24;
    if u16_at(&h, opt) != Some(0x20b) {
        return; // not PE32+
    }
    m.checksum = u32_at(&h, opt + 64).unwrap_or(0);
    let dirs = u32_at(&h, opt + 108).unwrap_or(0);
    if dirs <= 6 {
        return;
    }
    let (Some(rva), Some(size)) = (u32_at(&h, opt + 112 + 48), u32_at(&h, opt + 112 + 52)) else {
        return;
    };
    if rva == 0 || size == 0 || size > 28 * 64 || rva >= m.size {
        return;
    }
    let table = p.read(m.base + rva as u64, size as usize);
    for d in table.chunks_exact(28) {
        let (kind, len, at) = (
            u32_at(d, 12).unwrap_or(0),
            u32_at(d, 16).unwrap_or(0),
            u32_at(d, 20).unwrap_or(0),
        );
        if kind == 2 && at != 0 && (24..4096).contains(&len) && at < m.size {
            let cv = p.read(m.base + at as u64, len as usize);
            if cv.starts_with(b"RSDS") {
                m.cv = cv;
                return;
            }
        }
    }
}

/// The threads of process `pid`, by id.
fn thread_ids(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    // SAFETY: a toolhelp snapshot walked with a sized entry, then closed.
    unsafe {
        let snap = Owned(w::CreateToolhelp32Snapshot(w::TH32CS_SNAPTHREAD, 0));
        if snap.0 == w::INVALID_HANDLE_VALUE {
            return out;
        }
        let mut e: w::THREADENTRY32 = core::mem::zeroed();
        e.dwSize = core::mem::size_of::<w::THREADENTRY32>() as u32;
        let mut ok = w::Thread32First(snap.0, &mut e);
        while ok != 0 {
            if e.th32OwnerProcessID == pid {
                out.push(e.th32ThreadID);
            }
            ok = w::Thread32Next(snap.0, &mut e);
        }
    }
    out
}

/// A suspended thread, resumed on drop.
struct Suspended(Owned);

impl Drop for Suspended {
    fn drop(&mut self) {
        // SAFETY: a thread handle we suspended once.
        unsafe { w::ResumeThread(self.0 .0) };
    }
}

/// The stack of a thread whose stack pointer is `sp`: from `sp` to the end
/// of its committed region, at most `limit` bytes. After a stack overflow
/// `sp` may stand below the committed stack: then from the first committed
/// page above it (within 64 KiB).
fn stack(p: &Process, sp: u64, limit: usize) -> (u64, Vec<u8>) {
    let mut at = sp;
    for _ in 0..17 {
        // SAFETY: a query into a sized, writable structure.
        let mut mbi: w::MEMORY_BASIC_INFORMATION = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        let n = unsafe {
            w::VirtualQueryEx(
                p.0 .0,
                at as usize as *const core::ffi::c_void,
                &mut mbi,
                core::mem::size_of::<w::MEMORY_BASIC_INFORMATION>(),
            )
        };
        if n == 0 {
            break;
        }
        // Committed, and neither a guard page nor inaccessible.
        if mbi.State == w::MEM_COMMIT && mbi.Protect & 0x101 == 0 {
            let end = (mbi.BaseAddress + mbi.RegionSize) as u64;
            let len = (end.saturating_sub(at) as usize).min(limit);
            return (at, p.read(at, len));
        }
        at = (at | 0xfff) + 1;
    }
    (sp, Vec::new())
}

fn rip_rsp(ctx: &[u8]) -> (u64, u64) {
    (
        u64_at(ctx, 0xf8).unwrap_or(0),
        u64_at(ctx, 0x98).unwrap_or(0),
    )
}

/// Writes the minidump of the crash `c` into `dir`.
pub(crate) fn write(c: &CrashContext, dir: &Path) -> Result<(PathBuf, Stats), String> {
    let (code, record_at, context_at) =
        c.exception.ok_or("the crash context names no exception")?;
    // SAFETY: a plain call; the handle is owned.
    let handle =
        unsafe { w::OpenProcess(w::PROCESS_VM_READ | w::PROCESS_QUERY_INFORMATION, 0, c.pid) };
    if handle.is_null() {
        return Err(format!(
            "cannot open process {}: {}",
            c.pid,
            std::io::Error::last_os_error()
        ));
    }
    let p = Process(Owned(handle));
    let mut info = [0u8; 48];
    // SAFETY: a 48-byte buffer for ProcessBasicInformation.
    let st = unsafe {
        w::NtQueryInformationProcess(
            p.0 .0,
            0,
            info.as_mut_ptr().cast(),
            48,
            core::ptr::null_mut(),
        )
    };
    let peb = if st >= 0 {
        u64_at(&info, 8).unwrap_or(0)
    } else {
        0
    };
    let record = p
        .exact(record_at, 152)
        .ok_or("cannot read the exception record")?;
    let crash_ctx = p
        .exact(context_at, CONTEXT_SIZE)
        .ok_or("cannot read the exception's CONTEXT")?;
    let n = (u32_at(&record, 24).unwrap_or(0) as usize).min(15);
    let exception = md::Exception {
        thread: c.tid,
        code,
        flags: u32_at(&record, 4).unwrap_or(0),
        record: u64_at(&record, 8).unwrap_or(0),
        address: u64_at(&record, 16).unwrap_or(0),
        parameters: (0..n)
            .map(|i| u64_at(&record, 32 + 8 * i).unwrap_or(0))
            .collect(),
        context: crash_ctx.clone(),
    };

    // Stop every other thread while its registers and stack are read.
    let mut held = Vec::new();
    let mut threads = Vec::new();
    let mut memory = Vec::new();
    for tid in thread_ids(c.pid) {
        // SAFETY: plain calls; the handle is owned (and resumed on drop).
        let h = unsafe {
            w::OpenThread(
                w::THREAD_SUSPEND_RESUME | w::THREAD_GET_CONTEXT | w::THREAD_QUERY_INFORMATION,
                0,
                tid,
            )
        };
        if h.is_null() {
            continue;
        }
        // SAFETY: a thread handle with THREAD_SUSPEND_RESUME.
        if unsafe { w::SuspendThread(h) } == u32::MAX {
            drop(Owned(h));
            continue;
        }
        let t = Suspended(Owned(h));
        let mut tbi = [0u8; 48];
        // SAFETY: a 48-byte buffer for ThreadBasicInformation.
        let teb = if unsafe {
            w::NtQueryInformationThread(h, 0, tbi.as_mut_ptr().cast(), 48, core::ptr::null_mut())
        } >= 0
        {
            u64_at(&tbi, 8).unwrap_or(0)
        } else {
            0
        };
        let ctx = if tid == c.tid {
            crash_ctx.clone()
        } else {
            let mut ctx = w::Context([0; w::CONTEXT_SIZE]);
            ctx.0[w::CONTEXT_FLAGS_OFFSET..w::CONTEXT_FLAGS_OFFSET + 4]
                .copy_from_slice(&w::CONTEXT_ALL.to_le_bytes());
            // SAFETY: an aligned CONTEXT with its flags set.
            if unsafe { w::GetThreadContext(h, &mut ctx) } == 0 {
                continue;
            }
            ctx.0.to_vec()
        };
        let (pc, sp) = rip_rsp(&ctx);
        let limit = if tid == c.tid {
            CRASH_STACK
        } else {
            OTHER_STACK
        };
        let st = stack(&p, sp, limit);
        let around = p.read(pc.saturating_sub(128), 256);
        if !around.is_empty() {
            memory.push((pc.saturating_sub(128), around));
        }
        threads.push(md::Thread {
            id: tid,
            teb,
            context: ctx,
            stack: st,
        });
        held.push(t);
    }
    let modules = modules(&p, peb);
    drop(held);

    // SAFETY: sized out-parameters.
    let (si, ver) = unsafe {
        let mut si: w::SYSTEM_INFO = core::mem::zeroed();
        w::GetSystemInfo(&mut si);
        let mut v: w::OSVERSIONINFOW = core::mem::zeroed();
        v.dwOSVersionInfoSize = core::mem::size_of::<w::OSVERSIONINFOW>() as u32;
        w::RtlGetVersion(&mut v);
        (si, v)
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let dump = Dump {
        pid: c.pid,
        time: now as u32,
        threads,
        modules,
        memory,
        exception: Some(exception),
        system: md::System {
            processors: si.dwNumberOfProcessors.min(255) as u8,
            level: si.wProcessorLevel,
            revision: si.wProcessorRevision,
            version: (ver.dwMajorVersion, ver.dwMinorVersion, ver.dwBuildNumber),
        },
    };
    let bytes = md::assemble(&dump).map_err(|e| e.to_string())?;
    let exe = dump
        .modules
        .first()
        .and_then(|m| m.name.rsplit(['\\', '/']).next())
        .map(|n| {
            n.strip_suffix(".exe")
                .or(n.strip_suffix(".EXE"))
                .unwrap_or(n)
                .to_string()
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "process".into());
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{exe}-{}-{now}.dmp", c.pid));
    std::fs::write(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((
        path,
        Stats {
            threads: dump.threads.len(),
            modules: dump.modules.len(),
            bytes: bytes.len() as u64,
        },
    ))
}
