#!/usr/bin/env bash
# Overhead of `callstack record` on a CPython program beside py-spy's, at
# the same rate: tests/fixtures/python/shares.py (three functions at
# 60/30/10% of the CPU, work fixed by iteration counts) run bare, under
# `callstack record -F RATE`, under `py-spy record -r RATE --nonblocking`
# and under `py-spy record -r RATE` (blocking: it stops the process for
# each sample), RUNS alternating rounds; prints, for each, the median of
# the program's own run time (benches/python_timed.py: what the profiler
# slowed it by), of the whole command's wall time (with the profiler's
# start and its writing of the profile) and of its CPU time (user +
# system of the profiler and the program), and their overhead over the
# bare run's.
#
#   benches/python_record.sh [PYTHON] [RATE] [RUNS] [ROUNDS]
#
# Needs the release CLI (cargo build --release -p callstack-cli; found
# under $CARGO_TARGET_DIR, else target/) and py-spy on PATH.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${1:-/usr/bin/python3.11}
rate=${2:-100}
runs=${3:-7}
rounds=${4:-100}
cli=${CARGO_TARGET_DIR:-$root/target}/release/callstack
fixture=$root/crates/callstack-cli/tests/fixtures/python/shares.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prog=("$python" "$root/benches/python_timed.py" "$fixture" "$rounds" 100000)

wall() { # command... -> "wall_s cpu_s" on stdout (cpu: user + system of
  # the command and every process it waited for: the profiler and the program)
  /usr/bin/time -f "%e %U %S" -o "$tmp/time" "$@" >/dev/null 2>&1
  read -r e u s <"$tmp/time"
  echo "$e $(echo "$u + $s" | bc -l)"
}

declare -A times cpu
names=(bare callstack py-spy-nonblocking py-spy-blocking)
run() { # name command...
  local n=$1 w
  shift
  w=$(BENCH_OUT=$tmp/$n.self wall "$@")
  times[$n]+="${w% *} "
  cpu[$n]+="${w#* } "
}
for ((i = 0; i < runs; i++)); do
  run bare "${prog[@]}"
  run callstack "$cli" record -q -F "$rate" -o "$tmp/cs.data" -- "${prog[@]}"
  run py-spy-nonblocking py-spy record -r "$rate" --nonblocking -o "$tmp/spy.txt" --format raw -- "${prog[@]}"
  run py-spy-blocking py-spy record -r "$rate" -o "$tmp/spy.txt" --format raw -- "${prog[@]}"
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
bare=$(echo "${times[bare]}" | median)
bare_self=$(tr '\n' ' ' <"$tmp/bare.self" | median)
bare_cpu=$(echo "${cpu[bare]}" | median)
echo "$("$python" --version 2>&1), rate $rate Hz, $runs runs each, shares.py $rounds rounds"
printf '%-20s %10s %9s %10s %9s %8s %10s\n' run program_s overhead wall_s overhead cpu_s extra_cpu
for n in "${names[@]}"; do
  m=$(echo "${times[$n]}" | median)
  s=$(tr '\n' ' ' <"$tmp/$n.self" | median)
  c=$(echo "${cpu[$n]}" | median)
  printf '%-20s %10.3f %8.1f%% %10.3f %8.1f%% %8.3f %9.1f%%\n' "$n" "$s" "$(echo "($s - $bare_self) * 100 / $bare_self" | bc -l)" \
    "$m" "$(echo "($m - $bare) * 100 / $bare" | bc -l)" "$c" "$(echo "($c - $bare_cpu) * 100 / $bare_cpu" | bc -l)"
done
