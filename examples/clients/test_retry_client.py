"""Unit tests of retry_client.py's waits, jitter and deadline (standard library only):

    python3 -m unittest discover -s examples/clients -p 'test_*.py'

tests/tests/polyglot/client_example.rs runs them, and the client itself against a real slotgate.
"""

import contextlib
import email.utils
import io
import json
import random
import unittest
from unittest import mock

import retry_client as rc


class ToldWait(unittest.TestCase):
    def test_retry_after_ms_comes_first_and_keeps_its_precision(self):
        self.assertEqual(rc.told_wait({"retry-after-ms": "1234", "retry-after": "2"}), 1.234)
        self.assertEqual(rc.told_wait({"retry-after-ms": "0.5"}), 0.0005)

    def test_whole_seconds_when_there_are_no_milliseconds(self):
        self.assertEqual(rc.told_wait({"retry-after": "3"}), 3.0)

    def test_an_http_date(self):
        now = 1_800_000_000.0
        date = email.utils.formatdate(now + 7, usegmt=True)
        self.assertAlmostEqual(rc.told_wait({"retry-after": date}, now=now), 7.0)
        past = email.utils.formatdate(now - 7, usegmt=True)
        self.assertEqual(rc.told_wait({"retry-after": past}, now=now), 0.0)

    def test_garbage_falls_through_to_the_next_header_or_none(self):
        self.assertEqual(rc.told_wait({"retry-after-ms": "soon", "retry-after": "2"}), 2.0)
        self.assertIsNone(rc.told_wait({"retry-after": "soon"}))
        self.assertIsNone(rc.told_wait({"retry-after-ms": "-5"}))
        self.assertIsNone(rc.told_wait({"retry-after-ms": "inf"}))
        self.assertIsNone(rc.told_wait({}))


class WaitFor(unittest.TestCase):
    def test_never_less_than_told_and_at_most_ten_percent_more(self):
        rng = random.Random(7)
        for told in (0.001, 0.25, 1.0, 37.5):
            waits = [rc.wait_for(told, attempt=1, rand=rng.random) for _ in range(2000)]
            self.assertGreaterEqual(min(waits), told)
            self.assertLessEqual(max(waits), told * 1.1)
            # Spread over the whole band, not a constant.
            self.assertLess(min(waits), told * 1.01)
            self.assertGreater(max(waits), told * 1.09)

    def test_the_bounds_of_the_jitter(self):
        self.assertEqual(rc.wait_for(2.0, 1, rand=lambda: 0.0), 2.0)
        self.assertAlmostEqual(rc.wait_for(2.0, 1, rand=lambda: 1.0), 2.2)

    def test_without_a_header_exponential_backoff_capped(self):
        flat = lambda: 0.0  # noqa: E731
        self.assertEqual([rc.wait_for(None, n, rand=flat) for n in range(1, 7)], [0.5, 1, 2, 4, 8, 8])


class FakeTime:
    """A clock that only sleeping moves."""

    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def refusal(ms, secs):
    body = json.dumps({"error": {"message": "the queue is full", "type": "rate_limit_error", "code": "queue_full"}})
    return 429, {"retry-after-ms": str(ms), "retry-after": str(secs)}, body.encode()


ANSWER = (200, {}, json.dumps({"choices": [{"message": {"content": "hello"}}]}).encode())


class Run(unittest.TestCase):
    def run_client(self, responses, *argv):
        clock = FakeTime()
        calls = []

        def post(url, unix_socket, body, timeout, api_key=None):
            calls.append(timeout)
            return responses.pop(0)

        out, err = io.StringIO(), io.StringIO()
        args = rc.argparse.Namespace(
            prompt="hi", url="http://x/v1/chat/completions", unix_socket=None, deadline=10.0,
            max_tokens=8, model="m", api_key=None, json=False,
        )
        for flag, value in zip(argv[::2], argv[1::2]):
            setattr(args, flag, value)
        with mock.patch.object(rc, "post", post), mock.patch.object(rc.random, "random", lambda: 0.5), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = rc.run(args, clock=clock.clock, sleep=clock.sleep)
        events = [json.loads(line) for line in err.getvalue().splitlines() if line.startswith("{")]
        return code, clock.sleeps, calls, out.getvalue(), err.getvalue(), events

    def test_waits_what_it_is_told_plus_jitter_then_answers(self):
        code, sleeps, calls, out, _, events = self.run_client([refusal(1500, 2), refusal(250, 1), ANSWER])
        self.assertEqual(code, rc.EXIT_ANSWER)
        self.assertEqual(out, "hello\n")
        self.assertEqual(sleeps, [1.5 * 1.05, 0.25 * 1.05])
        # Each request's own timeout is what is left of the deadline.
        for got, want in zip(calls, [10.0, 10.0 - 1.575, 10.0 - 1.575 - 0.2625], strict=True):
            self.assertAlmostEqual(got, want)
        self.assertEqual([e["event"] for e in events], ["attempt"] * 3 + ["answer"])
        self.assertEqual(events[0]["code"], "queue_full")
        self.assertEqual(events[0]["told_s"], 1.5)

    def test_gives_up_at_once_when_the_wait_would_pass_the_deadline(self):
        code, sleeps, calls, out, err, events = self.run_client([refusal(3000, 3)], "deadline", 2.0)
        self.assertEqual(code, rc.EXIT_DEADLINE)
        self.assertEqual(sleeps, [])
        self.assertEqual(len(calls), 1)
        self.assertEqual(out, "")
        self.assertEqual(events[-1]["event"], "give_up")
        self.assertIn("gave up after 1 attempts", err)
        self.assertIn("pass the 2.0 s deadline", err)

    def test_stops_once_the_deadline_is_spent_by_waits(self):
        code, sleeps, _, _, _, events = self.run_client([refusal(4000, 4)] * 5, "deadline", 10.0)
        self.assertEqual(code, rc.EXIT_DEADLINE)
        self.assertEqual(sleeps, [4.2, 4.2])
        self.assertEqual(sum(e["event"] == "attempt" for e in events), 3)

    def test_other_statuses_are_not_retried(self):
        bad = (400, {}, b'{"error":{"message":"no","type":"invalid_request_error","code":"invalid_json"}}')
        code, sleeps, calls, _, err, _ = self.run_client([bad])
        self.assertEqual(code, rc.EXIT_ERROR)
        self.assertEqual((sleeps, len(calls)), ([], 1))
        self.assertIn("HTTP 400", err)


if __name__ == "__main__":
    unittest.main()
