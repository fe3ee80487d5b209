#!/usr/bin/env bash
# Makes sure `promtool` is on PATH, for the checks of examples/prometheus/ (the observability_kit
# test runs `promtool check rules` and `promtool test rules`). Prints nothing when it already is.
#
# Installs Debian's `prometheus` package (the only Debian package shipping promtool) with apt-get,
# through sudo when not root. Debian enables that package's prometheus service too; on a machine that
# should not run one: `systemctl disable --now prometheus`. Elsewhere, put promtool from a release
# tarball (https://prometheus.io/download/) on PATH, or name it in $PROMTOOL.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"

if [ -n "${PROMTOOL:-}" ] && [ -x "$PROMTOOL" ]; then exit 0; fi
if command -v promtool >/dev/null 2>&1; then exit 0; fi

if ! command -v apt-get >/dev/null 2>&1; then
  log "promtool is missing and this is not a Debian-like system (no apt-get);"
  log "install promtool from https://prometheus.io/download/ and put it on PATH (or set PROMTOOL)"
  exit 1
fi
apt_install "promtool" prometheus || exit 1

if ! command -v promtool >/dev/null 2>&1; then
  log "the prometheus package is installed but promtool is still not on PATH"
  exit 1
fi
log "$(promtool --version 2>&1 | head -n1)"
