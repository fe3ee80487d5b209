#!/usr/bin/env bash
# llama.cpp's own server test suite (tools/server/tests of the sdist scripts/setup-llama.sh builds)
# run through `slotgate wrap`, against the same suite run directly on llama-server:
#
#   direct    the suite on llama-server alone: the tests that pass this way are the ones that count.
#             Cached per sdist version in $SLOTGATE_CACHE/llama-suite (DIRECT=1 runs it again).
#   defaults  through slotgate on its defaults: a test that passes direct may fail only for one of
#             slotgate's documented protections (scripts/llama-suite/protections.txt, each with the
#             setting that lifts it, docs/endpoints.md).
#   lifted    through slotgate with those protections lifted: every test that passes direct passes.
#
# usage: bash scripts/test-llama-suite.sh [all|direct|defaults|lifted] [PYTEST_ARGS...]
#        (all: the three, the defaults way after the lifted one and only on the tests that reached
#        a protected route in it; PYTEST_ARGS narrow the through-slotgate runs, e.g.
#        unit/test_security.py; LLAMA_SUITE_JOBS=2 runs two pytest-xdist workers)
#
# The suite's launcher starts "$LLAMA_SERVER_BIN_PATH --host H --port P ..."; through slotgate that
# is scripts/llama-suite/llama-server, which runs `slotgate wrap` on H:P with the real llama-server
# as its child. The models the suite would download from Hugging Face (not reachable here) are the
# tiny random-weight ones of setup-llama.sh, laid out as Hugging Face's cache: tests that need a
# real model's answers fail direct too, and so do not count.
#
# Needs target/debug/slotgate (`cargo build -p slotgate --bins`; SLOTGATE_BIN to use another).
# Prints each way's counts and the tests that differ; exits 1 when through slotgate a test that
# passes direct fails, unless (defaults) it is a documented protection.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
source "$here/setup-common.sh"
setup_name=test-llama-suite

way="${1:-all}"
case "$way" in all|direct|defaults|lifted) shift || true ;; *) way=all ;; esac
narrow=("$@")

started=$SECONDS
eval "$(bash "$here/setup-llama.sh")"
suite="$LLAMA_SOURCE/tools/server/tests"
[ -f "$suite/utils.py" ] || { log "no test suite at $suite"; exit 1; }
version="$(sed -n 's/^Version: //p' "$LLAMA_SOURCE/../PKG-INFO" | head -n1)"
work="$cache/llama-suite"
mkdir -p "$work"
slotgate="${SLOTGATE_BIN:-${CARGO_TARGET_DIR:-$repo/target}/debug/slotgate}"
[ -x "$slotgate" ] || { log "no slotgate binary at $slotgate: cargo build -p slotgate --bins"; exit 1; }

# The suite's Python dependencies (its requirements.txt, and pytest-timeout so one hung test
# cannot stall the run), in a venv of their own, installed again when the requirements change.
venv="$cache/venv-llama-suite"
stamp="$(cat "$suite/requirements.txt" | sha256sum | cut -c1-16)-timeout"
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp" ]; then
  log "installing the suite's Python dependencies in $venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$suite/requirements.txt" \
    pytest-timeout >&2
  echo "$stamp" > "$venv/.installed"
fi

# Hugging Face's cache layout (models--ORG--REPO/refs/main, snapshots/COMMIT/FILE), which
# llama-server reads when the hub cannot be reached, holding the tiny models under the names of the
# suite's presets (utils.py ServerPreset): every preset starts, so the session does.
hf="$work/hf"
commit=0000000000000000000000000000000000000000
cached() { # REPO FILE MODEL
  local dir="$hf/models--${1//\//--}"
  mkdir -p "$dir/refs" "$(dirname "$dir/snapshots/$commit/$2")"
  echo "$commit" > "$dir/refs/main"
  ln -sfn "$3" "$dir/snapshots/$commit/$2"
}
cached ggml-org/test-model-stories260K stories260K.gguf "$LLAMA_MODEL"
cached ggml-org/test-model-stories260K-infill stories260K-infill.gguf "$LLAMA_MODEL_LONG"
cached ggml-org/models tinyllamas/stories260K.gguf "$LLAMA_MODEL"
cached ggml-org/models bert-bge-small/ggml-model-f16.gguf "$LLAMA_MODEL"
cached ggml-org/models jina-reranker-v1-tiny-en/ggml-model-f16.gguf "$LLAMA_MODEL"
cached ggml-org/stories15M_MOE stories15M_MOE-F16.gguf "$LLAMA_MODEL"
cached ggml-org/tinylaya-for-testing-gguf tinylaya.gguf "$LLAMA_MODEL"
cached ggml-org/tinyopenjev-for-testing-gguf tinyopenjev-Q8_0.gguf "$LLAMA_MODEL"
cached ggml-org/tinygemma3-GGUF tinygemma3-Q8_0.gguf "$LLAMA_MODEL"

export LLAMA_CACHE="$hf"
# Only the hub is unreachable; fail its requests at once rather than after a connect timeout.
export HF_HUB_OFFLINE=1

