//! The few Win32 functions and structures the crash handler and its
//! helper call (kernel32's, and the C runtime's `signal`), declared by
//! hand: the crate has no Windows bindings dependency. Layouts are the x64
//! ones of winnt.h, minwinbase.h, processthreadsapi.h and tlhelp32.h.

#![allow(non_snake_case, non_camel_case_types, clippy::upper_case_acronyms)]

use core::ffi::c_void;

pub type HANDLE = *mut c_void;
pub type BOOL = i32;

pub const INVALID_HANDLE_VALUE: HANDLE = -1isize as HANDLE;
pub const STD_ERROR_HANDLE: u32 = -12i32 as u32;
pub const INFINITE: u32 = u32::MAX;
pub const WAIT_OBJECT_0: u32 = 0;

pub const FILE_APPEND_DATA: u32 = 4;
pub const FILE_SHARE_READ: u32 = 1;
pub const FILE_SHARE_WRITE: u32 = 2;
pub const OPEN_ALWAYS: u32 = 4;
pub const FILE_ATTRIBUTE_NORMAL: u32 = 0x80;

pub const HANDLE_FLAG_INHERIT: u32 = 1;
pub const DUPLICATE_SAME_ACCESS: u32 = 2;
pub const STARTF_USESTDHANDLES: u32 = 0x100;
pub const CREATE_UNICODE_ENVIRONMENT: u32 = 0x400;

pub const PROCESS_VM_READ: u32 = 0x10;
pub const PROCESS_QUERY_INFORMATION: u32 = 0x400;
pub const THREAD_SUSPEND_RESUME: u32 = 2;
pub const THREAD_GET_CONTEXT: u32 = 8;
pub const THREAD_QUERY_INFORMATION: u32 = 0x40;
pub const TH32CS_SNAPTHREAD: u32 = 4;
/// `CONTEXT_AMD64 | CONTEXT_CONTROL | CONTEXT_INTEGER | CONTEXT_SEGMENTS |
/// CONTEXT_FLOATING_POINT | CONTEXT_DEBUG_REGISTERS` (`CONTEXT_ALL`).
pub const CONTEXT_ALL: u32 = 0x0010_001f;
/// `sizeof(CONTEXT)` on x64.
pub const CONTEXT_SIZE: usize = 1232;
/// `ContextFlags` in an x64 `CONTEXT`.
pub const CONTEXT_FLAGS_OFFSET: usize = 0x30;

/// `SIGABRT` of the C runtime (msvcrt and UCRT alike).
pub const SIGABRT: i32 = 22;

/// An x64 `CONTEXT`, 16-byte aligned as `GetThreadContext` needs.
#[repr(C, align(16))]
pub struct Context(pub [u8; CONTEXT_SIZE]);

/// `EXCEPTION_RECORD` (x64).
#[repr(C)]
pub struct EXCEPTION_RECORD {
    pub ExceptionCode: u32,
    pub ExceptionFlags: u32,
    pub ExceptionRecord: *mut EXCEPTION_RECORD,
    pub ExceptionAddress: *mut c_void,
    pub NumberParameters: u32,
    pub ExceptionInformation: [usize; 15],
}

/// `EXCEPTION_POINTERS`.
#[repr(C)]
pub struct EXCEPTION_POINTERS {
    pub ExceptionRecord: *mut EXCEPTION_RECORD,
    pub ContextRecord: *mut c_void,
}

pub type TopLevelFilter = unsafe extern "system" fn(*mut EXCEPTION_POINTERS) -> i32;

#[repr(C)]
pub struct SECURITY_ATTRIBUTES {
    pub nLength: u32,
    pub lpSecurityDescriptor: *mut c_void,
    pub bInheritHandle: BOOL,
}

#[repr(C)]
pub struct STARTUPINFOW {
    pub cb: u32,
    pub lpReserved: *mut u16,
    pub lpDesktop: *mut u16,
    pub lpTitle: *mut u16,
    pub dwX: u32,
    pub dwY: u32,
    pub dwXSize: u32,
    pub dwYSize: u32,
    pub dwXCountChars: u32,
    pub dwYCountChars: u32,
    pub dwFillAttribute: u32,
    pub dwFlags: u32,
    pub wShowWindow: u16,
    pub cbReserved2: u16,
    pub lpReserved2: *mut u8,
    pub hStdInput: HANDLE,
    pub hStdOutput: HANDLE,
    pub hStdError: HANDLE,
}

#[repr(C)]
pub struct PROCESS_INFORMATION {
    pub hProcess: HANDLE,
    pub hThread: HANDLE,
    pub dwProcessId: u32,
    pub dwThreadId: u32,
}

#[repr(C)]
pub struct THREADENTRY32 {
    pub dwSize: u32,
    pub cntUsage: u32,
    pub th32ThreadID: u32,
    pub th32OwnerProcessID: u32,
    pub tpBasePri: i32,
    pub tpDeltaPri: i32,
    pub dwFlags: u32,
}

#[repr(C)]
pub struct MEMORY_BASIC_INFORMATION {
    pub BaseAddress: usize,
    pub AllocationBase: usize,
    pub AllocationProtect: u32,
    pub PartitionId: u16,
    pub RegionSize: usize,
    pub State: u32,
    pub Protect: u32,
    pub Type: u32,
}
pub const MEM_COMMIT: u32 = 0x1000;

#[repr(C)]
pub struct SYSTEM_INFO {
    pub wProcessorArchitecture: u16,
    pub wReserved: u16,
    pub dwPageSize: u32,
    pub lpMinimumApplicationAddress: usize,
    pub lpMaximumApplicationAddress: usize,
    pub dwActiveProcessorMask: usize,
    pub dwNumberOfProcessors: u32,
    pub dwProcessorType: u32,
    pub dwAllocationGranularity: u32,
    pub wProcessorLevel: u16,
    pub wProcessorRevision: u16,
}

