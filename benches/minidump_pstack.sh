#!/usr/bin/env bash
# The whole command `callstack pstack --minidump OUT PID` on an idle process
# of 64 threads (main and 63 threads in pause()), measured from outside
# (fork to exit, file written), interleaved with a peer writing a minidump
# of the same process: by default the minidump-writer crate through
# benches/minidump_writer_peer (`PEER=path/to/binary` for another; `PEER=`
# for none). Medians and minimums of RUNS rounds, and the dump sizes.
#
# usage: bash benches/minidump_pstack.sh [RUNS]   (default 100)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-100}
target=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release -q -p callstack-cli
if [ -z "${PEER+x}" ]; then
  PEER=""
  if [ -f benches/minidump_writer_peer/Cargo.toml ]; then
    CARGO_TARGET_DIR="$target/peer" cargo build --release -q \
      --manifest-path benches/minidump_writer_peer/Cargo.toml
    PEER="$target/peer/release/minidump-writer-peer"
  fi
fi
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
cat > "$dir/idle.c" <<'C'
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static void *idle(void *a) { (void)a; for (;;) pause(); }
int main(void) {
    pthread_t t;
    for (int i = 0; i < 63; i++) pthread_create(&t, 0, idle, 0);
    printf("ready\n"); fflush(stdout);
    for (;;) pause();
}
C
gcc -O2 -pthread "$dir/idle.c" -o "$dir/idle"
"$dir/idle" > "$dir/ready" & pid=$!
while [ ! -s "$dir/ready" ]; do sleep 0.01; done
python3 - "$RUNS" "$pid" "$target/release/callstack" "$PEER" "$dir" <<'PY'
import os, statistics, subprocess, sys, time
runs, pid, cli, peer, d = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
cmds = {"callstack pstack --minidump": [cli, "pstack", "--minidump", f"{d}/ours.dmp", pid]}
if peer:
    cmds["minidump-writer (peer)"] = [peer, pid, f"{d}/peer.dmp"]
times = {k: [] for k in cmds}
for _ in range(runs):
    for k, c in cmds.items():
        t = time.perf_counter()
        r = subprocess.run(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times[k].append((time.perf_counter() - t) * 1e3)
        assert r.returncode == 0, (k, r.returncode)
load = open("/proc/loadavg").read().split()[0]
print(f"64 idle threads, {runs} interleaved rounds, load {load}")
for k, v in times.items():
    out = cmds[k][3] if k.startswith("callstack") else cmds[k][2]
    print(f"{k:32} median {statistics.median(v):6.2f} ms  min {min(v):6.2f} ms  dump {os.path.getsize(out)} bytes")
PY
