"""The workloads of the heap-tracking benches, written into a directory.

    python3 benches/heap_workloads.py DIR

writes DIR/alloc.py (a JSON round trip of 60,000 small dicts: python3 with
PYTHONMALLOC=malloc sends every object through malloc) and DIR/big.i (1500
generated C functions, preprocessed: what gcc's cc1 -O2 compiles).
`benches/memtrack_sampled.sh` runs it; `benches/memtrack_ab.py` imports it.
"""
import subprocess
import sys

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


if __name__ == "__main__":
    write(sys.argv[1])
