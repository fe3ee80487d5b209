"""Unit tests of the request guard, run natively: `python3 -m unittest` in this folder."""

import json
import sys
import unittest
from pathlib import Path

# The SDK is not an installed package: the build gives it to componentize-py with `-p sdk-py`, the
# tests take it from the same place. Imported first, it puts the WIT bindings on the path.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "sdk-py"))

from slotgate_policy import allow, is_allowed, testing  # noqa: E402

from componentize_py_types import Err  # noqa: E402

import app  # noqa: E402

SETTINGS = json.dumps(
    {
        "max_tokens": 512,
        "max_prompt_chars": 1000,
        "max_prompt_tokens": 200,
        "allowed_paths": ["/v1/chat/completions", "/v1/completions", "/v1/embeddings*"],
        "denied_paths": ["/v1/embeddings/batch"],
        "allowed_models": ["qwen2.5-7b", "llama-3.1-*"],
        "cache_isolation": True,
    }
)


def evaluate(settings=SETTINGS, **request):
    return app.WitWorld().evaluate(settings, testing.evaluation(**request))


def validate(settings):
    return app.WitWorld().validate_settings(settings if isinstance(settings, str) else json.dumps(settings))


class RequestGuard(unittest.TestCase):
    def setUp(self):
        # The guard keeps no state; the fake is there so a stray host call would work, not raise.
        self.host = testing.FakeHost().install()
        self.addCleanup(self.host.uninstall)

    def denial(self, **request):
        d = evaluate(**request)
        self.assertFalse(is_allowed(d), f"{request}: {d}")
        self.assertEqual((d.value.status, d.value.reason), (403, None))
        return d.value.message

    def test_a_request_within_limits_is_capped_and_isolated(self):
        d = evaluate(model="qwen2.5-7b", max_tokens=100, prompt_chars=900)
        self.assertTrue(is_allowed(d))
        a = d.value
        self.assertEqual((a.cap_max_tokens, a.disable_prompt_cache, a.strip_id_slot), (512, True, True))
        self.assertEqual((a.tenant, a.cost, a.priority, a.response_headers), (None, None, None, []))
        d = evaluate(max_tokens=100000)
        self.assertEqual((is_allowed(d), d.value.cap_max_tokens), (True, 512))

    def test_paths_are_allow_listed_and_deny_listed(self):
        self.assertTrue(is_allowed(evaluate(path="/v1/completions?x=1")))
        self.assertTrue(is_allowed(evaluate(path="/v1/embeddings")))
        self.assertEqual(self.denial(path="/v1/embeddings/batch"), "/v1/embeddings/batch is not served here")
        self.denial(path="/slots/0", method="POST")
        self.denial(path="/v1/chat/completions/")

    def test_models_are_allow_listed_and_a_nameless_request_passes(self):
        self.assertTrue(is_allowed(evaluate(model="llama-3.1-8b")))
        self.assertEqual(self.denial(model="gpt-4"), "model `gpt-4` is not served here")
        self.assertTrue(is_allowed(evaluate(stream=True)))

    def test_large_prompts_are_refused(self):
        self.assertIn("1001 characters", self.denial(prompt_chars=1001))
        self.assertIn("about 201 tokens", self.denial(prompt_tokens_estimate=201))
        self.assertEqual(
            self.denial(prompt_tokens_estimate=10, prompt_tokens=201),
            "the prompt has 201 tokens; the limit is 200",
        )
        # The exact count wins over a larger estimate.
        self.assertTrue(is_allowed(evaluate(prompt_tokens_estimate=900, prompt_tokens=150)))

    def test_over_max_tokens_can_deny_instead_of_capping(self):
        settings = json.dumps({"max_tokens": 512, "over_max_tokens": "deny"})
        self.assertEqual(
            self.denial(settings=settings, max_tokens=513), "max_tokens 513 is over the limit of 512"
        )
        d = evaluate(settings, max_tokens=512)
        self.assertEqual((is_allowed(d), d.value.cap_max_tokens), (True, 512))
        self.assertFalse(d.value.disable_prompt_cache)
        # A request naming no max_tokens is capped, not refused.
        self.assertTrue(is_allowed(evaluate(settings)))

    def test_no_settings_allow_everything_unchanged(self):
        d = evaluate("null", path="/anything", max_tokens=99999)
        self.assertEqual(d, allow())

    def test_settings_are_validated(self):
        example = (HERE / "settings.example.json").read_text()
        self.assertFalse(validate(example).needs_prompt_tokens)
        self.assertFalse(validate("null").needs_prompt_tokens)
        # A token limit asks for the exact count before the chain decides; without one, no count.
        self.assertTrue(validate({"max_prompt_tokens": 100}).needs_prompt_tokens)
        self.assertFalse(validate({"max_prompt_chars": 100}).needs_prompt_tokens)
        for bad, why in [
            ({"allowed_paths": ["v1/chat/completions"]}, "path pattern `v1/chat/completions` must start with `/`"),
            ({"denied_paths": ["*"]}, "must start with `/`"),
            ({"allowed_models": [""]}, "model pattern `` is empty"),
            ({"max_tokens": 0}, "max_tokens must be positive"),
            ({"max_tokens": -1}, "non-negative integer"),
            ({"max_tokens": True}, "non-negative integer"),
            ({"max_tokens": "5"}, "non-negative integer"),
            ({"over_max_tokens": "truncate"}, "unknown variant `truncate`"),
            ({"max_token": 5}, "unknown field `max_token`"),
            ({"allowed_models": "qwen"}, "list of strings"),
            ({"cache_isolation": 1}, "true or false"),
            ([], "must be a JSON object"),
        ]:
            with self.assertRaises(Err, msg=bad) as caught:
                validate(bad)
            self.assertIn(why, caught.exception.value)

    def test_the_example_settings(self):
        """The Rust example's fixture (policies/request-guard/fixtures/example-settings.json)."""
        settings = json.dumps(
            {
                **json.loads((HERE / "settings.example.json").read_text()),
                "max_prompt_tokens": 32000,
            }
        )
        d = evaluate(settings, model="qwen2.5-7b-instruct-q4_k_m", max_tokens=8000, prompt_chars=5000)
        self.assertTrue(is_allowed(d))
        self.assertEqual(
            (d.value.cap_max_tokens, d.value.disable_prompt_cache, d.value.strip_id_slot), (2048, True, True)
        )
        self.assertEqual(self.denial(settings=settings, path="/v1/embeddings"), "/v1/embeddings is not served here")
        self.denial(settings=settings, path="/slots/0")
        self.assertEqual(
            self.denial(settings=settings, path="/completion", model="gpt-4o"), "model `gpt-4o` is not served here"
        )
        self.denial(settings=settings, prompt_chars=200001)

    def test_on_complete_does_nothing(self):
        app.WitWorld().on_complete(SETTINGS, testing.completion())
        self.assertEqual((self.host.take_logs(), self.host.take_events()), ([], []))


if __name__ == "__main__":
    unittest.main()
