#!/usr/bin/env bash
# Scale-out figures (issue 36): two llama-server + slotgate pairs under bursts larger than one pair
# holds, a plain round-robin against LiteLLM's least-busy routing and SMG's least_load (which polls
# slotgate's /v1/loads) in the same invocation: requests
# per pair, p50 and p95 of a client's wait, and the p95 ratio. Release build; prints figures and
# ratios, asserts nothing about time. SCALEOUT_ROUNDS=N bursts per way (default 6),
# SCALEOUT_BURST=N clients per burst (default 4).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/setup-llama.sh)"
export LLAMA_SERVER LLAMA_MODEL LLAMA_MODEL_LONG LLAMA_SOURCE
eval "$(bash scripts/setup-python-clients.sh)"
export SLOTGATE_PYTHON
export LITELLM="$(dirname "$SLOTGATE_PYTHON")/litellm"
eval "$(bash scripts/setup-smg.sh)"
export SLOTGATE_SMG
cargo build --release -p slotgate --bins
SLOTGATE_BIN="$PWD/${CARGO_TARGET_DIR:-target}/release/slotgate" \
  cargo bench -p slotgate-tests --bench scaleout "$@"
