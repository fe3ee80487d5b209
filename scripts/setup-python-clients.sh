#!/usr/bin/env bash
# Installs the Python clients the SDK tests drive (tests/python/requirements.txt, every package
# pinned) from PyPI into a venv at $SLOTGATE_CACHE/venv-clients (default ~/.cache/slotgate). The venv
# carries a stamp with the SHA-256 of the requirements file: while they match and the packages
# import, a run does nothing else (well under a second); an edited file (a bump, a line another
# suite appended) reinstalls from it.
#
# Prints nothing on stdout but the interpreter, as a shell assignment:
#   SLOTGATE_PYTHON=/.../venv-clients/bin/python
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requirements="$root/tests/python/requirements.txt"
venv="$cache/venv-clients"
python="$venv/bin/python"
stamp="$venv/.requirements.sha256"

[ -f "$requirements" ] || { log "no $requirements"; exit 1; }
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

installed() {
  # find_spec, not import: importing the SDK takes most of a second.
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$python" -c \
    'import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ("openai", "anthropic", "httpx2"))))' 2>/dev/null
}

if ! installed; then
  mkdir -p "$cache"
  # Two test processes may set up at once: one installs, the other waits and finds it done.
  exec 9>"$cache/venv-clients.lock"
  flock 9
  if ! installed; then
    rm -f "$stamp"
    if ! "$python" -c '' 2>/dev/null; then
      log "creating python venv at $venv"
      rm -rf "$venv"
      python3 -m venv "$venv" >&2
    fi
    log "installing $(grep -cv '^\s*\(#\|$\)' "$requirements") pinned packages from $requirements"
    "$python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
    printf '%s\n' "$want" > "$stamp"
  fi
fi

echo "SLOTGATE_PYTHON=$python"
