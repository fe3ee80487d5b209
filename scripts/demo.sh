#!/usr/bin/env bash
# slotgate in one command: a real llama-server with one slot, slotgate in front of it, and a burst of
# concurrent chat requests. Shows who got served, who waited in the queue and for how long, who was turned
# away at once with 429 and Retry-After, /status during the burst, and the metrics afterwards. Then
# llama-server with its own defaults (4 slots sharing one KV pool): four long requests at once fail
# straight to it, and are all served through slotgate, which admits them as the pool holds them.
#
#   scripts/demo.sh            # first run builds llama-server (~6 min on 2 cores), later runs take seconds
#
# Environment: DEMO_REQUESTS (10), DEMO_QUEUE_DEPTH (4), DEMO_MAX_TOKENS (tokens per answer),
# DEMO_ADMIN_PORT (9464, or a free port if that one is taken). Everything it starts is stopped on exit.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requests="${DEMO_REQUESTS:-10}"
queue_depth="${DEMO_QUEUE_DEPTH:-4}"
max_tokens="${DEMO_MAX_TOKENS:-400}"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

for tool in curl python3 cargo; do
  command -v "$tool" >/dev/null || die "needs $tool on PATH"
done

work="$(mktemp -d "${TMPDIR:-/tmp}/slotgate-demo.XXXXXX")"
llama_pid=""
gate_pid=""
pids=()

