#!/usr/bin/env bash
# uPlot, the console's chart library, vendored in sidecar/console/vendor/uplot/ from npm
# (sidecar/console/vendor/uplot/SOURCE.md). Fetches the pinned version with `npm pack`, checks the
# tarball's integrity against the one pinned here, and either copies its files in (no argument:
# after changing the version and integrity below, to bump it) or, with --check, fails when a
# vendored file differs from the package's (the full test tier runs that).
set -euo pipefail
version="1.6.32"
integrity="sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
files=(dist/uPlot.iife.min.js dist/uPlot.min.css LICENSE)

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/sidecar/console/vendor/uplot"
command -v npm >/dev/null || { echo "vendor-uplot: needs npm (apt-get install npm)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "uplot@$version" >/dev/null)
tarball="$work/uplot-$version.tgz"
got="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
[ "$got" = "$integrity" ] || { echo "vendor-uplot: uplot@$version is $got, not the pinned $integrity" >&2; exit 1; }
tar -xzf "$tarball" -C "$work"
status=0
for f in "${files[@]}"; do
  if [ "${1:-}" = "--check" ]; then
    cmp -s "$work/package/$f" "$dest/$(basename "$f")" \
      || { echo "vendor-uplot: $dest/$(basename "$f") differs from uplot@$version's $f" >&2; status=1; }
  else
    cp "$work/package/$f" "$dest/"
  fi
done
if [ "$status" = 0 ]; then echo "uplot@$version: ${files[*]} $([ "${1:-}" = --check ] && echo "match the package" || echo "copied")"; fi
exit "$status"
