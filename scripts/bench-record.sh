#!/usr/bin/env bash
# `callstack record` + `callstack report` against `perf record --call-graph
# dwarf` + `perf report` on the same workload (tests/fixtures/c/prof_hot.c,
# -O2 without frame pointers, 2 threads), recorded with -p for SECONDS at
# 999 Hz. Prints the CPU time of each recorder (user+sys) and the median of
# 3 report runs (wall), side by side.
#   scripts/bench-record.sh [SECONDS]   (default 10)
set -euo pipefail
secs=${1:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --release -q -p callstack-cli
cs=$target/release/callstack
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gcc -O2 -g -fomit-frame-pointer -pthread -o "$dir/prof_hot" "$root/tests/fixtures/c/prof_hot.c"

cpu() { awk '{printf "%.2f", $2 + $3}' "$1"; }
median3() { sort -n | sed -n 2p; }

"$dir/prof_hot" $((secs + 3)) 2 & pid=$!; sleep 0.5
/usr/bin/time -o "$dir/t" -f "%e %U %S" "$cs" record -q -F 999 -d "$secs" -p $pid -o "$dir/cs.data"
echo "callstack record: $(cpu "$dir/t") s CPU, $(stat -c %s "$dir/cs.data") bytes"
wait $pid
"$dir/prof_hot" $((secs + 3)) 2 & pid=$!; sleep 0.5
/usr/bin/time -o "$dir/t" -f "%e %U %S" perf record -q -F 999 --call-graph dwarf -p $pid -o "$dir/perf.data" -- sleep "$secs" 2>/dev/null
echo "perf record --call-graph dwarf: $(cpu "$dir/t") s CPU, $(stat -c %s "$dir/perf.data") bytes"
wait $pid

for i in 1 2 3; do
  /usr/bin/time -o "$dir/t" -f "%e" "$cs" report "$dir/cs.data" --top 10 >"$dir/cs.txt"; cat "$dir/t"
done | median3 >"$dir/cs.med"
for i in 1 2 3; do
  /usr/bin/time -o "$dir/t" -f "%e" perf report -i "$dir/perf.data" --stdio >"$dir/perf.txt" 2>/dev/null; cat "$dir/t"
done | median3 >"$dir/perf.med"
echo "callstack report: $(cat "$dir/cs.med") s (median of 3)"
echo "perf report --stdio: $(cat "$dir/perf.med") s (median of 3)"
awk -v a="$(cat "$dir/perf.med")" -v b="$(cat "$dir/cs.med")" 'BEGIN { if (b > 0) printf "ratio perf report / callstack report: %.1fx\n", a / b }'
echo "kernel frames: $(grep -c '_\[k\]' "$dir/cs.txt" || true) of callstack's top 10 (perf_event_paranoid $(cat /proc/sys/kernel/perf_event_paranoid), uid $(id -u))"
echo "callstack report, top (self):"; sed -n 1,6p "$dir/cs.txt"
echo "perf report --no-children, top (self):"
perf report -i "$dir/perf.data" --stdio --no-children --sort symbol 2>/dev/null | grep -E '^ +[0-9.]+%' | head -5
hot='(hot_seventy|warm_twenty|cool_ten)'
echo "callstack report, inclusive:"
"$cs" report "$dir/cs.data" --top 0 --folded - | awk -v re="$hot" '
  { n = $NF; t += n; seen = ""
    for (i = 1; i <= split($0, f, ";"); i++) { sub(/ [0-9]+$/, "", f[i]); if (f[i] ~ "^" re "$" && index(seen, f[i]) == 0) { s[f[i]] += n; seen = seen " " f[i] } } }
  END { for (k in s) printf "  %6.2f%%  %s\n", 100 * s[k] / t, k }' | sort -rn
echo "perf report --children, inclusive:"
perf report -i "$dir/perf.data" --stdio --children --sort symbol -g none 2>/dev/null | awk -v re="$hot" '$3 == "[.]" && $4 ~ "^" re "$" && !seen[$4]++ { print "  " $1 "  " $4 }'
