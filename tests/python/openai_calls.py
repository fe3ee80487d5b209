"""Single OpenAI SDK calls against slotgate, for the Rust tests to check what the SDK made of them.

    "$SLOTGATE_PYTHON" tests/python/openai_calls.py --base-url URL chat   --max-tokens 16
    "$SLOTGATE_PYTHON" tests/python/openai_calls.py --base-url URL stream --max-tokens 16 [--include-usage]
    "$SLOTGATE_PYTHON" tests/python/openai_calls.py --base-url URL responses --max-tokens 16 [--stream]
    "$SLOTGATE_PYTHON" tests/python/openai_calls.py --base-url URL error  --call chat|files \
        [--prompt-chars N] [--max-retries N]

With `--on-cue` the call waits, SDK imported and client built, until a line arrives on stdin, after
printing `ready` on a line of its own: the test then sets the scene (a busy slot) and says go, so
the call comes within milliseconds, however long Python took to start.

Prints one JSON object on stdout:
- chat / stream: the parsed answer (content, finish_reason, usage; for a stream its chunk count and
  which chunk carried usage);
- error: the exception the SDK raised (class and its ancestry, status, code, type, body, message)
  or `"raised": null` if the call succeeded;
and, for each, every HTTP attempt (see recording.py).
"""

import json
import sys

from recording import Recorder, driver_parser, openai, sdk_client, versions

PROMPT = "Tell me a long story about a lighthouse keeper."


def messages(args):
    text = PROMPT if args.prompt_chars is None else ("lighthouse " * args.prompt_chars)[: args.prompt_chars]
    return [{"role": "user", "content": text}]


def chat(client, args):
    completion = client.chat.completions.create(
        model=args.model, messages=messages(args), max_tokens=args.max_tokens, extra_body={"ignore_eos": True}
    )
    choice = completion.choices[0]
    return {
        "object": completion.object,
        "content": choice.message.content,
        "finish_reason": choice.finish_reason,
        "usage": completion.usage.model_dump() if completion.usage else None,
    }


def stream(client, args):
    kwargs = {"stream_options": {"include_usage": True}} if args.include_usage else {}
    chunks = client.chat.completions.create(
        model=args.model,
        messages=messages(args),
        max_tokens=args.max_tokens,
        stream=True,
        extra_body={"ignore_eos": True},
        **kwargs,
    )
    content, finish_reason, usage, usage_chunk, count = [], None, None, None, 0
    for chunk in chunks:
        if chunk.usage is not None:
            usage, usage_chunk = chunk.usage.model_dump(), count
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            if choice.finish_reason:
                finish_reason = choice.finish_reason
        count += 1
    return {
        "object": "chat.completion.chunk",
        "content": "".join(content),
        "finish_reason": finish_reason,
        "usage": usage,
        "chunks": count,
        "usage_chunk": usage_chunk,
    }


def responses(client, args):
    """The Responses API (`client.responses.create`), whole or streamed."""
    kwargs = {"model": args.model, "input": PROMPT, "max_output_tokens": args.max_tokens}
    if not args.stream:
        r = client.responses.create(**kwargs)
        return {
            "object": r.object,
            "status": r.status,
            "content": r.output_text,
            "usage": r.usage.model_dump() if r.usage else None,
        }
    events, text, usage, status = [], [], None, None
    for event in client.responses.create(stream=True, **kwargs):
        events.append(event.type)
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        if event.type == "response.completed":
            usage, status = event.response.usage.model_dump(), event.response.status
    return {"object": "response", "status": status, "content": "".join(text), "usage": usage, "events": events}


def error(client, args):
    try:
        if args.call == "files":
            client.files.list()
        else:
            chat(client, args)
    except openai.APIStatusError as e:
        return {
            "raised": type(e).__name__,
            "ancestry": [c.__name__ for c in type(e).__mro__],
            "status": e.status_code,
            "code": e.code,
            "type": e.type,
            "body": e.body,
            "message": e.message,
        }
    except openai.OpenAIError as e:
        return {"raised": type(e).__name__, "ancestry": [c.__name__ for c in type(e).__mro__], "message": str(e)}
    return {"raised": None}


def main():
    parser = driver_parser(__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("chat", "stream", "responses", "error"):
        p = sub.add_parser(name)
        p.add_argument("--max-tokens", type=int, default=16)
        p.add_argument("--prompt-chars", type=int, help="a prompt of this many characters instead")
        if name == "stream":
            p.add_argument("--include-usage", action="store_true")
        if name == "responses":
            p.add_argument("--stream", action="store_true")
        if name == "error":
            p.add_argument("--call", choices=("chat", "files"), default="chat")
    args = parser.parse_args()

    recorder = Recorder()
    client = sdk_client(args.base_url, recorder, args.max_retries, args.api_key or "sk-slotgate-tests")
    if args.on_cue:
        # The SDK imports its resources on first use: before the cue, not after.
        client.chat.completions, client.files
        print("ready", flush=True)
        sys.stdin.readline()
    try:
        result = {"chat": chat, "stream": stream, "responses": responses, "error": error}[args.command](client, args)
    finally:
        client.close()
    result["versions"] = versions()
    result["attempts"] = recorder.attempts
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
