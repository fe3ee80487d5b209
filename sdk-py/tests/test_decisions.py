import unittest

# The SDK first: outside the component it puts the bindings generated from the WIT on the path.
import slotgate_policy as sdk
from wit_world.imports import types


class Decisions(unittest.TestCase):
    def test_allow_changes_nothing_unless_told(self):
        d = sdk.allow()
        self.assertIsInstance(d, types.Decision_Allow)
        self.assertTrue(sdk.is_allowed(d))
        a = d.value
        self.assertEqual((a.tenant, a.cost, a.cap_max_tokens), (None, None, None))
        self.assertEqual((a.disable_prompt_cache, a.strip_id_slot, a.response_headers), (False, False, []))
        self.assertEqual(a.rate_limits, types.RateLimits(requests=None, tokens=None))
        a = sdk.allow(tenant="team-a", cost=120, strip_id_slot=True).value
        self.assertEqual((a.tenant, a.cost, a.strip_id_slot), ("team-a", 120, True))

    def test_an_unknown_field_is_refused(self):
        with self.assertRaisesRegex(TypeError, "Allow has no field cap_tokens"):
            sdk.allow(cap_tokens=5)

    def test_denials_carry_status_reason_and_retry(self):
        d = sdk.forbidden("no")
        self.assertFalse(sdk.is_allowed(d))
        self.assertEqual(
            d.value,
            types.Deny(
                status=403, reason=None, message="no", retry_after_seconds=None,
                should_retry=None, rate_limits=types.RateLimits(None, None),
            ),
        )
        d = sdk.too_many_requests("later", 7).value
        self.assertEqual((d.status, d.retry_after_seconds, d.reason, d.should_retry), (429, 7, None, None))
        d = sdk.quota_exceeded("spent", 3600).value
        self.assertEqual(
            (d.status, d.reason, d.retry_after_seconds, d.should_retry), (429, "quota_exceeded", 3600, False)
        )
        d = sdk.deny(429, "x", reason="busy").value
        self.assertEqual((d.status, d.reason), (429, "busy"))

    def test_settings_verdict_asks_for_nothing_by_default(self):
        self.assertFalse(sdk.settings_ok().needs_prompt_tokens)
        self.assertTrue(sdk.settings_ok(needs_prompt_tokens=True).needs_prompt_tokens)

    def test_settings_load_null_as_empty(self):
        self.assertEqual(sdk.load_settings("null"), {})
        self.assertEqual(sdk.load_settings('{"a": 1}'), {"a": 1})
        for bad in ("[1]", "3", "{", ""):
            with self.assertRaises(ValueError, msg=bad):
                sdk.load_settings(bad)


if __name__ == "__main__":
    unittest.main()
