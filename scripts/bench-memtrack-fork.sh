#!/usr/bin/env bash
# Cost of fork+exec under `callstack memtrack`: wall time of
#   callstack memtrack -o OUT -- bash -c 'for i in $(seq 100); do /bin/true; done'
# for each build given (LABEL=PATH/TO/callstack; its preload library is the
# libcallstack_preload.so next to it), runs alternating, median of N.
#
# bash scripts/bench-memtrack-fork.sh N LABEL=CLI [LABEL=CLI ...]
set -euo pipefail
n=$1
shift
unset CALLSTACK_PRELOAD_LIB
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for _ in $(seq "$n"); do
  for spec in "$@"; do
    label=${spec%%=*}
    cli=${spec#*=}
    s=$(date +%s%N)
    "$cli" memtrack -o "$out/$label.heap" -- bash -c 'for i in $(seq 100); do /bin/true; done' >/dev/null 2>&1
    e=$(date +%s%N)
    echo "$label $(( (e - s) / 1000000 ))"
    rm -f "$out"/*
  done
done | sort -k1,1 -k2,2n | awk '{ a[$1] = a[$1] " " $2; c[$1]++ }
  END { for (k in a) { split(a[k], v, " "); printf "  %-8s median %5.2f s  (ms:%s)\n", k, v[int((c[k] + 1) / 2)] / 1000, a[k] } }'
