#!/usr/bin/env bash
# The policy author's loop, step by step, in seconds: `slotgate policy new` (Python, Rust), the
# build, `policy check` twice (a fresh compile cache, then the same file again), `policy eval`,
# and a start of slotgate with the Python policy until it serves: once with an empty compile
# cache, once restarted with it warm (docs/performance.md#the-authors-loop). Prints figures and
# asserts nothing about time.
#
# The release binary when target/release/slotgate is newer than every file of sidecar/src, else
# the debug one (built if missing); AUTHOR_LOOP_BIN chooses another. Needs python3 (the Python
# build installs componentize-py into ~/.cache/slotgate/venv-componentize-py once) and the
# wasm32-unknown-unknown Rust target.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
target=${CARGO_TARGET_DIR:-target}
newest_src=$(find sidecar/src -type f -printf '%T@\n' | sort -n | tail -1)
if [ -n "${AUTHOR_LOOP_BIN:-}" ]; then
  bin=$AUTHOR_LOOP_BIN build="given"
elif [ -x "$target/release/slotgate" ] &&
  [ "$(stat -c %Y "$target/release/slotgate")" -ge "${newest_src%.*}" ]; then
  bin=$PWD/$target/release/slotgate build="release"
else
  [ -x "$target/debug/slotgate" ] || cargo build -p slotgate --bins
  bin=$PWD/$target/debug/slotgate build="debug"
  [ "$(stat -c %Y "$bin")" -ge "${newest_src%.*}" ] || build="debug, older than sidecar/src"
fi
work=$(mktemp -d)
trap 'kill "${gate:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
cache=$work/compile-cache
export SLOTGATE=$bin
echo "slotgate: $bin ($build); $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

# Runs "$@" and prints how long it took under LABEL; on failure shows what it said.
step() {
  local label=$1
  shift
  local began ended
  began=$(date +%s.%N)
  if ! "$@" >"$work/step.log" 2>&1; then
    cat "$work/step.log" >&2
    echo "author-loop: $label failed" >&2
    exit 1
  fi
  ended=$(date +%s.%N)
  printf '%-44s %7.2f s\n' "$label" "$(echo "$ended - $began" | bc)"
}

step "policy new --lang python" "$bin" policy new --lang python bench-py --dir "$work"
step "policy new --lang rust" "$bin" policy new --lang rust bench-rs --dir "$work"
step "build (python: componentize-py)" bash "$work/bench-py/build.sh"
step "build (rust: cargo, wasm32)" env CARGO_TARGET_DIR="$HOME/.cache/slotgate/policy-new-target" \
  bash "$work/bench-rs/build.sh"
for lang in py rs; do
  wasm=$work/bench-$lang/bench-$lang.wasm
  settings=()
  [ -f "$work/bench-$lang/settings.json" ] && settings=(--settings "$work/bench-$lang/settings.json")
  step "policy check ($lang, compile cache empty)" "$bin" policy check --cache-dir "$cache" \
    "${settings[@]}" "$wasm"
  step "policy check ($lang, cached)" "$bin" policy check --cache-dir "$cache" "${settings[@]}" "$wasm"
  # The Rust template's sample request; the Python template has none of its own.
  step "policy eval ($lang, cached)" "$bin" policy eval --cache-dir "$cache" --policy "$wasm" \
    "${settings[@]}" --input "$work/bench-rs/request.json"
done

# Starts slotgate with the Python policy and the daemon's own compile cache, and waits until a
# request is answered by anything but the start's 503 `starting` (no llama-server listens on the
# upstream port: the answer is then the upstream's error, which is the pipeline's).
serve_cache=$work/serve-cache
start_until_serving() {
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin" --upstream http://127.0.0.1:9 --listen "tcp:127.0.0.1:$port" --admin-listen off \
    --state-dir off --policy "$work/bench-py/bench-py.wasm" --policy-cache-dir "$serve_cache" \
    >"$work/gate.log" 2>&1 &
  gate=$!
  while :; do
    reason=$(curl -s -o /dev/null -D - -X POST -H 'content-type: application/json' \
      -d '{"messages":[{"role":"user","content":"hi"}]}' \
      "http://127.0.0.1:$port/v1/chat/completions" 2>/dev/null |
      tr -d '\r' | sed -n 's/^x-slotgate-reason: //Ip')
    [ -n "$reason" ] && [ "$reason" != starting ] && break
    kill -0 "$gate" 2>/dev/null || { cat "$work/gate.log" >&2; return 1; }
    sleep 0.02
  done
  kill -TERM "$gate"
  wait "$gate" || true
  gate=
}
step "start with the python policy (cache empty)" start_until_serving
step "restart with it cached, until it serves" start_until_serving
grep -h "policies compiled" "$work/gate.log" | sed 's/^/  last start: /'
