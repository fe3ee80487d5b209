#!/usr/bin/env bash
# Tests the Python policy kit natively: the unit tests of sdk-py/ and of every policy in
# policies-py/ (against the SDK's fake host), then the project template as a user gets it: made
# into a fresh folder outside the repository, with the SDK and the WIT copied in as `slotgate
# policy new` and `slotgate policy wit` would write them, its tests run and its build.sh run, to show it builds on its own.
# Exits non-zero on the first failure. Needs python3 and PyPI (once, for componentize-py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Tests must not leave __pycache__ folders in the work tree.
export PYTHONDONTWRITEBYTECODE=1

# A new project gets a copy of the SDK (it has no repository to take it from): `slotgate policy new`
# writes sdk-py/slotgate_policy into it beside the template's files. The template's build.sh must
# pin the same componentize-py.
pin() { sed -n 's/^COMPONENTIZE_PY_VERSION=//p' "$1"; }
if [ "$(pin scripts/build-policies-py.sh)" != "$(pin sdk-py/template/build.sh)" ]; then
  echo "error: scripts/build-policies-py.sh and sdk-py/template/build.sh pin different componentize-py" >&2
  exit 1
fi

scripts/build-policies-py.sh bindings >/dev/null

echo "== sdk-py" >&2
(cd sdk-py && python3 -m unittest)

for dir in policies-py/*/; do
  dir=${dir%/}
  compgen -G "$dir/test_*.py" >/dev/null || continue
  echo "== $dir" >&2
  (cd "$dir" && python3 -m unittest)
done

echo "== sdk-py/template" >&2
project=$(mktemp -d)
trap 'rm -rf "$project"' EXIT
name=py-policy-check
# The template's files, as a new project gets them (not what a build in place would have left).
(cd sdk-py/template && find . -type f -not -path '*/__pycache__/*' -not -path './bindings/*' \
  -not -path './wit/*' -not -name '*.wasm') | while read -r file; do
  mkdir -p "$project/$(dirname "$file")"
  sed "s/{{name}}/$name/g" "sdk-py/template/$file" >"$project/$file"
  [ ! -x "sdk-py/template/$file" ] || chmod +x "$project/$file"
done
mkdir -p "$project/slotgate_policy"
cp sdk-py/slotgate_policy/*.py "$project/slotgate_policy/"
mkdir -p "$project/wit"
cp sdk/wit/policy.wit "$project/wit/policy.wit"
# SLOTGATE names no program, so build.sh takes the WIT copied in, as with a slotgate that has no
# `policy wit` yet; a project's real build asks slotgate.
(cd "$project" && SLOTGATE=/nonexistent ./build.sh bindings && python3 -m unittest)
artifact=$(cd "$project" && SLOTGATE=/nonexistent ./build.sh)
if [ "$artifact" != "$project/$name.wasm" ] || [ ! -s "$artifact" ]; then
  echo "error: the template's build.sh printed \`$artifact\`, not a component at $project/$name.wasm" >&2
  exit 1
fi
wasm_tools=${SLOTGATE_PY_VENV:-$HOME/.cache/slotgate/venv-componentize-py}/bin/wasm-tools
world=$("$wasm_tools" component wit "$artifact")
if ! grep -qF "export evaluate: func" <<<"$world"; then
  echo "error: the template's component does not export evaluate" >&2
  exit 1
fi
echo "template built: $(du -h "$artifact" | cut -f1) $name.wasm" >&2
