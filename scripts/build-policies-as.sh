#!/usr/bin/env bash
# Builds the AssemblyScript example policies in policies-as/ (with the SDK in sdk-as/) into
# <target dir>/policies/as-<name>.wasm, then runs the SDK's and the policies' tests under Node's test
# runner (skip them with --no-test). Prints one artifact path per line on stdout; everything else
# goes to stderr.
#
# Idempotent, like build-policies.sh: `npm ci` runs only when a package.json or package-lock.json
# changed since the last install (node_modules/ stays in each package's directory, gitignored), a
# module is recompiled only when one of its sources is newer, and an artifact whose bytes did not
# change keeps its mtime, so a watching slotgate does not reload it. npm's download cache is
# ${SLOTGATE_CACHE:-$HOME/.cache/slotgate}/npm.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

run_tests=1
for arg in "$@"; do
  case "$arg" in
    --no-test) run_tests=0 ;;
    *) echo "usage: $0 [--no-test]" >&2; exit 2 ;;
  esac
done

command -v node >/dev/null && command -v npm >/dev/null || {
  echo "error: node and npm are needed (Node 20 or later)" >&2
  exit 1
}
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 20 ] || { echo "error: Node 20 or later is needed, found $(node --version)" >&2; exit 1; }

export npm_config_cache="${SLOTGATE_CACHE:-$HOME/.cache/slotgate}/npm"
export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false

# Cargo's own answer, so CARGO_TARGET_DIR and .cargo/config.toml are honoured.
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || { echo "error: cannot find cargo's target directory" >&2; exit 1; }
out="$target_dir/policies"
mkdir -p "$out"

# `npm ci` in $1 unless its node_modules was installed from these very manifests (npm ci empties
# node_modules first, so the stamp goes with it).
install() {
  local dir=$1 stamp="$1/node_modules/.slotgate-installed"
  local want
  want=$(cat "$dir/package.json" "$dir/package-lock.json" | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    (cd "$dir" && npm ci --prefer-offline --loglevel=error) >&2
    echo "$want" >"$stamp"
  fi
}

# Whether $1 is missing or older than any file under the paths that follow.
stale() {
  [ -f "$1" ] || return 0
  [ -n "$(find "${@:2}" -type f -newer "$1" -print -quit)" ]
}

# Copies $1 to $2 unless $2 already has the same bytes.
install_if_changed() {
  cmp -s "$1" "$2" 2>/dev/null || cp "$1" "$2"
}

install sdk-as
install policies-as

sdk=(sdk-as/assembly sdk-as/asconfig.json sdk-as/package-lock.json)

# The SDK's own test policy.
if stale sdk-as/build/probe.wasm "${sdk[@]}" sdk-as/tests/probe.ts sdk-as/tests/asconfig.json; then
  (cd sdk-as && node_modules/.bin/asc tests/probe.ts --config tests/asconfig.json --target release) >&2
fi

for dir in policies-as/*/; do
  dir=${dir%/}
  name=$(basename "$dir")
  [ -f "$dir/assembly/index.ts" ] && [ -f "$dir/asconfig.json" ] || continue
  wasm="$dir/build/$name.wasm"
  if stale "$wasm" "$dir/assembly" "$dir/asconfig.json" "${sdk[@]}" policies-as/package-lock.json; then
    (cd "$dir" && ../node_modules/.bin/asc assembly/index.ts --config asconfig.json --target release) >&2
  fi
  install_if_changed "$wasm" "$out/as-$name.wasm"
  echo "$out/as-$name.wasm"
done

if [ "$run_tests" = 1 ]; then
  # Files, not directories: Node 20 searches a directory, Node 22 reads arguments as globs.
  node --test sdk-as/tests/*.test.mjs policies-as/*/tests/*.test.mjs >&2
fi
