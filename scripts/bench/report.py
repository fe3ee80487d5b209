"""Prints scripts/bench.sh's table from its wrk results, one median over the rounds per figure.

    python3 report.py RESULTS.tsv NAME:KIND:LABEL ...

RESULTS.tsv has one line per wrk run: name conc round p50_us p99_us requests duration_us non2xx
connect_err read_err write_err timeouts (the fields after `round` as post.lua prints them), then
cpu_us: the CPU time (user + system) the system's own processes used over that wrk run, -1 when
not measured.
KIND says what a system is compared with and what it must answer:
  base     the mock alone: the latency every proxy's "added" figure is measured from
  ref      nginx proxying to the mock: the baseline of the "vs nginx" ratios (must answer 200)
  stack    a bare hyper proxy (scripts/bench/stack): the "vs stack" ratios are against the best of
           these at each concurrency, the stack's limit (must answer 200)
  proxy    a proxy in front of the mock (must answer 200)
  seed     the seed's queue proxy (answers 200, or 429 when its 8-place FIFO is full)
  ref429   nginx `return 429`: the baseline of the fast-429 "vs nginx" ratios (must answer 429)
  stack429 a bare hyper 429 responder: the best of these is the fast-429 "vs stack" baseline
           (must answer 429)
  fast429  a gate whose every answer is 429 (must answer 429)
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
            p50, p99, req, dur, non2xx, conn, rd, wr, tmo, *rest = map(int, nums)
            cpu = rest[0] if rest else -1
            runs[(name, int(conc))].append(dict(
                p50=p50, p99=p99, req=req, dur=dur, non2xx=non2xx, readerr=rd, sockerr=conn + wr + tmo,
                cpu=cpu))
    systems = [s.split(":", 2) for s in sys.argv[2:]]

    def med(name, conc, key):
        rs = runs.get((name, conc))
        if not rs:
            return None
        if key == "rps_ok":
            vals = [(r["req"] - r["non2xx"]) / (r["dur"] / 1e6) for r in rs]
        elif key == "rps_all":
            vals = [r["req"] / (r["dur"] / 1e6) for r in rs]
        elif key == "cpu":
            # Microseconds of the system's CPU per request it answered.
            vals = [r["cpu"] / r["req"] for r in rs if r["cpu"] >= 0 and r["req"] > 0]
            if not vals:
                return None
        else:
            vals = [r[key] for r in rs]
        return statistics.median(vals)

    def of(kind):
        return [n for n, k, _ in systems if k == kind]

    label_of = {n: l for n, _, l in systems}
    base = of("base")[0]
    ref = of("ref")[0]
    ref429 = (of("ref429") or [None])[0]
    b50, b99 = med(base, 1, "p50"), med(base, 1, "p99")

    def added(name):
        return med(name, 1, "p50") - b50, med(name, 1, "p99") - b99

    def ratio(a, b):
        return "%.2fx" % (a / b) if a is not None and b is not None and b > 0 else "-"

    def us(v):
        return "-" if v is None else "%.1f" % v

    def rps_ok(n):
        return med(n, 64, "rps_ok")

    def rps_all(n):
        return med(n, 64, "rps_all")

    # The stack's limit: at each concurrency, the best of the bare hyper systems, whichever shape.
    # (figure, name) of the lowest (c=1 latency) or the highest (c=64 rate) figure.
    def best(names, figure, pick):
        vals = [(figure(n), n) for n in names]
        vals = [(v, n) for v, n in vals if v is not None]
        return pick(vals) if vals else (None, None)

    s50, s50_name = best(of("stack"), lambda n: added(n)[0], min)
    srps, srps_name = best(of("stack"), rps_ok, max)
    q50, q50_name = best(of("stack429"), lambda n: med(n, 1, "p50"), min)
    qrps, qrps_name = best(of("stack429"), rps_all, max)

    head = ("system", "c=1 p50", "c=1 p99", "p50 vs", "p50 vs", "p99 vs", "c=64 rps", "rps vs",
            "rps vs", "CPU us", "answers")
    fmt = "%-34s %8s %8s %6s %6s %6s %8s %6s %6s %7s  %s"
    rule = "-" * 128
    print("vs stack: against the best bare hyper proxy shape (scripts/bench/stack) at that concurrency:")
    print("  c=1 added p50: %s; c=64 rps: %s" % (label_of.get(s50_name, "-"), label_of.get(srps_name, "-")))
    print("  fast 429: %s at c=1, %s at c=64" % (label_of.get(q50_name, "-"), label_of.get(qrps_name, "-")))
    print("CPU us: the system's own CPU (user + system, all its processes) per request, c=64")
    print()
    print(fmt % head)
    print(fmt % ("", "added us", "added us", "nginx", "stack", "nginx", "", "nginx", "stack", "/req", ""))
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
        refusing = kind in ("ref429", "stack429", "fast429")
        if refusing:
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

        cpu = us(med(name, 64, "cpu"))
        if refusing and section != "429":
            section = "429"
            print(rule)
            print("fast 429 (no upstream involved: latencies are absolute; vs nginx return 429, vs the best stack 429)")
        if kind == "base":
            print(fmt % (label, "%d" % b50, "%d" % b99, "", "", "", "%.0f" % med(name, 64, "rps_ok"), "",
                         "", cpu, answers + "  (absolute latency: the baseline)"))
        elif refusing:
            a50, a99, rps = med(name, 1, "p50"), med(name, 1, "p99"), rps_all(name)
            n50, n99 = med(ref429, 1, "p50"), med(ref429, 1, "p99")
            print(fmt % (label, "%d" % a50, "%d" % a99, ratio(a50, n50), ratio(a50, q50), ratio(a99, n99),
                         "%.0f" % rps, ratio(rps, rps_all(ref429)), ratio(rps, qrps), cpu, answers))
        else:
            a50, a99 = added(name)
            rps = rps_ok(name)
            print(fmt % (label, "%.0f" % a50, "%.0f" % a99, ratio(a50, r50), ratio(a50, s50), ratio(a99, r99),
                         "%.0f" % rps, ratio(rps, rrps), ratio(rps, srps), cpu, answers))
    print(rule)

    # slotgate runs a current-thread runtime per core (app::workers): the stack in that shape is
    # what it would reach with nothing of its own.
    same = next((n for n in of("stack") if n.endswith("-per-core")), None)
    same429 = next((n for n in of("stack429") if n.endswith("-per-core")), None)
    if same or same429:
        print("against the stack in slotgate's own shape (per-core), slotgate / stack: c=64 rps, c=1 p50 (added for")
        print("proxies, absolute for 429s), CPU per request at c=64")
        pairs = [(n, same, lambda n: added(n)[0], rps_ok) for n in of("proxy") if same]
        pairs += [(n, same429, lambda n: med(n, 1, "p50"), rps_all) for n in of("fast429") if same429]
        for name, twin, p50, rps in pairs:
            cpu, tcpu = med(name, 64, "cpu"), med(twin, 64, "cpu")
            print("  %-36s %6s rps  %6s p50  %6s CPU (%s us vs %s us: %s)" % (
                label_of[name], ratio(rps(name), rps(twin)), ratio(p50(name), p50(twin)), ratio(cpu, tcpu),
                us(cpu), us(tcpu), label_of[twin]))
        print()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
