#!/usr/bin/env bash
# Overload figures on the real llama-server and on the fake: the Retry-After hit rate of clients that
# retry exactly when told, and goodput at 10x the load the slot can serve against goodput at 1x.
# Release build; prints figures and ratios, asserts nothing about time. OVERLOAD_SECONDS=N sets the
# length of each goodput run (default 30), OVERLOAD_ROUNDS=N the bursts of each Retry-After run
# (default 8, about 40 retries; more for a tighter figure).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/setup-llama.sh)"
export LLAMA_SERVER LLAMA_MODEL LLAMA_MODEL_LONG LLAMA_SOURCE
cargo build --release -p slotgate --bins
SLOTGATE_BIN="$PWD/${CARGO_TARGET_DIR:-target}/release/slotgate" \
  cargo bench -p slotgate-tests --bench overload "$@"
