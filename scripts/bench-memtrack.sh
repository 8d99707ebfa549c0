#!/usr/bin/env bash
# Cost per tracked allocation of `callstack memtrack` (the preload library,
# capture fast and exact) beside heaptrack, on one C workload in one run:
# at a call depth of 40, rounds of malloc(32) + free, timed inside the loop
# (tests/fixtures/c/memtrack_bench.c; best of 5 rounds per tool). Then the
# Rust side: `Tracking` beside dhat-rs (benches/alloc_tracking.rs).
#
# bash scripts/bench-memtrack.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p callstack-cli -p callstack-preload
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
gcc -O2 -fno-builtin -fno-omit-frame-pointer -g tests/fixtures/c/memtrack_bench.c -o "$dir/bench"
cli="$target/release/callstack"
ns() { sed -n 's/.*ns_per_pair=\([0-9.]*\).*/\1/p'; }
base=$("$dir/bench" "$n" 40 | ns)
fast=$("$cli" memtrack --capture fast -o "$dir/f.heap" -- "$dir/bench" "$n" 40 | ns)
exact=$("$cli" memtrack --capture exact -o "$dir/e.heap" -- "$dir/bench" "$n" 40 | ns)
ht=$(heaptrack -o "$dir/ht" "$dir/bench" "$n" 40 2>/dev/null | ns)
echo "C: malloc(32)+free pairs at depth 40, $n per tool, best of 5 rounds"
awk -v b="$base" -v f="$fast" -v e="$exact" -v h="$ht" 'BEGIN {
  printf "  glibc alone               %7.1f ns/pair\n", b;
  printf "  memtrack --capture fast   %7.1f ns/pair  (+%.1f ns per tracked pair, 1.00x)\n", f, f-b;
  printf "  memtrack --capture exact  %7.1f ns/pair  (+%.1f ns per tracked pair, %.2fx fast)\n", e, e-b, (e-b)/(f-b);
  printf "  heaptrack                 %7.1f ns/pair  (+%.1f ns per tracked pair, %.2fx fast)\n", h, h-b, (h-b)/(f-b);
}'
cargo bench -q -p callstack-benches --bench alloc_tracking -- "$n" 2>/dev/null | sed -n '/pairs at depth/,$p'