/// `RTL_OSVERSIONINFOW`.
#[repr(C)]
pub struct OSVERSIONINFOW {
    pub dwOSVersionInfoSize: u32,
    pub dwMajorVersion: u32,
    pub dwMinorVersion: u32,
    pub dwBuildNumber: u32,
    pub dwPlatformId: u32,
    pub szCSDVersion: [u16; 128],
}

#[link(name = "kernel32")]
unsafe extern "system" {
    pub fn GetCurrentThreadId() -> u32;
    pub fn GetCurrentProcessId() -> u32;
    pub fn GetCurrentProcess() -> HANDLE;
    pub fn DuplicateHandle(
        src_process: HANDLE,
        src: HANDLE,
        dst_process: HANDLE,
        dst: *mut HANDLE,
        access: u32,
        inherit: BOOL,
        options: u32,
    ) -> BOOL;
    pub fn GetStdHandle(which: u32) -> HANDLE;
    pub fn WriteFile(
        h: HANDLE,
        buf: *const u8,
        len: u32,
        written: *mut u32,
        ov: *mut c_void,
    ) -> BOOL;
    pub fn CreateFileW(
        name: *const u16,
        access: u32,
        share: u32,
        sa: *mut SECURITY_ATTRIBUTES,
        disposition: u32,
        flags: u32,
        template: HANDLE,
    ) -> HANDLE;
    pub fn CloseHandle(h: HANDLE) -> BOOL;
    pub fn CreateEventW(
        sa: *mut SECURITY_ATTRIBUTES,
        manual: BOOL,
        initial: BOOL,
        name: *const u16,
    ) -> HANDLE;
    pub fn SetEvent(h: HANDLE) -> BOOL;
    pub fn WaitForSingleObject(h: HANDLE, ms: u32) -> u32;
    pub fn AddVectoredExceptionHandler(first: u32, f: TopLevelFilter) -> *mut c_void;
    pub fn SetUnhandledExceptionFilter(f: Option<TopLevelFilter>) -> Option<TopLevelFilter>;
    pub fn CreatePipe(
        read: *mut HANDLE,
        write: *mut HANDLE,
        sa: *mut SECURITY_ATTRIBUTES,
        size: u32,
    ) -> BOOL;
    pub fn SetHandleInformation(h: HANDLE, mask: u32, flags: u32) -> BOOL;
    pub fn CreateProcessW(
        app: *const u16,
        cmd: *mut u16,
        psa: *mut SECURITY_ATTRIBUTES,
        tsa: *mut SECURITY_ATTRIBUTES,
        inherit: BOOL,
        flags: u32,
        env: *mut c_void,
        dir: *const u16,
        si: *mut STARTUPINFOW,
        pi: *mut PROCESS_INFORMATION,
    ) -> BOOL;
    pub fn TerminateProcess(h: HANDLE, code: u32) -> BOOL;
    pub fn GetExitCodeProcess(h: HANDLE, code: *mut u32) -> BOOL;
    pub fn GetCommandLineW() -> *const u16;
    pub fn QueryPerformanceCounter(v: *mut i64) -> BOOL;
    pub fn QueryPerformanceFrequency(v: *mut i64) -> BOOL;
    pub fn RtlCaptureContext(ctx: *mut Context);
    pub fn Sleep(ms: u32);
    pub fn GetLastError() -> u32;
    pub fn OpenProcess(access: u32, inherit: BOOL, pid: u32) -> HANDLE;
    pub fn ReadProcessMemory(
        h: HANDLE,
        addr: *const c_void,
        buf: *mut c_void,
        len: usize,
        read: *mut usize,
    ) -> BOOL;
    pub fn CreateToolhelp32Snapshot(flags: u32, pid: u32) -> HANDLE;
    pub fn Thread32First(snap: HANDLE, e: *mut THREADENTRY32) -> BOOL;
    pub fn Thread32Next(snap: HANDLE, e: *mut THREADENTRY32) -> BOOL;
    pub fn OpenThread(access: u32, inherit: BOOL, tid: u32) -> HANDLE;
    pub fn SuspendThread(h: HANDLE) -> u32;
    pub fn ResumeThread(h: HANDLE) -> u32;
    pub fn GetThreadContext(h: HANDLE, ctx: *mut Context) -> BOOL;
    pub fn VirtualQueryEx(
        h: HANDLE,
        addr: *const c_void,
        info: *mut MEMORY_BASIC_INFORMATION,
        len: usize,
    ) -> usize;
    pub fn GetSystemInfo(info: *mut SYSTEM_INFO);
}

#[link(name = "ntdll")]
unsafe extern "system" {
    pub fn RtlGetVersion(info: *mut OSVERSIONINFOW) -> i32;
    /// Class 0 (`ProcessBasicInformation`): the PEB's address at offset 8
    /// of the 48-byte answer.
    pub fn NtQueryInformationProcess(
        h: HANDLE,
        class: u32,
        info: *mut c_void,
        len: u32,
        ret: *mut u32,
    ) -> i32;
    /// Class 0 (`ThreadBasicInformation`): the TEB's address at offset 8
    /// of the 48-byte answer.
    pub fn NtQueryInformationThread(
        h: HANDLE,
        class: u32,
        info: *mut c_void,
        len: u32,
        ret: *mut u32,
    ) -> i32;
}

unsafe extern "C" {
    /// The C runtime's `signal` (msvcrt's, or the UCRT's).
    pub fn signal(sig: i32, handler: usize) -> usize;
}
