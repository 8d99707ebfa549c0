#!/usr/bin/env bash
# Races `callstack pstack` / `callstack core` against gdb on two small
# targets, where per-process fixed costs (start-up, opening glibc's debug
# file) dominate rather than the number of frames (benches/remote.sh has
# the 67-thread target):
#   - tests/fixtures/c/remote_threads.c run with 6 workers: 9 threads;
#   - Debian's python3 with 5 threads (4 sleeping in time.sleep, main too).
# Both tools see the same debug info (libc6-dbg's, installed by
# scripts/install-test-deps.sh; no python3-dbg).
#
#   bash benches/remote_small.sh [RUNS]   (default 5 runs per tool; medians)
#
# Prints each tool's median wall and CPU time (user + sys), the ratios, and
# how long `callstack pstack` kept the target stopped (its --timing line).
#
# CS_BEFORE=PATH also races another build of callstack (say, main's,
# copied aside) in the same run, for a before/after comparison.
# WAITERS=1 adds a third target: python3 with 4 threads in
# threading.Event().wait(), whose glibc frames have tail-call frames.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
FLAGS=${FLAGS:-"-g -O2 -fno-omit-frame-pointer"}
GDB=(gdb -nx -batch -ex 'set debuginfod enabled off' -ex 'thread apply all bt')

cargo build --release -q -p callstack-cli
CS=${CARGO_TARGET_DIR:-target}/release/callstack
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; exec 3>&- 2>/dev/null || true; rm -rf "$work"' EXIT

# median_ms CMD...: runs CMD $RUNS times (output discarded) and prints the
# median wall time and the median CPU time (user + sys) in ms: "WALL CPU".
median_ms() {
  python3 - "$RUNS" "$@" <<'PY'
import resource, subprocess, sys, time
runs, cmd = int(sys.argv[1]), sys.argv[2:]
walls, cpus = [], []
for _ in range(runs):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    walls.append((time.perf_counter() - t0) * 1e3)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpus.append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * 1e3)
med = lambda v: sorted(v)[len(v) // 2]
print(f"{med(walls):.1f} {med(cpus):.1f}")
PY
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1fx", a/b}'; }
w() { echo "$1" | cut -d' ' -f1; }
c() { echo "$1" | cut -d' ' -f2; }
line() {
  local r=""
  [ -n "${3:-}" ] && r="   -> callstack is $(ratio "$(w "$2")" "$(w "$3")") faster (wall), $(ratio "$(c "$2")" "$(c "$3")") (cpu)"
  printf '  %-20s wall %7s ms, cpu %7s ms%s\n' "$1" "$(w "$2")" "$(c "$2")" "$r"
}

# race NAME PID EXE: pstack and core of PID against gdb.
race() {
  local name=$1 pid=$2 exe=$3 stops=() frames
  frames=$($CS pstack --json "$pid" | grep -o '"pc"' | wc -l)
  echo "$name: $(ls /proc/"$pid"/task | wc -l) threads, $frames frames"
  for _ in $(seq 1 "$RUNS"); do
    stops+=($($CS pstack --timing "$pid" 2>&1 >/dev/null | awk '/target stopped for/ {print $5}'))
  done
  local stop_med
  stop_med=$(printf '%s\n' "${stops[@]}" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
  local cs gdb before
  cs=$(median_ms "$CS" pstack "$pid")
  gdb=$(median_ms "${GDB[@]}" -p "$pid")
  line "callstack pstack" "$cs"
  echo "                       target stopped: median ${stop_med} ms"
  if [ -n "${CS_BEFORE:-}" ]; then
    before=$(median_ms "$CS_BEFORE" pstack "$pid")
    line "CS_BEFORE pstack" "$before" "$cs"
  fi
  line "gdb -p" "$gdb" "$cs"
  gcore -o "$work/core" "$pid" >/dev/null 2>&1
  local core="$work/core.$pid"
  cs=$(median_ms "$CS" core "$exe" "$core")
  gdb=$(median_ms "${GDB[@]}" "$exe" "$core")
  line "callstack core" "$cs"
  if [ -n "${CS_BEFORE:-}" ]; then
    before=$(median_ms "$CS_BEFORE" core "$exe" "$core")
    line "CS_BEFORE core" "$before" "$cs"
  fi
  line "gdb EXE CORE" "$gdb" "$cs"
}

# Waits until process $1 has $2 threads, all asleep.
settle() {
  for _ in $(seq 1 500); do
    local n=0
    for s in /proc/$1/task/*/stat; do
      [ "$(cut -d' ' -f3 "$s" 2>/dev/null)" = S ] && n=$((n+1))
    done
    [ "$n" -eq "$2" ] && return 0
    sleep 0.01
  done
  echo "target $1 did not settle" >&2; exit 1
}

gcc $FLAGS -pthread tests/fixtures/c/remote_threads.c -o "$work/remote_threads"
mkfifo "$work/in"
"$work/remote_threads" 6 3 <"$work/in" >"$work/out" &
pids+=($!)
exec 3>"$work/in"
settle "${pids[0]}" 9
race "remote_threads 6 3 ($FLAGS)" "${pids[0]}" "$work/remote_threads"

PY=/usr/bin/python3   # Debian's, not a version manager's shim
"$PY" -c '
import threading, time
for _ in range(4):
    threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
time.sleep(1000)' &
pids+=($!)
settle "${pids[1]}" 5
race "$PY (Debian's, 5 threads)" "${pids[1]}" "$PY"
if [ -n "${WAITERS:-}" ]; then
  "$PY" -c '
import threading, time
for _ in range(4):
    threading.Thread(target=lambda: threading.Event().wait(), daemon=True).start()
time.sleep(1000)' &
  pids+=($!)
  settle "${pids[2]}" 5
  race "$PY (4 threads in Event().wait())" "${pids[2]}" "$PY"
fi
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
