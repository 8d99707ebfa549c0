#!/usr/bin/env bash
# Races `callstack pstack` / `callstack core` against gdb and eu-stack on a
# process with 64 threads about 30 frames deep (tests/fixtures/c/remote_threads.c).
#
#   bash benches/remote.sh [RUNS]        (default 7 runs per tool; medians printed)
#
# Prints the median wall time of each tool, the ratios, and how long
# `callstack pstack` kept the target stopped (its --timing line).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-7}
THREADS=64
DEPTH=25            # descend() levels; + block_here, chain, worker_main, start_thread, clone3
FLAGS=${FLAGS:-"-g -O2 -fno-omit-frame-pointer"}

cargo build --release -q -p callstack-cli
CS=target/release/callstack
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null || true; exec 3>&- 2>/dev/null || true; rm -rf "$work"' EXIT
gcc $FLAGS -pthread tests/fixtures/c/remote_threads.c -o "$work/remote_threads"

mkfifo "$work/in"
"$work/remote_threads" $THREADS $DEPTH <"$work/in" >"$work/out" &
pid=$!
exec 3>"$work/in"
# Wait until every thread sits in its blocking system call (futex or read).
for _ in $(seq 1 2000); do
  n=0
  for s in /proc/$pid/task/*/syscall; do
    case "$(cut -d' ' -f1 "$s" 2>/dev/null)" in 202|0) n=$((n+1));; esac
  done
  [ "$n" -eq $((THREADS + 3)) ] && break
  sleep 0.01
done
[ "$n" -eq $((THREADS + 3)) ] || { echo "fixture threads did not all block" >&2; exit 1; }

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
w() { echo "$1" | cut -d' ' -f1; }   # wall part of a median_ms result
c() { echo "$1" | cut -d' ' -f2; }   # CPU part
# line LABEL RESULT [BASE]: "LABEL  wall W ms, cpu C ms  (ratios against BASE)"
line() {
  local r=""
  [ -n "${3:-}" ] && r="   -> callstack is $(ratio "$(w "$2")" "$(w "$3")") faster (wall), $(ratio "$(c "$2")" "$(c "$3")") (cpu)"
  printf '  %-20s wall %7s ms, cpu %7s ms%s\n' "$1" "$(w "$2")" "$(c "$2")" "$r"
}

frames=$($CS pstack --json $pid | grep -o '"pc"' | wc -l)
echo "target: $THREADS worker threads + main + waker + a thread in a signal handler, $frames frames in all ($FLAGS)"

# How long the target is stopped, per run of callstack pstack.
stops=()
for _ in $(seq 1 "$RUNS"); do
  stops+=($($CS pstack --timing $pid 2>&1 >/dev/null | awk '/target stopped for/ {print $5}'))
done
stop_med=$(printf '%s\n' "${stops[@]}" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
stop_max=$(printf '%s\n' "${stops[@]}" | sort -n | tail -1)

cs_live=$(median_ms $CS pstack $pid)
gdb_live=$(median_ms gdb -nx -batch -ex 'set debuginfod enabled off' -ex 'thread apply all bt' -p $pid)
if command -v eu-stack >/dev/null; then
  eu_live=$(median_ms eu-stack -p $pid)
  # With inlined frames and source lines, as callstack prints them.
  eu_live_is=$(median_ms eu-stack -i -s -p $pid)
else
  eu_live="not installed"
fi

gcore -o "$work/core" $pid >/dev/null 2>&1
core="$work/core.$pid"
cs_core=$(median_ms $CS core "$work/remote_threads" "$core")
gdb_core=$(median_ms gdb -nx -batch -ex 'set debuginfod enabled off' -ex 'thread apply all bt' "$work/remote_threads" "$core")
core_size=$(du -m "$core" | cut -f1)

echo "live process (median of $RUNS runs; wall time and CPU time, user + sys):"
line "callstack pstack" "$cs_live"
echo "                       target stopped: median ${stop_med} ms, max ${stop_max} ms (first PTRACE_INTERRUPT to last PTRACE_DETACH)"
line "gdb -p" "$gdb_live" "$cs_live"
if [ "$eu_live" = "not installed" ]; then
  echo "  eu-stack -p          not installed (apt-get install elfutils)"
else
  line "eu-stack -p" "$eu_live" "$cs_live"
  echo "                       (eu-stack prints names only and reads no DWARF; with inlines and lines:)"
  line "eu-stack -i -s -p" "$eu_live_is" "$cs_live"
fi
echo "core file (${core_size} MB, median of $RUNS runs):"
line "callstack core" "$cs_core"
line "gdb EXE CORE" "$gdb_core" "$cs_core"

echo go >&3
exec 3>&-
wait $pid && echo "target exited normally: $(tail -1 "$work/out")"
