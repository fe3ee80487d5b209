#!/usr/bin/env bash
# What policies cost, measured against no-policy baselines in the same run (prints ratios; asserts
# nothing about time): per evaluation (sidecar/benches/policy_eval.rs, including the inline /
# fiber / block_in_place / spawn_blocking comparison) and per whole request through the release binary
# (tests/benches/gate_overhead.rs). Builds the example policies and the release binary first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/build-policies.sh >/dev/null
cargo build --release -p slotgate --bin slotgate
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
cargo bench -p slotgate --bench policy_eval
SLOTGATE_BIN="$target_dir/release/slotgate" cargo bench -p slotgate-tests --bench gate_overhead
