#!/usr/bin/env python3
"""A chat client that waits as slotgate tells it: Python's standard library only.

slotgate answers an overloaded request at once with 429 (or 503 while it drains or llama-server is
down) and says when to come back: `retry-after-ms`, its estimate in milliseconds, and `Retry-After`,
the same rounded up to whole seconds. This client sleeps that long plus up to 10 % of it (jitter, so
clients told the same time do not all come back in the same instant; never less than told) and tries
again, until an overall deadline: when the next wait would end past it, it gives up at once instead
of sleeping in vain.

    python3 retry_client.py --url http://127.0.0.1:8080/v1/chat/completions --deadline 60 "Hello"
    python3 retry_client.py --unix-socket /run/slotgate/slotgate.sock --max-tokens 64 "Hello"

stdout: the answer's text (`--json`: the whole response body). stderr: one JSON object per line for
every attempt (`"event": "attempt"`) and how it ended (`"answer"` or `"give_up"`). Exit status: 0 for
an answer, 1 when the deadline ran out, 2 for an error that retrying cannot fix (any other status,
a refused connection).
"""

import argparse
import email.utils
import http.client
import json
import random
import socket
import sys
import time
import urllib.parse

RETRY_STATUSES = (429, 503)
# Without a header (a proxy's bare 503): exponential backoff from this, capped.
BACKOFF_START = 0.5
BACKOFF_CAP = 8.0

EXIT_ANSWER, EXIT_DEADLINE, EXIT_ERROR = 0, 1, 2


def told_wait(headers, now=None):
    """Seconds the server asked us to wait, or None: `retry-after-ms` first (sub-second), then
    `Retry-After` as seconds or as an HTTP date. `headers` maps lower-case names to values."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms)
            if value >= 0 and value != float("inf"):
                return value / 1000.0
        except ValueError:
            pass
    secs = headers.get("retry-after")
    if secs is None:
        return None
    try:
        value = float(secs)
        return value if value >= 0 and value != float("inf") else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(secs).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def wait_for(told, attempt, jitter=0.1, rand=None):
    """How long to sleep before attempt `attempt + 1`: what the server said plus up to `jitter` of
    it (never less than told), or without a header exponential backoff with the same jitter.
    `rand` draws from [0, 1) (default `random.random`)."""
    rand = rand or random.random
    base = told if told is not None else min(BACKOFF_START * 2 ** (attempt - 1), BACKOFF_CAP)
    return base * (1.0 + jitter * rand())


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket (slotgate's default listener)."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def post(url, unix_socket, body, timeout, api_key=None):
    """One POST; returns (status, lower-cased headers, body bytes)."""
    parts = urllib.parse.urlsplit(url)
    path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    if unix_socket:
        conn = UnixHTTPConnection(unix_socket, timeout)
    elif parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def log(event, **fields):
    print(json.dumps({"event": event, **fields}), file=sys.stderr, flush=True)


def error_code(body):
    try:
        return json.loads(body)["error"].get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def run(args, clock=time.monotonic, sleep=time.sleep):
    body = json.dumps(
        {
            "model": args.model,
            "messages": [{"role": "user", "content": args.prompt}],
            "max_tokens": args.max_tokens,
        }
    ).encode()
    start = clock()
    deadline = start + args.deadline
    attempt = 0
    while True:
        attempt += 1
        remaining = deadline - clock()
        sent = clock() - start
        try:
            # A request never outlives the deadline either (queued, or a long answer).
            status, headers, raw = post(args.url, args.unix_socket, body, max(remaining, 0.001), args.api_key)
        except (OSError, http.client.HTTPException) as e:
            log("attempt", attempt=attempt, sent_s=round(sent, 4), error=f"{type(e).__name__}: {e}")
            if isinstance(e, (TimeoutError, socket.timeout)):
                log("give_up", attempt=attempt, reason=f"no answer within the {args.deadline} s deadline")
                print(f"retry_client: gave up: no answer within the {args.deadline} s deadline", file=sys.stderr)
                return EXIT_DEADLINE
            print(f"retry_client: {args.unix_socket or args.url}: {e}", file=sys.stderr)
            return EXIT_ERROR
        received = clock() - start
        entry = {
            "attempt": attempt,
            "sent_s": round(sent, 4),
            "received_s": round(received, 4),
            "status": status,
            "code": error_code(raw) if status >= 400 else None,
            "retry_after_ms": headers.get("retry-after-ms"),
            "retry_after": headers.get("retry-after"),
        }
        if status == 200:
            log("attempt", **entry)
            log("answer", attempt=attempt, elapsed_s=round(received, 4))
            answer = json.loads(raw)
            print(json.dumps(answer) if args.json else answer["choices"][0]["message"]["content"])
            return EXIT_ANSWER
        if status not in RETRY_STATUSES:
            log("attempt", **entry)
            print(f"retry_client: HTTP {status}: {raw.decode(errors='replace')}", file=sys.stderr)
            return EXIT_ERROR
        told = told_wait(headers)
        wait = wait_for(told, attempt)
        entry["told_s"] = told
        entry["wait_s"] = wait
        log("attempt", **entry)
        left = deadline - clock()
        if wait > left:
            said = f"{told:.3f} s" if told is not None else "no wait"
            reason = (
                f"slotgate answered {status} {entry['code'] or ''} and said to come back in {said}; "
                f"waiting {wait:.3f} s would pass the {args.deadline} s deadline ({max(left, 0):.3f} s left)"
            )
            log("give_up", attempt=attempt, at_s=round(clock() - start, 4), reason=reason)
            print(f"retry_client: gave up after {attempt} attempts: {reason}", file=sys.stderr)
            return EXIT_DEADLINE
        sleep(wait)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt", nargs="?", default="Say hello.")
    parser.add_argument(
        "--url",
        default="http://localhost/v1/chat/completions",
        help="the chat endpoint (with --unix-socket only its path is used) [%(default)s]",
    )
    parser.add_argument("--unix-socket", help="connect to this Unix socket instead of the URL's host")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds for the whole call, waits included [%(default)s]")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default="default")
    parser.add_argument("--api-key", help="sent as a bearer token (slotgate's tenant)")
    parser.add_argument("--json", action="store_true", help="print the whole response body")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
