import unittest

import slotgate_policy as sdk
from slotgate_policy import testing


class Identity(unittest.TestCase):
    def test_the_identity_is_the_one_the_host_named(self):
        # The host names the caller; the request's key and peer are not looked at again.
        r = testing.request(peer={"uid": 1000, "gid": 1000}, api_key="sha256:ab")
        self.assertEqual(sdk.identity(r), "anonymous")
        for caller in ("uid:1000", "sha256:ab", "alice"):
            r = testing.request(peer={"uid": 1000}, api_key="sha256:ab", caller=caller)
            self.assertEqual(sdk.identity(r), caller)
            self.assertEqual(sdk.tenant_key(r), caller)

    def test_tenant_key_prefers_a_non_empty_tenant_header(self):
        r = testing.request(caller="uid:7", headers={"x-tenant": "team-a"})
        self.assertEqual(sdk.tenant_key(r, "x-tenant"), "header:team-a")
        self.assertEqual(sdk.tenant_key(r), "uid:7")
        self.assertEqual(sdk.tenant_key(r, "openai-project"), "uid:7")
        r = testing.request(headers={"x-tenant": ""})
        self.assertEqual(sdk.tenant_key(r, "x-tenant"), "anonymous")

    def test_tenant_headers_are_checked(self):
        sdk.check_tenant_header("openai-organization")
        with self.assertRaisesRegex(ValueError, "not a header policies see"):
            sdk.check_tenant_header("authorization")

    def test_prompt_tokens_best_prefers_the_count(self):
        self.assertEqual(sdk.prompt_tokens_best(testing.request(prompt_tokens_estimate=9)), 9)
        self.assertEqual(sdk.prompt_tokens_best(testing.request(prompt_tokens_estimate=9, prompt_tokens=0)), 0)

    def test_hashed_keys_are_recognised(self):
        good = "sha256:" + "0a" * 32
        self.assertTrue(sdk.is_hashed_key(good))
        self.assertFalse(sdk.is_hashed_key("sk-secret"))
        self.assertFalse(sdk.is_hashed_key(good.upper()))
        self.assertFalse(sdk.is_hashed_key(good[:-1]))
        self.assertFalse(sdk.is_hashed_key(good + "\n"))


if __name__ == "__main__":
    unittest.main()
