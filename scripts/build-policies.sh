#!/usr/bin/env bash
# Builds every example policy in policies/ into <target dir>/policies/: each Rust crate to a
# wasm32-unknown-unknown module (cargo profile `policy`: size-optimised, LTO, stripped), NAME.wasm
# speaking ABI v1 and, for a crate with a `v2` feature, NAME-v2.wasm carrying the v2 contract
# (slotgate makes it a component on load); and each hand-written `policy.wat` copied as it is
# (slotgate's wasmtime compiles WAT text directly).
# Prints one artifact path per line on stdout. Idempotent; a warm run only checks freshness, and an
# artifact that did not change keeps its mtime, so a watching slotgate does not reload it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TARGET=wasm32-unknown-unknown
PROFILE=policy

if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
  command -v rustup >/dev/null || { echo "error: the $TARGET target is missing and rustup is not available" >&2; exit 1; }
  rustup target add "$TARGET" >&2
fi

# Cargo's own answer, so CARGO_TARGET_DIR and .cargo/config.toml are honoured.
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || { echo "error: cannot find cargo's target directory" >&2; exit 1; }
out="$target_dir/policies"
mkdir -p "$out"

rust=()
v2=()
wat=()
# tests/probe-policy: the v2 policy the host's tests drive (tests/tests/policies/components.rs).
for dir in policies/*/ tests/probe-policy/; do
  dir=${dir%/}
  if [ -f "$dir/policy.wat" ]; then
    wat+=("$dir")
  elif [ -f "$dir/Cargo.toml" ] && grep -q '"cdylib"' "$dir/Cargo.toml"; then
    pkg=$(sed -n 's/^name *= *"\([^"]*\)".*/\1/p' "$dir/Cargo.toml" | head -n1)
    rust+=("$pkg")
    if grep -q '^v2 *=' "$dir/Cargo.toml"; then v2+=("$pkg"); fi
  fi
done

# Copies $1 to $2 unless $2 already has the same bytes.
install_if_changed() {
  cmp -s "$1" "$2" 2>/dev/null || cp "$1" "$2"
}

if [ ${#rust[@]} -gt 0 ]; then
  args=()
  for pkg in "${rust[@]}"; do args+=(-p "$pkg"); done
  # One invocation for all of them: dependencies are built once. Progress goes to stderr.
  cargo build --quiet --profile "$PROFILE" --target "$TARGET" "${args[@]}" >&2
  for pkg in "${rust[@]}"; do
    install_if_changed "$target_dir/$TARGET/$PROFILE/${pkg//-/_}.wasm" "$out/$pkg.wasm"
    echo "$out/$pkg.wasm"
  done
fi

if [ ${#v2[@]} -gt 0 ]; then
  args=()
  for pkg in "${v2[@]}"; do args+=(-p "$pkg" --features "$pkg/v2"); done
  cargo build --quiet --profile "$PROFILE" --target "$TARGET" "${args[@]}" >&2
  for pkg in "${v2[@]}"; do
    install_if_changed "$target_dir/$TARGET/$PROFILE/${pkg//-/_}.wasm" "$out/$pkg-v2.wasm"
    echo "$out/$pkg-v2.wasm"
  done
fi

for dir in "${wat[@]}"; do
  name=$(basename "$dir")
  install_if_changed "$dir/policy.wat" "$out/$name.wat"
  echo "$out/$name.wat"
done
