#!/usr/bin/env bash
# The in-process tests on RISC-V 64: the crate and its tests built for
# riscv64gc-unknown-linux-gnu and run under qemu-user on this host.
# Run by scripts/test.sh; on its own: `bash scripts/test-riscv64.sh`.
#
# Which tests: the library's unit tests and the in-process ones that apply
# to an architecture with CFI, frame records, signal frames and prologue
# analysis (capture_exact through a C library without CFI) but no exit
# hooks or profiler yet (see the list below).
# The tests that drive gdb, cores, the CLI or the C API stay host-only.
# Needs the riscv64 standard library (rustup installs it here when it can;
# without it the stage says so and is skipped: set
# CALLSTACK_REQUIRE_RISCV64=1 to make that an error).
set -euo pipefail
cd "$(dirname "$0")/.."
target=riscv64gc-unknown-linux-gnu
if [ "$(uname -m)" = riscv64 ]; then
    echo "riscv64 host: the workspace's tests already ran natively" >&2
    exit 0
fi
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    if ! rustup target add "$target" >&2; then
        msg="the $target standard library could not be installed (rustup target add): RISC-V 64 in-process tests skipped"
        if [ -n "${CALLSTACK_REQUIRE_RISCV64:-}" ]; then
            echo "error: $msg" >&2
            exit 1
        fi
        echo "warning: $msg" >&2
        exit 0
    fi
fi
sysroot=/usr/riscv64-linux-gnu
export CARGO_TARGET_RISCV64GC_UNKNOWN_LINUX_GNU_LINKER=riscv64-linux-gnu-gcc
export CARGO_TARGET_RISCV64GC_UNKNOWN_LINUX_GNU_RUNNER="qemu-riscv64 -L $sysroot"
# The C fixtures are built as gcc builds them on x86-64 and AArch64, with
# asynchronous unwind tables (.eh_frame), which riscv64's gcc before 13
# leaves out by default; a fixture's own -fno-asynchronous-unwind-tables
# comes later on the command line and still wins.
cc_dir=$(mktemp -d)
trap 'rm -rf "$cc_dir"' EXIT
printf '#!/bin/sh\nexec riscv64-linux-gnu-gcc -fasynchronous-unwind-tables "$@"\n' >"$cc_dir/riscv64-cc"
chmod +x "$cc_dir/riscv64-cc"
export CALLSTACK_TEST_CC="$cc_dir/riscv64-cc"
export CALLSTACK_TEST_QEMU=1
# Executables a test builds for its own architecture (crash_rust's
# fixture) are built with --target and run through the runner above.
export CALLSTACK_TEST_TARGET=$target
# Left out: exact_signal and exact_storm (a capture from a signal handler
# that crosses the signal frame, or is interrupted in glibc: qemu-user 7.2
# has no riscv64 vDSO, its signal trampoline is an anonymous page that is
# no module, and Debian's riscv64 glibc has no CFI for malloc, memcpy or
# strlen, which would need riscv64 instruction analysis); profiler (no
# riscv64 tests). crash_rust runs below, on the scenarios that do not
# crash inside glibc (no CFI there, see above) or below exit hooks (none on
# riscv64 yet).
# Also left out, for time (each takes over a minute under qemu, where the
# host and the AArch64 stage run them): the unit tests that compare the
# DWARF and CFI readers with gimli over this test binary.
# The machine-code walker `InProcess` (insn_noalloc, insn_signal_inprocess:
# its code reader takes every executable mapping, qemu's trampoline page
# too, so it crosses the signal frame by the trampoline's code).
# The unit tests that spawn a compiler or a shell run one at a time, apart,
# and insn_inprocess too (it builds its libraries from four tests):
# qemu-user 7.2 can deadlock a child forked while other guest threads run
# (see scripts/test-aarch64.sh).
forking=(unwind::table::aarch64_rule_forms symbolize::dwarf::tests::a_listed_unit_without_rows_ends_the_search
    symbolize::sup::tests remote::perf::sample_tests python::ran::tests)
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
    args=(-- --skip symbolize::dwarf::tests::inlined_calls_match_gimli
        --skip symbolize::dwarf::tests::line_programs_match_gimli
        --skip unwind::cfi_fast::tests::agrees_with_gimli_on_loaded_modules)
    for t in "${forking[@]}"; do args+=(--skip "$t"); done
    cargo test --target "$target" -p callstack --lib -- --test-threads=1 "${forking[@]}"
    cargo test --target "$target" -p callstack --test insn_inprocess --test insn_noalloc \
        --test insn_signal_inprocess -- --test-threads=1
    # exact_dlopen forks the cross compiler from two tests: one at a time
    # (scripts/test-aarch64.sh says why).
    cargo test --target "$target" -p callstack --test exact_dlopen -- --test-threads=1
    dlopen=()
else
    dlopen=(--test exact_dlopen)
fi
# alloc_tracking is left out for time too (about 10 minutes under
# qemu-riscv64, 8 s under qemu-aarch64); alloc_sampled, over the same
# path, stays.
cargo test --target "$target" -p callstack --lib \
    --test c_frame_records --test context_chain --test capture_fast --test exact_rust \
    --test exact_rust_nofp --test exact_table "${dlopen[@]}" \
    --test exact_first_capture --test no_alloc \
    --test alloc_sampled --test alloc_tracking_exit --test layers \
    --test symbolize_dlclose --test trace_symbolize \
    --test signal_safety --test called_from "${args[@]}"
# adversarial and stale_stack (crafted contexts, stacks and frame chains;
# stacks merged with a thread descriptor's mapping), apart: they are
# harness = false, and stale_stack takes the arguments above as filters.
# What they skip here, and say so: stale_stack's main-thread cases
# (qemu-riscv64 leaves no room below the main thread's descriptor), the
# adversarial SIGPROF storm (samples through glibc code without CFI run
# uncached prologue analysis, and the loader thread starved in one run of
# six).
if [ $# -eq 0 ]; then
    cargo test --target "$target" -p callstack --test adversarial --test stale_stack
fi
# Crash reports: the fixture built for riscv64 crashes under qemu-riscv64
# and the host's `callstack` binary symbolizes its report (qemu-user cannot
# re-execute a guest binary); each test asserts the exact chain of names.
if [ $# -eq 0 ]; then
    cargo test --target "$target" -p callstack --test crash_rust -- \
        crash_rust_null_dereference crash_rust_call_through_a_null_pointer \
        crash_rust_illegal_instruction crash_rust_breakpoint_trap \
        crash_rust_stack_overflow crash_rust_on_a_second_thread \
        crash_rust_panic_hook_reports_the_panic crash_rust_report_file_gets_both_parts \
        crash_rust_report_allocates_nothing crash_rust_previous_handler_still_runs
fi
# symbolize_api runs its tests one at a time: it spawns the cross compiler
# and binutils from its tests, and qemu-user 7.2 can deadlock a child forked
# while other guest threads run (the child waits forever on a lock another
# thread held at the fork; seen twice in about 20 runs, in two of its
# tests). With one test thread nothing else runs when it forks.
if [ $# -eq 0 ]; then
    cargo test --target "$target" -p callstack --test symbolize_api -- --test-threads=1
fi
