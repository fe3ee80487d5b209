#!/usr/bin/env bash
# What quotas cost, on one slotgate binary in front of the nginx mock (mock.conf.in), budgets and
# the ledger kept on disk (state.dir) as in production:
#
# 1. c=64 requests/s and c=1 p50 with no policy, token-budget and the quota example (calendar
#    quotas per tenant, every answer with rate-limit headers), 1000 tenants, rounds interleaved;
#    medians as ratios to no-policy.
# 2. The store under that load: commits/s and rows written/s (slotgate_state_*), and fsync and
#    fdatasync calls/s of the whole process (strace -c with its seccomp filter, which stops only
#    those calls), at the rate the quota run reaches.
# 3. Memory: RSS after one tenant, and after 100,000 distinct tenants (each with a quota window and
#    a ledger row), on the same binary.
#
#   bash scripts/bench/quota.sh [BINARY]      (default: the release build, built if missing)
#
# Environment: QB_ROUNDS (3), QB_SECONDS (8). Asserts nothing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
source "$here/lib.sh"
target_dir="$(cargo_target_dir)"
bin="${1:-$target_dir/release/slotgate}"
[ -x "$bin" ] || cargo build --release -p slotgate >&2
bash scripts/build-policies.sh >/dev/null
rounds="${QB_ROUNDS:-3}" secs="${QB_SECONDS:-8}"
for tool in nginx wrk strace curl; do
  command -v "$tool" >/dev/null || { echo "quota.sh: needs $tool (apt-get install nginx-light wrk strace curl)" >&2; exit 2; }
done

bench_root qb
start_mock
echo '{"capacity": 1000000000000, "refill_per_second": 1000000000}' >"$root/budget.json"
echo '{"period": "day", "tokens": 1000000000000, "requests": 1000000000}' >"$root/quota.json"

declare -A port_of pid_of
start() { # NAME [args...]
  local name="$1"
  shift
  start_mock_gate "$name" ${STRACE:+strace -f --seccomp-bpf -c -e trace=fsync,fdatasync -o "$STRACE"} \
    "$bin" --state-dir "$root/$name/state" "$@"
  pid_of[$name]=$gate_pid
  port_of[$name]=$gate_port
}
metric() { # NAME METRIC: its value (sum over label sets), 0 when absent
  curl -sf --unix-socket "$root/$1/admin.sock" http://localhost/metrics \
    | awk -v m="$2" '$1 ~ "^"m"({|$)" {s += $2} END {printf "%d\n", s}'
}
rss_kb() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }

start no-policy
start token-budget --policy "$target_dir/policies/token-budget.wasm" --policy-settings "$root/budget.json"
start quota --policy "$target_dir/policies/quota.wasm" --policy-settings "$root/quota.json"
systems=(no-policy token-budget quota)

echo "== 1. cost per request (c=64, 1000 tenants; c=1 p50)"
printf '%-6s %-14s %12s %10s\n' round system "c=64 rps" "c=1 p50"
for r in $(seq "$rounds"); do
  for s in "${systems[@]}"; do
    url="http://127.0.0.1:${port_of[$s]}/v1/chat/completions"
    read -r rps p50 < <(TENANTS=1000 rps_p50 "$url" post-tenants.lua)
    printf '%-6s %-14s %12s %10s\n' "$r" "$s" "$rps" "$p50" | tee -a "$root/rows"
  done
done
medians "$root/rows" no-policy 14

echo
echo "== 2. the store under load (quota, c=64, 1000 tenants; fsyncs counted by strace, which started it with a seccomp filter: only those calls stop)"
STRACE="$root/strace.txt" start store --policy "$target_dir/policies/quota.wasm" --policy-settings "$root/quota.json"
url="http://127.0.0.1:${port_of[store]}/v1/chat/completions"
w0=$(metric store slotgate_state_writes_total); n0=$(metric store slotgate_state_rows_written_total)
rps=$(TENANTS=1000 wrk -t2 -c64 -d"${secs}s" -s "$here/post-tenants.lua" "$url" | awk '/Requests\/sec/{print $2}')
w1=$(metric store slotgate_state_writes_total); n1=$(metric store slotgate_state_rows_written_total)
# SIGTERM to slotgate (strace's child): strace prints its count when it exits.
pkill -TERM -P "${pid_of[store]}" || true
wait "${pid_of[store]}" 2>/dev/null || true
syncs=$(awk '/fsync|fdatasync/{s += $4} END {print s + 0}' "$root/strace.txt")
echo "at $rps req/s for ${secs}s: $(( (w1 - w0) / secs )) commits/s, $(( (n1 - n0) / secs )) rows written/s, $(( syncs / secs )) fsync+fdatasync calls/s (start and stop included)"

echo
echo "== 3. memory with 100,000 tenants (quota policy: a quota window and a ledger row each)"
start mem --policy "$target_dir/policies/quota.wasm" --policy-settings "$root/quota.json"
url="http://127.0.0.1:${port_of[mem]}/v1/chat/completions"
TENANTS=1 wrk -t1 -c4 -d2s -s "$here/post-tenants.lua" "$url" >/dev/null
sleep 1
one=$(rss_kb "${pid_of[mem]}")
# 100,000 distinct keys: each thread walks its own stride through them; run until the ledger holds
# them all (GET /usage counts the rows).
TENANTS=100000 wrk -t2 -c64 -d25s -s "$here/post-tenants.lua" "$url" >/dev/null
sleep 1
rows=$(curl -sf --unix-socket "$root/mem/admin.sock" "http://localhost/usage?format=csv" | tail -n +2 | wc -l)
many=$(rss_kb "${pid_of[mem]}")
echo "RSS after 1 tenant: $((one / 1024)) MiB; after $rows tenants in the ledger: $((many / 1024)) MiB; $(( (many - one) * 1024 / (rows > 1 ? rows - 1 : 1) )) bytes per tenant"
