#!/usr/bin/env bash
# The made-up-key flood of issue 47, on the real llama-server (one slot, run with --api-key): a
# valid client sends short chats one after another, first alone, then while wrk floods the same
# address from 32 connections with a new made-up key on every request. Run straight at llama-server
# (the baseline: it refuses a wrong key before any slot), and through slotgate in each mode that
# checks callers (`upstream`: llama-server's keys; `keys`: slotgate's own), rounds interleaved.
# Prints, per system, the valid client's median latency alone and under the flood, their ratio,
# what it was answered, the flood's rate and slotgate's RSS before and after. Asserts nothing.
#
#   bash scripts/bench/keys-flood.sh [BINARY]   (default: the release build, built if missing)
#
# Environment: KF_ROUNDS (3), KF_CHATS (8 per phase), KF_TOKENS (16, max_tokens of a chat).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
source "$here/lib.sh"
target_dir="$(cargo_target_dir)"
bin="${1:-$target_dir/release/slotgate}"
[ -x "$bin" ] || cargo build --release -p slotgate >&2
rounds="${KF_ROUNDS:-3}" chats="${KF_CHATS:-8}" tokens="${KF_TOKENS:-16}"
for tool in wrk curl; do
  command -v "$tool" >/dev/null || { echo "keys-flood.sh: needs $tool" >&2; exit 2; }
done
llama_env
bench_root kf
llama_key="sk-llama-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf '%s\n' "$llama_key" >"$root/llama.key"
echo "admin-token-keys-flood" >"$root/admin.token"
llama_port="$(free_port)"
"$LLAMA_SERVER" -m "$LLAMA_MODEL" -np 1 -c 2048 --host 127.0.0.1 --port "$llama_port" \
  --api-key "$llama_key" --no-webui >"$root/llama.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$llama_port/health" >/dev/null && break
  sleep 0.1
done

declare -A port_of pid_of key_of
port_of[direct]=$llama_port
key_of[direct]=$llama_key
start() { # NAME MODE
  local name="$1" port
  port="$(free_port)"
  mkdir -p "$root/$name"
  "$bin" --listen "tcp:127.0.0.1:$port" --upstream "http://127.0.0.1:$llama_port" \
    --client-auth "$2" --upstream-api-key-file "$root/llama.key" --state-dir "$root/$name/state" \
    --admin-listen "unix:$root/$name/admin.sock" --admin-token-file "$root/admin.token" \
    >"$root/$name/slotgate.log" 2>&1 &
  pid_of[$name]=$!
  pids+=($!)
  port_of[$name]=$port
  wait_ready "$root/$name/admin.sock" \
    || { echo "keys-flood.sh: $name never became ready" >&2; tail -20 "$root/$name/slotgate.log" >&2; exit 1; }
}
start upstream upstream
key_of[upstream]=$llama_key
start keys keys
key_of[keys]=$("$bin" key create --tenant valid --json --admin "unix:$root/keys/admin.sock" \
  --admin-token-file "$root/admin.token" | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')
rss() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }

body="{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":$tokens}"
chat_run() { # NAME PHASE ROUND: $chats chats one after another, one row each
  local i out
  for i in $(seq "$chats"); do
    out=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' \
      -H "Authorization: Bearer ${key_of[$1]}" -H 'Content-Type: application/json' \
      -d "$body" "http://127.0.0.1:${port_of[$1]}/v1/chat/completions")
    echo "$3 $1 $2 $out" >>"$root/rows"
  done
}
for r in $(seq "$rounds"); do
  for s in direct upstream keys; do
    chat_run "$s" alone "$r"
    TENANTS=100000000 wrk -t1 -c32 -d600s -s "$bench_dir/post-tenants.lua" \
      "http://127.0.0.1:${port_of[$s]}/v1/chat/completions" >"$root/flood-$s-$r" 2>&1 &
    flood=$!
    sleep 1
    chat_run "$s" flood "$r"
    kill -INT "$flood"
    wait "$flood" 2>/dev/null || true
    echo "$r $s $(awk '/Requests\/sec/{print $2}' "$root/flood-$s-$r") $(awk '/Non-2xx/{print $NF}' "$root/flood-$s-$r")" >>"$root/floods"
  done
  echo "round $r done" >&2
done
for s in upstream keys; do
  echo "$s $(rss "${pid_of[$s]}")" >>"$root/rss"
done
python3 - "$root/rows" "$root/floods" "$root/rss" "$root/keys/state/state.redb" <<'PY'
import os, statistics, sys
rows, floods = {}, {}
for line in open(sys.argv[1]):
    _, name, phase, code, secs = line.split()
    rows.setdefault((name, phase), []).append((int(code), float(secs)))
for line in open(sys.argv[2]):
    parts = line.split()
    floods.setdefault(parts[1], []).append(float(parts[2]) if len(parts) > 2 else 0.0)
rss = dict(line.split() for line in open(sys.argv[3]))
print(f"{'system':<9} {'alone p50':>10} {'flood p50':>10} {'ratio':>6} {'served alone':>13} {'under flood':>12} {'flood req/s':>12} {'RSS kB':>8}")
for name in ["direct", "upstream", "keys"]:
    a, f = rows[(name, "alone")], rows[(name, "flood")]
    pa = statistics.median(s for _, s in a)
    pf = statistics.median(s for _, s in f)
    ok = lambda v: f"{sum(c == 200 for c, _ in v)}/{len(v)}"
    print(f"{name:<9} {pa * 1000:>8.0f}ms {pf * 1000:>8.0f}ms {pf / pa:>6.2f} {ok(a):>13} {ok(f):>12} "
          f"{statistics.median(floods[name]):>12.0f} {rss.get(name, '-'):>8}")
print(f"state.redb of keys after the floods: {os.path.getsize(sys.argv[4]) // 1024} KiB")
PY
