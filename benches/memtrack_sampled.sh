#!/usr/bin/env bash
# Sampled heap tracking (`callstack memtrack --sample-bytes N`) beside exact
# tracking, on python3 and on gcc's compiler proper (cc1), same run:
#   - time added to the bare run (median wall and CPU of RUNS runs each,
#     the three modes taking turns);
#   - per round (one run of each mode, next to each other), the sampled
#     mode's added time over exact tracking's added time: the median of
#     those paired figures and its 95% confidence interval (order
#     statistics, benches/stats.py), which the machine's slow drifts do
#     not move as they move medians of whole columns;
#   - per site (the folded stack, symbolized) of exact tracking's top 10 by
#     allocated bytes: the sampled estimate over the exact figure.
#
#   bash benches/memtrack_sampled.sh [RUNS] [N...]   (default 5 runs; N 524288 65536)
#   LOADS=cc1 bash benches/memtrack_sampled.sh 30 16384   (only the workloads whose name has "cc1")
#
# python3 runs with PYTHONMALLOC=malloc (every object through malloc, as
# heap profilers of Python ask for; its default pymalloc serves small
# objects from its own arenas) and, for reference, with its default.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
shift || true
SIZES=("${@:-524288 65536}")
[ $# -gt 0 ] || SIZES=(524288 65536)
cargo build --release -q -p callstack-cli -p callstack-preload
CS=$(realpath "${CARGO_TARGET_DIR:-target}/release/callstack")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
PY=$(command -v python3)
# The real interpreter, not a shim script.
PY=$("$PY" -c 'import sys; print(sys.executable)')
CC1=$(gcc -print-prog-name=cc1)
python3 benches/heap_workloads.py "$work"
python3 - "$work" "$CS" "$RUNS" "$PY" "$CC1" "${SIZES[@]}" <<'PYEOF'
import os, statistics, subprocess, sys
sys.path.insert(0, "benches")
import heap_workloads, stats
work, cs, runs, py, cc1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
sizes = [int(s) for s in sys.argv[6:]]
loads = [l for l in heap_workloads.loads(work, py, cc1, pymalloc=True) if os.environ.get("LOADS", "") in l[0]]
def run(cmd, env, heap=None, n=None):
    if heap is not None:
        cmd = [cs, "memtrack", "--summary", "/dev/null", "-o", heap] + (["--sample-bytes", str(n)] if n else []) + ["--"] + cmd
    return heap_workloads.timed(cmd, env)
def folded(heap):
    out = subprocess.run([cs, "report", heap, "--top", "0", "--sample-type", "alloc_space", "--folded", "-"],
                         capture_output=True, text=True, check=True).stdout
    d = {}
    for l in out.splitlines():
        st, _, v = l.rpartition(" ")
        d[st] = d.get(st, 0) + int(v)
    return d
for name, cmd, env in loads:
    modes = [("bare", None)] + [("exact", 0)] + [(f"N={n}", n) for n in sizes]
    times = {m: [] for m, _ in modes}
    for r in range(runs):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m, n in order:
            heap = None if n is None else f"{work}/{m}.heap"
            times[m].append(run(cmd, env, heap, n))
    med = {m: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for m, v in times.items()}
    print(f"\n{name}: median of {runs} runs (wall s, CPU s; added over bare)")
    bw, bc = med["bare"]
    ew, ec = med["exact"]
    for m, _ in modes:
        w, c = med[m]
        extra = ""
        if m.startswith("N="):
            extra = f"  added/exact's added: wall {(w - bw) / max(ew - bw, 1e-9):.3f}, CPU {(c - bc) / max(ec - bc, 1e-9):.3f}"
        print(f"  {m:10} {w:7.3f} {c:7.3f}  (+{w - bw:.3f}, +{c - bc:.3f}){extra}")
    for m, _ in modes[2:]:
        if ew - bw < 0.1 * bw:
            # Exact tracking adds too little (python3 with pymalloc) for a
            # ratio to it to mean anything, round by round.
            print(f"  {m}: per round: exact tracking adds under 10% of the bare run, no paired ratio")
            continue
        for k, what in ((0, "wall"), (1, "CPU")):
            r = [(times[m][i][k] - times["bare"][i][k]) / max(times["exact"][i][k] - times["bare"][i][k], 1e-9)
                 for i in range(runs)]
            med, lo, hi = stats.median_ci(r)
            print(f"  {m}: per round, added/exact's added ({what}): median {med:.3f}, 95% CI [{lo:.3f}, {hi:.3f}]")
    exact = folded(f"{work}/exact.heap")
    top = sorted(exact.items(), key=lambda kv: -kv[1])[:10]
    for n in sizes:
        s = folded(f"{work}/N={n}.heap")
        ratios = [s.get(st, 0) / v for st, v in top]
        worst = max(abs(r - 1) for r in ratios)
        print(f"  N={n}: top-10 sites' estimated bytes / exact: " + " ".join(f"{r:.3f}" for r in ratios)
              + f"  (worst {worst * 100:.1f}%; site sizes {top[0][1] >> 20}..{top[-1][1] >> 20} MiB)")
PYEOF
