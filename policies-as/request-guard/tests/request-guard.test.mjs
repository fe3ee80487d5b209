// The AssemblyScript request-guard, built to build/request-guard.wasm, against the runner's
// emulated host: the Rust original's unit tests, ported case for case, and its fixtures.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";

import { loadPolicy } from "@slotgate/sdk-as/runner";

const MODULE = new URL("../build/request-guard.wasm", import.meta.url);
const RUST = new URL("../../../policies/request-guard/", import.meta.url);

const SETTINGS = {
  max_tokens: 512,
  max_prompt_chars: 1000,
  max_prompt_tokens: 200,
  allowed_paths: ["/v1/chat/completions", "/v1/completions", "/v1/embeddings*"],
  denied_paths: ["/v1/embeddings/batch"],
  allowed_models: ["qwen2.5-7b", "llama-3.1-*"],
  cache_isolation: true,
};

for (const snapshot of [true, false]) {
  describe(`request-guard (${snapshot ? "from a snapshot" : "settings in every input"})`, async () => {
    const p = await loadPolicy(MODULE, { snapshot });
    const evaluate = (request) => p.run({ request, settings: SETTINGS });
    const denial = (request) => {
      const d = evaluate(request);
      assert.equal(d.status, 403, `${JSON.stringify(request)}: ${JSON.stringify(d)}`);
      return d.message;
    };

    it("a request within limits is capped and isolated", () => {
      const d = evaluate({ model: "qwen2.5-7b", max_tokens: 100, prompt_chars: 900 });
      assert.deepEqual(d, {
        verdict: "allow",
        mutations: { cap_max_tokens: 512, disable_prompt_cache: true, strip_id_slot: true },
      });
      const big = evaluate({ max_tokens: 100000 });
      assert.deepEqual([big.verdict, big.mutations.cap_max_tokens], ["allow", 512]);
    });

    it("paths are allow-listed and deny-listed", () => {
      assert.equal(evaluate({ path: "/v1/completions?x=1" }).verdict, "allow");
      assert.equal(evaluate({ path: "/v1/embeddings" }).verdict, "allow");
      assert.equal(denial({ path: "/v1/embeddings/batch" }), "/v1/embeddings/batch is not served here");
      denial({ path: "/slots/0", method: "POST" });
      denial({ path: "/v1/chat/completions/" });
    });

    it("models are allow-listed and a nameless request passes", () => {
      assert.equal(evaluate({ model: "llama-3.1-8b" }).verdict, "allow");
      assert.equal(denial({ model: "gpt-4" }), "model `gpt-4` is not served here");
      assert.equal(evaluate({ stream: true }).verdict, "allow");
    });

    it("large prompts are refused", () => {
      assert.equal(denial({ prompt_chars: 1001 }), "the prompt has 1001 characters; the limit is 1000");
      assert.equal(denial({ prompt_tokens_estimate: 201 }), "the prompt has about 201 tokens; the limit is 200");
      assert.equal(
        denial({ prompt_tokens_estimate: 100, prompt_tokens: 201 }),
        "the prompt has 201 tokens; the limit is 200",
        "decided on the exact count when there is one",
      );
    });

    it("over_max_tokens can deny instead of capping", () => {
      const input = (n) => ({ request: { max_tokens: n }, settings: { max_tokens: 512, over_max_tokens: "deny" } });
      const d = p.run(input(513));
      assert.deepEqual(d, { verdict: "deny", status: 403, message: "max_tokens 513 is over the limit of 512" });
      const ok = p.run(input(512));
      assert.deepEqual(ok, { verdict: "allow", mutations: { cap_max_tokens: 512 } }, "no cache isolation");
    });

    it("no settings allow everything unchanged", () => {
      assert.deepEqual(p.run({ request: { path: "/anything", max_tokens: 99999 } }), { verdict: "allow" });
    });

    it("settings are validated", () => {
      const example = JSON.parse(readFileSync(new URL("../settings.example.json", import.meta.url), "utf8"));
      assert.deepEqual(example, JSON.parse(readFileSync(new URL("settings.example.json", RUST), "utf8")), "the Rust original's");
      assert.deepEqual(p.validate(example), { valid: true, keeps_settings: true });
      // A token limit asks for the exact count before the chain decides; without one, no count.
      assert.equal(p.validate({ max_prompt_tokens: 100 }).needs_prompt_tokens, true);
      assert.equal(p.validate({ max_prompt_chars: 100 }).needs_prompt_tokens, undefined);
      assert.deepEqual(p.validate({ max_tokens: null, max_prompt_tokens: null }), { valid: true, keeps_settings: true });
      for (const [bad, why] of [
        [{ allowed_paths: ["v1/chat/completions"] }, "path pattern `v1/chat/completions` must start with `/`"],
        [{ denied_paths: ["*"] }, "path pattern `*` must start with `/`"],
        [{ allowed_models: [""] }, "model pattern `` is empty"],
        [{ max_tokens: 0 }, "max_tokens must be positive"],
        [{ over_max_tokens: "truncate" }, "invalid settings: `over_max_tokens`: unknown variant `truncate`, expected `cap` or `deny`"],
        [{ max_token: 5 }, "invalid settings: unknown field `max_token`"],
        [{ allowed_paths: null }, "invalid settings: `allowed_paths`: expected an array"],
      ]) {
        assert.deepEqual(p.validate(bad), { valid: false, message: why }, JSON.stringify(bad));
      }
    });

    it("passes the Rust original's fixtures", () => {
      assert.equal(p.runFixtures(new URL("fixtures/", RUST)), 1);
    });
  });
}
