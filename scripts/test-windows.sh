#!/usr/bin/env bash
# The Windows x86-64 stage: the C API built for x86_64-pc-windows-gnu,
# linked into C programs built by mingw-w64 and run under wine on this
# (x86-64 Linux) host. Run by scripts/test.sh; on its own:
# `bash scripts/test-windows.sh`.
#
# What it checks:
# - the library compiles for the target with and without its default
#   features (the capture-only build);
# - crates/callstack-capi/tests/windows_c.rs: callstack_capture_fast's
#   chains (main thread, skip, a CreateThread thread) in tests/fixtures/c/
#   win_chain.c: callstack_capture_fast at -O0 and -O2 with frame
#   pointers, callstack_capture_exact at -O0 and -O2 with and without
#   them, named on this side from the PE (COFF symbols and mingw's DWARF);
# - crates/callstack-capi/tests/windows_crash.rs: crash reports and
#   minidumps of tests/fixtures/c/win_crash.c (-O0, -O2 with and without
#   frame pointers): a call through a null pointer, a division by zero, an
#   illegal instruction, abort() and a stack overflow give their exit
#   status, the designed chain with function, file and line, and a
#   minidump that minidump-stackwalk unwinds to the same chain; exceptions
#   the program handles itself give no report;
# - crates/callstack/tests/windows_rust.rs: capture_exact in a Rust
#   program (examples/win_chain.rs) down to ntdll;
# - crates/callstack/tests/windows_rust_crash.rs: crash reports in a Rust
#   program (examples/win_crash.rs): caught panics give none, a null read
#   gives its chain and a minidump.
#
# Needs the target's standard library (rustup), x86_64-w64-mingw32-gcc and
# wine64 (scripts/install-test-deps.sh installs them). Without them, or if
# wine cannot run a program here, the stage says so and is skipped: set
# CALLSTACK_REQUIRE_WINDOWS=1 to make that an error.
#
# Time (this shared 2-core host, after scripts/test.sh's own builds): about
# 35 s warm (the crash tests: about 12 s for windows_crash's 3 builds and 18
# crashes, 3 at a time, 5 s for windows_rust_crash); about 2 min with no
# Windows build and no wine prefix yet.
#
# Wine's prefix (its C: drive and registry, ~700 MB, created on first use
# in about 5 s) is kept between runs in $CALLSTACK_WINEPREFIX (default
# ~/.cache/callstack/wine); wine's own messages are off (WINEDEBUG=-all).
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-pc-windows-gnu

skip() {
    if [ -n "${CALLSTACK_REQUIRE_WINDOWS:-}" ]; then
        echo "error: $1" >&2
        exit 1
    fi
    echo "warning: $1: Windows tests skipped" >&2
    exit 0
}

[ "$(uname -m)" = x86_64 ] || skip "wine runs x86-64 Windows programs on an x86-64 host only"
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    rustup target add "$target" >&2 || skip "the $target standard library could not be installed"
fi
command -v x86_64-w64-mingw32-gcc >/dev/null || skip "no x86_64-w64-mingw32-gcc (Debian: gcc-mingw-w64-x86-64)"
wine=""
for w in wine64 /usr/lib/wine/wine64 wine; do
    if command -v "$w" >/dev/null 2>&1; then
        wine=$(command -v "$w")
        break
    fi
done
[ -n "$wine" ] || skip "no wine64 (Debian: wine64)"
export WINEPREFIX="${CALLSTACK_WINEPREFIX:-$HOME/.cache/callstack/wine}"
export WINEDEBUG=-all
mkdir -p "$(dirname "$WINEPREFIX")"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The prefix (first run only), and a first program: can wine run here?
start=$(date +%s%N)
if [ ! -e "$WINEPREFIX/system.reg" ]; then
    "$wine" wineboot --init >"$scratch/wine.err" 2>&1 || true
    # wineboot returns before the prefix is written: wait for wine's server.
    for s in "$(dirname "$wine")/wineserver64" "$(dirname "$wine")/wineserver" wineserver; do
        if command -v "$s" >/dev/null 2>&1; then
            "$s" -w || true
            break
        fi
    done
fi
printf '#include <stdio.h>\nint main(void) { puts("wine ok"); return 0; }\n' >"$scratch/hello.c"
x86_64-w64-mingw32-gcc -O2 "$scratch/hello.c" -o "$scratch/hello.exe"
out=$("$wine" "$scratch/hello.exe" 2>"$scratch/wine.err" | tr -d "\r" || true)
if [ "$out" != "wine ok" ]; then
    cat "$scratch/wine.err" >&2
    skip "wine could not run a program (prefix $WINEPREFIX)"
fi
echo "wine ready in $((($(date +%s%N) - start) / 1000000)) ms (prefix $WINEPREFIX)" >&2
# Rust's standard library imports ProcessPrng from bcryptprimitives.dll,
# which wine 8 (Debian 12) lacks: a stand-in in the prefix's system32.
sys32="$WINEPREFIX/drive_c/windows/system32"
if [ ! -e "$sys32/bcryptprimitives.dll" ]; then
    x86_64-w64-mingw32-gcc -O2 -shared tests/fixtures/c/win_bcryptprimitives.c -ladvapi32 \
        -o "$sys32/bcryptprimitives.dll"
fi

# Compiles without the symbolizer and the remote unwinder (checked), and
# with them (the C library the tests link).
cargo check -q --target "$target" -p callstack --no-default-features
cargo build -q --release --target "$target" -p callstack-capi
export CALLSTACK_WINDOWS_LIB="${CARGO_TARGET_DIR:-$PWD/target}/$target/release"
# The CLI for Windows (its Linux-only subcommands left out): its
# `addr2line` under wine, on mingw's DWARF and on a PDB. In the same cargo
# command, a Rust program: examples/win_chain.rs and win_crash.rs (the
# crate's dev-dependencies are Unix-only: none is built here); one build of
# the crate serves both.
cargo build -q --target "$target" -p callstack-cli -p callstack --bin callstack --example win_chain --example win_crash
export CALLSTACK_WINDOWS_CLI="${CARGO_TARGET_DIR:-$PWD/target}/$target/debug/callstack.exe"
export CALLSTACK_WINDOWS_EXAMPLES="${CARGO_TARGET_DIR:-$PWD/target}/$target/debug/examples"
export CALLSTACK_WINE="$wine"
cargo test -q -p callstack-capi --test windows_c -- --ignored "$@"
cargo test -q -p callstack-capi --test windows_crash -- --ignored "$@"
cargo test -q -p callstack --test windows_rust --test windows_rust_crash -- --ignored "$@"
