#!/usr/bin/env bash
# Crash-report latency: from the fault to the end of the symbolized report,
# as the helper prints it ("... (N ms after the fault)"), and the wall time of
# the whole crashing run, for the C and Rust crash fixtures; beside it, the
# wall time of the usual alternative, running the same crash under
# `gdb -batch -ex run -ex bt`.
#
# usage: bash benches/crash_report.sh [RUNS]   (default 11; medians printed)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-11}
cargo build --release -q -p callstack-capi -p callstack-cli -p crash_fixture
dir=target/bench-crash; mkdir -p "$dir"
gcc -g -O0 -fno-omit-frame-pointer -pthread tests/fixtures/c/crash_fixture.c \
    -Icrates/callstack-capi/include target/release/libcallstack.a -lpthread -ldl -lm \
    -o "$dir/crash_c"
cli=$PWD/target/release/callstack
rust=$PWD/target/release/crash_fixture

python3 - "$RUNS" "$dir/crash_c" "$rust" "$cli" <<'PY'
import os, re, statistics, subprocess, sys, time
runs, c_exe, rust_exe, cli = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

def once(cmd, env_extra):
    env = dict(os.environ); env.pop("CALLSTACK_CRASH_HELPER", None); env.update(env_extra)
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    wall = (time.perf_counter() - t) * 1e3
    m = re.search(r"end of symbolized report \(([\d.]+) ms after the fault\)", p.stderr)
    return (float(m.group(1)) if m else None), wall

def row(label, cmd, env):
    sym, wall = [], []
    for _ in range(runs):
        s, w = once(cmd, env)
        if s is not None: sym.append(s)
        wall.append(w)
    med = lambda v: f"{statistics.median(v):8.1f}" if v else "     n/a"
    print(f"{label:48s} {med(sym)} {med(wall)}   ({len(sym)}/{runs} symbolized)")
    return statistics.median(wall)

print(f"{'':48s} {'fault->sym':>8s} {'wall':>8s}   (medians, ms, {runs} runs)")
walls = {}
for scen in ["null", "abort", "malloc", "overflow"]:
    walls[("c", scen)] = row(f"C {scen}, helper = the program itself", [c_exe, scen], {})
    row(f"C {scen}, helper = callstack binary", [c_exe, scen], {"CALLSTACK_CRASH_HELPER": cli})
for scen in ["null", "abort", "malloc", "overflow"]:
    row(f"Rust {scen}, helper = the program itself", [rust_exe, scen], {})
    row(f"Rust {scen}, helper = callstack binary", [rust_exe, scen], {"CALLSTACK_CRASH_HELPER": cli})
g = []
for _ in range(max(3, runs // 3)):
    t = time.perf_counter()
    subprocess.run(["gdb", "-nx", "-batch", "-ex", "set debuginfod enabled off", "-ex", "run", "-ex", "bt",
                    "--args", c_exe, "null"], capture_output=True, env=dict(os.environ, CALLSTACK_CRASH_HELPER="none"), timeout=120)
    g.append((time.perf_counter() - t) * 1e3)
gm = statistics.median(g)
print(f"{'peer: gdb -batch -ex run -ex bt, C null':48s} {'':8s} {gm:8.1f}")
print(f"ratio gdb wall / our wall (C null, self helper): {gm / walls[('c','null')]:.1f}x")
PY
