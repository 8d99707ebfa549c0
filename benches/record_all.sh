#!/usr/bin/env bash
# `callstack record -a` beside `perf record -a -g --call-graph dwarf` on a
# host running 20 busy processes (C, Rust, python3, bash loops, and loops
# that exec and exit a program every second), each recorder for SECS
# seconds in turn on the same steady workload:
#   - each process name's share of the samples (idle left out), ours and
#     perf's, and the largest difference;
#   - for ours, the share of each process's samples whose chain reaches the
#     thread's first frame: `_start` (in a stripped program, unnamed, but
#     then `__libc_start_main` is there), `clone3`/`clone` for a thread,
#     the loader's entry for a process that is still starting;
#   - each recorder's CPU time (user + sys) and peak resident memory, and
#     perf report's (the DWARF unwinding perf leaves to it, with call
#     graphs: what our recorder does as the samples arrive).
# With ROUNDS, then ROUNDS rounds of SECS seconds each, taking turns on the
# same workload: BASE (another build's `callstack`, when given), ours, ours
# with `--no-python` (native frames only), and perf; each one's CPU time
# over perf's in the same round, and the medians (this VM is noisy: a lone
# run's ratio wanders by a tenth).
#
# Ours samples at HZ (default 999: `record -a`'s own default is 99, the
# always-on rate; 999 keeps these figures comparable with the earlier
# ones), perf at its default (4000 Hz).
#
#   sudo bash benches/record_all.sh [SECS [ROUNDS [BASE]]]   (default 30 0)
#   HZ=99 sudo -E bash benches/record_all.sh 30
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-30}
ROUNDS=${2:-0}
HZ=${HZ:-999}
BASE=${3:-}
cargo build --release -q -p callstack-cli
CS=$(realpath "${CARGO_TARGET_DIR:-target}/release/callstack")
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
gcc -O2 -fomit-frame-pointer -pthread tests/fixtures/c/prof_hot.c -o "$work/c_hot"
cat >"$work/rust_hot.rs" <<'RS'
use std::hint::black_box;
#[inline(never)]
fn rust_inner(n: u64) -> u64 { (0..n).fold(0u64, |a, x| black_box(a.wrapping_mul(31).wrapping_add(x))) }
#[inline(never)]
fn rust_outer() -> u64 { rust_inner(black_box(1 << 20)) }
fn main() { loop { black_box(rust_outer()); } }
RS
rustc -O -g -o "$work/rust_hot" "$work/rust_hot.rs"
long=$((SECS * (3 + 4 * ROUNDS) + 60))
for _ in 1 2 3 4 5 6; do "$work/c_hot" "$long" 1 & pids+=($!); done
for _ in 1 2 3 4; do "$work/rust_hot" & pids+=($!); done
py=$(python3 -c 'import sys; print(sys.executable)')
for _ in 1 2 3 4; do "$py" -c 'import json
while True: json.loads(json.dumps([{"k": i} for i in range(1000)]))' & pids+=($!); done
for _ in 1 2 3 4; do bash -c 'while :; do x=$((x+1)); done' & pids+=($!); done
for _ in 1 2; do bash -c 'while :; do /bin/true; gzip -c /bin/bash >/dev/null; sleep 1; done' & pids+=($!); done
sleep 2
# Ours, then perf's, on the same workload.
/usr/bin/time -f "%U %S %M" -o "$work/cs.time" "$CS" record -q -a -F "$HZ" -d "$SECS" -o "$work/cs.data"
"$CS" report "$work/cs.data" --top 0 --per-thread --folded "$work/cs.folded"
/usr/bin/time -f "%U %S %M" -o "$work/perf.time" perf record -q -a -g --call-graph dwarf -o "$work/perf.data" -- sleep "$SECS" 2>/dev/null
/usr/bin/time -f "%U %S %M" -o "$work/perf-report.time" \
    perf report -i "$work/perf.data" --stdio --sort comm --no-children -g caller 2>/dev/null >"$work/perf-full.txt"
