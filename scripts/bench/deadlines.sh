#!/usr/bin/env bash
# Deadlines at 2x overload on the real llama-server with one slot (issue 22): slotgate in front
# (`--slots 1 --queue-depth 64 --queue-timeout 60s`), and scripts/bench/deadlines.py sending the same
# arrivals with `X-Slotgate-Deadline-Ms` and as plain FIFO. Prints the share of interactive
# requests that started within their deadline in each, and the ratio; asserts nothing. Needs
# scripts/setup-llama.sh (run here) and a built slotgate (target/release, else target/debug, else
# it is built).
#
#   bash scripts/bench/deadlines.sh     # DEADLINE_REQUESTS (40), DEADLINE_SERVICE_MS (400), DEADLINE_ROUNDS (2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
llama_bench deadlines LLAMA_MODEL 2048
port="$(free_port)"
"$slotgate" --listen "tcp:127.0.0.1:$port" --upstream "unix:$root/llama.sock" \
  --admin-listen "unix:$root/admin.sock" --slots 1 --queue-depth 64 --queue-timeout 60s \
  >"$root/slotgate.log" 2>&1 &
pids+=($!)
wait_ready "$root/admin.sock" 300 || { echo "deadlines: slotgate never became ready" >&2; exit 1; }
echo "deadlines: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
python3 scripts/bench/deadlines.py "http://127.0.0.1:$port" --requests "${DEADLINE_REQUESTS:-40}" \
  --service-ms "${DEADLINE_SERVICE_MS:-400}" --rounds "${DEADLINE_ROUNDS:-2}"
