/* callstack: fast and exact call-stack capture. C API.
 *
 * Link with libcallstack.a (plus -lpthread -ldl -lm) or libcallstack.so.
 * Build your code with -fno-omit-frame-pointer for callstack_capture_fast.
 */
#ifndef CALLSTACK_H
#define CALLSTACK_H

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
 * lookup per thread); async-signal-safe; never faults on a corrupt chain. */
uint32_t callstack_capture_fast(uint32_t skip, uint32_t max, uintptr_t* out);

/* A fast 64-bit hash of `count` addresses, for grouping equal stacks.
 * Stable within a process. A null `frames` hashes as an empty list. */
uint64_t callstack_hash(const uintptr_t* frames, uint32_t count);

/* Optional: look up the calling thread's stack bounds now, so that its
 * first capture makes no system call either. */
void callstack_prepare_thread(void);

#ifdef __cplusplus
}
#endif

#endif /* CALLSTACK_H */
