"""Runs a python program (`python_timed.py PROGRAM ARGS...`) and appends
its own run time in seconds (time.perf_counter around it) to the file
$BENCH_OUT: what a profiler attached to it slowed it by, without the
profiler's start and end. For benches/python_record.sh."""
import os
import runpy
import sys
import time

sys.argv = sys.argv[1:]
t = time.perf_counter()
runpy.run_path(sys.argv[0], run_name="__main__")
elapsed = time.perf_counter() - t
with open(os.environ["BENCH_OUT"], "a") as f:
    f.write(f"{elapsed}\n")
