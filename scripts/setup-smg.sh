#!/usr/bin/env bash
# Installs SMG, the Shepherd Model Gateway (PyPI `smg`, pinned below; a Rust router shipped as a
# Python wheel), into a venv of its own at $SLOTGATE_CACHE/venv-smg (default ~/.cache/slotgate):
# the router of the scale-out test that reads slotgate's load (`GET /v1/loads`,
# tests/tests/llama/e2e_smg.rs, docs/observability.md). Its own venv: it pins protobuf and grpcio
# releases LiteLLM's proxy does not take. A run that finds the pinned release installed does
# nothing else.
#
# Prints nothing on stdout but the command, as a shell assignment:
#   SLOTGATE_SMG=/.../venv-smg/bin/smg
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"

# The release the test was written against: its load monitor polls `/loads?model=`, then
# `/v1/loads?include=...` (the engine route slotgate serves), every --load-monitor-interval.
version="1.13.0"
venv="$cache/venv-smg"
smg="$venv/bin/smg"
stamp="$venv/.smg-version"

installed() { [ -x "$smg" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; }

if ! installed; then
  mkdir -p "$cache"
  exec 9>"$cache/venv-smg.lock"
  flock 9
  if ! installed; then
    rm -rf "$venv"
    log "installing smg==$version from PyPI into $venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "smg==$version" >&2
    printf '%s\n' "$version" > "$stamp"
  fi
fi

echo "SLOTGATE_SMG=$smg"
