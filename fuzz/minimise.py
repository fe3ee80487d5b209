#!/usr/bin/env python3
"""Shrinks fuzz/corpus/<target> to few inputs that still cover every edge the corpus covers.

`cargo fuzz cmin <target> -- -use_counters=0` keeps every edge but picks inputs smallest first, so it
keeps many small inputs that each add one edge. This picks greedily by how many edges are still
uncovered instead, which needs about half the files. Inputs named `seed-*` (hand-written, readable)
and `regress-*` (reproducers of fixed findings) are always kept.

Each input runs alone in a libFuzzer merge with -use_counters=0, whose control file then lists every
edge the input covers. Run from fuzz/ after `cargo fuzz build` (see docs/fuzzing.md):

    RUSTC_BOOTSTRAP=1 cargo fuzz cmin <target> -- -use_counters=0
    python3 minimise.py <target>
"""

import os
import shutil
import subprocess
import sys
import tempfile

KEEP = ("seed-", "regress-")


def edges_of(binary, path, scratch):
    """The edges one input covers, as indices of the binary's coverage table."""
    one, empty, control = (os.path.join(scratch, n) for n in ("one", "empty", "control"))
    for d in (one, empty):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    if os.path.exists(control):
        os.remove(control)
    shutil.copy(path, one)
    subprocess.run(
        [binary, "-merge=1", "-use_counters=0", "-rss_limit_mb=2048",
         "-merge_control_file=" + control, empty, one],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    covered = set()
    if not os.path.exists(control):
        return covered  # libFuzzer skips an empty input (and always runs one itself)
    with open(control) as f:
        for line in f:
            if line.startswith("COV "):
                covered.update(map(int, line.split()[2:]))
    return covered


def main():
    target = sys.argv[1]
    binary = os.path.join("target", "x86_64-unknown-linux-gnu", "release", target)
    corpus = os.path.join("corpus", target)
    scratch = tempfile.mkdtemp()
    names = sorted(os.listdir(corpus))
    edges = {n: edges_of(binary, os.path.join(corpus, n), scratch) for n in names}
    size = {n: os.path.getsize(os.path.join(corpus, n)) for n in names}
    kept = [n for n in names if n.startswith(KEEP)]
    left = set().union(*edges.values()) - set().union(set(), *(edges[n] for n in kept))
    while left:
        best = max(edges, key=lambda n: (len(edges[n] & left), -size[n]))
        kept.append(best)
        left -= edges[best]
    for n in set(names) - set(kept):
        os.remove(os.path.join(corpus, n))
    shutil.rmtree(scratch)
    total = set().union(*edges.values())
    print(f"{target}: {len(names)} inputs -> {len(kept)} ({sum(size[n] for n in kept)} bytes), "
          f"all {len(total)} edges kept")


if __name__ == "__main__":
    main()
