#!/usr/bin/env bash
# Which embedded database for state.dir: redb 2.6 (current) vs SQLite (rusqlite, bundled, WAL,
# synchronous=FULL / NORMAL) vs fjall 3, on slotgate's write pattern. Builds and runs everything
# (about 11 minutes on a 2-core machine) and prints markdown tables, ratios against redb.
#
#   scripts/bench/store-choice/run.sh            # everything
#   REPS=3 COMMITS=50 GROW_COMMITS=2400 BUILD_REPS=3 WORK=/tmp/x scripts/bench/store-choice/run.sh
#
# The crate is not part of slotgate's workspace (its Cargo.toml has its own [workspace]); it
# builds into $CARGO_TARGET_DIR (default ~/.cache/slotgate/target-store-choice). strace, when
# installed, counts the fsyncs (apt-get install strace). Results: RESULTS.md beside this file.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/slotgate/target-store-choice}"
export REPS="${REPS:-3}" COMMITS="${COMMITS:-50}" GROW_COMMITS="${GROW_COMMITS:-2400}"
BUILD_REPS="${BUILD_REPS:-3}"
WORK="${WORK:-/tmp/slotgate-store-choice}"

command -v strace >/dev/null || echo "note: strace not installed, the fsyncs column stays empty" >&2

echo "== building the benchmark (release)" >&2
cargo build --release --quiet --manifest-path "$HERE/Cargo.toml"
(cd "$HERE/tiny" && cargo fetch --quiet)

echo "# store-choice, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -r)"
echo "# REPS=$REPS COMMITS=$COMMITS GROW_COMMITS=$GROW_COMMITS BUILD_REPS=$BUILD_REPS"
start=$(date +%s)
"$CARGO_TARGET_DIR/release/store-choice" all "$WORK"

# Build cost: a binary that opens a database and writes one row, slotgate's release profile (fat
# LTO, one codegen unit), stripped; built from an empty target directory (dependencies fetched
# before) BUILD_REPS times, median. `none` is the same program writing a plain file.
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
declare -A secs size
for f in none redb sqlite fjall; do
  times=()
  for ((i = 1; i <= BUILD_REPS; i++)); do
    echo "[build] $f run $i" >&2
    t="$CARGO_TARGET_DIR/tiny-$f"
    rm -rf "$t"
    a=$(date +%s.%N)
    (cd "$HERE/tiny" && cargo build --quiet --release --no-default-features --features "$f" --target-dir "$t")
    b=$(date +%s.%N)
    times+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", b - a}')")
  done
  secs[$f]=$(printf '%s\n' "${times[@]}" | median)
  size[$f]=$(stat -c %s "$t/release/store-choice-tiny")
done
echo
echo "### Build cost (tiny binary: open + write one row; release, fat LTO, stripped; median of $BUILD_REPS clean builds)"
echo
echo "| crate | clean build s | added s | vs redb | binary KiB | added KiB | vs redb |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for f in none redb sqlite fjall; do
  awk -v f="$f" -v s="${secs[$f]}" -v s0="${secs[none]}" -v sr="${secs[redb]}" \
      -v z="${size[$f]}" -v z0="${size[none]}" -v zr="${size[redb]}" 'BEGIN {
    as = s - s0; ar = sr - s0; az = (z - z0) / 1024; azr = (zr - z0) / 1024;
    rs = (f == "none") ? "-" : sprintf("%.2fx", as / ar);
    rz = (f == "none") ? "-" : sprintf("%.2fx", az / azr);
    printf "| %s | %.1f | %.1f | %s | %.0f | %.0f | %s |\n", f, s, as, rs, z / 1024, az, rz }'
done
echo
echo "# total $(( $(date +%s) - start )) s"
