"""Unit tests of {{name}}, run natively against a fake host: `python3 -m unittest` (or pytest),
after `./build.sh bindings` (or a build) generated bindings/."""

import unittest

# The SDK first: outside the component it puts bindings/ on the path, which `app` needs.
from slotgate_policy import is_allowed, testing

from componentize_py_types import Err

import app


class Policy(unittest.TestCase):
    def setUp(self):
        self.host = testing.FakeHost().install()
        self.addCleanup(self.host.uninstall)
        self.policy = app.WitWorld()

    def test_every_request_is_allowed_unchanged(self):
        d = self.policy.evaluate("null", testing.evaluation(path="/v1/completions", max_tokens=100))
        self.assertTrue(is_allowed(d))
        self.assertIsNone(d.value.cap_max_tokens)

    def test_settings_must_be_a_json_object(self):
        self.assertFalse(self.policy.validate_settings("null").needs_prompt_tokens)
        self.assertFalse(self.policy.validate_settings("{}").needs_prompt_tokens)
        with self.assertRaises(Err):
            self.policy.validate_settings("[1, 2]")


if __name__ == "__main__":
    unittest.main()
