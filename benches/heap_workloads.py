"""The workloads of the heap-tracking benches, written into a directory.

    python3 benches/heap_workloads.py DIR

writes DIR/alloc.py (a JSON round trip of 60,000 small dicts: python3 with
PYTHONMALLOC=malloc sends every object through malloc) and DIR/big.i (1500
generated C functions, preprocessed: what gcc's cc1 -O2 compiles).
`benches/memtrack_sampled.sh` and `benches/memtrack_ab.py` import it for
the workloads' command lines (`loads`) and their timed runs (`timed`).
"""
import os
import resource
import subprocess
import sys
import time

ALLOC_PY = '''import json
d = [{"k%d" % i: [i] * 10, "s": "x" * (i % 100)} for i in range(60000)]
s = json.dumps(d)
for _ in range(3):
    json.loads(s)
'''


def write(work):
    with open(f"{work}/alloc.py", "w") as f:
        f.write(ALLOC_PY)
    with open(f"{work}/big.c", "w") as f:
        f.write("#include <stdio.h>\n#include <string.h>\n")
        for i in range(1500):
            f.write(f"""
struct s{i} {{ int a[{i % 17 + 1}]; double d; char name[{i % 31 + 1}]; }};
static int helper{i}(struct s{i} *p, int n) {{
    int t = 0;
    for (int k = 0; k < n; k++) {{ t += p->a[k % {i % 17 + 1}] * k; if (t > {i * 7}) t -= n; }}
    return t + (int)p->d;
}}
int func{i}(int n) {{
    struct s{i} x; memset(&x, 0, sizeof x);
    x.d = n * 0.5;
    switch (n % 4) {{ case 0: return helper{i}(&x, n); case 1: return helper{i}(&x, n + 1) * 2;
    case 2: snprintf(x.name, sizeof x.name, "%d", n); return (int)strlen(x.name); default: return n; }}
}}
""")
    subprocess.run(["gcc", "-E", f"{work}/big.c", "-o", f"{work}/big.i"], check=True)


def loads(work, py, cc1, pymalloc=False):
    """(name, command, environment) of each workload written to `work`:
    python3 `py` with PYTHONMALLOC=malloc (and with pymalloc too when asked),
    then gcc's `cc1` -O2."""
    out = [("python3 (PYTHONMALLOC=malloc)", [py, f"{work}/alloc.py"], {"PYTHONMALLOC": "malloc"})]
    if pymalloc:
        out.append(("python3 (pymalloc)", [py, f"{work}/alloc.py"], {}))
    out.append(("cc1 -O2", [cc1, "-fpreprocessed", "-O2", "-quiet", f"{work}/big.i", "-o", "/dev/null"], {}))
    return out


def timed(cmd, env):
    """Runs `cmd` with `env` added to the environment, its output dropped;
    its wall time and CPU time (user + sys of the whole command), seconds."""
    e = dict(os.environ, **env)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


if __name__ == "__main__":
    write(sys.argv[1])
