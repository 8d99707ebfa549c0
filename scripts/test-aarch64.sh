#!/usr/bin/env bash
# The in-process tests on AArch64: the crate and its tests built for
# aarch64-unknown-linux-gnu and run under qemu-user on this (x86-64) host.
# Run by scripts/test.sh; on its own: `bash scripts/test-aarch64.sh`.
#
# Which tests: the library's unit tests and the in-process ones
# (capture_fast; capture_exact with and without frame pointers, through
# dlopen/dlclose, on a process's first capture, in a SIGPROF storm; the
# no-allocation and signal-safety checks; called_from through a shared
# library built by the cross compiler; Rust crash reports; the sampling
# profiler; the symbolizer's API; exit hooks on Rust frames and on C frames
# of a library built by the cross compiler, on coroutines, in a SIGPROF
# storm). The tests that drive gdb, cores, the CLI
# or the C API stay host-only. Needs the aarch64 standard library (rustup
# installs it here when it can; without it the stage says so and is
# skipped: set CALLSTACK_REQUIRE_AARCH64=1 to make that an error).
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
if [ "$(uname -m)" = aarch64 ]; then
    echo "aarch64 host: the workspace's tests already ran natively" >&2
    exit 0
fi
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    if ! rustup target add "$target" >&2; then
        msg="the $target standard library could not be installed (rustup target add): AArch64 in-process tests skipped"
        if [ -n "${CALLSTACK_REQUIRE_AARCH64:-}" ]; then
            echo "error: $msg" >&2
            exit 1
        fi
        echo "warning: $msg" >&2
        exit 0
    fi
fi
sysroot=/usr/aarch64-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $sysroot"
export CALLSTACK_TEST_CC=aarch64-linux-gnu-gcc
export CALLSTACK_TEST_QEMU=1
# dlopen of the cross-built fixtures finds the guest's libc through -L.
cargo test --target "$target" -p callstack --lib \
    --test capture_fast --test exact_rust --test exact_rust_nofp \
    --test exact_dlopen --test exact_first_capture --test exact_storm \
    --test no_alloc --test signal_safety --test called_from \
    --test crash_rust --test profiler --test symbolize_api \
    --test exit_hook --test exit_hook_c --test exit_hook_stacks \
    --test exit_hook_storm "$@"
