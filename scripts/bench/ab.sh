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
bash scripts/build-policies.sh >/dev/null
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
policy="$target_dir/policies/token-budget.wasm"
rounds="${AB_ROUNDS:-3}" secs="${AB_SECONDS:-8}"

root="$(mktemp -d -t slotgate-ab.XXXXXX)"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT

user=""; [ "$(id -u)" = 0 ] && user="user root;"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mkdir -p "$root/mock"
mock_port="$(port)"
sed -e "s|@DIR@|$root/mock|g" -e "s|@USER@|$user|g" -e "s|@BENCH@|$here|g" -e "s|@MOCK_PORT@|$mock_port|g" \
  "$here/mock.conf.in" >"$root/mock/nginx.conf"
nginx -p "$root/mock" -c "$root/mock/nginx.conf" -e "$root/mock/error.log" &
pids+=($!)
echo '{"capacity": 1000000000000, "refill_per_second": 1000000000}' >"$root/budget.json"

systems=()
start() { # NAME BINARY [args...]
  local name="$1" bin="$2" p; shift 2
  p="$(port)"
  mkdir -p "$root/$name"
  "$bin" --listen "tcp:127.0.0.1:$p" --upstream "unix:$root/mock/mock.sock" \
    --admin-listen "unix:$root/$name/admin.sock" --log-format json --slots 64 --queue-depth 1024 \
    "$@" >"$root/$name/slotgate.log" 2>&1 &
  pids+=($!)
  local i
  for i in $(seq 200); do
    curl -sf --unix-socket "$root/$name/admin.sock" http://localhost/readyz >/dev/null && break
    sleep 0.1
  done
  curl -sf --unix-socket "$root/$name/admin.sock" http://localhost/readyz >/dev/null \
    || { echo "ab: $name never became ready" >&2; tail -20 "$root/$name/slotgate.log" >&2; exit 1; }
  systems+=("$name:$p")
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
    rps=$(wrk -t2 -c64 -d"${secs}s" -s "$here/post.lua" "$url" | awk '/Requests\/sec/{print $2}')
    p50=$(wrk -t1 -c1 -d5s --latency -s "$here/post.lua" "$url" | awk '/ 50%/{print $2}')
    printf '%-6s %-20s %12s %10s\n' "$r" "${s%%:*}" "$rps" "$p50" | tee -a "$root/rows"
  done
done
# Medians per system, as ratios to base-no-policy (throughput: higher is better; p50: lower is).
python3 - "$root/rows" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    _, name, rps, p50 = line.split()
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", p50)
    p50 = float(m[1]) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m[2]]
    rows.setdefault(name, []).append((float(rps), p50))
base = rows["base-no-policy"]
b_rps = statistics.median(r for r, _ in base)
b_p50 = statistics.median(p for _, p in base)
print(f"\n{'system':<20} {'c=64 rps':>10} {'ratio':>6} {'c=1 p50 ms':>11} {'ratio':>6}")
for name, v in rows.items():
    rps = statistics.median(r for r, _ in v)
    p50 = statistics.median(p for _, p in v)
    print(f"{name:<20} {rps:>10.0f} {rps / b_rps:>6.3f} {p50:>11.3f} {p50 / b_p50:>6.3f}")
PY
