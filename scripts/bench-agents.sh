#!/usr/bin/env bash
# Coding agents on one slot: the wall time of a burst of agent runs (5 Claude Code, 2 Codex CLI,
# 1 opencode by default; docs/agents.md) on one llama-server slot, direct and through slotgate, in
# the same invocation, and the ratio through / direct. Release build; prints figures and asserts
# nothing about time. AGENTS_CLAUDE_CODE, AGENTS_CODEX and AGENTS_OPENCODE set the burst,
# AGENTS_ROUNDS the rounds (default 3; the figure is their median).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/setup-llama.sh)"
export LLAMA_SERVER LLAMA_MODEL LLAMA_MODEL_LONG LLAMA_SOURCE
eval "$(bash scripts/setup-agents.sh)"
export CLAUDE_CODE CODEX OPENCODE
cargo build --release -p slotgate --bins
SLOTGATE_BIN="$PWD/${CARGO_TARGET_DIR:-target}/release/slotgate" \
  cargo bench -p slotgate-tests --bench agents "$@"
