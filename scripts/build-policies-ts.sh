#!/usr/bin/env bash
# Builds the TypeScript policies v2 into WebAssembly components of the world in sdk/wit/policy.wit,
# in <target dir>/policies/: policies-ts/tenant-priority → tenant-priority-ts.wasm, and each hostile
# fixture policies-ts/hostile/<name> → hostile-ts-<name>.wasm. Prints one artifact path per line on
# stdout; everything else goes to stderr.
#
#   scripts/build-policies-ts.sh              install, generate the WIT's types, build
#   scripts/build-policies-ts.sh --deps-only  install and generate the types only (for the tests)
#
# `jco componentize` (StarlingMonkey, via componentize-js) bundles each policy.ts with the SDK in
# sdk-ts/src and pre-initialises the engine; `--disable all` leaves out every WASI feature, so the
# component imports the world's interfaces and nothing else (checked after each build). The npm
# packages are pinned in sdk-ts/package-lock.json and installed once into sdk-ts/node_modules, from
# the download cache ${SLOTGATE_CACHE:-$HOME/.cache/slotgate}/npm-ts-policies.
#
# Idempotent, like build-policies.sh: a component is rebuilt only when a hash of its inputs (the
# lock file, the WIT, the SDK, its own folder) differs from the one kept beside it in
# <name>.wasm.inputs, and an artifact whose bytes did not change keeps its mtime, so a watching
# slotgate does not reload it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

deps_only=0
for arg in "$@"; do
  case "$arg" in
    --deps-only) deps_only=1 ;;
    *) echo "usage: $0 [--deps-only]" >&2; exit 2 ;;
  esac
done

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "error: node and npm are needed (Node 20.6 or later)" >&2
  exit 1
fi
# 20.6: module.register, which the tests' fake host needs.
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 6) ? 0 : 1)' || {
  echo "error: Node 20.6 or later is needed, found $(node --version)" >&2
  exit 1
}

export npm_config_cache="${SLOTGATE_CACHE:-$HOME/.cache/slotgate}/npm-ts-policies"
export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false

WIT=sdk/wit/policy.wit
bin="sdk-ts/node_modules/.bin"

# Hash of the files under the paths given (sorted, so the order of `find` does not matter).
digest() {
  find "$@" -type f -not -path '*/node_modules/*' -not -path '*/build/*' -print0 |
    sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}

# `npm ci` unless node_modules was installed from this very lock file (npm ci empties node_modules
# first, so the stamp goes with it).
stamp="sdk-ts/node_modules/.slotgate-installed"
want=$(cat sdk-ts/package.json sdk-ts/package-lock.json | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing sdk-ts's npm packages" >&2
  (cd sdk-ts && npm ci --prefer-offline --loglevel=error) >&2
  echo "$want" >"$stamp"
fi

# The WIT's TypeScript declarations, regenerated when the WIT or jco changed.
want=$(cat "$WIT" sdk-ts/package-lock.json | sha256sum | cut -d' ' -f1)
if [ "$(cat sdk-ts/generated/.inputs 2>/dev/null)" != "$want" ]; then
  rm -rf sdk-ts/generated
  "$bin/jco" guest-types "$WIT" --world-name policy -o sdk-ts/generated -q >&2
  echo "$want" >sdk-ts/generated/.inputs
fi

if [ "$deps_only" = 1 ]; then
  exit 0
fi

# Cargo's own answer, so CARGO_TARGET_DIR and .cargo/config.toml are honoured.
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || { echo "error: cannot find cargo's target directory" >&2; exit 1; }
out="$target_dir/policies"
mkdir -p "$out"

# Each component: its artifact name and its entry module.
apps=("tenant-priority-ts policies-ts/tenant-priority/src/policy.ts")
for dir in policies-ts/hostile/*/; do
  name=$(basename "$dir")
  [ -f "$dir/policy.ts" ] && apps+=("hostile-ts-${name//_/-} ${dir}policy.ts")
done

# Every flag that shapes the component is part of its inputs.
flags=(--world-name policy --disable all --bundle-config sdk-ts/bundle.config.mjs)
shared=$(echo "${flags[*]}" | cat - sdk-ts/package-lock.json "$WIT" sdk-ts/tsconfig.base.json | sha256sum | cut -d' ' -f1)
sdk=$(digest sdk-ts/src sdk-ts/bundle.config.mjs)

# Copies $1 to $2 unless $2 already has the same bytes.
install_if_changed() {
  cmp -s "$1" "$2" 2>/dev/null || cp "$1" "$2"
}

# Builds one component: $1 its name, $2 its entry module, $3 the hash of its inputs.
build() {
  local name=$1 entry=$2 inputs=$3
  local wasm="$out/$name.wasm" tmp="$out/.$name.wasm.tmp" wit foreign
  echo "building $name.wasm from $entry" >&2
  # jco may rewrite the WIT it is given (it adds imports for Node built-ins it stands in for): it
  # gets a copy, never the contract.
  wit=$(mktemp -d)
  cp "$WIT" "$wit/policy.wit"
  "$bin/jco" componentize "$entry" --wit "$wit/policy.wit" "${flags[@]}" -o "$tmp" >&2 || {
    rm -rf "$wit"
    return 1
  }
  rm -rf "$wit"
  # Anything outside the world (a WASI feature left on, a `node:` builtin the bundler turned into a
  # `jco:node/...` import) would be refused by slotgate at load: refuse it here, naming it.
  foreign=$("$bin/jco" wit "$tmp" | sed -n 's/^ *import \([^;]*\);.*/\1/p' | grep -v '^slotgate:policy/' || true)
  if [ -n "$foreign" ]; then
    rm -f "$tmp"
    echo "error: $name.wasm imports more than the world: $(echo "$foreign" | tr '\n' ' ')" >&2
    return 1
  fi
  install_if_changed "$tmp" "$wasm"
  rm -f "$tmp"
  echo "$inputs" >"$wasm.inputs"
}

stale=()
for app in "${apps[@]}"; do
  read -r name entry <<<"$app"
  src=$(dirname "$entry")
  # The bundler reads the nearest tsconfig.json: beside the entry or one folder up.
  tsconfig="$src/tsconfig.json"
  [ -f "$tsconfig" ] || tsconfig="$(dirname "$src")/tsconfig.json"
  inputs=$(echo "$shared $sdk $(digest "$src" "$tsconfig")" | sha256sum | cut -d' ' -f1)
  if [ ! -f "$out/$name.wasm" ] || [ "$(cat "$out/$name.wasm.inputs" 2>/dev/null)" != "$inputs" ]; then
    stale+=("$name $entry $inputs")
  fi
done

if [ ${#stale[@]} -gt 0 ]; then
  # jco strips the types without checking them: the compiler checks them first.
  "$bin/tsc" -p policies-ts/tenant-priority --noEmit >&2
  "$bin/tsc" -p policies-ts/hostile >&2
  # jco works on one core: as many builds side by side as there are cores.
  slots=$(nproc 2>/dev/null || echo 2)
  running=0
  failed=0
  for job in "${stale[@]}"; do
    read -r name entry inputs <<<"$job"
    build "$name" "$entry" "$inputs" &
    running=$((running + 1))
    if [ "$running" -ge "$slots" ]; then
      wait -n || failed=1
      running=$((running - 1))
    fi
  done
  while [ "$running" -gt 0 ]; do
    wait -n || failed=1
    running=$((running - 1))
  done
  [ "$failed" = 0 ] || exit 1
fi

for app in "${apps[@]}"; do
  read -r name _ <<<"$app"
  echo "$out/$name.wasm"
done
