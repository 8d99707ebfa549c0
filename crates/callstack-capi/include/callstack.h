/* callstack: fast and exact call-stack capture. C API.
 *
 * Link with libcallstack.a (plus -lpthread -ldl -lm) or libcallstack.so.
 * Build your code with -fno-omit-frame-pointer for callstack_capture_fast.
 */
#ifndef CALLSTACK_H
#define CALLSTACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Walks the frame-pointer chain of the calling thread.
 * out[0] is a return address inside the function that called
 * callstack_capture_fast; `skip` drops that many more entries.
 * Writes at most `max` entries and returns how many it wrote.
 * A null `out` or max == 0 returns 0.
 * No allocation, no lock, no system call (but a one-time stack-bounds
 * lookup per thread); async-signal-safe; never faults on a corrupt chain.
 * On Windows x64 the chain ends at a frame whose rbp does not point at its
 * saved rbp (gcc points it into big frames there): see
 * callstack_capture_exact. */
uint32_t callstack_capture_fast(uint32_t skip, uint32_t max, uintptr_t* out);

/* Unwinds the calling thread's stack exactly, from DWARF CFI (.eh_frame):
 * right for code built without frame pointers, glibc included.
 * Same contract as callstack_capture_fast: out[0] is a return address
 * inside the function that called callstack_capture_exact; `skip` drops
 * that many more; writes at most `max` entries and returns how many.
 * A null `out` or max == 0 returns 0.
 * Passes through PLT stubs, signal frames (from a signal handler it goes on
 * into the interrupted code), alloca frames, leaf functions and code
 * without CFI but with a frame pointer; ends at the thread's first frame.
 * No allocation, no lock, no system call (but a one-time stack-bounds
 * lookup per thread); async-signal-safe; never faults on a corrupt stack.
 * Works without any set-up on glibc 2.35+; see callstack_prepare.
 * On Windows x64: from the loaded images' .pdata/.xdata unwind data
 * instead, with the stack's bounds from the thread's TEB. */
uint32_t callstack_capture_exact(uint32_t skip, uint32_t max, uintptr_t* out);

/* Unwinds the code a signal interrupted, from a signal handler's third
 * argument (`void* ucontext`, a ucontext_t*): out[0] is the interrupted pc
 * (exact, not a return address), out[1] the return address into its
 * caller, and so on. Writes at most `max` entries and returns how many.
 * A null `ucontext` or `out`, or max == 0, returns 0. Async-signal-safe:
 * meant for SIGPROF handlers.
 * On Windows x64, `ucontext` is a CONTEXT* instead (a vectored exception
 * handler's ExceptionInfo->ContextRecord). */
uint32_t callstack_capture_from_context(const void* ucontext, uint32_t max, uintptr_t* out);

/* Optional: compile the unwind tables of every loaded object now, so that
 * exact captures are at full speed from the first one. Needed once before
 * capturing with glibc older than 2.35; call it again after dlclose.
 * NOT async-signal-safe (allocates, takes the loader's lock). */
void callstack_prepare(void);

/* A fast 64-bit hash of `count` addresses, for grouping equal stacks.
 * Stable within a process. A null `frames` hashes as an empty list. */
uint64_t callstack_hash(const uintptr_t* frames, uint32_t count);

/* Optional: look up the calling thread's stack bounds now, so that its
 * first capture makes no system call either. NOT async-signal-safe (asks
 * glibc for the thread's stack: takes the thread's lock, allocates). */
void callstack_prepare_thread(void);

/* Crash reports. Installs handlers for SIGSEGV, SIGBUS, SIGILL, SIGFPE,
 * SIGABRT and SIGTRAP, running on an alternate signal stack. On a crash:
 *  1. the raw report, written in the handler with async-signal-safe calls
 *     only and no allocation: the signal and its code in words, the thread
 *     id and name, and every frame as address, module, offset, build-id;
 *     to stderr and, if report_path_or_null is not NULL, appended to that
 *     file;
 *  2. the symbolized report (function, file:line, inlined frames), printed
 *     by a helper process started with a raw clone + execve (never in the
 *     crashed process: the crash may be inside malloc) and waited for with
 *     a timeout (default 5 s). The helper is $CALLSTACK_CRASH_HELPER if set
 *     ("none" skips this step), else the `callstack` binary next to the
 *     executable or on PATH, else this program itself, re-executed with
 *     CALLSTACK_CRASH_SYMBOLIZE=1: then this very call symbolizes the
 *     report read on stdin and exits. So call it first thing in main().
 *     $CALLSTACK_CRASH_TIMEOUT_MS sets the timeout;
 *     If $CALLSTACK_CRASH_MINIDUMP_DIR names a directory, the helper first
 *     writes a minidump there (see the function below);
 *  3. the previous handler of the signal runs, or the default action: the
 *     process dies as it would have without us (same status, same core).
 * Returns 0 on success, -1 on failure (errno set). Not async-signal-safe. */
int callstack_install_crash_handler(const char* report_path_or_null);

