#!/usr/bin/env bash
# Builds {{name}}.wasm, a slotgate policy: src/policy.ts (with the SDK in slotgate-sdk/) made into a
# WebAssembly component of the world in wit/policy.wit by `jco componentize` from npm.
#
#   ./build.sh         type-check, then {{name}}.wasm
#   ./build.sh test    type-check and run the unit tests under node --test, against a fake host
#
# The WIT comes from `slotgate policy wit` (the contract of the slotgate that will run the policy),
# else the wit/policy.wit already here. Set SLOTGATE to use a slotgate that is not on PATH. npm's
# download cache is ~/.cache/slotgate/npm-ts-policies unless npm_config_cache says otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

NAME="{{name}}"

case "${1:-}" in
  "" | test) ;;
  *) echo "usage: $0 [test]" >&2; exit 2 ;;
esac

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

command -v npm >/dev/null || { echo "error: node and npm are needed (Node 20.6 or later)" >&2; exit 1; }
export npm_config_cache="${npm_config_cache:-$HOME/.cache/slotgate/npm-ts-policies}"
export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false

# The pinned packages, installed again only when package.json or the lock file changed.
want=$(cat package.json package-lock.json 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ "$(cat node_modules/.installed 2>/dev/null)" != "$want" ]; then
  if [ -f package-lock.json ]; then
    npm ci --prefer-offline --loglevel=error >&2
  else
    npm install --prefer-offline --loglevel=error >&2
  fi
  want=$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)
  echo "$want" >node_modules/.installed
fi
bin=node_modules/.bin

# The WIT's TypeScript declarations (never written by hand), when the WIT or jco changed.
want=$(cat wit/policy.wit package-lock.json | sha256sum | cut -d' ' -f1)
if [ "$(cat generated/.inputs 2>/dev/null)" != "$want" ]; then
  rm -rf generated
  "$bin/jco" guest-types wit/policy.wit --world-name policy -o generated -q >&2
  echo "$want" >generated/.inputs
fi

if [ "${1:-}" = test ]; then
  rm -rf build
  "$bin/tsc" -p . >&2
  # register.js resolves the policy's `slotgate:policy/...` imports to the SDK's fake host.
  exec node --import ./build/slotgate-sdk/testing/register.js --test build/test/*.test.js
fi

# jco strips the types without checking them.
"$bin/tsc" -p . --noEmit >&2
# jco may rewrite the WIT it is given (it adds imports for Node built-ins it stands in for): it gets
# a copy, never the contract.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp wit/policy.wit "$tmp/policy.wit"
# --disable all: no WASI feature, so the component imports the world's interfaces and nothing else.
"$bin/jco" componentize src/policy.ts --wit "$tmp/policy.wit" --world-name policy --disable all \
  --bundle-config bundle.config.mjs -o "$NAME.wasm.tmp" >&2
mv "$NAME.wasm.tmp" "$NAME.wasm"
echo "$PWD/$NAME.wasm"
