#!/usr/bin/env bash
# Two slotgate binaries head to head on the hot path: each with no policy and with token-budget, in
# front of the same nginx mock (mock.conf.in), rounds interleaved (A B A B ...) so drift on a noisy
# machine hits both alike; and the head binary with OpenTelemetry traces on (every request traced,
# exported to the mock's /v1/traces). Prints wrk's c=64 requests/s and c=1 p50 per run, then each
# system's medians as ratios to base-no-policy; asserts nothing.
#
#   bash scripts/bench/ab.sh BASE_BINARY HEAD_BINARY
#
# A base binary: `git worktree add /tmp/base <commit> && CARGO_TARGET_DIR=/tmp/base-target cargo
# build --release -p slotgate --manifest-path /tmp/base/Cargo.toml`. Environment: AB_ROUNDS (3),
# AB_SECONDS (8, each c=64 run; c=1 runs take 5).
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
base="$1" head="$2"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
source "$here/lib.sh"
bash scripts/build-policies.sh >/dev/null
policy="$(cargo_target_dir)/policies/token-budget.wasm"
rounds="${AB_ROUNDS:-3}" secs="${AB_SECONDS:-8}"

bench_root ab
start_mock
echo '{"capacity": 1000000000000, "refill_per_second": 1000000000}' >"$root/budget.json"

systems=()
start() { # NAME BINARY [args...]
  start_mock_gate "$@"
  systems+=("$1:$gate_port")
}
start base-no-policy "$base"
start head-no-policy "$head"
start base-token-budget "$base" --policy "$policy" --policy-settings "$root/budget.json"
start head-token-budget "$head" --policy "$policy" --policy-settings "$root/budget.json"
OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$mock_port" start head-traces-on "$head"

printf '%-6s %-20s %12s %10s\n' round system "c=64 rps" "c=1 p50"
for r in $(seq "$rounds"); do
  for s in "${systems[@]}"; do
    url="http://127.0.0.1:${s#*:}/v1/chat/completions"
    read -r rps p50 < <(rps_p50 "$url" post.lua)
    printf '%-6s %-20s %12s %10s\n' "$r" "${s%%:*}" "$rps" "$p50" | tee -a "$root/rows"
  done
done
# Medians per system, as ratios to base-no-policy.
medians "$root/rows" base-no-policy 20
