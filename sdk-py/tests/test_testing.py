import math
import unittest

# The SDK first: outside the component it puts the bindings generated from the WIT on the path.
import slotgate_policy as sdk
from slotgate_policy import testing
from slotgate_policy.testing import WALL_START_MS, FakeHost, HostTrap

from componentize_py_types import Err
from wit_world.imports import clocks, log, state

DAY_MS = 86_400_000


class Wiring(unittest.TestCase):
    def test_install_replaces_the_generated_functions_and_uninstall_restores_them(self):
        with FakeHost() as host:
            self.assertEqual(clocks.wall_ms(), WALL_START_MS)
            log.log(log.Level.INFO, "hello")
            self.assertEqual(host.take_logs(), [(log.Level.INFO, "hello")])
            self.assertEqual(state.bucket_take("k", 1.0, 0.0, 1.0), 0.0)
        with self.assertRaises(NotImplementedError):
            state.bucket_take("k", 1.0, 0.0, 1.0)

    def test_inputs_take_their_time_from_the_installed_host(self):
        self.assertEqual(testing.evaluation().now_unix_ms, WALL_START_MS)
        with FakeHost() as host:
            host.advance_ms(1500)
            self.assertEqual(testing.evaluation().now_unix_ms, WALL_START_MS + 1500)
            self.assertEqual(testing.completion().evaluated_unix_ms, WALL_START_MS + 1500)
        self.assertEqual(testing.evaluation(now_unix_ms=5).now_unix_ms, 5)

    def test_inputs_default_like_the_host_and_take_overrides(self):
        e = testing.evaluation(path="/v1/completions", queue={"depth": 3}, earlier={"policies": 1})
        self.assertEqual((e.request.method, e.request.path), ("POST", "/v1/completions"))
        self.assertEqual((e.request.queue.depth, e.request.queue.capacity), (3, 8))
        self.assertEqual(e.earlier.policies, 1)
        c = testing.completion(completion_tokens=40, status=499, outcome="client_gone")
        self.assertEqual((c.completion_tokens, c.status, c.chain_allowed), (40, 499, True))
        self.assertFalse(c.decision.strip_id_slot)
        self.assertEqual(testing.completion(decision=sdk.allow(cost=9)).decision.cost, 9)
        with self.assertRaises(TypeError):
            testing.completion(decision=sdk.forbidden("no"))


class State(unittest.TestCase):
    def setUp(self):
        self.host = FakeHost().install()
        self.addCleanup(self.host.uninstall)

    def test_buckets_start_full_refill_and_say_how_long_to_wait(self):
        self.assertEqual(state.bucket_level("b", 10.0, 1.0), 10.0)
        self.assertEqual(state.bucket_take("b", 10.0, 1.0, 8.0), 0.0)
        self.assertEqual(state.bucket_take("b", 10.0, 1.0, 4.0), 2.0)
        self.assertEqual(state.bucket_level("b", 10.0, 1.0), 2.0)
        self.host.advance_ms(2000)
        self.assertEqual(state.bucket_take("b", 10.0, 1.0, 4.0), 0.0)
        self.assertEqual(state.bucket_take("b", 10.0, 1.0, 11.0), math.inf)
        self.assertEqual(state.bucket_take("n", 1.0, 0.0, 1.0), 0.0)
        self.assertEqual(state.bucket_take("n", 1.0, 0.0, 1.0), math.inf)

    def test_refunds_stop_at_capacity_and_may_charge(self):
        state.bucket_take("b", 10.0, 0.0, 6.0)
        self.assertEqual(state.bucket_refund("b", 10.0, 0.0, 2.0), 6.0)
        self.assertEqual(state.bucket_refund("b", 10.0, 0.0, 100.0), 10.0)
        self.assertEqual(state.bucket_refund("b", 10.0, 0.0, -15.0), -5.0)

    def test_windows_forget_what_is_older_than_the_window(self):
        self.assertEqual(state.window_add("w", 1000, 2), 2)
        self.host.advance_ms(600)
        self.assertEqual(state.window_add("w", 1000, 3), 5)
        self.host.advance_ms(400)
        self.assertEqual(state.window_add("w", 1000, 0), 3)
        self.host.advance_ms(600)
        self.assertEqual(state.window_add("w", 1000, 0), 0)

    def test_a_quota_is_spent_until_its_window_ends(self):
        self.host.set_wall_ms(ms_at_day(10) + 3_600_000)  # 01:00 UTC
        self.assertEqual(state.quota_take("t", "day", 100.0, 60.0), 0.0)
        self.assertEqual(state.quota_level("t", "day", 100.0), 40.0)
        # Refused: the seconds until midnight.
        self.assertEqual(state.quota_take("t", "day", 100.0, 60.0), 23 * 3600.0)
        self.assertEqual(state.quota_take("t", "day", 100.0, 101.0), math.inf)
        self.assertEqual(state.quota_reset_ms("day"), ms_at_day(11))
        self.host.advance_ms(23 * 3_600_000)
        self.assertEqual(state.quota_level("t", "day", 100.0), 100.0)
        self.assertEqual(state.quota_take("t", "day", 100.0, 60.0), 0.0)

    def test_a_refund_goes_to_the_window_it_was_taken_from_while_it_lasts(self):
        start = ms_at_day(10)
        self.host.set_wall_ms(start)
        state.quota_take("t", "day", 100.0, 70.0)
        self.assertEqual(state.quota_refund("t", "day", 100.0, 20.0, start), 50.0)
        self.host.advance_ms(DAY_MS)
        # The window has ended: it keeps what it used, and today's is untouched.
        self.assertEqual(state.quota_refund("t", "day", 100.0, 20.0, start), 50.0)
        self.assertEqual(state.quota_level("t", "day", 100.0), 100.0)
        self.assertEqual(state.quota_refund("t", "day", 100.0, 5.0, 0), 100.0)

    def test_an_operator_limit_wins_and_keeps_what_was_used(self):
        state.quota_take("t", "week", 100.0, 30.0)
        self.host.set_quota_limit("t", "week", 50.0)
        self.assertEqual(state.quota_limit("t", "week", 100.0), 50.0)
        self.assertEqual(state.quota_level("t", "week", 100.0), 20.0)
        self.host.set_quota_limit("t", "week", None)
        self.assertEqual(state.quota_limit("t", "week", 100.0), 100.0)

    def test_bad_periods_are_errors_and_bad_names_trap(self):
        for call in (
            lambda: state.quota_take("t", "fortnight", 1.0, 1.0),
            lambda: state.quota_level("t", "day@", 1.0),
            lambda: state.quota_reset_ms("minute"),
        ):
            with self.assertRaises(Err):
                call()
        with self.assertRaises(HostTrap):
            state.bucket_take("k" * 4097, 1.0, 0.0, 1.0)
        with self.assertRaises(HostTrap):
            state.event("Bad-Name")
        state.event("over_budget")
        self.assertEqual(self.host.take_events(), ["over_budget"])


def ms_at_day(n):
    """Midnight UTC of the n-th day after the fake's start day."""
    return (WALL_START_MS // DAY_MS + n) * DAY_MS


if __name__ == "__main__":
    unittest.main()
