#!/usr/bin/env bash
# Installs what the console's browser tests need (tests/tests/console/): Debian's `chromium`
# package (apt-get, through sudo when not root), and Playwright's Python package (and libfaketime's,
# for a usage history of several days), pinned in tests/console/requirements.txt, in a venv at $SLOTGATE_CACHE/venv-console (default
# ~/.cache/slotgate). Playwright never downloads a browser of its own: the tests launch the system
# chromium through `executable_path`. A second run only checks (well under a second).
#
# Prints nothing on stdout but shell assignments:
#   SLOTGATE_CONSOLE_PYTHON=/.../venv-console/bin/python
#   SLOTGATE_CHROMIUM=/usr/bin/chromium
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requirements="$root/tests/console/requirements.txt"
venv="$cache/venv-console"
python="$venv/bin/python"
stamp="$venv/.requirements.sha256"

chromium="${SLOTGATE_CHROMIUM:-$(command -v chromium || true)}"
if [ -z "$chromium" ] || [ ! -x "$chromium" ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    log "chromium is missing and this is not a Debian-like system (no apt-get): install a Chromium and set SLOTGATE_CHROMIUM"
    exit 1
  fi
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { log "chromium is missing; installing it needs root and there is no sudo"; exit 1; }
    sudo=(sudo)
  fi
  log "installing Debian's chromium package"
  "${sudo[@]}" apt-get update -qq >&2
  # The fonts: a page drawn without any would be boxes in the screenshots.
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
  chromium="$(command -v chromium)"
fi

[ -f "$requirements" ] || { log "no $requirements"; exit 1; }
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
installed() {
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$python" -c \
    'import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ("playwright", "libfaketime"))))' 2>/dev/null
}
if ! installed; then
  mkdir -p "$cache"
  exec 9>"$cache/venv-console.lock"
  flock 9
  if ! installed; then
    rm -f "$stamp"
    if ! "$python" -c '' 2>/dev/null; then
      log "creating python venv at $venv"
      rm -rf "$venv"
      python3 -m venv "$venv" >&2
    fi
    log "installing $(grep -cv '^\s*\(#\|$\)' "$requirements") pinned package(s) from $requirements"
    # PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD: the package alone; its browsers come from nowhere here.
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$python" -m pip install --quiet --disable-pip-version-check \
      -r "$requirements" >&2
    printf '%s\n' "$want" > "$stamp"
  fi
fi

echo "SLOTGATE_CONSOLE_PYTHON=$python"
echo "SLOTGATE_CHROMIUM=$chromium"
