#!/usr/bin/env bash
# Shedding on the real llama-server with one slot (issue 22): an interactive request's time to
# first token while a long background stream holds the slot, through two slotgates in front of the
# same llama-server (the 16k-token tiny model, `-np 1 -c 16384`): one with `--sheddable-priority
# 10`, one without. scripts/bench/shedding.py prints the median TTFT of each and the ratio; asserts
# nothing. Needs scripts/setup-llama.sh (run here) and a built slotgate (target/release, else
# target/debug, else it is built).
#
#   bash scripts/bench/shedding.sh     # SHED_ROUNDS (5), SHED_BACKGROUND_S (6)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
llama_bench shedding LLAMA_MODEL_LONG 16384
start_gate() { # NAME PORT [FLAGS...]
  local name="$1" port="$2"
  shift 2
  "$slotgate" --listen "tcp:127.0.0.1:$port" --upstream "unix:$root/llama.sock" \
    --admin-listen "unix:$root/$name.sock" --slots 1 --queue-depth 8 --queue-timeout 60s \
    --trust-client-priority "$@" >"$root/$name.log" 2>&1 &
  pids+=($!)
  wait_ready "$root/$name.sock" 300 || { echo "slotgate $name did not become ready" >&2; exit 1; }
}
shed_port="$(free_port)"
start_gate shed "$shed_port" --sheddable-priority 10
plain_port="$(free_port)"
start_gate plain "$plain_port"
echo "shedding: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ), $("$slotgate" --version)"
python3 scripts/bench/shedding.py "http://127.0.0.1:$shed_port" "http://127.0.0.1:$plain_port" \
  --rounds "${SHED_ROUNDS:-5}" --background-s "${SHED_BACKGROUND_S:-6}"
