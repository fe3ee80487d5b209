"""SDK calls against a slotgate whose quota policy runs out, for the Rust tests to check what the
SDKs read of the rate-limit headers and that they do not retry a `quota_exceeded` refusal.

    "$SLOTGATE_PYTHON" tests/python/quota_calls.py --base-url URL openai    --calls 5 --max-tokens 8
    "$SLOTGATE_PYTHON" tests/python/quota_calls.py --base-url URL anthropic --calls 5 --max-tokens 8

`openai` uses the OpenAI SDK (`--base-url` ends in /v1) on chat completions, `anthropic` the
Anthropic SDK (`--base-url` is the root) on the Messages API; each through its raw-response accessor
(`with_raw_response`), the way a client reads headers. Calls go on until one raises or `--calls` are
made. Prints one JSON object: each call's status and rate-limit headers (or the exception, its
status and error body), and every HTTP attempt (see recording.py).
"""

import json
import sys

from recording import Recorder, driver_parser, sdk_client, versions

try:
    import anthropic
    import openai
except ImportError as e:
    sys.exit(f"{sys.argv[0]}: {e}: run it with the venv's Python (scripts/setup-python-clients.sh)")

PROMPT = "Count to three."


def limits(headers):
    """The rate-limit headers of an answer, by name."""
    return {
        k.lower(): v
        for k, v in headers.items()
        if k.lower().startswith(("x-ratelimit-", "anthropic-ratelimit-")) or k.lower() == "x-should-retry"
    }


def call_openai(client, args):
    raw = client.chat.completions.with_raw_response.create(
        model=args.model, max_tokens=args.max_tokens, messages=[{"role": "user", "content": PROMPT}]
    )
    raw.parse()
    return raw


def call_anthropic(client, args):
    raw = client.messages.with_raw_response.create(
        model=args.model, max_tokens=args.max_tokens, messages=[{"role": "user", "content": PROMPT}]
    )
    raw.parse()
    return raw


def main():
    parser = driver_parser(__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("openai", "anthropic"):
        p = sub.add_parser(name)
        p.add_argument("--calls", type=int, default=5)
        p.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()

    recorder = Recorder()
    if args.command == "openai":
        client = sdk_client(args.base_url, recorder, args.max_retries, api_key=args.api_key or "sk-slotgate-tests")
        call, errors = call_openai, openai.APIStatusError
    else:
        client = anthropic.Anthropic(
            base_url=args.base_url,
            api_key=args.api_key or "sk-ant-slotgate-tests",
            max_retries=args.max_retries,
            http_client=recorder.http_client(),
        )
        call, errors = call_anthropic, anthropic.APIStatusError
    calls = []
    try:
        for _ in range(args.calls):
            try:
                raw = call(client, args)
                calls.append({"status": raw.status_code, "headers": limits(raw.headers)})
            except errors as e:
                calls.append(
                    {
                        "status": e.status_code,
                        "exception": type(e).__name__,
                        "headers": limits(e.response.headers),
                        "body": e.body,
                    }
                )
                break
    finally:
        client.close()
    json.dump({"calls": calls, "attempts": recorder.attempts, "versions": versions()}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
