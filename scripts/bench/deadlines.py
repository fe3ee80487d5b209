"""Deadlines at 2x overload on one slot (issue 22): the same arrivals, half interactive (a short
deadline) and half batch (a long one), sent to slotgate at URL twice: with `X-Slotgate-Deadline-Ms`
on every request, and as plain FIFO (no header; the same queue timeout). Prints, per run, the share
of interactive requests that started within their deadline, how the others ended, and the slot time
spent on interactive answers that started too late to be wanted; asserts nothing.

    python3 deadlines.py URL [--requests N] [--service-ms S] [--short-ms D] [--rounds R]

Standard library only. A request "started within its deadline" when it was answered 200 and its
`x-slotgate-queue-wait-ms` is at most the deadline; for FIFO the same test against the deadline the
request would have carried.
"""
import argparse
import json
import statistics
import threading
import time
import urllib.error
import urllib.request


def post(url, tokens, deadline_ms):
    body = json.dumps({
        "messages": [{"role": "user", "content": "tell me about the sea"}],
        "max_tokens": tokens,
        "ignore_eos": True,
    }).encode()
    headers = {"content-type": "application/json"}
    if deadline_ms is not None:
        headers["x-slotgate-deadline-ms"] = str(deadline_ms)
    req = urllib.request.Request(url + "/v1/chat/completions", body, headers)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
            wait = int(r.headers.get("x-slotgate-queue-wait-ms", "0"))
            return {"status": r.status, "wait_ms": wait, "took": time.monotonic() - t0}
    except urllib.error.HTTPError as e:
        code = json.loads(e.read() or b"{}").get("error", {}).get("code")
        return {"status": e.code, "code": code, "took": time.monotonic() - t0}


def service_seconds(url, tokens):
    best = float("inf")
    for _ in range(3):
        t0 = time.monotonic()
        r = post(url, tokens, None)
        assert r["status"] == 200, r
        best = min(best, time.monotonic() - t0)
    return best


def tokens_for(url, target_s):
    """`max_tokens` for one answer of about `target_s` (from a timed 100-token probe)."""
    per_token = service_seconds(url, 100) / 100
    return max(10, int(target_s / per_token))


def run(url, plan, tokens, with_deadlines):
    """`plan`: (offset seconds, kind, deadline ms) per request. Returns (kind, deadline, result)."""
    results = [None] * len(plan)

    def one(i, at, deadline):
        time.sleep(max(0.0, at - (time.monotonic() - start)))
        results[i] = post(url, tokens, deadline if with_deadlines else None)

    start = time.monotonic()
    threads = [threading.Thread(target=one, args=(i, at, d)) for i, (at, _, d) in enumerate(plan)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [(kind, d, r) for (_, kind, d), r in zip(plan, results)]


def summary(results, service):
    inter = [(d, r) for kind, d, r in results if kind == "interactive"]
    batch = [(d, r) for kind, d, r in results if kind == "batch"]
    within = sum(1 for d, r in inter if r["status"] == 200 and r["wait_ms"] <= d)
    late = sum(1 for d, r in inter if r["status"] == 200 and r["wait_ms"] > d)
    refused = sum(1 for _, r in inter if r["status"] == 429)
    expired = sum(1 for _, r in inter if r["status"] == 504)
    batch_ok = sum(1 for _, r in batch if r["status"] == 200)
    return {
        "within": within / len(inter),
        "late": late,
        "refused": refused,
        "expired": expired,
        "wasted_s": late * service,
        "batch_ok": batch_ok / len(batch),
        "n": len(inter),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--service-ms", type=int, default=400, help="one answer's length, roughly")
    p.add_argument("--short-ms", type=int, default=2000)
    p.add_argument("--long-ms", type=int, default=60000)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    args.tokens = tokens_for(args.url, args.service_ms / 1000)
    service = service_seconds(args.url, args.tokens)
    gap = service / 2  # arrivals at twice what one slot serves
    plan = [
        (i * gap, "interactive" if i % 2 else "batch", args.short_ms if i % 2 else args.long_ms)
        for i in range(args.requests)
    ]
    print(f"  one answer {service:.2f} s ({args.tokens} tokens); {args.requests} requests, one every {gap:.2f} s (2x "
          f"overload), alternating batch ({args.long_ms} ms) and interactive ({args.short_ms} ms)")
    shares = {True: [], False: []}
    for _ in range(args.rounds):
        for with_deadlines in (True, False):
            s = summary(run(args.url, plan, args.tokens, with_deadlines), service)
            shares[with_deadlines].append(s["within"])
            name = "deadlines" if with_deadlines else "plain FIFO"
            print(f"  {name:<11} interactive started within {args.short_ms} ms: {s['within']:6.1%} "
                  f"of {s['n']}; late {s['late']} (slot time spent on them {s['wasted_s']:.1f} s), "
                  f"refused at arrival {s['refused']}, left at deadline {s['expired']}; "
                  f"batch served {s['batch_ok']:.0%}")
    d, f = statistics.median(shares[True]), statistics.median(shares[False])
    ratio = f"{d / f:.1f}x" if f > 0 else "inf (FIFO: none)"
    print(f"  median share within deadline: deadlines {d:.1%}, plain FIFO {f:.1%}: {ratio}")


if __name__ == "__main__":
    main()
