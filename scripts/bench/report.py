"""Prints scripts/bench.sh's table from its wrk results, one median over the rounds per figure.

    python3 report.py RESULTS.tsv NAME:KIND:LABEL ...

RESULTS.tsv has one line per wrk run: name conc round p50_us p99_us requests duration_us non2xx
connect_err read_err write_err timeouts (the fields after `round` as post.lua prints them).
KIND says what a system is compared with and what it must answer:
  base    the mock alone: the latency every proxy's "added" figure is measured from
  ref     nginx proxying to the mock: the baseline of the ratios (must answer 200)
  proxy   a proxy in front of the mock (must answer 200)
  seed    the seed's queue proxy (answers 200, or 429 when its 8-place FIFO is full)
  ref429  nginx `return 429`: the baseline of the fast-429 ratios (must answer 429)
  fast429 a gate whose every answer is 429 (must answer 429)
Exits 1 if a system answered other than it must, or had socket errors.
"""
import statistics
import sys
from collections import defaultdict


def main():
    runs = defaultdict(list)  # (name, conc) -> [dict]
    with open(sys.argv[1]) as f:
        for line in f:
            name, conc, _round, *nums = line.split()
            p50, p99, req, dur, non2xx, conn, rd, wr, tmo = map(int, nums)
            runs[(name, int(conc))].append(dict(
                p50=p50, p99=p99, req=req, dur=dur, non2xx=non2xx, readerr=rd, sockerr=conn + wr + tmo))
    systems = [s.split(":", 2) for s in sys.argv[2:]]

    def med(name, conc, key):
        rs = runs.get((name, conc))
        if not rs:
            return None
        if key == "rps_ok":
            vals = [(r["req"] - r["non2xx"]) / (r["dur"] / 1e6) for r in rs]
        elif key == "rps_all":
            vals = [r["req"] / (r["dur"] / 1e6) for r in rs]
        else:
            vals = [r[key] for r in rs]
        return statistics.median(vals)

    base = next(n for n, k, _ in systems if k == "base")
    ref = next(n for n, k, _ in systems if k == "ref")
    ref429 = next((n for n, k, _ in systems if k == "ref429"), None)
    b50, b99 = med(base, 1, "p50"), med(base, 1, "p99")

    def added(name):
        return med(name, 1, "p50") - b50, med(name, 1, "p99") - b99

    def ratio(a, b):
        return "%.2fx" % (a / b) if b and b > 0 else "-"

    head = ("system", "c=1 p50", "c=1 p99", "p50 vs", "p99 vs", "c=64 rps", "rps vs", "answers")
    fmt = "%-34s %9s %9s %7s %7s %9s %7s  %s"
    rule = "-" * 110
    print(fmt % head)
    print(fmt % ("", "added us", "added us", "nginx", "nginx", "", "nginx", ""))
    print(rule)
    bad = False
    r50, r99 = added(ref)
    rrps = med(ref, 64, "rps_ok")
    section = None
    for name, kind, label in systems:
        rs = runs[(name, 1)] + runs[(name, 64)]
        req = sum(r["req"] for r in rs)
        non2xx = sum(r["non2xx"] for r in rs)
        sockerr = sum(r["sockerr"] for r in rs)
        readerr = sum(r["readerr"] for r in rs)
        if kind == "seed" and readerr <= req:
            # HTTP/1.0 answers without Content-Length end at the close, which wrk also counts as a
            # read error: one per answer is no failure.
            readerr = 0
        sockerr += readerr
        if kind in ("ref429", "fast429"):
            ok = non2xx == req and sockerr == 0
            answers = "all %d are 429" % req if ok else "%d of %d non-2xx" % (non2xx, req)
        elif kind == "seed":
            # Its accept backlog of 5 and one worker time some connections out at c=64: the seed's
            # own limits, reported below, not a failure of the benchmark.
            ok = True
            answers = "%d 200, %d non-2xx (its FIFO full: 429)" % (req - non2xx, non2xx)
        else:
            ok = non2xx == 0 and sockerr == 0
            answers = "all %d are 200" % req if ok else "%d of %d non-2xx" % (non2xx, req)
        if sockerr:
            answers += ", %d socket errors/timeouts" % sockerr
        if not ok:
            answers += "  <-- WRONG"
            bad = True

        if kind in ("ref429", "fast429") and section != "429":
            section = "429"
            print(rule)
            print("fast 429 (no upstream involved: latencies are absolute, ratios against nginx return 429)")
        if kind == "base":
            print(fmt % (label, "%d" % b50, "%d" % b99, "", "", "%.0f" % med(name, 64, "rps_ok"), "",
                         answers + "  (absolute latency: the baseline)"))
        elif kind in ("ref429", "fast429"):
            a50, a99, rps = med(name, 1, "p50"), med(name, 1, "p99"), med(name, 64, "rps_all")
            n50, n99 = med(ref429, 1, "p50"), med(ref429, 1, "p99")
            print(fmt % (label, "%d" % a50, "%d" % a99, ratio(a50, n50), ratio(a99, n99), "%.0f" % rps,
                         ratio(rps, med(ref429, 64, "rps_all")), answers))
        else:
            a50, a99 = added(name)
            rps = med(name, 64, "rps_ok")
            print(fmt % (label, "%.0f" % a50, "%.0f" % a99, ratio(a50, r50), ratio(a99, r99),
                         "%.0f" % rps, ratio(rps, rrps), answers))
    print(rule)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
