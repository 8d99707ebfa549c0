#!/usr/bin/env bash
# What `callstack record` costs the program it samples: a CPU-bound C
# program of fixed work (its own CLOCK_MONOTONIC run time printed) run
# bare and recorded, in ABBA order (bare, recorded, recorded, bare for
# each variant in turn), N rounds. Variants: `record -F 999` (the
# adaptive user stack copy, 8 KiB at the start), `--stack-size 4096`,
# `record -F 99`, `record -a -F 999` and `record -a -F 99` (the whole
# host, started before the program and stopped by SIGTERM after it: a
# script's background job ignores SIGINT; root), and when perf is installed
# `perf record -F 999 -g --call-graph dwarf`, `perf record -F 999`
# with no call graph (the cost of the sampling interrupt alone) and
# `perf record -a -F 999 -g --call-graph dwarf` (as `record -a`).
#
# Each ABBA round gives one paired ratio, (recorded + recorded) /
# (bare + bare): the two bare runs around the two recorded ones cancel
# the machine's slow drifts (a shared VM's speed moves by 10% over
# minutes). Printed per variant: the median of its ratios, a 95%
# confidence interval of that median (distribution-free: order
# statistics of the ratios, binomial ranks), the mean with two standard
# errors, and the medians of the raw run times. The bar's "spread below
# 1%" is the interval's width: add rounds until it is.
#
#   bash benches/record_overhead.sh [N]   (default 10)
#   VARIANTS="adaptive all perf-nocg" WORK=400000000 bash benches/record_overhead.sh 60
#
# VARIANTS picks variants (default: those above; also `sN`, a fixed
# copy of N bytes, `fN` and `allN`, `record` and `record -a` at N Hz);
# WORK is the loop's iteration count (default 800000000, about a second
# here).
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
    volatile unsigned long r = work(WORK);
    (void)r;
    printf("%.6f\n", now() - t);
    return 0;
}
C
gcc -O2 -DWORK="${WORK:-800000000}ul" -o "$work/fixed" "$work/fixed.c"
run_bare() { "$work/fixed"; }
# The whole host recorded at $1 Hz around the program: started half a
# second before it (its first look at every process done), stopped after it.
all_around() {
    "$CS" record -q -a -F "$1" -o "$work/a.data" &
    local rp=$!
    sleep 0.5
    "$work/fixed"
    kill -TERM "$rp"
    wait "$rp" || true
}
run_var() {
    case "$1" in
    adaptive) "$CS" record -q -F 999 -o "$work/r.data" -- "$work/fixed" ;;
    # sN: a fixed copy of N bytes (s16384, s4096, ...).
    s[0-9]*) "$CS" record -q -F 999 --stack-size "${1#s}" -o "$work/r.data" -- "$work/fixed" ;;
    # fN: the adaptive copy at N Hz (f99, ...).
    f[0-9]*) "$CS" record -q -F "${1#f}" -o "$work/r.data" -- "$work/fixed" ;;
    # allN: `record -a` at N Hz (all99, ...).
    all[0-9]*) all_around "${1#all}" ;;
    perf) perf record -q -F 999 -g --call-graph dwarf -o "$work/p.data" -- "$work/fixed" 2>/dev/null ;;
    perf-nocg) perf record -q -F 999 -o "$work/p.data" -- "$work/fixed" 2>/dev/null ;;
    all) all_around 999 ;;
    perf-all)
        # perf's whole-host recording, the same way.
        perf record -q -a -F 999 -g --call-graph dwarf -o "$work/pa.data" 2>/dev/null &
        local pp=$!
        sleep 0.5
        "$work/fixed"
        kill -TERM "$pp"
        wait "$pp" || true
        ;;
    esac
}
if [[ -n ${VARIANTS:-} ]]; then
    read -ra variants <<<"$VARIANTS"
else
    variants=(adaptive s4096 f99 all all99)
    command -v perf >/dev/null && variants+=(perf perf-nocg perf-all)
fi
for v in "${variants[@]}"; do : >"$work/$v.bare" && : >"$work/$v"; done
for ((i = 0; i < N; i++)); do
    for v in "${variants[@]}"; do
        run_bare >>"$work/$v.bare"
        run_var "$v" | tail -1 >>"$work/$v"
        run_var "$v" | tail -1 >>"$work/$v"
        run_bare >>"$work/$v.bare"
    done
done
python3 - "$work" "${variants[@]}" <<'PY'
import statistics, sys
sys.path.insert(0, "benches")
import stats
work, variants = sys.argv[1], sys.argv[2:]
print(f"{'variant':<10} {'rounds':>6} {'median':>8} {'95% CI of median':>19} {'mean +- 2 SE':>16}   bare / recorded medians")
for v in variants:
    bare = [float(x) for x in open(f"{work}/{v}.bare")]
    rec = [float(x) for x in open(f"{work}/{v}")]
    r = [(rec[2*i] + rec[2*i+1]) / (bare[2*i] + bare[2*i+1]) - 1 for i in range(len(bare) // 2)]
    med, lo, hi = stats.median_ci(r)
    mean, se = stats.mean_se(r)
    print(f"{v:<10} {len(r):>6} {med*100:>+7.2f}% [{lo*100:+6.2f}%, {hi*100:+6.2f}%] "
          f"{mean*100:+6.2f}% +- {2*se*100:.2f}%   {statistics.median(bare):.4f} / {statistics.median(rec):.4f} s")
PY