# SIGTERM, then SIGKILL if it is still there after $2 seconds.
stop() {
  local pid="$1" secs="$2"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq $((secs * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# Runs on every exit path. Clients first: background jobs ignore the terminal's Ctrl-C, and slotgate would
# otherwise keep draining their answers. Then slotgate, then llama-server, then the temp dir.
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local pid
  for pid in ${pids[@]+"${pids[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
  stop "$gate_pid" 10
  stop "$llama_pid" 5
  if [ "$rc" -ne 0 ] && [ -d "$work" ]; then
    for log in "$work"/*.log; do
      [ -s "$log" ] || continue
      printf '\n--- last lines of %s ---\n' "$(basename "$log")" >&2
      tail -n 15 "$log" >&2
    done
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Polls until "$@" succeeds, for up to $1 seconds.
wait_for() {
  local secs="$1"; shift
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

http_ok() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$@")" = 200 ]; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

say "1/7 llama-server and a tiny model (scripts/setup-llama.sh, cached after the first run)"
setup_out="$("$root/scripts/setup-llama.sh")" || die "scripts/setup-llama.sh failed (see its messages above)"
LLAMA_SERVER="$(sed -n 's/^LLAMA_SERVER=//p' <<<"$setup_out")"
LLAMA_MODEL="$(sed -n 's/^LLAMA_MODEL=//p' <<<"$setup_out")"
LLAMA_MODEL_LONG="$(sed -n 's/^LLAMA_MODEL_LONG=//p' <<<"$setup_out")"
[ -x "$LLAMA_SERVER" ] && [ -f "$LLAMA_MODEL" ] || die "setup-llama.sh printed no usable paths: $setup_out"
echo "llama-server: $LLAMA_SERVER"
echo "model:        $LLAMA_MODEL"

say "2/7 cargo build --release -p slotgate"
(cd "$root" && cargo build --release -p slotgate)
target_dir="${CARGO_TARGET_DIR:-$root/target}"
slotgate="$target_dir/release/slotgate"
[ -x "$slotgate" ] || die "no binary at $slotgate"

say "3/7 llama-server -np 1 on $work/llama.sock"
llama_sock="$work/llama.sock"
LD_LIBRARY_PATH="$(dirname "$LLAMA_SERVER")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$LLAMA_SERVER" -m "$LLAMA_MODEL" --host "$llama_sock" -np 1 -c 2048 --metrics --no-webui \
  >"$work/llama-server.log" 2>&1 &
llama_pid=$!
wait_for 60 http_ok --unix-socket "$llama_sock" http://llama/health || die "llama-server did not become healthy"
echo "healthy (pid $llama_pid)"

admin_port="${DEMO_ADMIN_PORT:-9464}"
port_free "$admin_port" || admin_port="$(free_port)"
admin="http://127.0.0.1:$admin_port"
gate_sock="$work/slotgate.sock"
# The admin listener wants a token (docs/security.md): every admin call below sends it.
token_file="$work/admin-token"
(umask 077; python3 -c 'import secrets; print(secrets.token_hex(32))' >"$token_file")
acurl() { curl -s -H "Authorization: Bearer $(cat "$token_file")" "$@"; }
say "4/7 slotgate --slots 1 --queue-depth $queue_depth (clients: $gate_sock, admin: $admin)"
"$slotgate" --listen "unix:$gate_sock" --upstream "unix:$llama_sock" --admin-listen "tcp:127.0.0.1:$admin_port" \
  --admin-token-file "$token_file" \
  --slots 1 --queue-depth "$queue_depth" --health-interval 200ms >"$work/slotgate.log" 2>&1 &
gate_pid=$!
wait_for 15 http_ok "$admin/readyz" || die "slotgate did not become ready"
echo "ready (pid $gate_pid)"
printf 'GET %s/status without the admin token: %s; with it: %s\n' "$admin" \
  "$(curl -s -o /dev/null -w '%{http_code}' "$admin/status")" \
  "$(acurl -o /dev/null -w '%{http_code}' "$admin/status")"

say "5/7 a burst of $requests concurrent chat requests, 30 ms apart, max_tokens $max_tokens"
body="$(printf '{"messages":[{"role":"user","content":"Tell me a long story."}],"max_tokens":%d,"ignore_eos":true}' \
  "$max_tokens")"
start_ns="$(date +%s%N)"
for i in $(seq 1 "$requests"); do
  curl -s --unix-socket "$gate_sock" -o "$work/body.$i" -D "$work/head.$i" \
    -w '%{http_code} %{time_total}\n' -H 'content-type: application/json' -d "$body" \
    http://slotgate/v1/chat/completions >"$work/code.$i" &
  pids+=($!)
  sleep 0.03
done

# /status while the burst is served, one line per sample, until every client is answered.
status_line() {
  python3 -c '
import json, sys
s = json.load(sys.stdin)
print("slots busy {}/{}  queue {}/{}  inflight {}  mean service {:.2f}s  upstream ready {}".format(
    s["slots"]["busy"], s["slots"]["total"], s["queue"]["depth"], s["queue"]["capacity"],
    s["inflight"], s.get("service_time_seconds") or 0, s["upstream"]["ready"]))'
}
echo "GET $admin/status during the burst:"
while :; do
  running=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=$((running + 1)); done
  [ "$running" -gt 0 ] || break
  elapsed_ms=$((($(date +%s%N) - start_ns) / 1000000))
  deferred="$(curl -s --unix-socket "$llama_sock" http://llama/metrics | sed -n 's/^llamacpp:requests_deferred //p')"
  printf '  %6d ms  %s  | llama-server deferred %s\n' "$elapsed_ms" \
    "$(acurl "$admin/status" | status_line)" "${deferred:-?}"
  sleep 0.25
done
for pid in "${pids[@]}"; do wait "$pid" || true; done

echo
printf '%-4s %-7s %-12s %-14s %-9s %s\n' '#' status retry-after queue-wait-ms total-s 'result'
header() { tr -d '\r' <"$1" | sed -n "s/^$2: *//Ip" | head -n1; }
served=0 rejected=0
for i in $(seq 1 "$requests"); do
  code=000 total=?
  read -r code total <"$work/code.$i" || true
  result="$(python3 -c '
import json, sys
try:
    b = json.load(open(sys.argv[1]))
except ValueError:
    print("(not JSON)"); sys.exit()
if "error" in b:
    print("error: " + b["error"].get("code", "?"))
else:
    u = b.get("usage", {})
    print("{} prompt + {} completion tokens, finish {}".format(
        u.get("prompt_tokens"), u.get("completion_tokens"), b["choices"][0].get("finish_reason")))
' "$work/body.$i")"
  printf '%-4s %-7s %-12s %-14s %-9s %s\n' "$i" "$code" "$(header "$work/head.$i" retry-after)" \
    "$(header "$work/head.$i" x-slotgate-queue-wait-ms)" "$total" "$result"
  case "$code" in 200) served=$((served + 1)) ;; 429) rejected=$((rejected + 1)) ;; esac
done
echo
echo "$served served one at a time in arrival order, $rejected turned away at once with 429 (queue full)."

say "6/7 metrics after the burst"
echo "slotgate ($admin/metrics):"
acurl "$admin/metrics" | grep -E '^slotgate_(requests_total|tokens_total|queue_depth|slots_busy|inflight|upstream_ready)|^slotgate_(queue_wait|upstream)_seconds_(sum|count)' |
  sed 's/^/  /'
echo "llama-server (deferred stays 0: it never had to queue anything itself):"
curl -s --unix-socket "$llama_sock" http://llama/metrics |
  grep -E '^llamacpp:(requests_processing|requests_deferred|n_decode_total|tokens_predicted_total) ' | sed 's/^/  /'

echo
echo "SIGTERM to slotgate (pid $gate_pid)..."
kill -TERM "$gate_pid"
gate_rc=0
wait "$gate_pid" || gate_rc=$?
gate_pid=""
echo "slotgate exited with status $gate_rc"
[ -S "$gate_sock" ] && die "slotgate left its socket $gate_sock behind"
stop "$llama_pid" 5
llama_pid=""
[ "$gate_rc" -eq 0 ] || die "slotgate should exit 0 after SIGTERM"

say "7/7 llama-server's own defaults: no -np, 4 slots sharing one KV pool of 8192 tokens"
pool_sock="$work/pool.sock"
LD_LIBRARY_PATH="$(dirname "$LLAMA_SERVER")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$LLAMA_SERVER" -m "$LLAMA_MODEL_LONG" -c 8192 --host "$pool_sock" --metrics --no-webui \
  >"$work/llama-server-pool.log" 2>&1 &
llama_pid=$!
wait_for 60 http_ok --unix-socket "$pool_sock" http://llama/health || die "llama-server did not become healthy"
long_prompt="$(printf 'the lighthouse keeper kept the light burning %.0s' $(seq 40))"
long_body="$(printf '{"messages":[{"role":"user","content":"%s"}],"max_tokens":3000,"ignore_eos":true}' "$long_prompt")"
# Four at once against $1 (a socket, and the host name for curl); prints each status and wait.
four() {
  local sock="$1" host="$2" i
  local four_pids=()
  for i in 1 2 3 4; do
    curl -s --unix-socket "$sock" -o /dev/null -D "$work/pool-head.$i" -w '%{http_code} %{time_total}\n' \
      -H 'content-type: application/json' -d "$long_body" "http://$host/v1/chat/completions" \
      >"$work/pool-code.$i" &
    four_pids+=($!)
  done
  for i in "${four_pids[@]}"; do wait "$i" || true; done
  local wait_ms
  for i in 1 2 3 4; do
    wait_ms="$(header "$work/pool-head.$i" x-slotgate-queue-wait-ms)"
    printf '  #%s  %s s%s\n' "$i" "$(cat "$work/pool-code.$i")" "${wait_ms:+  (waited $wait_ms ms for room)}"
  done
}
echo "four requests of about 3,300 tokens at once, straight to llama-server (each fits alone, not together):"
four "$pool_sock" llama
"$slotgate" --listen "unix:$gate_sock" --upstream "unix:$pool_sock" --admin-listen "tcp:127.0.0.1:$admin_port" \
  --admin-token-file "$token_file" --queue-timeout 300s --health-interval 200ms >"$work/slotgate-pool.log" 2>&1 &
gate_pid=$!
wait_for 15 http_ok "$admin/readyz" || die "slotgate did not become ready"
learned_pool() { acurl "$admin/status" | grep -q '"tokens":8192'; }
wait_for 10 learned_pool || die "slotgate did not learn the pool"
acurl "$admin/status" | python3 -c '
import json, sys
s = json.load(sys.stdin)
p = s["kv_pool"]
print("slotgate learnt: {} slots, shared pool of {} tokens, from {}".format(s["slots"]["total"], p["tokens"], p["source"]))'
echo "the same four through slotgate (admitted as the pool holds them, two at a time):"
four "$gate_sock" slotgate
stop "$gate_pid" 10
gate_pid=""
stop "$llama_pid" 5
llama_pid=""
echo "done."
