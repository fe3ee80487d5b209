"""Anthropic SDK calls against slotgate (the Messages API, /v1/messages), for the Rust tests to
check what the SDK made of them.

    "$SLOTGATE_PYTHON" tests/python/anthropic_calls.py --base-url URL messages --max-tokens 8
    "$SLOTGATE_PYTHON" tests/python/anthropic_calls.py --base-url URL stream   --max-tokens 8
    "$SLOTGATE_PYTHON" tests/python/anthropic_calls.py --base-url URL count
    "$SLOTGATE_PYTHON" tests/python/anthropic_calls.py --base-url URL burst --clients 8 --max-tokens 32 --max-retries 30
    "$SLOTGATE_PYTHON" tests/python/anthropic_calls.py --base-url URL --max-retries 0 --on-cue error

`--base-url` is the server root (the SDK adds /v1/messages). With `--on-cue` the call waits, after
printing `ready`, until a line arrives on stdin (see openai_calls.py). Prints one JSON object on
stdout: the answer (text, stop reason, usage), the event types of a stream, a count, the burst's
clients, or the exception the SDK raised; and every HTTP attempt (see recording.py).
"""

import json
import sys
import threading

from recording import Recorder, driver_parser, now_ms, versions

try:
    import anthropic
except ImportError as e:
    sys.exit(f"{sys.argv[0]}: {e}: run it with the venv's Python (scripts/setup-python-clients.sh)")

PROMPT = "Tell me a long story about a lighthouse keeper."
MESSAGES = [{"role": "user", "content": PROMPT}]


def client_for(args, recorder, max_retries=None):
    return anthropic.Anthropic(
        base_url=args.base_url,
        api_key=args.api_key or "sk-ant-slotgate-tests",
        max_retries=args.max_retries if max_retries is None else max_retries,
        http_client=recorder.http_client(),
    )


def usage(u):
    return {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "cache_read_input_tokens": u.cache_read_input_tokens,
    }


def messages(client, args):
    m = client.messages.create(model=args.model, max_tokens=args.max_tokens, messages=MESSAGES)
    return {
        "type": m.type,
        "text": "".join(b.text for b in m.content if b.type == "text"),
        "stop_reason": m.stop_reason,
        "usage": usage(m.usage),
    }


def stream(client, args):
    events, text = [], []
    with client.messages.stream(model=args.model, max_tokens=args.max_tokens, messages=MESSAGES) as s:
        for event in s:
            events.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text.append(event.delta.text)
        final = s.get_final_message()
    return {"events": events, "text": "".join(text), "stop_reason": final.stop_reason, "usage": usage(final.usage)}


def count(client, args):
    c = client.messages.count_tokens(model=args.model, messages=MESSAGES)
    return {"input_tokens": c.input_tokens}


def raised(e):
    out = {"raised": type(e).__name__, "ancestry": [c.__name__ for c in type(e).__mro__], "message": str(e)}
    if isinstance(e, anthropic.APIStatusError):
        out.update({"status": e.status_code, "body": e.body})
    return out


def error(client, args):
    try:
        messages(client, args)
    except anthropic.AnthropicError as e:
        return raised(e)
    return {"raised": None}


def burst(args):
    """`--clients` clients at once, each with its own client and the SDK's own retries."""
    results = [None] * args.clients
    start = threading.Barrier(args.clients)

    def one(i):
        recorder = Recorder()
        client = client_for(args, recorder)
        start.wait()
        try:
            results[i] = {"index": i, "ok": True, **messages(client, args)}
        except anthropic.AnthropicError as e:
            results[i] = {"index": i, "ok": False, **raised(e)}
        finally:
            client.close()
        results[i]["attempts"] = recorder.attempts

    threads = [threading.Thread(target=one, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"clients": results, "done_ms": now_ms()}


def main():
    parser = driver_parser(__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("messages", "stream", "count", "error", "burst"):
        p = sub.add_parser(name)
        p.add_argument("--max-tokens", type=int, default=8)
        if name == "burst":
            p.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()

    if args.command == "burst":
        result = burst(args)
    else:
        recorder = Recorder()
        client = client_for(args, recorder)
        if args.on_cue:
            client.messages
            print("ready", flush=True)
            sys.stdin.readline()
        try:
            result = {"messages": messages, "stream": stream, "count": count, "error": error}[args.command](client, args)
        finally:
            client.close()
        result["attempts"] = recorder.attempts
    result["versions"] = versions()
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
