"""What the OpenAI SDK really sends: an httpx2 client whose event hooks log every HTTP attempt.

Shared by the drivers in this folder (run by tests/tests/e2e_openai_sdk.rs with $SLOTGATE_PYTHON,
the venv scripts/setup-python-clients.sh makes). openai 3.x is built on httpx2 (a fork of httpx)
and takes one of its clients as `http_client`; the SDK's own retries go through the same client, so
each attempt, retry or not, shows up here with the SDK's `x-stainless-retry-count`.
"""

import argparse
import sys
import time

SETUP = "scripts/setup-python-clients.sh"

try:
    import httpx2
    import openai
except ImportError as e:  # run with a Python that lacks the pinned clients
    sys.exit(
        f"{sys.argv[0]}: {e}: run it with the venv's Python: "
        f'eval "$(bash {SETUP})" && "$SLOTGATE_PYTHON" {sys.argv[0]} ...'
    )

# Every time is in milliseconds since this module was imported, on one monotonic clock.
T0 = time.monotonic()


def now_ms():
    return (time.monotonic() - T0) * 1000.0


class Recorder:
    """One entry per HTTP attempt: when it was sent, when its head came back, status, wait headers."""

    def __init__(self):
        self.attempts = []

    def on_request(self, request):
        self.attempts.append(
            {
                "sent_ms": now_ms(),
                "retry_count": int(request.headers.get("x-stainless-retry-count", "-1")),
                "path": request.url.path,
            }
        )

    def on_response(self, response):
        # Called once the head has arrived, before the SDK reads the body or decides to retry.
        attempt = self.attempts[-1]
        attempt["received_ms"] = now_ms()
        attempt["status"] = response.status_code
        attempt["retry_after_ms"] = _number(response.headers.get("retry-after-ms"))
        attempt["retry_after"] = _number(response.headers.get("retry-after"))
        if response.status_code >= 400:
            # An error body is small and read at once; the SDK reads it again from the buffer.
            response.read()
            try:
                attempt["error"] = response.json().get("error")
            except ValueError:
                attempt["error"] = response.text

    def http_client(self, timeout=120.0):
        return httpx2.Client(
            timeout=timeout,
            event_hooks={"request": [self.on_request], "response": [self.on_response]},
        )


def _number(value):
    return None if value is None else float(value)


def sdk_client(base_url, recorder, max_retries, api_key="sk-slotgate-tests"):
    """An `openai.OpenAI` client whose every attempt `recorder` sees."""
    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=max_retries,
        http_client=recorder.http_client(),
    )


def driver_parser(doc):
    """The options every driver here takes; each adds its subcommands."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--max-retries", type=int, default=2, help="the SDK's default is 2")
    parser.add_argument("--on-cue", action="store_true", help="print `ready`, call once stdin has a line")
    parser.add_argument("--model", default="tiny", help="the request's model (a router's model id)")
    parser.add_argument("--api-key", default=None, help="the key the SDK sends (else a dummy one)")
    return parser


def versions():
    found = {"openai": openai.__version__, "httpx2": httpx2.__version__}
    try:
        import anthropic

        found["anthropic"] = anthropic.__version__
    except ImportError:
        pass
    return found
