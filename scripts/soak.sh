#!/usr/bin/env bash
# The soak (issue 8, item 7; not in CI): $1 minutes (default 30) of mixed traffic against slotgate in
# front of a real llama-server, one status line per minute, the invariants at the end. Uses the release
# binary; the output is also written to $SOAK_LOG (default soak-<date>.log in the current directory).
# Exit status: 0 if every invariant held. The 2-minute version runs in CI as tests/tests/llama/soak_ci.rs.
set -euo pipefail
minutes="${1:-30}"
log="${SOAK_LOG:-$PWD/soak-$(date +%Y%m%d-%H%M%S).log}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cargo build --release -p slotgate
eval "$(bash scripts/setup-llama.sh)"
export LLAMA_SERVER LLAMA_MODEL LLAMA_MODEL_LONG LLAMA_SOURCE
bash scripts/build-policies.sh >/dev/null
cargo build --release -p slotgate-tests --example soak

target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
export SLOTGATE_BIN="$target_dir/release/slotgate"
{
  echo "soak: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "slotgate: $SLOTGATE_BIN ($(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty'))"
} | tee "$log"
set +e
"$target_dir/release/examples/soak" --minutes "$minutes" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); log: $log" | tee -a "$log"
exit "$status"
