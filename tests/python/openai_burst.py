"""A burst of OpenAI SDK clients, each left to the SDK's own retries, against slotgate.

    "$SLOTGATE_PYTHON" tests/python/openai_burst.py --base-url http://127.0.0.1:PORT/v1 \
        --clients 12 --max-tokens 200 --max-retries 30

All clients are built first and released together by a barrier, each in a thread with a client of
its own (one connection pool each, as separate processes would have). Prints one JSON object on
stdout: the SDK's version and, per client, the answer (or the error it ended with) and every HTTP
attempt the SDK made (see recording.py), for the Rust test to check the waits against the headers.
"""

import argparse
import json
import sys
import threading

from recording import Recorder, now_ms, sdk_client, versions


def one_client(index, args, barrier, out):
    recorder = Recorder()
    client = sdk_client(args.base_url, recorder, args.max_retries)
    result = {"index": index, "attempts": recorder.attempts}
    out[index] = result
    barrier.wait()
    result["started_ms"] = now_ms()
    try:
        completion = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"{args.prompt} ({index})"}],
            max_tokens=args.max_tokens,
            # llama-server's own field: random weights may sample end-of-text at any step.
            extra_body={"ignore_eos": True},
        )
        choice = completion.choices[0]
        result.update(
            ok=True,
            content=choice.message.content,
            finish_reason=choice.finish_reason,
            usage=completion.usage.model_dump() if completion.usage else None,
        )
    except Exception as e:  # reported, not raised: the test shows every client's fate
        result.update(ok=False, error=f"{type(e).__name__}: {e}")
    finally:
        result["finished_ms"] = now_ms()
        client.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-retries", type=int, default=30)
    parser.add_argument("--prompt", default="Tell me a long story about a lighthouse keeper.")
    args = parser.parse_args()

    barrier = threading.Barrier(args.clients)
    out = [None] * args.clients
    threads = [
        threading.Thread(target=one_client, args=(i, args, barrier, out)) for i in range(args.clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    json.dump({"versions": versions(), "clients": out}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
