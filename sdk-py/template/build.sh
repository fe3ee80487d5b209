#!/usr/bin/env bash
# Builds {{name}}.wasm, a slotgate policy: app.py made into a WebAssembly component of the world in
# wit/policy.wit by componentize-py from PyPI, installed once into a venv under ~/.cache.
#
#   ./build.sh            bindings/ for the tests, then {{name}}.wasm
#   ./build.sh bindings   only bindings/: the Python modules generated from the WIT, which the
#                         unit tests import (`python3 -m unittest`)
#
# The WIT comes from `slotgate policy wit` (the contract of the slotgate that will run the policy),
# else the wit/policy.wit already here. Set SLOTGATE to use a slotgate that is not on PATH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

NAME="{{name}}"
# Pinned: the component's Python (3.14) and the WASI version it imports are componentize-py's.
COMPONENTIZE_PY_VERSION=0.25.1
VENV=${SLOTGATE_PY_VENV:-$HOME/.cache/slotgate/venv-componentize-py}

mkdir -p wit
if wit=$("${SLOTGATE:-slotgate}" policy wit 2>/dev/null) && [[ $wit == *"package slotgate:policy"* ]]; then
  # Rewritten only when it changed, so the file's date tells when the contract last moved.
  [ "$wit" = "$(cat wit/policy.wit 2>/dev/null)" ] || printf '%s\n' "$wit" >wit/policy.wit
elif [ -f wit/policy.wit ]; then
  echo "note: no \`slotgate policy wit\`; building against wit/policy.wit as it is" >&2
else
  echo "error: no WIT contract: install slotgate (\`slotgate policy wit\` prints it) or put it in wit/policy.wit" >&2
  exit 1
fi

if [ "$("$VENV/bin/componentize-py" --version 2>/dev/null)" != "componentize-py $COMPONENTIZE_PY_VERSION" ]; then
  echo "installing componentize-py $COMPONENTIZE_PY_VERSION into $VENV" >&2
  [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION" >&2
fi
componentize_py="$VENV/bin/componentize-py"

# Regenerated when the WIT or componentize-py changed.
digest=$({ echo "$COMPONENTIZE_PY_VERSION"; cat wit/policy.wit; } | sha256sum | cut -d' ' -f1)
if [ "$(cat bindings/.inputs 2>/dev/null)" != "$digest" ]; then
  rm -rf bindings.tmp
  "$componentize_py" -d wit -w policy bindings bindings.tmp >&2
  echo "$digest" >bindings.tmp/.inputs
  rm -rf bindings
  mv bindings.tmp bindings
fi
if [ "${1:-}" = bindings ]; then
  exit 0
fi

# componentize-py appends an active venv's site-packages to the app's path; the component should
# hold only what this folder imports.
unset VIRTUAL_ENV
"$componentize_py" --quiet -d wit -w policy componentize -p . app -o "$NAME.wasm.tmp" >&2
mv "$NAME.wasm.tmp" "$NAME.wasm"
echo "$PWD/$NAME.wasm"
