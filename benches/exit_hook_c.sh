#!/usr/bin/env bash
# The cost of an exit hook from Rust and from C, side by side in one run:
# the Rust bench's interleaved medians (cargo bench --bench exit_hook), then
# crates/callstack-capi/benches/exit_hook.c built at -O0 and -O2 against
# target/release/libcallstack.a (medians of 2000 rounds of 200 calls).
# Usage: benches/exit_hook_c.sh   (CARGO_TARGET_DIR honoured)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
cd "$root"
cargo build --release -q -p callstack-capi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for o in O0 O2; do
    gcc -$o -g -I crates/callstack-capi/include crates/callstack-capi/benches/exit_hook.c \
        "$target/release/libcallstack.a" -lpthread -ldl -lm -o "$out/exit_hook_$o"
done
echo "Rust (cargo bench -p callstack-benches --bench exit_hook):"
cargo bench -q -p callstack-benches --bench exit_hook -- --warm-up-time 1 --measurement-time 2 2>/dev/null |
    sed -n '/interleaved medians/,$p'
echo
echo "C (ns per call; the last column: the row minus its plain call):"
echo "| build | row | ns | hook's added cost, ns |"
echo "|---|---|---:|---:|"
for round in 1 2; do
    for o in O0 O2; do
        "$out/exit_hook_$o" "-$o ($round)"
    done
done
