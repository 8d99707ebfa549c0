#!/usr/bin/env bash
# Crash-time minidump latency, 64 threads, in one run:
#  - ours: tests/fixtures/c/crash_minidump.c (-O2) with 60 idle threads plus
#    its 3 blocked ones and main (64), crashing (null dereference) with the
#    handler writing a minidump; the time from the fault to the dump file
#    closed, as the helper prints it ("minidump: PATH (... T ms after the
#    fault)": from the handler's clock reading at the signal to the writer's
#    return, in the helper, both CLOCK_MONOTONIC). The helper is the program
#    itself re-executed (no `callstack` binary on PATH), symbolizing off
#    (CALLSTACK_CRASH_HELPER=none): the dump is written first either way.
#    Also the wall time of the whole crashing run (start, 64 threads,
#    crash, dump, death), for reference.
#  - peer: the minidump-writer crate (benches/minidump_writer_peer, the way
#    a crash reporter using it dumps from its monitor process) dumping the
#    same program, running idle with its 64 threads: the wall time of the
#    whole command, measured from outside (spawn to exit).
#  - beside it: `callstack pstack --minidump OUT PID` on the same process,
#    the whole command likewise.
#
# usage: bash benches/minidump_crash.sh [RUNS]   (default 21; medians printed)
#        MD_HEAP_MB=N: the fixture allocates and touches N MiB of heap first
#        (a large resident set, for ours and for the peers' target alike).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-21}
target=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release -q -p callstack-capi -p callstack-cli
(cd benches/minidump_writer_peer && CARGO_TARGET_DIR="$target/peer" cargo build --release -q)
dir=$target/bench-minidump; rm -rf "$dir"; mkdir -p "$dir"
gcc -g -O2 -pthread tests/fixtures/c/crash_minidump.c \
    -Icrates/callstack-capi/include "$target/release/libcallstack.a" -lpthread -ldl -lm \
    -o "$dir/crash_minidump"

python3 - "$RUNS" "$dir" "$dir/crash_minidump" "$target/peer/release/minidump-writer-peer" \
    "$target/release/callstack" <<'PY'
import os, re, statistics, subprocess, sys, time
runs, d, exe, peer, cli = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
env = dict(os.environ, MD_IDLE_THREADS="60", CALLSTACK_CRASH_HELPER="none",
           PATH="/usr/bin:/bin")
env.pop("CALLSTACK_CRASH_MINIDUMP_DIR", None)
med = lambda v: statistics.median(v)

ours, ours_wall, threads = [], [], set()
for i in range(runs):
    out = f"{d}/ours-{i}"
    t = time.perf_counter()
    p = subprocess.run([exe, "null", out], env=env, capture_output=True, text=True, timeout=60)
    ours_wall.append((time.perf_counter() - t) * 1e3)
    m = re.search(r"minidump: (\S+) \((\d+) threads.* ([\d.]+) ms after the fault\)", p.stderr)
    if not m:
        sys.exit("no dump written:\n" + p.stderr)
    ours.append(float(m.group(3)))
    threads.add(int(m.group(2)))

def dump_cmd(cmd_of):
    idle = subprocess.Popen([exe, "idle", "-"], env=env, stdout=subprocess.PIPE, text=True)
    idle.stdout.readline()  # "fixture: tids ...": every thread is blocked
    walls = []
    try:
        for i in range(runs):
            out = f"{d}/dump-{i}.dmp"
            t = time.perf_counter()
            subprocess.run(cmd_of(idle.pid, out), check=True, capture_output=True, timeout=60)
            walls.append((time.perf_counter() - t) * 1e3)
            os.remove(out)
    finally:
        idle.kill(); idle.wait()
    return walls

peer_wall = dump_cmd(lambda pid, out: [peer, str(pid), out])
pstack_wall = dump_cmd(lambda pid, out: [cli, "pstack", "--minidump", out, str(pid)])
# The cost of spawning a command from this driver, for scale.
true_wall = []
for _ in range(runs):
    t = time.perf_counter(); subprocess.run(["/bin/true"]); true_wall.append((time.perf_counter() - t) * 1e3)

print(f"threads in our dumps: {sorted(threads)}; {runs} runs; medians in ms")
print(f"ours: crash -> dump file closed (in the helper)            {med(ours):7.2f}")
print(f"ours: whole crashing run (start, 64 threads, crash, dump)   {med(ours_wall):7.2f}")
print(f"peer: minidump-writer-peer PID OUT, whole command           {med(peer_wall):7.2f}")
print(f"callstack pstack --minidump OUT PID, whole command          {med(pstack_wall):7.2f}")
print(f"(spawning /bin/true from this driver                        {med(true_wall):7.2f})")
print(f"ratio ours crash->dump / minidump-writer command: {med(ours) / med(peer_wall):.2f}")
PY
