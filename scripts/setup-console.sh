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
chromium="${SLOTGATE_CHROMIUM:-$(command -v chromium || true)}"
if [ -z "$chromium" ] || [ ! -x "$chromium" ]; then
  # The fonts: a page drawn without any would be boxes in the screenshots.
  apt_install "the console's browser tests" chromium fonts-dejavu-core || {
    log "or install a Chromium and set SLOTGATE_CHROMIUM"
    exit 1
  }
  chromium="$(command -v chromium)"
fi

# PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD: the package alone; its browsers come from nowhere here.
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 pinned_venv venv-console "$requirements" playwright libfaketime

echo "SLOTGATE_CONSOLE_PYTHON=$python"
echo "SLOTGATE_CHROMIUM=$chromium"
