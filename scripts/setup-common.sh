# What the setup-*.sh scripts share, sourced by them (never run): $cache, where they install
# ($SLOTGATE_CACHE, default ~/.cache/slotgate), and `log`, a progress line on stderr under the
# script's name (their stdout carries only the shell assignments they print).
cache="${SLOTGATE_CACHE:-$HOME/.cache/slotgate}"
setup_name="$(basename "${BASH_SOURCE[1]}" .sh)"
log() { printf '%s: %s\n' "$setup_name" "$*" >&2; }

# Installs the Debian packages named after `why` (what they are for, said in the messages) with
# apt-get, through sudo when not root. Fails, saying so, where there is no apt-get or no way to
# become root.
apt_install() {
  local why=$1
  shift
  if ! command -v apt-get >/dev/null 2>&1; then
    log "$why: this is not a Debian-like system (no apt-get); install $* yourself"
    return 1
  fi
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { log "$why: installing $* needs root and there is no sudo"; return 1; }
    sudo=(sudo)
  fi
  log "$why: installing Debian's $*"
  "${sudo[@]}" apt-get update -qq >&2
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "$@" >&2
}

# A venv at $cache/NAME holding the pinned packages of REQUIREMENTS, then MODULES that must be
# found in it for it to count as installed. It carries a stamp with the file's SHA-256: while that
# matches and the modules are there, nothing is done (well under a second); an edited file
# reinstalls from it. Two processes asking at once: one installs, the other waits for it. Sets
# `python` to the venv's interpreter; pip sees the caller's environment.
pinned_venv() {
  local name=$1 requirements=$2
  shift 2
  local venv="$cache/$name" want modules
  local stamp="$venv/.requirements.sha256"
  python="$venv/bin/python"
  [ -f "$requirements" ] || { log "no $requirements"; return 1; }
  want="$(sha256sum "$requirements" | cut -d' ' -f1)"
  modules="$(printf '"%s",' "$@")"
  # find_spec, not import: importing an SDK takes most of a second.
  venv_ready() {
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$python" -c \
      "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ($modules))))" 2>/dev/null
  }
  venv_ready && return 0
  mkdir -p "$cache"
  exec 9>"$cache/$name.lock"
  flock 9
  if ! venv_ready; then
    rm -f "$stamp"
    if ! "$python" -c '' 2>/dev/null; then
      log "creating python venv at $venv"
      rm -rf "$venv"
      python3 -m venv "$venv" >&2
    fi
    log "installing $(grep -cv '^\s*\(#\|$\)' "$requirements") pinned package(s) from $requirements"
    "$python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
    printf '%s\n' "$want" > "$stamp"
  fi
  exec 9>&-
}
