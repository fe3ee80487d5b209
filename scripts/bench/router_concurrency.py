"""Direct concurrency on llama-server's router mode (issue 21): the same requests to two loaded
models one at a time, two at once on one model, and at once across the two models, against the
router at URL. Prints wall times and each run's ratio to the serial run; asserts nothing.

    python3 router_concurrency.py URL MODEL_A MODEL_B [--tokens N] [--rounds R]

Standard library only. Every request must answer 200 with N completion tokens (`ignore_eos`), or the
script exits non-zero.
"""
import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request


def request(url, model, tokens):
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": "tell me about the sea"}],
        "max_tokens": tokens,
        "ignore_eos": True,
    }).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        got = json.load(r)["usage"]["completion_tokens"]
    if got != tokens:
        sys.exit(f"{model}: {got} completion tokens, not {tokens}")


def at_once(url, models, tokens):
    threads = [threading.Thread(target=request, args=(url, m, tokens)) for m in models]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


def one_by_one(url, models, tokens):
    t0 = time.monotonic()
    for m in models:
        request(url, m, tokens)
    return time.monotonic() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    a, b = args.a, args.b
    for m in (a, b):  # loaded before anything is timed
        request(args.url, m, 1)
    runs = {
        "serial: a a b b, one at a time": lambda: one_by_one(args.url, [a, a, b, b], args.tokens),
        "a a at once (one model, its 2 slots)": lambda: at_once(args.url, [a, a], args.tokens),
        "a b at once (two models)": lambda: at_once(args.url, [a, b], args.tokens),
        "a a b b at once": lambda: at_once(args.url, [a, a, b, b], args.tokens),
    }
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            times[name].append(run())
    base = statistics.median(times["serial: a a b b, one at a time"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<40} {med:8.2f} s   x{med / base:6.2f} the serial run")


if __name__ == "__main__":
    main()
