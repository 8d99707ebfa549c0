#!/usr/bin/env bash
# Races `callstack addr2line` against binutils `addr2line` and
# `llvm-symbolizer` on 10,000 return addresses (minus 1: the call
# instructions) of a large binary with full debug info, cold each time
# (a fresh process reading the file), plus a one-address run (load and
# first answer). Prints medians of wall and CPU time, peak RSS, ratios,
# and whether our output is identical to binutils'.
#
# Usage: benches/symbolize-cli.sh [RUNS]     (default 5)
# Binary: $CALLSTACK_BENCH_BINARY, else the callstack CLI built with
# debug = 2 into target/bench-bigdebug (built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
cargo build --release -q -p callstack-cli
OURS=$PWD/target/release/callstack
BIN=${CALLSTACK_BENCH_BINARY:-$PWD/target/bench-bigdebug/release/callstack}
if [ ! -x "$BIN" ]; then
  echo "building $BIN (callstack CLI with debug = 2)..." >&2
  CARGO_PROFILE_RELEASE_DEBUG=2 CARGO_TARGET_DIR=$PWD/target/bench-bigdebug \
    cargo build --release -q -p callstack-cli
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# Return addresses: the instruction after each call, 10,000 evenly sampled.
objdump -d --no-show-raw-insn "$BIN" |
  awk '/\tcall/{c=1; next} c && /^ *[0-9a-f]+:/{sub(":","",$1); print $1; c=0}' > "$W/ras"
python3 - "$W/ras" > "$W/probes" <<'PY'
import sys
l = [int(x, 16) for x in open(sys.argv[1])]
n = len(l)
for i in range(10000):
    print("0x%x" % (l[i * n // 10000] - 1))
PY
head -1 "$W/probes" > "$W/one"
echo "binary: $BIN ($(du -m "$BIN" | cut -f1) MB), $(wc -l < "$W/probes") addresses, $RUNS runs each"

# run NAME INPUT CMD...: median wall s, median user+sys s, max RSS MB
run() {
  local name=$1 input=$2; shift 2
  for _ in $(seq "$RUNS"); do
    /usr/bin/time -f "%e %U %S %M" -o "$W/t" "$@" < "$input" > "$W/out.$name"
    cat "$W/t"
  done | python3 -c '
import sys, statistics as st
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
print("%.3f %.3f %.1f" % (st.median(r[0] for r in rows), st.median(r[1] + r[2] for r in rows), max(r[3] for r in rows) / 1024))'
}

declare -A WALL CPU RSS WALL1
for tool in callstack binutils llvm; do
  case $tool in
    callstack) cmd=("$OURS" addr2line -f -i -C -e "$BIN");;
    binutils) cmd=(addr2line -f -i -C -e "$BIN");;
    llvm) cmd=(llvm-symbolizer --output-style=GNU -f -i -C "--obj=$BIN");;
  esac
  read -r w c r < <(run "$tool" "$W/probes" "${cmd[@]}")
  WALL[$tool]=$w; CPU[$tool]=$c; RSS[$tool]=$r
  read -r w1 _ _ < <(run "$tool.one" "$W/one" "${cmd[@]}")
  WALL1[$tool]=$w1
done
printf '%-12s %14s %16s %14s %14s %12s\n' tool "first answer s" "10k wall s" "10k cpu s" "cpu vs ours" "peak RSS MB"
for tool in callstack binutils llvm; do
  printf '%-12s %14s %16s %14s %13.2fx %12s\n' "$tool" "${WALL1[$tool]}" "${WALL[$tool]}" "${CPU[$tool]}" \
    "$(python3 -c "print(${CPU[$tool]} / max(${CPU[callstack]}, 1e-9))")" "${RSS[$tool]}"
done
if cmp -s "$W/out.callstack" "$W/out.binutils"; then
  echo "callstack addr2line output identical to binutils addr2line: yes"
else
  echo "callstack addr2line output identical to binutils addr2line: NO ($(diff "$W/out.binutils" "$W/out.callstack" | grep -c '^<') lines differ)"
fi
