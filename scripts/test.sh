#!/usr/bin/env bash
# The test command of the README: installs what the tests need when it is
# missing, then runs the whole workspace's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean build and run of every stage writes about 12 GB under target/
# (measured 2026-11-28: 8.7 GB after the host stage, 12.2 GB after the
# cross ones; the tests remove their scratch files when they pass); say so
# up front rather than fail mid-link with "No space left on device".
avail_kb=$(df -Pk . | awk 'NR==2 {print $4}')
if [ -n "$avail_kb" ] && [ "$avail_kb" -lt 13000000 ]; then
    echo "warning: only $((avail_kb / 1024)) MB free here; the build and tests need about 12 GB" >&2
fi
bash scripts/install-test-deps.sh
# Incremental caches only help a developer's next edit; a run of the whole
# suite would leave more than a gigabyte of them.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The oracles (gdb with `set debuginfod enabled off`, binutils) read local
# files only: so does every symbolizer of the tests, whatever servers this
# machine names. The debuginfod tests set their own.
unset DEBUGINFOD_URLS
# The C tests link target/release/libcallstack.a and run target/release/callstack
# (whose `memtrack` preloads target/release/libcallstack_preload.so); the
# Rust crash tests run target/release/crash_fixture. The same package list
# as testsupport::RELEASE_PACKAGES: the tests' own build is then fresh.
cargo build --release -q -p callstack-capi -p callstack-cli -p callstack-preload -p crash_fixture
# Capture must build without the symbolizer and the remote unwinder.
cargo check -q -p callstack --no-default-features --all-targets
# Each stage says how long it took (CI's budget is 30 minutes on 2 cores).
stage() {
    local t=$SECONDS
    "$@"
    echo "stage \`$*\`: $((SECONDS - t)) s" >&2
}
stage cargo test --workspace "$@"
# The in-process capture on AArch64, under qemu-user.
stage bash scripts/test-aarch64.sh
# The in-process capture on RISC-V 64, under qemu-user.
stage bash scripts/test-riscv64.sh
# Windows x86-64: the C API built for x86_64-pc-windows-gnu, C programs
# built by mingw-w64, run under wine.
stage bash scripts/test-windows.sh
echo "all stages: $SECONDS s" >&2
