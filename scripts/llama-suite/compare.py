"""Compares a through-slotgate run of llama.cpp's server tests with the direct one: every test that
passes direct and does not pass through slotgate is printed, as `protected` when protections.txt
names it (a test id's prefix and the setting that lifts the protection) and the run may have
protections, else as `FAILED`. Exits with the number of FAILED ones (at most 100).

usage: compare.py NAME DIRECT.tsv THROUGH.tsv PROTECTIONS.txt protected|strict [narrowed]
       (narrowed: the run was of some tests only; those it did not run do not count)
"""
import sys


def outcomes(path):
    out = {}
    with open(path) as f:
        for line in f:
            outcome, _, test = line.rstrip("\n").partition("\t")
            out[test] = outcome
    return out


def main():
    name, direct_path, through_path, protections_path, mode = sys.argv[1:6]
    direct = outcomes(direct_path)
    through = outcomes(through_path)
    protections = []
    with open(protections_path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                prefix, _, setting = line.rstrip("\n").partition("\t")
                protections.append((prefix.strip(), setting.strip()))
    counted = sorted(t for t, o in direct.items() if o == "passed")
    if len(sys.argv) > 6 and sys.argv[6] == "narrowed":
        counted = [t for t in counted if t in through]
    lost = [t for t in counted if through.get(t) != "passed"]
    print(f"{name}: {len(counted) - len(lost)} of the {len(counted)} tests that pass direct pass through slotgate")
    bad = 0
    for test in lost:
        why = next((s for p, s in protections if test.startswith(p)), None)
        state = through.get(test, "not run")
        if mode == "protected" and why:
            print(f"  protected  {test}  ({why})")
        else:
            print(f"  FAILED     {test}  ({state})")
            bad += 1
    sys.exit(min(bad, 100))


if __name__ == "__main__":
    main()
