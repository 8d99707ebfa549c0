"""Two builds of `callstack memtrack --sample-bytes N` side by side, one run.

    python3 benches/memtrack_ab.py RUNS OLD_CALLSTACK NEW_CALLSTACK [N]

Each binary needs its `libcallstack_preload.so` beside it. The workloads are
those of `benches/memtrack_sampled.sh` (python3 with PYTHONMALLOC=malloc on a
JSON round trip; gcc's cc1 -O2 on 1500 generated functions). Modes take
turns round by round: bare, exact (NEW), N with OLD, N with NEW. Prints the
median wall and CPU (user + sys of the whole command) of each mode, and each
sampled mode's added time over exact tracking's added time.
"""
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import heap_workloads  # noqa: E402

runs = int(sys.argv[1])
old_cs, new_cs = os.path.realpath(sys.argv[2]), os.path.realpath(sys.argv[3])
n = int(sys.argv[4]) if len(sys.argv) > 4 else 16384
py = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"],
                    capture_output=True, text=True, check=True).stdout.strip()
cc1 = subprocess.run(["gcc", "-print-prog-name=cc1"], capture_output=True, text=True,
                     check=True).stdout.strip()
work = tempfile.mkdtemp()
heap_workloads.write(work)
loads = heap_workloads.loads(work, py, cc1)


def run(cmd, env, cs=None, bytes_=None):
    if cs:
        cmd = [cs, "memtrack", "--summary", "/dev/null", "-o", f"{work}/heap",
               "--sample-bytes", str(bytes_), "--"] + cmd
    return heap_workloads.timed(cmd, env)


modes = [("bare", None, None), ("exact", new_cs, 0), ("old", old_cs, n), ("new", new_cs, n)]
for name, cmd, env in loads:
    t = {m: [] for m, _, _ in modes}
    for r in range(runs):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m, cs, b in order:
            t[m].append(run(cmd, env, cs, b))
    med = {m: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
           for m, v in t.items()}
    bw, bc = med["bare"]
    ew, ec = med["exact"]
    print(f"{name}: median of {runs} (wall s / CPU s): "
          + ", ".join(f"{m} {w:.3f}/{c:.3f}" for m, (w, c) in med.items()))
    for m in ("old", "new"):
        w, c = med[m]
        print(f"  {m} N={n}: added over exact's added: wall {(w - bw) / max(ew - bw, 1e-9):.3f}, "
              f"CPU {(c - bc) / max(ec - bc, 1e-9):.3f}")
    sys.stdout.flush()
subprocess.run(["rm", "-rf", work])
