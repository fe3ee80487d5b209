# What the setup-*.sh scripts share, sourced by them (never run): $cache, where they install
# ($SLOTGATE_CACHE, default ~/.cache/slotgate), and `log`, a progress line on stderr under the
# script's name (their stdout carries only the shell assignments they print).
cache="${SLOTGATE_CACHE:-$HOME/.cache/slotgate}"
setup_name="$(basename "${BASH_SOURCE[1]}" .sh)"
log() { printf '%s: %s\n' "$setup_name" "$*" >&2; }