# run NAME LAUNCHER [PYTEST_ARGS...]: the suite with LAUNCHER as its llama-server; writes
# $work/NAME.tsv (OUTCOME<TAB>TEST<TAB>the paths slotgate refused with 403 in a failed test, read
# from its access log: in the test's captured output, and in $work/NAME.logs, where the launcher
# keeps each test's slotgate output) and $work/NAME.log.
run() {
  local name="$1" launcher="$2"; shift 2
  local t0=$SECONDS
  log "$name: running the suite ($launcher)"
  rm -rf "$work/$name.logs"
  (
    cd "$suite"
    SUITE_LOG_DIR="$work/$name.logs" LLAMA_SERVER_BIN_PATH="$launcher" "$venv/bin/python" -m pytest -p no:cacheprovider -q \
      ${jobs:+-n "$jobs"} \
      --timeout 120 -o junit_family=xunit1 --junitxml="$work/$name.xml" \
      -o junit_logging=system-out "$@" \
      > "$work/$name.log" 2>&1 || true
  )
  "$venv/bin/python" "$here/llama-suite/results.py" "$work/$name.xml" "$work/$name.logs" \
    | sort > "$work/$name.tsv"
  log "$name: $(grep -c '^passed' "$work/$name.tsv" || true) passed of $(wc -l < "$work/$name.tsv") in $((SECONDS - t0))s (log: $work/$name.log)"
}

# LLAMA_SUITE_JOBS=N: N pytest-xdist workers (the suite's conftest gives each its own port,
# 8080 + 10 x its number); unset, one.
jobs="${LLAMA_SUITE_JOBS:-}"

direct="$work/direct-$version.tsv"
if [ "$way" = all ] || [ "$way" = direct ]; then
  if [ ! -s "$direct" ] || [ -n "${DIRECT:-}" ]; then
    run direct "$LLAMA_SERVER"
    cp "$work/direct.tsv" "$direct"
  else
    log "direct: cached ($direct), $(grep -c '^passed' "$direct") passed"
  fi
fi
[ "$way" = direct ] && exit 0
[ -s "$direct" ] || { log "no direct results: run \`$0 direct\` first"; exit 1; }

export SUITE_SLOTGATE="$slotgate" SUITE_LLAMA_SERVER="$LLAMA_SERVER"
# What lifts each protection (docs/endpoints.md); the defaults way runs without them.
lifted_args="--forward-host-endpoints --client-admin-routes all"

status=0
for name in lifted defaults; do
  [ "$way" = all ] || [ "$way" = "$name" ] || continue
  case "$name" in
    defaults) export SUITE_SLOTGATE_ARGS="" ;;
    lifted) export SUITE_SLOTGATE_ARGS="$lifted_args" ;;
  esac
  narrowed=${narrow[@]:+narrowed}
  # Only the tests that pass direct (or those PYTEST_ARGS name): the rest cannot count, and many
  # of them are the slowest (downloads that cannot happen, timeouts).
  if [ ${#narrow[@]} -gt 0 ]; then
    run "$name" "$here/llama-suite/llama-server" "${narrow[@]}"
  elif [ "$way" = all ] && [ "$name" = defaults ]; then
    # After the lifted way: only the tests that reached a protected route in it (slotgate's
    # access log in their output), or whose output showed no request at all. The two ways differ
    # in nothing but those routes (the settings are read in one place, routes::allowed, and only
    # for admin and host routes), so every other test runs through the defaults as it ran
    # lifted, where it passed. This keeps CI's step at about the lifted way's time.
    "$venv/bin/python" "$here/llama-suite/compare.py" touched "$work/lifted.tsv" \
      > "$work/selected-defaults.txt"
    log "defaults: $(wc -l < "$work/selected-defaults.txt") tests reached a protected route lifted (or showed no request); the rest run as they did lifted"
    narrowed="else=$work/lifted.tsv"
    run "$name" "$here/llama-suite/llama-server" "@$work/selected-defaults.txt"
  else
    grep '^passed' "$direct" | cut -f2 > "$work/selected.txt"
    run "$name" "$here/llama-suite/llama-server" "@$work/selected.txt"
  fi
  mode=protected; [ "$name" = lifted ] && mode=strict
  compare() {
    "$venv/bin/python" "$here/llama-suite/compare.py" "$name" "$direct" "$work/$name.tsv" \
      "$here/llama-suite/protections.txt" "$mode" $narrowed "$@"
  }
  if ! compare > "$work/$name.compare"; then
    # Each test that failed and is no protection runs once more, on its own: a few of the
    # suite's tests race llama-server against itself (test_router_delete_model's DELETE against
    # the router's reload after a download the offline hub cannot make), and lose now and then
    # under load, direct too. One that passes again is printed `flaky`; one that fails twice fails.
    sed -n 's/^  FAILED     \(.*\)  (.*)$/\1/p' "$work/$name.compare" > "$work/$name.again.txt"
    log "$name: $(wc -l < "$work/$name.again.txt") failed, run once more"
    run "$name-again" "$here/llama-suite/llama-server" "@$work/$name.again.txt"
    compare "again=$work/$name-again.tsv" > "$work/$name.compare" || status=1
  fi
  cat "$work/$name.compare"
done
log "took $((SECONDS - started))s"
exit "$status"
