"""Time to first token of an interactive request while one slot is held by background work, with
and without shedding (issue 22): a long background stream (priority 10) takes the slot, then an
interactive stream (priority 0) arrives. Run against two slotgates in front of the same one-slot
llama-server, one with `--sheddable-priority 10`, one without; prints the median TTFT of each and
the ratio, and how the background streams ended; asserts nothing.

    python3 shedding.py SHED_URL PLAIN_URL [--rounds N] [--background-s S]

Standard library only.
"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def stream(url, priority, tokens, first_token=None):
    """Sends a chat stream; returns (seconds to the first content token, how it ended)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    body = json.dumps({
        "messages": [{"role": "user", "content": "tell me about the sea"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "priority": priority,
    })
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        return None, f"status {resp.status}"
    ttft, ended = None, "cut"
    try:
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                ended = "done"
                break
            event = json.loads(data)
            if "error" in event:
                ended = f"error {event['error'].get('code')}"
                continue
            delta = (event.get("choices") or [{}])[0].get("delta", {})
            if ttft is None and delta.get("content"):
                ttft = time.monotonic() - t0
                if first_token is not None:
                    first_token.set()
    except (http.client.HTTPException, OSError) as e:
        ended = ended if ended.startswith("error") else f"cut ({type(e).__name__})"
    finally:
        conn.close()
    return ttft, ended


def per_token(url):
    """Seconds per generated token, from a timed 200-token stream (the faster of two)."""
    best = float("inf")
    for _ in range(2):
        t0 = time.monotonic()
        stream(url, 0, 200)
        best = min(best, (time.monotonic() - t0) / 200)
    return best


def round_trip(url, tokens, lead):
    """One background stream holding the slot, then an interactive one `lead` seconds into it."""
    started = threading.Event()
    background = {}

    def run_background():
        background["ttft"], background["ended"] = stream(url, 10, tokens, started)

    t = threading.Thread(target=run_background)
    t.start()
    started.wait(60)
    time.sleep(lead)
    ttft, ended = stream(url, 0, 16)
    t.join()
    return ttft, ended, background.get("ended")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shed_url")
    ap.add_argument("plain_url")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--background-s", type=float, default=6.0)
    a = ap.parse_args()
    pt = per_token(a.plain_url)
    tokens = min(16000, max(200, int(a.background_s / pt)))
    print(f"{pt * 1000:.2f} ms per token: background streams of {tokens} tokens "
          f"(about {tokens * pt:.1f} s), the interactive one 0.5 s into each, {a.rounds} rounds")
    results = {}
    for name, url in (("without shedding", a.plain_url), ("with --sheddable-priority 10", a.shed_url)):
        ttfts, ends = [], {}
        for _ in range(a.rounds):
            ttft, ended, bg = round_trip(url, tokens, 0.5)
            if ttft is not None:
                ttfts.append(ttft)
            ends[bg] = ends.get(bg, 0) + 1
        results[name] = statistics.median(ttfts) if ttfts else float("nan")
        print(f"  {name:30} interactive TTFT median {results[name] * 1000:8.1f} ms "
              f"(min {min(ttfts) * 1000:.1f}, max {max(ttfts) * 1000:.1f}); background ended: {ends}")
    plain, shed = results["without shedding"], results["with --sheddable-priority 10"]
    print(f"  TTFT with shedding / without: {shed / plain:.4f} ({plain / shed:.0f}x sooner)")


if __name__ == "__main__":
    main()