perf report -i "$work/perf.data" --stdio --sort comm --no-children -g none 2>/dev/null >"$work/perf.txt"
python3 - "$work" <<'PY'
import re, sys, collections
work = sys.argv[1]
ours = collections.Counter()
whole = collections.Counter()
tid_names = {}
for line in open(f"{work}/cs.folded"):
    stack, _, v = line.rstrip("\n").rpartition(" ")
    root = stack.split(";")[0]
    # --per-thread roots are "name (tid)", or "thread tid" when unnamed.
    name = re.sub(r"\s*\(\d+\)$|[ -]\d+$", "", root)
    ours[name] += int(v)
    frames = stack.split(";")
    starts = ("_start", "clone3", "clone", "__libc_start_main_impl", "start_thread")
    if len(frames) > 1 and (frames[1].startswith("ld-linux") or any(f in starts for f in frames[1:])):
        whole[name] += int(v)
theirs = collections.Counter()
for line in open(f"{work}/perf.txt"):
    m = re.match(r"\s*([\d.]+)%\s+(.+?)\s*$", line)
    if m:
        theirs[m.group(2)] += float(m.group(1))
for c in (ours, theirs):
    for idle in ("swapper", "swapper/0", "swapper/1"):
        c.pop(idle, None)
t_ours = sum(ours.values()) or 1
t_theirs = sum(theirs.values()) or 1
names = sorted(set(ours) | set(theirs), key=lambda n: -(ours[n] / t_ours + theirs[n] / t_theirs))
worst = 0
print(f"{'process':20} {'ours %':>8} {'perf %':>8} {'ours to _start/clone %':>24}")
for n in names[:15]:
    a, b = ours[n] * 100 / t_ours, theirs[n] * 100 / t_theirs
    worst = max(worst, abs(a - b))
    w = f"{whole[n] * 100 / ours[n]:.1f}" if ours[n] else "-"
    print(f"{n[:20]:20} {a:8.1f} {b:8.1f} {w:>24}")
print(f"largest difference of a share: {worst:.1f} points")
for who in ("cs", "perf", "perf-report"):
    u, s, m = open(f"{work}/{who}.time").read().split()
    print(f"{who:11}: CPU {float(u) + float(s):.2f} s, peak RSS {int(m) / 1024:.0f} MB")
PY
[ "$ROUNDS" -gt 0 ] || exit 0
for r in $(seq "$ROUNDS"); do
    for who in base ours ours-no-python perf; do
        case $who in
        base)
            [ -n "$BASE" ] || continue
            cmd=("$BASE" record -q -a -F "$HZ" -d "$SECS" -o "$work/r.data") ;;
        ours) cmd=("$CS" record -q -a -F "$HZ" -d "$SECS" -o "$work/r.data") ;;
        ours-no-python) cmd=("$CS" record -q -a -F "$HZ" --no-python -d "$SECS" -o "$work/r.data") ;;
        perf) cmd=(perf record -q -a -g --call-graph dwarf -o "$work/r.perf" -- sleep "$SECS") ;;
        esac
        # A new file each time: perf truncating its last 2 GB file would
        # count against it.
        rm -f "$work/r.perf" "$work/r.data"
        /usr/bin/time -f "%U %S" -o "$work/$who.r$r" "${cmd[@]}" 2>/dev/null
    done
done
python3 - "$work" "$ROUNDS" <<'PY'
import os, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
whos = [w for w in ("base", "ours", "ours-no-python") if os.path.exists(f"{work}/{w}.r1")]
cpu = lambda w, r: sum(map(float, open(f"{work}/{w}.r{r}").read().split()))
ratios = {w: [] for w in whos}
print(f"{'round':>5} {'perf s':>7} " + " ".join(f"{w + ' s':>17} {'/perf':>6}" for w in whos))
for r in range(1, rounds + 1):
    p = cpu("perf", r)
    cells = []
    for w in whos:
        c = cpu(w, r)
        ratios[w].append(c / p)
        cells.append(f"{c:17.2f} {c / p:6.2f}")
    print(f"{r:5} {p:7.2f} " + " ".join(cells))
for w in whos:
    print(f"median {w} / perf: {statistics.median(ratios[w]):.2f}")
PY
