#!/usr/bin/env bash
# Runs the TypeScript policies' tests under Node's test runner, against the SDK's fake host: the
# SDK's own (sdk-ts/test), tenant-priority's (policies-ts/tenant-priority/test), a type-check of the
# hostile fixtures, and the template's. The template is made into a new project in a temporary
# folder, as a policy author would start one (sdk-ts/README.md, "A new policy project"), and must
# pass its own tests and build its component with its own build.sh, away from this repository.
# Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The pinned npm packages and the WIT's declarations, as the build uses them.
scripts/build-policies-ts.sh --deps-only
bin=$PWD/sdk-ts/node_modules/.bin

echo "== sdk-ts" >&2
rm -rf sdk-ts/build
"$bin/tsc" -p sdk-ts >&2
# Files, not directories: Node 20 searches a directory, Node 22 reads arguments as globs.
(cd sdk-ts && node --import ./build/src/testing/register.js --test build/test/*.test.js)

echo "== policies-ts/tenant-priority" >&2
dir=policies-ts/tenant-priority
rm -rf "$dir/build"
"$bin/tsc" -p "$dir" >&2
(cd "$dir" && node --import ./build/sdk-ts/src/testing/register.js --test build/policies-ts/tenant-priority/test/*.test.js)

echo "== policies-ts/hostile (type-check)" >&2
"$bin/tsc" -p policies-ts/hostile >&2

echo "== sdk-ts/template" >&2
# The template pins the same packages as the SDK (one set of versions to review and cache), and
# bundles with the same options.
node -e '
  const fs = require("fs");
  const pkgs = (f) => { const p = JSON.parse(fs.readFileSync(f, "utf8")).packages; delete p[""]; return JSON.stringify(p); };
  if (pkgs("sdk-ts/package-lock.json") !== pkgs("sdk-ts/template/package-lock.json")) {
    console.error("sdk-ts/template/package-lock.json resolves other packages than sdk-ts/package-lock.json");
    process.exit(1);
  }'
cmp -s sdk-ts/bundle.config.mjs sdk-ts/template/bundle.config.mjs || {
  echo "error: sdk-ts/template/bundle.config.mjs differs from sdk-ts/bundle.config.mjs" >&2
  exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
name=ts-template-check
project="$tmp/$name"
cp -R sdk-ts/template "$project"
mkdir -p "$project/slotgate-sdk" "$project/wit"
cp -R sdk-ts/src/. "$project/slotgate-sdk/"
cp sdk/wit/policy.wit "$project/wit/policy.wit"
grep -rl --null '{{name}}' "$project" | xargs -0 sed -i "s/{{name}}/$name/g"
if grep -rn '{{' "$project" >&2; then
  echo "error: placeholders left in the new project" >&2
  exit 1
fi
# SLOTGATE=false: no `slotgate policy wit`, so build.sh falls back to the wit/policy.wit copied in.
(cd "$project" && SLOTGATE=false ./build.sh test)
wasm=$(cd "$project" && SLOTGATE=false ./build.sh)
if [ "$wasm" != "$project/$name.wasm" ] || [ ! -s "$wasm" ]; then
  echo "error: build.sh did not build $name.wasm" >&2
  exit 1
fi
world=$("$bin/jco" wit "$wasm")
for want in 'export validate-settings:' 'export evaluate:' 'export on-complete:' \
  'import slotgate:policy/log@' 'import slotgate:policy/clocks@' 'import slotgate:policy/state@'; do
  grep -q "^ *$want" <<<"$world" || { echo "error: $name.wasm lacks \`$want\`" >&2; exit 1; }
done
if grep '^ *import ' <<<"$world" | grep -v 'slotgate:policy/' >&2; then
  echo "error: $name.wasm imports more than the world" >&2
  exit 1
fi
echo "template: $name.wasm built standalone ($(stat -c %s "$wasm") bytes), world checked" >&2
