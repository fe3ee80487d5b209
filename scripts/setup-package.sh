#!/usr/bin/env bash
# Installs what the package and image tests (tests/tests/deploy/deploy_package.rs, deploy_image.rs)
# need, on a fresh Debian machine:
#
# - cargo-deb (pinned) from crates.io into $SLOTGATE_CACHE/cargo-deb (default
#   ~/.cache/slotgate/cargo-deb): it builds the .deb. A first install compiles it (about 2 minutes
#   on 2 cores); a second run prints the path and does nothing else.
# - podman and runc from Debian (apt-get, through sudo when not root), which build the image from
#   scratch and run it. runc, not Debian's default crun: crun refuses this kind of machine's hybrid
#   cgroup layout. dpkg, dpkg-deb and systemd-analyze are Debian's own and already there.
#
# Prints nothing on stdout but shell assignments:
#   CARGO_DEB=/.../cargo-deb/bin/cargo-deb
#   PODMAN=/usr/bin/podman
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"

CARGO_DEB_VERSION=3.8.0

root="$cache/cargo-deb"
cargo_deb="$root/bin/cargo-deb"
if ! [ -x "$cargo_deb" ] || [ "$("$cargo_deb" --version 2>/dev/null)" != "cargo-deb $CARGO_DEB_VERSION" ]; then
  log "installing cargo-deb $CARGO_DEB_VERSION from crates.io into $root"
  cargo install --quiet --locked --force --root "$root" "cargo-deb@$CARGO_DEB_VERSION" >&2
fi

missing=()
for tool in podman runc dpkg-deb systemd-analyze systemd-sysusers deb-systemd-helper; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "the package and image tests (missing: ${missing[*]})" \
    podman runc netavark dpkg systemd init-system-helpers || exit 1
fi

echo "CARGO_DEB=$cargo_deb"
echo "PODMAN=$(command -v podman)"
