#!/usr/bin/env bash
# An agent and a chat client on one llama-server slot under each --cached-token-weight: each one's
# share of the slot, its wait for it, and the chat's time to first token (tests/benches/cached_weight.rs;
# docs/spend.md). Release build, the real llama-server and Claude Code; prints figures and asserts
# nothing about time. CW_SECONDS sets each phase (default 60), CW_WEIGHTS the weights (1,0.1,0).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
eval "$(bash scripts/setup-llama.sh)"
export LLAMA_SERVER LLAMA_MODEL LLAMA_MODEL_LONG LLAMA_SOURCE
eval "$(bash scripts/setup-agents.sh)"
export CLAUDE_CODE CODEX OPENCODE
cargo build --release -p slotgate --bins
SLOTGATE_BIN="$PWD/${CARGO_TARGET_DIR:-target}/release/slotgate" \
  cargo bench -p slotgate-tests --bench cached_weight "$@"
