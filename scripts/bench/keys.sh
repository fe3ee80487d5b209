#!/usr/bin/env bash
# What slotgate's own keys cost (issue 47), on one slotgate binary in front of the nginx mock
# (mock.conf.in), state kept on disk as in production. Ratios against baselines run in the same
# invocation, rounds interleaved; asserts nothing.
#
# 1. The key check per request: c=64 requests/s and c=1 p50 with --client-auth open (no check, the
#    same bearer sent) against --client-auth keys with a key slotgate issued.
# 2. Refusing made-up keys: --client-auth keys flooded with a new made-up key on every request (all
#    401) against nginx `return 401`: refusals/s, and CPU per refusal (utime + stime of the process
#    over the run), so refusals per CPU-second read as "per core".
# 3. Memory per 100,000 keys: `cargo bench -p slotgate --bench keys` (RSS of the key table, and the
#    check's nanoseconds against a bare SHA-256).
#
#   bash scripts/bench/keys.sh [BINARY]      (default: the release build, built if missing)
#
# Environment: KB_ROUNDS (3), KB_SECONDS (8).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
source "$here/lib.sh"
target_dir="$(cargo_target_dir)"
bin="${1:-$target_dir/release/slotgate}"
[ -x "$bin" ] || cargo build --release -p slotgate >&2
rounds="${KB_ROUNDS:-3}" secs="${KB_SECONDS:-8}"
for tool in nginx wrk curl; do
  command -v "$tool" >/dev/null || { echo "keys.sh: needs $tool (apt-get install nginx-light wrk curl)" >&2; exit 2; }
done

bench_root kb
start_mock
echo "admin-token-keys-bench" >"$root/admin.token"
declare -A port_of pid_of
start() { # NAME [args...]
  local name="$1"
  shift
  start_mock_gate "$name" "$bin" --state-dir "$root/$name/state" --admin-token-file "$root/admin.token" "$@"
  pid_of[$name]=$gate_pid
  port_of[$name]=$gate_port
}
cpu_ticks() { # PID: utime + stime, in clock ticks
  awk '{print $14 + $15}' "/proc/$1/stat"
}

start open --client-auth open
# The tarpit off (--refusal-rate 0): part 2 measures what one refusal costs, as a flood from many
# peers pays it; one peer's flood is slowed to a trickle (scripts/bench/keys-flood.sh).
start keys --client-auth keys --refusal-rate 0
key=$("$bin" key create --tenant bench --json --admin "unix:$root/keys/admin.sock" \
  --admin-token-file "$root/admin.token" | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')

echo "== 1. the key check per request (c=64; c=1 p50), one key"
for r in $(seq "$rounds"); do
  for s in open keys; do
    read -r rps p50 < <(KEY="$key" rps_p50 "http://127.0.0.1:${port_of[$s]}/v1/chat/completions" post-key.lua)
    printf '%-6s %-8s %12s %10s\n' "$r" "$s" "$rps" "$p50" | tee -a "$root/rows"
  done
done
medians "$root/rows" open 8

echo
echo "== 2. refusing made-up keys (c=64, a new key every request) against nginx return 401"
nginx_port="$(free_port)"
mkdir -p "$root/n401"
cat >"$root/n401/nginx.conf" <<CONF
$( [ "$(id -u)" = 0 ] && echo "user root;" )
worker_processes 1;
daemon off;
pid $root/n401/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $root/n401/b; proxy_temp_path $root/n401/p; fastcgi_temp_path $root/n401/f;
  uwsgi_temp_path $root/n401/u; scgi_temp_path $root/n401/s;
  keepalive_requests 10000000;
  server {
    listen 127.0.0.1:$nginx_port;
    location / { default_type application/json; return 401 '{"error":{"code":"invalid_api_key","message":"Incorrect API key provided.","type":"invalid_request_error"}}'; }
  }
}
CONF
nginx -p "$root/n401" -c "$root/n401/nginx.conf" -e "$root/n401/error.log" &
pids+=($!)
sleep 1
nginx_worker=$(pgrep -P "$(cat "$root/n401/nginx.pid")" | head -1)
printf '%-6s %-10s %12s %14s %12s\n' round system "401/s" "CPU us/401" "401/CPU-s"
refuse() { # NAME URL PID
  local t0 t1 out n
  t0=$(cpu_ticks "$3")
  out=$(TENANTS=100000000 wrk -t2 -c64 -d"${secs}s" -s "$bench_dir/post-tenants.lua" "$2")
  t1=$(cpu_ticks "$3")
  n=$(awk '/requests in/{print $1}' <<<"$out")
  python3 - "$1" "$n" "$secs" "$((t1 - t0))" "$(getconf CLK_TCK)" "$r" <<'PY'
import sys
name, n, secs, ticks, hz, r = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
cpu = ticks / hz
print(f"{r:<6} {name:<10} {n / secs:>12.0f} {cpu / n * 1e6:>14.1f} {n / cpu if cpu else 0:>12.0f}")
PY
}
for r in $(seq "$rounds"); do
  refuse slotgate "http://127.0.0.1:${port_of[keys]}/v1/chat/completions" "${pid_of[keys]}" | tee -a "$root/refusals"
  refuse nginx "http://127.0.0.1:$nginx_port/v1/chat/completions" "$nginx_worker" | tee -a "$root/refusals"
done
python3 - "$root/refusals" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    _, name, rate, us, per_cpu = line.split()
    rows.setdefault(name, []).append((float(rate), float(us), float(per_cpu)))
med = {n: [statistics.median(x[i] for x in v) for i in range(3)] for n, v in rows.items()}
b = med["nginx"]
print(f"\n{'system':<10} {'401/s':>10} {'ratio':>6} {'401/CPU-s':>10} {'ratio':>6}")
for n, (rate, _, per_cpu) in med.items():
    print(f"{n:<10} {rate:>10.0f} {rate / b[0]:>6.3f} {per_cpu:>10.0f} {per_cpu / b[2]:>6.3f}")
PY
stored=$(du -k "$root/keys/state/state.redb" | cut -f1)
echo "state.redb after the flood: ${stored} KiB (a made-up key is not stored)"

echo
echo "== 3. the key table in memory, and the check itself"
cargo bench -q -p slotgate --bench keys 2>/dev/null
