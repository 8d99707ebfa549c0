#!/usr/bin/env bash
# The test command of the README: installs what the tests need when it is
# missing, then runs the whole workspace's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
# The C tests link target/release/libcallstack.a and run target/release/callstack.
cargo build --release -q -p callstack-capi -p callstack-cli
# Capture must build without the symbolizer and the remote unwinder.
cargo check -q -p callstack --no-default-features --all-targets
cargo test --workspace "$@"
