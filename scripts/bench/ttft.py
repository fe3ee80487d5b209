"""Time to first token through Unix sockets: streamed chat requests, one at a time, each with a
unique prompt (so neither llama-server's prompt cache nor slotgate's count cache helps), sent to each
target in turn, rotating the order every round so no target always goes first. TTFT is the time from
sending the request (connect included) to the first SSE `data:` line whose delta carries content.

    python3 ttft.py [--requests N] [--warmup W] [--max-tokens T] NAME=SOCKET [NAME=SOCKET ...]

The first target is the baseline that the others' added milliseconds are measured against.
Standard library only. Exits non-zero if any request failed or never streamed content.
"""
import argparse
import http.client
import json
import math
import socket
import sys
import time
import uuid


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket: only where it connects changes."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def one(path, prompt, max_tokens):
    """(ttft_seconds or None, error or None) for one streamed chat request."""
    body = json.dumps({
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        # Random weights can sample end-of-text first; then there would be no content to time.
        "ignore_eos": True,
    })
    conn = UnixHTTPConnection(path, timeout=120)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return None, "status %d: %s" % (resp.status, resp.read()[:200])
        ttft = None
        # Read to the end of the body (past `[DONE]`, to the last chunk) even once timed: the next
        # request then finds llama-server idle, and slotgate counts this one `ok`, not `client_gone`.
        for line in resp:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if ttft is None and data != b"[DONE]":
                choices = json.loads(data).get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    ttft = time.perf_counter() - t0
        return ttft, None if ttft is not None else "no content streamed"
    except (OSError, http.client.HTTPException, ValueError) as e:
        return None, repr(e)
    finally:
        conn.close()


def pct(sorted_values, q):
    """Nearest-rank percentile of an ascending list."""
    return sorted_values[max(0, math.ceil(q / 100 * len(sorted_values)) - 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("targets", nargs="+", metavar="NAME=SOCKET")
    a = ap.parse_args()
    targets = [t.split("=", 1) for t in a.targets]
    ttfts = {name: [] for name, _ in targets}
    errors = {name: [] for name, _ in targets}
    run = uuid.uuid4().hex[:8]
    for i in range(a.warmup + a.requests):
        k = i % len(targets)
        for name, path in targets[k:] + targets[:k]:
            prompt = "%s-%d-%s: tell me about lighthouses and the sea." % (run, i, name)
            ttft, err = one(path, prompt, a.max_tokens)
            if i < a.warmup:
                continue
            if err:
                errors[name].append(err)
            else:
                ttfts[name].append(ttft * 1000)

    base = targets[0][0]
    b = sorted(ttfts[base])
    print("%-26s %8s %10s %10s %12s %12s" % ("target", "answered", "p50 (ms)", "p99 (ms)",
                                             "p50 added", "p99 added"))
    failed = False
    for name, _ in targets:
        v = sorted(ttfts[name])
        if errors[name]:
            failed = True
        if not v:
            print("%-26s %3d/%-4d %10s" % (name, 0, a.requests, "-"))
            continue
        added = "" if name == base or not b else "%+12.2f %+12.2f" % (pct(v, 50) - pct(b, 50),
                                                                      pct(v, 99) - pct(b, 99))
        print("%-26s %3d/%-4d %10.2f %10.2f %s" % (name, len(v), a.requests, pct(v, 50), pct(v, 99),
                                                   added))
    for name, errs in errors.items():
        for e in errs[:3]:
            print("  %s failed: %s" % (name, e))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
