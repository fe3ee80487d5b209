#!/usr/bin/env bash
# Stages the build context of slotgate's container image: CONTEXT/Containerfile (a copy of the one
# beside this script) and CONTEXT/rootfs/, holding
#
#   /usr/local/bin/slotgate       BINARY, its debug info stripped (a release build has none)
#   /lib/..., /lib64/...          every shared library `ldd BINARY` names, and the loader, copied
#                                 from this machine at the paths ldd prints
#   /etc/passwd, /etc/group       the user and group slotgate (65532), which the image runs as
#
# and nothing else: no shell, no package manager, no CA certificates, no time zone files (slotgate
# carries its own time zone data). Then `podman build CONTEXT` (or buildah, docker) builds it.
#
#   bash packaging/image/stage.sh target/release/slotgate /tmp/slotgate-image
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BINARY CONTEXT" >&2
  exit 2
fi
binary="$1"
context="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

rootfs="$context/rootfs"
rm -rf "$rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc"
cp "$here/Containerfile" "$context/Containerfile"
strip --strip-debug -o "$rootfs/usr/local/bin/slotgate" "$binary"
chmod 0755 "$rootfs/usr/local/bin/slotgate"

# `ldd` prints `name => /path (0x...)` for a library, `/path (0x...)` for the loader, and no path
# for the vDSO. A library ldd cannot find fails the stage.
if ldd "$binary" | grep -q 'not found'; then
  ldd "$binary" >&2
  echo "$0: a library of $binary is missing" >&2
  exit 1
fi
ldd "$binary" | awk '/=>/ { if ($3 ~ /^\//) print $3; next } $1 ~ /^\// { print $1 }' |
  while read -r lib; do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done

printf 'slotgate:x:65532:65532:slotgate:/nonexistent:/nonexistent\n' > "$rootfs/etc/passwd"
printf 'slotgate:x:65532:\n' > "$rootfs/etc/group"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"

find "$rootfs" -type f -printf '%P\n' | sort >&2
