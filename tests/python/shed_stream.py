"""A sheddable stream through the real SDKs: what a client sees when slotgate sheds it.

    "$SLOTGATE_PYTHON" tests/python/shed_stream.py --base-url http://127.0.0.1:PORT \
        --api openai|anthropic --max-tokens 16000 --priority 10

Opens a stream at `--priority` (llama-server's own `priority` field, read by slotgate with
--trust-client-priority) and reads it to its end. Prints one JSON object: the SDK's version, the
events read, and how the stream ended: `ended` is "complete", or the exception the SDK raised, with
its message and the error body it carries (for the Rust test to check the documented `shed` error).
"""

import argparse
import json
import sys

try:
    import anthropic
    import openai
except ImportError as e:
    sys.exit(f"{sys.argv[0]}: {e}: run it with $SLOTGATE_PYTHON (scripts/setup-python-clients.sh)")


def openai_stream(args, out):
    client = openai.OpenAI(base_url=args.base_url + "/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "tell me about the sea"}],
        max_tokens=args.max_tokens,
        stream=True,
        extra_body={"ignore_eos": True, "priority": args.priority},
    )
    for _chunk in stream:
        out["events"] += 1
    out["ended"] = "complete"


def anthropic_stream(args, out):
    client = anthropic.Anthropic(base_url=args.base_url, api_key="none", max_retries=0)
    with client.messages.stream(
        model="tiny",
        max_tokens=args.max_tokens,
        messages=[{"role": "user", "content": "tell me about the sea"}],
        extra_body={"priority": args.priority},
    ) as stream:
        for _event in stream:
            out["events"] += 1
    out["ended"] = "complete"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--api", choices=["openai", "anthropic"], required=True)
    p.add_argument("--max-tokens", type=int, default=16000)
    p.add_argument("--priority", type=int, default=10)
    args = p.parse_args()
    sdk = openai if args.api == "openai" else anthropic
    out = {"sdk": f"{args.api} {sdk.__version__}", "events": 0}
    try:
        (openai_stream if args.api == "openai" else anthropic_stream)(args, out)
    except Exception as e:  # reported: the test checks what the SDK made of the shed
        body = getattr(e, "body", None)
        out.update(ended=type(e).__name__, message=str(e), body=body)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
