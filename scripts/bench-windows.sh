#!/usr/bin/env bash
# Windows x86-64 under wine: a warm capture 20 calls deep by
# callstack_capture_fast, callstack_capture_exact, RtlCaptureStackBackTrace
# and a StackWalk64 loop, in one process and run
# (tests/fixtures/c/win_bench.c, -O2 with frame pointers). Prints
# "<method> <frames> <ns per capture> <same frames as capture_exact>".
# Needs what scripts/test-windows.sh needs (and its wine prefix).
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-pc-windows-gnu
wine=$(command -v wine64 || echo /usr/lib/wine/wine64)
export WINEPREFIX="${CALLSTACK_WINEPREFIX:-$HOME/.cache/callstack/wine}"
export WINEDEBUG=-all
cargo build -q --release --target "$target" -p callstack-capi
lib="${CARGO_TARGET_DIR:-target}/$target/release/libcallstack.a"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
x86_64-w64-mingw32-gcc -O2 -fno-omit-frame-pointer -I crates/callstack-capi/include \
    tests/fixtures/c/win_bench.c "$lib" -lkernel32 -lntdll -luserenv -lws2_32 -ldbghelp \
    -o "$scratch/win_bench.exe"
"$wine" "$scratch/win_bench.exe" | tr -d '\r'
