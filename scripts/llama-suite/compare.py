"""Compares a through-slotgate run of llama.cpp's server tests with the direct one: every test that
passes direct and does not pass through slotgate is printed, as `protected` when the run may have
protections, protections.txt names the test (a test id's prefix and the setting that lifts the
protection), and slotgate's access log shows it refused (403) one of that setting's routes during
the test; else as `FAILED`. A protected test must also pass with the protections lifted (the
`lifted` way, strict), so a second fault behind the 403 cannot hide. Exits with the number of
FAILED ones (at most 100).

usage: compare.py NAME DIRECT.tsv THROUGH.tsv PROTECTIONS.txt protected|strict [narrowed|else=OTHER.tsv] [again=AGAIN.tsv]
       (narrowed: the run was of some tests only; those it did not run do not count.
        else=OTHER.tsv: those it did not run count as they ran in OTHER.tsv.
        again=AGAIN.tsv: a second run of the FAILED ones; one that passed there is printed
        `flaky` and does not count as FAILED)
       compare.py touched THROUGH.tsv
       (prints the tests during which slotgate answered a path of a protected route, whatever the
       status, or whose captured output shows no request at all (a test that reads the server's
       output itself hides slotgate's log): the only ones whose outcome the protections' settings
       can change, as far as the log can tell)
"""
import sys


# The routes each setting forwards (docs/endpoints.md#protections): the paths slotgate refuses
# without it.
ROUTES = {
    "--forward-host-endpoints": ("/tools", "/cors-proxy"),
    "--client-admin-routes slots": ("/slots",),
    "--client-admin-routes metrics": ("/metrics",),
    "--client-admin-routes models": ("/models",),
    "--client-admin-routes lora-adapters": ("/lora-adapters",),
    "--client-admin-routes props": ("/props",),
}


def outcomes(path):
    """{test: (outcome, [paths refused with 403])}"""
    out = {}
    with open(path) as f:
        for line in f:
            outcome, test, refused = (line.rstrip("\n").split("\t") + ["", ""])[:3]
            out[test] = (outcome, [p for p in refused.split(",") if p])
    return out


def touched(through_path):
    prefixes = tuple(p for routes in ROUTES.values() for p in routes)
    with open(through_path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t") + ["", "", ""]
            paths = [p for p in fields[3].split(",") if p]
            if not paths or any(p.split("?")[0].startswith(prefixes) for p in paths):
                print(fields[1])


def main():
    if sys.argv[1] == "touched":
        return touched(sys.argv[2])
    name, direct_path, through_path, protections_path, mode = sys.argv[1:6]
    direct = outcomes(direct_path)
    through = outcomes(through_path)
    protections = []
    with open(protections_path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                prefix, _, setting = line.rstrip("\n").partition("\t")
                protections.append((prefix.strip(), setting.strip()))
    counted = sorted(t for t, (o, _) in direct.items() if o == "passed")
    extras = sys.argv[6:]
    again = {}
    for e in extras:
        if e.startswith("again="):
            again = outcomes(e[len("again="):])
    extra = next((e for e in extras if not e.startswith("again=")), "")
    if extra == "narrowed":
        counted = [t for t in counted if t in through]
    elif extra.startswith("else="):
        ran = sum(1 for t in counted if t in through)
        other = outcomes(extra[len("else="):])
        through = {**{t: other[t] for t in counted if t in other}, **through}
        print(f"{name}: {ran} tests run this way, the other {len(counted) - ran} as in {extra[5:]}")
    lost = [t for t in counted if through.get(t, ("not run",))[0] != "passed"]
    print(f"{name}: {len(counted) - len(lost)} of the {len(counted)} tests that pass direct pass through slotgate")
    bad = 0
    for test in lost:
        state, refused = through.get(test, ("not run", []))
        # Every protections.txt line naming the test whose routes slotgate refused in it.
        why = []
        for prefix, setting in protections:
            routes = ROUTES.get(setting, ())
            shown = [r for r in refused if routes and r.split("?")[0].startswith(routes)]
            if test.startswith(prefix) and shown:
                why.append(f"{setting}: {', '.join(shown)} refused")
        if mode == "protected" and why:
            print(f"  protected  {test}  ({'; '.join(why)})")
        elif again.get(test, ("",))[0] == "passed":
            print(f"  flaky      {test}  ({state} once, passed on its second run)")
        else:
            note = f"; refused {', '.join(refused)}" if refused else ""
            print(f"  FAILED     {test}  ({state}{note})")
            bad += 1
    sys.exit(min(bad, 100))


if __name__ == "__main__":
    main()
