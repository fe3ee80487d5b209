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
pinned_venv venv-clients "$requirements" openai anthropic httpx2

echo "SLOTGATE_PYTHON=$python"
