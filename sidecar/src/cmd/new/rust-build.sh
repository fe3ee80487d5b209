#!/usr/bin/env bash
# Builds {{name}}.wasm: the policy for wasm32-unknown-unknown, a core module carrying the
# slotgate:policy@2.0.0 contract, which slotgate makes a component when it loads it. Needs the
# target: `rustup target add wasm32-unknown-unknown`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
cargo build --quiet --release --target wasm32-unknown-unknown
cp "${CARGO_TARGET_DIR:-target}/wasm32-unknown-unknown/release/{{crate}}.wasm" "{{name}}.wasm"
echo "{{name}}.wasm"
