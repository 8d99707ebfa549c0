#!/usr/bin/env bash
# What `callstack record` costs the program it samples: a CPU-bound C
# program of fixed work (its own CLOCK_MONOTONIC run time printed) run
# bare and recorded, in ABBA order (bare, recorded, recorded, bare ...
# for each variant in turn), N rounds; the median run time of each and
# its distance from the bare median. Variants: `record -F 999` (the
# adaptive user stack copy, 8 KiB at the start), `--stack-size 16384`
# (the old default), `--stack-size 4096`, `record -a` (the whole host,
# started before the program and stopped by SIGTERM after it: a script's
# background job ignores SIGINT; root), and when perf is installed
# `perf record -F 999 -g --call-graph dwarf` and `perf record -F 999`
# with no call graph (the cost of the sampling interrupt alone). Each
# variant's runs are printed with their spread (lowest, highest). Run it
# on a quiet machine (nothing else building): the figures move by a
# percent with the load.
#
#   bash benches/record_overhead.sh [N]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10}
cargo build --release -q -p callstack-cli
CS=$(realpath "${CARGO_TARGET_DIR:-target}/release/callstack")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/fixed.c" <<'C'
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
__attribute__((noinline)) unsigned long work(unsigned long n) {
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++) x = x * x + i;
    return x;
}
int main(void) {
    double t = now();
    volatile unsigned long r = work(800000000ul);
    (void)r;
    printf("%.6f\n", now() - t);
    return 0;
}
C
gcc -O2 -o "$work/fixed" "$work/fixed.c"
run_bare() { "$work/fixed"; }
run_var() {
    case "$1" in
    adaptive) "$CS" record -q -F 999 -o "$work/r.data" -- "$work/fixed" ;;
    s16384) "$CS" record -q -F 999 --stack-size 16384 -o "$work/r.data" -- "$work/fixed" ;;
    s4096) "$CS" record -q -F 999 --stack-size 4096 -o "$work/r.data" -- "$work/fixed" ;;
    perf) perf record -q -F 999 -g --call-graph dwarf -o "$work/p.data" -- "$work/fixed" 2>/dev/null ;;
    perf-nocg) perf record -q -F 999 -o "$work/p.data" -- "$work/fixed" 2>/dev/null ;;
    all)
        # The whole host recorded around the program: started half a
        # second before it (its first look at every process done), stopped
        # after it.
        "$CS" record -q -a -F 999 -o "$work/a.data" &
        local rp=$!
        sleep 0.5
        "$work/fixed"
        kill -TERM "$rp"
        wait "$rp" || true
        ;;
    esac
}
variants=(adaptive s16384 s4096 all)
command -v perf >/dev/null && variants+=(perf perf-nocg)
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
: >"$work/bare"
for v in "${variants[@]}"; do : >"$work/$v"; done
for ((i = 0; i < N; i++)); do
    for v in "${variants[@]}"; do
        run_bare >>"$work/bare"
        run_var "$v" | tail -1 >>"$work/$v"
        run_var "$v" | tail -1 >>"$work/$v"
        run_bare >>"$work/bare"
    done
done
b=$(median <"$work/bare")
spread() { sort -n "$1" | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%s-%s", lo, hi}'; }
printf '%-10s %s s           (%s)\n' bare "$b" "$(spread "$work/bare")"
for v in "${variants[@]}"; do
    m=$(median <"$work/$v")
    printf '%-10s %s s  %+.2f%%  (%s)\n' "$v" "$m" "$(echo "($m / $b - 1) * 100" | bc -l)" "$(spread "$work/$v")"
done
