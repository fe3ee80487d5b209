#!/usr/bin/env bash
# Direct concurrency on llama-server's router mode (issue 21): what happens when two models decode at
# once on this machine. Starts the router (`--models-dir` with copies of the tiny model,
# `--models-max 2`, `-np 2`) once per thread setting (llama-server's default, which gives every child
# all the cores; `--poll 0`; `-t 1`) and runs scripts/bench/router_concurrency.py against it: the
# same requests one at a time, two at once on one model, and at once across two models. With the
# default threads, the same runs go through slotgate too, its models taking turns (`--model-turns
# auto`, which turns them on there) and not (`off`). Prints wall times and ratios to each run's own
# serial run; asserts nothing. Needs scripts/setup-llama.sh (run here) and a built slotgate
# (target/release, else target/debug, else it is built).
#
#   bash scripts/bench/router-concurrency.sh        # ROUTER_TOKENS (200), ROUTER_ROUNDS (3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
llama_env
root="$(mktemp -d -t slotgate-router.XXXXXX)"
pid="" gate=""
cleanup() {
  [ -n "$gate" ] && kill "$gate" 2>/dev/null && wait "$gate" 2>/dev/null
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$root"
}
trap cleanup EXIT
mkdir -p "$root/models"
cp "$LLAMA_MODEL" "$root/models/alpha.gguf"
cp "$LLAMA_MODEL" "$root/models/beta.gguf"
port="$(free_port)"
find_slotgate
echo "router-concurrency: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for threads in "" "--poll 0" "-t 1"; do
  # shellcheck disable=SC2086 # the setting is two words or none
  "$LLAMA_SERVER" --models-dir "$root/models" --models-max 2 -np 2 -c 4096 --host 127.0.0.1 \
    --port "$port" --no-webui $threads >"$root/router.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  label="$threads"; [ -n "$label" ] || label="with llama-server's default threads (every core)"
  echo "children $label:"
  python3 scripts/bench/router_concurrency.py "http://127.0.0.1:$port" alpha beta \
    --tokens "${ROUTER_TOKENS:-200}" --rounds "${ROUTER_ROUNDS:-3}"
  if [ -z "$threads" ]; then
    for turns in auto off; do
      gate_port="$(free_port)"
      "$slotgate" --listen "tcp:127.0.0.1:$gate_port" --upstream "http://127.0.0.1:$port" \
        --admin-listen "unix:$root/admin.sock" --model-turns "$turns" --queue-timeout 600s \
        >"$root/slotgate.log" 2>&1 &
      gate=$!
      wait_ready "$root/admin.sock" 100 || true
      echo "  through slotgate, --model-turns $turns:"
      python3 scripts/bench/router_concurrency.py "http://127.0.0.1:$gate_port" alpha beta \
        --tokens "${ROUTER_TOKENS:-200}" --rounds "${ROUTER_ROUNDS:-3}" | sed 's/^/  /'
      taking="$(curl -sf --unix-socket "$root/admin.sock" http://localhost/status \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["model_turns"]["taking_turns"])')"
      echo "    (taking turns at the end: $taking)"
      kill "$gate"; wait "$gate" 2>/dev/null || true; gate=""
    done
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
done
