#!/bin/bash
# What `record -a --off-cpu --pid-filter PID` costs on a host where another
# process switches a lot: a bystander (two threads passing a byte over
# pipes, ~100,000 switches a second) beside the target
# (crates/callstack-cli/tests/fixtures/python/offcpu.py, 70/30 blocked in
# two functions). Prints, per recorder binary and round, the recorder's
# CPU time (user, sys), its peak RSS, and the target's off_cpu split.
# Usage: sudo bash benches/offcpu_filter.sh [ROUNDS] BIN [BIN...]
#   (e.g. an older build beside target/release/callstack).
set -eu
rounds=${1:-3}; shift
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/pingpong.c" <<'C'
#include <pthread.h>
#include <unistd.h>
static int a[2], b[2];
static void *other(void *x) {
    char c;
    while (read(a[0], &c, 1) == 1) write(b[1], &c, 1);
    return x;
}
int main(void) {
    pipe(a); pipe(b);
    pthread_t t; pthread_create(&t, 0, other, 0);
    char c = 0;
    for (;;) { write(a[1], &c, 1); if (read(b[0], &c, 1) != 1) break; }
}
C
gcc -O2 -pthread "$work/pingpong.c" -o "$work/pingpong"
fixture=$root/crates/callstack-cli/tests/fixtures/python/offcpu.py
for r in $(seq "$rounds"); do
    for bin in "$@"; do
        "$work/pingpong" & pp=$!
        python3 "$fixture" 8 & t=$!
        sleep 0.5
        /usr/bin/time -f "%U %S %M" -o "$work/time" \
            "$bin" record -q -a --off-cpu -d 5 --pid-filter $t -o "$work/d.data"
        kill $pp $t 2>/dev/null || true
        wait $pp $t 2>/dev/null || true
        "$bin" report --sample-type off_cpu --folded "$work/f" "$work/d.data" >/dev/null
        read -r u s m < "$work/time"
        awk -v b="$bin" -v r="$r" -v u="$u" -v s="$s" -v m="$m" '
            { n = $NF; t += n; if (/sleep_seventy/) a += n; if (/read_thirty/) c += n }
            END { printf "round %d %s: recorder cpu %.2f s (user %s, sys %s), %d MB; sleep_seventy/read_thirty %.1f/%.1f\n",
                  r, b, u + s, u, s, m / 1024, 100 * a / (a + c), 100 * c / (a + c) }' "$work/f"
    done
done