/* callstack_install_crash_handler, and on a crash a minidump (the format
 * crash services such as Sentry, Socorro and Breakpad's tools read: every
 * thread's registers and stack, the modules with their build-ids, the
 * signal) written into minidump_dir_or_null (created if missing) as
 * <exe>-<pid>-<unix-seconds>.dmp. The helper process writes it, reading
 * every thread of the crashed process with ptrace, before the symbolized
 * report, which names the file on a "minidump: PATH" line; it does not use
 * the crashed process's heap or locks. NULL falls back to
 * $CALLSTACK_CRASH_MINIDUMP_DIR, else no dump. Returns 0 on success, -1 on
 * failure (errno set). Not async-signal-safe. */
int callstack_install_crash_handler_with_minidumps(const char* report_path_or_null,
                                                   const char* minidump_dir_or_null);

/* Gives the calling thread its own alternate signal stack, so that a stack
 * overflow on it is reported too. Alternate stacks are per thread: call
 * this at the start of every thread you create (the installing thread has
 * one already). Without it, other crashes of that thread are still
 * reported. Idempotent. Returns 0 on success, -1 on failure. */
int callstack_crash_thread_init(void);

/* Symbolizing. Both functions below share one symbolizer per process,
 * built on first use from the loaded objects (their DWARF, else symbol
 * tables) and kept, with its caches, until exit; objects loaded later by
 * dlopen are picked up. They are thread-safe (one lock) and NOT
 * async-signal-safe (they allocate and lock): in a signal handler, capture
 * only, and symbolize later or elsewhere (see the crash handler above). */

/* Flag: the address is an exact pc (a fault's pc, out[0] of
 * callstack_capture_from_context), not a return address. A return address
 * (every entry of callstack_capture_fast/exact) is looked up at addr - 1,
 * the call instruction. */
#define CALLSTACK_SYMBOLIZE_EXACT 1u

#define CALLSTACK_EINVAL (-1)    /* invalid arguments */
#define CALLSTACK_ENOMODULE (-2) /* no loaded object contains the address */
#define CALLSTACK_EIO (-3)       /* write failed, errno set */

/* Names `addr` into `buf`, the caller's buffer of `len` bytes: the text is
 * NUL-terminated and truncated to len - 1 bytes. One line per level,
 * innermost inlined function first, the real function last:
 *   "function at file:line", "(inlined) function at file:line",
 *   or "?? (module+0xoffset)" when nothing names the address.
 * Returns the length of the whole text without the NUL (as snprintf: a
 * value >= len means it was truncated; call again with a larger buffer),
 * CALLSTACK_ENOMODULE (buf gets "") or CALLSTACK_EINVAL (buf NULL with
 * len > 0). Nothing returned points into the library's memory.
 * Absent from a library built with `--no-default-features` (no
 * `symbolize` feature), as is callstack_print_trace. */
int callstack_symbolize(uintptr_t addr, uint32_t flags, char* buf, size_t len);

/* 1 when the calling thread's stack passes through a function named
 * `name`, 0 when not: the whole name as the symbolizer gives it
 * ("ns::f(int)", "main") or a prefix of it ending before "::", "(" or "<"
 * ("ns::f", "ns"); inlined frames count. CALLSTACK_EINVAL when `name` is
 * NULL or not UTF-8. The first call from a site names its frames (reads
 * debug info); later ones cost an exact capture and a cache probe per
 * frame. Not async-signal-safe. Absent without the `symbolize` feature. */
int callstack_called_from(const char* name);

/* callstack_called_from for any of `count` names, in one walk. */
int callstack_called_from_any(const char* const* names, uint32_t count);

/* Writes `count` frames to the file descriptor `fd`, one line per level:
 *   "#N   0x00005555deadbeef in function at file:line"
 * frames[0] is a return address unless `flags` has
 * CALLSTACK_SYMBOLIZE_EXACT; the others always are. Returns 0,
 * CALLSTACK_EINVAL (frames NULL with count > 0) or CALLSTACK_EIO. */
int callstack_print_trace(const uintptr_t* frames, uint32_t count, uint32_t flags, int fd);

/* Exit hooks (x86-64 Linux). Runs hook(arg) right after the frame `depth`
 * levels up returns (0: the function calling this; 1: its caller), by
 * replacing that frame's return address with a trampoline that saves the
 * return registers (rax, rdx, xmm0, xmm1, a long double in st0/st1), calls
 * the hook, restores them and returns to the original address. Several
 * hooks may stand on one thread; hooks on one frame run last installed
 * first. Captures (fast, exact, from a context, the crash handler,
 * `callstack pstack`) report the original return address; the trampoline
 * has CFI, so C++ exceptions, glibc backtrace() and gdb pass through it.
 * longjmp (or an exception caught further up) over a hooked frame skips its
 * hook: counted by callstack_exit_hook_skipped(), as are the hooks still
 * pending when a thread ends (pthread_exit, cancellation). Hooks may be
 * pending on several stacks of a thread (makecontext coroutines, a
 * sigaltstack) and return in any order. A hook must not unwind
 * (throw). Returns 0, or -1 when the frame cannot be hooked. Not
 * async-signal-safe. */
int callstack_exit_hook_install(uint32_t depth, void (*hook)(void*), void* arg);

/* Hooks skipped so far because their frame never returned (see above). */
uint64_t callstack_exit_hook_skipped(void);

#ifdef __cplusplus
}
#endif

#endif /* CALLSTACK_H */
