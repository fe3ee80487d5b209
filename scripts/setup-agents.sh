#!/usr/bin/env bash
# Installs the coding agents the `agents` tests run headless against slotgate (docs/agents.md), each
# pinned, from npm into $SLOTGATE_CACHE/agents (default ~/.cache/slotgate):
#
#   @anthropic-ai/claude-code  Claude Code, `claude -p`: the Anthropic Messages API
#   @openai/codex              the Codex CLI, `codex exec`: the Responses API
#   opencode-ai                opencode, `opencode run`: OpenAI chat completions
#
# Each ships its program as a platform package (a native binary), so Node only runs npm and their
# install scripts. Claude Code 2.1.197 is the last release that declares Node 20 (2.1.198 and later
# ask for Node 22). The folder carries a stamp of the pinned list, written once each program has
# answered `--version`: while it matches and the programs are there, a run does nothing else (well
# under a second); a bump reinstalls.
#
# Prints nothing on stdout but the programs, as shell assignments:
#   CLAUDE_CODE=/.../agents/node_modules/.bin/claude
#   CODEX=/.../agents/node_modules/.bin/codex
#   OPENCODE=/.../agents/node_modules/.bin/opencode
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"

PACKAGES=(
  @anthropic-ai/claude-code@2.1.197
  @openai/codex@0.171.0
  opencode-ai@1.18.33
)

dir="$cache/agents"
bin="$dir/node_modules/.bin"
stamp="$dir/.installed"
want="$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -d' ' -f1)"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  log "node and npm are needed (Node 20 or later: apt-get install nodejs npm)"
  exit 1
fi

installed() {
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] || return 1
  local p
  for p in claude codex opencode; do
    [ -x "$bin/$p" ] || return 1
  done
}

if ! installed; then
  mkdir -p "$cache"
  # Two test processes may set up at once: one installs, the other waits and finds it done.
  exec 9>"$cache/agents.lock"
  flock 9
  if ! installed; then
    log "installing ${PACKAGES[*]} from npm into $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    echo '{"private": true}' >"$dir/package.json"
    # A download cache of its own, thrown away after: the installed folder is the cache (the three
    # weigh about 1 GB; their tarballs another 350 MB).
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    # Under a throwaway HOME too: opencode's install script runs the program, which writes its
    # state under HOME. The user's npm configuration (a registry mirror) still applies.
    (
      cd "$dir"
      HOME="$scratch" npm_config_userconfig="${npm_config_userconfig:-$HOME/.npmrc}" \
        npm_config_cache="$scratch/npm" npm install --no-audit --no-fund --loglevel=error \
        --no-update-notifier --save-exact "${PACKAGES[@]}" >&2
    )
    # Each answers --version there, with its update checks off, as the tests run them.
    for p in claude codex opencode; do
      v="$(cd "$scratch" && HOME="$scratch" CODEX_HOME="$scratch" DISABLE_AUTOUPDATER=1 \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 OPENCODE_DISABLE_AUTOUPDATE=1 \
        timeout 60 "$bin/$p" --version 2>&1)" || {
        log "$bin/$p --version failed: $v"
        exit 1
      }
      log "$p: $v"
    done
    printf '%s\n' "$want" >"$stamp"
  fi
fi

echo "CLAUDE_CODE=$bin/claude"
echo "CODEX=$bin/codex"
echo "OPENCODE=$bin/opencode"
