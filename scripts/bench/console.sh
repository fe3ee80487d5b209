#!/usr/bin/env bash
# The console's page weight and load time on the admin listener (docs/console.md#what-it-weighs),
# on one slotgate with an admin token and no upstream (the page's own files and /live answer without
# one). Asserts nothing.
#
# 1. Weight: the bytes each file of the page takes on the wire, as slotgate serves it (not
#    compressed) and what gzip -9 would make of it, for the first page (the live view) and for the
#    usage page, which loads the chart library on first use.
# 2. Load time in Debian's headless Chromium (Playwright, scripts/setup-console.sh): from
#    navigation to the live view drawn from /live, cold (a new browser context, nothing cached) and
#    warm (a reload: every file answered 304), the median of CB_ROUNDS; beside them the baselines of
#    the same rounds: a new context opening /livez (plain text: what the browser itself costs) and
#    one GET /status from the page (one round trip).
#
#   bash scripts/bench/console.sh [BINARY]      (default: the debug build, built if missing)
#
# Environment: CB_ROUNDS (15).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
source "$here/lib.sh"
target_dir="$(cargo_target_dir)"
bin="${1:-$target_dir/debug/slotgate}"
[ -x "$bin" ] || cargo build -p slotgate >&2
eval "$(bash scripts/setup-console.sh)"

bench_root cb
port="$(free_port)"
echo "admin-token-console-bench" >"$root/admin.token"
"$bin" run --listen "unix:$root/gate.sock" --admin-listen "tcp:127.0.0.1:$port" \
  --upstream "unix:$root/no-upstream.sock" --admin-token-file "$root/admin.token" \
  --state-dir "$root/state" >"$root/gate.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/livez" >/dev/null && break; sleep 0.1; done

echo "== weight (bytes on the wire, not compressed; gzip -9 beside) =="
total=0 ztotal=0 chart=0 zchart=0
for f in "" console.css favicon.svg app.js api.js dom.js live.js keys.js quotas.js usage.js \
  vendor/uplot/uPlot.iife.min.js vendor/uplot/uPlot.min.css; do
  curl -sf "http://127.0.0.1:$port/console/$f" -o "$root/file"
  n=$(wc -c <"$root/file") z=$(gzip -9c "$root/file" | wc -c)
  printf '  %-34s %7d %7d\n' "/console/$f" "$n" "$z"
  case "$f" in
    vendor/*) chart=$((chart + n)) zchart=$((zchart + z)) ;;
    *) total=$((total + n)) ztotal=$((ztotal + z)) ;;
  esac
done
printf '  %-34s %7d %7d\n' "first page (live view)" "$total" "$ztotal"
printf '  %-34s %7d %7d\n' "+ the chart, on the usage page" "$chart" "$zchart"
printf '  %-34s %7d %7d\n' "all" "$((total + chart))" "$((ztotal + zchart))"

echo "== load time in headless Chromium (median of ${CB_ROUNDS:-15}) =="
"$SLOTGATE_CONSOLE_PYTHON" "$here/console_load.py" "http://127.0.0.1:$port" \
  "$SLOTGATE_CHROMIUM" "admin-token-console-bench" "${CB_ROUNDS:-15}"
