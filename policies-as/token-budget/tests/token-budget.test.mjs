// The AssemblyScript token-budget, built to build/token-budget.wasm, against the runner's emulated
// host: the Rust original's unit tests, ported case for case, and its fixtures, run as they are.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";

import { loadPolicy } from "@slotgate/sdk-as/runner";

const MODULE = new URL("../build/token-budget.wasm", import.meta.url);
const RUST = new URL("../../../policies/token-budget/", import.meta.url);

const SETTINGS = { capacity: 1000, refill_per_second: 100 };
// Unix-socket peers, named as the host names them (`caller`).
const ALICE = { peer: { uid: 1000, gid: 1000 }, caller: "uid:1000" };
const BOB = { peer: { uid: 1001, gid: 1001 }, caller: "uid:1001" };

const req = (tenant, prompt, maxTokens) => ({
  request: { ...tenant, prompt_tokens_estimate: prompt, max_tokens: maxTokens },
  settings: SETTINGS,
});

const done = (tenant, prompt, maxTokens, [promptUsed, completionUsed]) => ({
  ...req(tenant, prompt, maxTokens),
  prompt_tokens: promptUsed,
  completion_tokens: completionUsed,
  upstream_ms: 300,
});

for (const snapshot of [true, false]) {
  describe(`token-budget (${snapshot ? "from a snapshot" : "settings in every input"})`, async () => {
    const p = await loadPolicy(MODULE, { snapshot });

    it("charges the estimate and refuses with Retry-After when dry", () => {
      p.reset();
      assert.deepEqual(p.run(req(ALICE, 100, 500)), { verdict: "allow", cost: 600 });
      const d = p.run(req(ALICE, 100, 500));
      // 400 left, 600 needed, 100 per second.
      assert.deepEqual(d, { verdict: "deny", status: 429, message: "token budget exhausted", retry_after_seconds: 2 });
      assert.equal(p.run(req(BOB, 100, 500)).verdict, "allow", "buckets are per tenant");
      p.advanceMs(2000);
      assert.equal(p.run(req(ALICE, 100, 500)).verdict, "allow");
    });

    it("the API key beats the uid and no identity shares one bucket", () => {
      p.reset();
      const key = { ...ALICE, api_key: "sha256:" + "ab".repeat(32), caller: "sha256:" + "ab".repeat(32) };
      assert.equal(p.run(req(key, 0, 1000)).verdict, "allow");
      assert.equal(p.run(req(ALICE, 0, 1000)).verdict, "allow", "same uid without the key: another bucket");
      assert.equal(p.run(req({}, 0, 1000)).verdict, "allow");
      assert.equal(p.run(req({}, 0, 1)).verdict, "deny");
    });

    it("a tenant header keys the budget when present and can have its own", () => {
      p.reset();
      const settings = {
        capacity: 1000, refill_per_second: 0, tenant_header: "x-tenant",
        tenants: { "header:big": { capacity: 3000, refill_per_second: 0 } },
      };
      const key = "sha256:" + "cd".repeat(32);
      const from = (team, maxTokens) => ({
        request: { api_key: key, caller: key, headers: { "x-tenant": team }, max_tokens: maxTokens },
        settings,
      });
      assert.equal(p.run(from("team-a", 1000)).verdict, "allow");
      assert.equal(p.run(from("team-a", 1)).verdict, "deny", "team-a is dry");
      assert.equal(p.run(from("team-b", 1000)).verdict, "allow");
      assert.equal(p.run(from("big", 1000)).verdict, "allow");
      assert.equal(p.run(from("big", 1000)).verdict, "allow");
      const keyed = { request: { api_key: key, caller: key, max_tokens: 1000 }, settings };
      assert.equal(p.run(keyed).verdict, "allow");
      assert.equal(p.run(keyed).verdict, "deny");
    });

    it("oversized requests are forbidden and tenants can have their own budget", () => {
      p.reset();
      const d = p.run(req(ALICE, 1, 1000));
      assert.equal(d.status, 403);
      assert.equal(d.message, "this request may use 1001 tokens, more than the budget of 1000 holds: lower max_tokens");
      const big = {
        request: { ...ALICE, max_tokens: 5000 },
        settings: { capacity: 1000, refill_per_second: 1, tenants: { "uid:1000": { capacity: 8000, refill_per_second: 1 } } },
      };
      assert.equal(p.run(big).cost, 5000);
    });

    it("completion refunds what was not used and charges what was underestimated", () => {
      p.reset();
      assert.equal(p.run(req(ALICE, 100, 800)).verdict, "allow");
      // 900 charged, 150 used: 750 back, so 850 are there now.
      p.complete(done(ALICE, 100, 800, [100, 50]));
      assert.equal(p.run(req(ALICE, 50, 800)).verdict, "allow");
      assert.equal(p.run(req(ALICE, 0, 1)).status, 429);

      p.reset();
      assert.equal(p.run(req(BOB, 100, 100)).verdict, "allow");
      // 200 charged, 900 used: 700 more, leaving 100.
      p.complete(done(BOB, 100, 100, [100, 800]));
      assert.equal(p.run(req(BOB, 0, 100)).verdict, "allow");
      assert.equal(p.run(req(BOB, 0, 100)).retry_after_seconds, 1);
      assert.deepEqual(
        p.takeLogs().map((l) => l.level + " " + l.message),
        ["debug uid:1001: charged 200, settled by -700.0, level 100.0"],
        "each settlement is logged at debug",
      );
    });

    it("requests that never reached the upstream are refunded and denials are not", () => {
      p.reset();
      assert.equal(p.run(req(ALICE, 100, 900)).verdict, "allow");
      p.complete({ ...req(ALICE, 100, 900), status: 429, outcome: "queue_full" });
      assert.equal(p.run(req(ALICE, 100, 900)).verdict, "allow");
      p.complete({ ...req(ALICE, 100, 900), decision: { verdict: "deny", status: 429 }, status: 429, outcome: "denied" });
      assert.equal(p.run(req(ALICE, 0, 1)).verdict, "deny");
    });

    it("a fixed quota has no Retry-After", () => {
      p.reset();
      const quota = { request: { max_tokens: 10 }, settings: { capacity: 10, refill_per_second: 0 } };
      assert.equal(p.run(quota).verdict, "allow");
      const d = p.run(quota);
      assert.equal(d.status, 429);
      assert.equal(d.retry_after_seconds, undefined);
    });

    it("a request without max_tokens is charged the default", () => {
      p.reset();
      const s = { capacity: 5000, refill_per_second: 1, default_max_tokens: 700 };
      assert.equal(p.run({ request: { prompt_tokens_estimate: 10 }, settings: s }).cost, 710);
      const exact = { request: { prompt_tokens_estimate: 10, prompt_tokens: 12 }, settings: s };
      assert.equal(p.run(exact).cost, 712, "the exact count wins over the estimate");
      assert.equal(p.run({ request: {}, settings: { capacity: 5000, refill_per_second: 1 } }).cost, 1024);
    });

    it("settings are validated", () => {
      const example = JSON.parse(readFileSync(new URL("../settings.example.json", import.meta.url), "utf8"));
      assert.deepEqual(example, JSON.parse(readFileSync(new URL("settings.example.json", RUST), "utf8")), "the Rust original's");
      assert.deepEqual(p.validate(example), { valid: true, keeps_settings: true });
      for (const [bad, why] of [
        [null, "settings are required: missing field `capacity`"],
        [{ capacity: 0, refill_per_second: 1 }, "the default budget: capacity must be positive"],
        [{ capacity: 10, refill_per_second: -1 }, "the default budget: refill_per_second must be a number >= 0 (0: a fixed quota)"],
        [{ capacity: 10 }, "invalid settings: missing field `refill_per_second`"],
        [{ capacity: 10.5, refill_per_second: 1 }, "invalid settings: `capacity`: expected a non-negative integer"],
        [
          { capacity: 10, refill_per_second: 1, tenants: { "sk-raw-key": { capacity: 1, refill_per_second: 1 } } },
          "tenant `sk-raw-key` is not a tenant's name (as `slotgate key create --tenant` gives it; never a raw key), `sha256:<64 hex>` (`slotgate hash-key KEY` prints it), `uid:<n>`, `anonymous` or, with tenant_header, `header:<value>`",
        ],
        [
          { capacity: 10, refill_per_second: 1, tenants: { "uid:7": { capacity: 0, refill_per_second: 1 } } },
          "tenant `uid:7`: capacity must be positive",
        ],
        [
          { capacity: 10, refill_per_second: 1, tenants: { "uid:4294967296": { capacity: 1, refill_per_second: 1 } } },
          "tenant `uid:4294967296` is not a tenant's name (as `slotgate key create --tenant` gives it; never a raw key), `sha256:<64 hex>` (`slotgate hash-key KEY` prints it), `uid:<n>`, `anonymous` or, with tenant_header, `header:<value>`",
        ],
        [
          { capacity: 10, refill_per_second: 1, tenants: { anonymous: { capacity: 1, refill_per_second: 1, burst: 2 } } },
          "invalid settings: unknown field `burst`",
        ],
        [{ capacity: 10, refill_per_second: 1, burst: 3 }, "invalid settings: unknown field `burst`"],
        [
          { capacity: 10, refill_per_second: 1, tenant_header: "authorization" },
          "tenant_header `authorization` is not a header policies see; use one of x-tenant, openai-organization, openai-project",
        ],
        [
          { capacity: 10, refill_per_second: 1, tenants: { "header:team-a": { capacity: 1, refill_per_second: 1 } } },
          "tenant `header:team-a` is not a tenant's name (as `slotgate key create --tenant` gives it; never a raw key), `sha256:<64 hex>` (`slotgate hash-key KEY` prints it), `uid:<n>`, `anonymous` or, with tenant_header, `header:<value>`",
        ],
      ]) {
        assert.deepEqual(p.validate(bad), { valid: false, message: why }, JSON.stringify(bad));
      }
    });

    it("passes the Rust original's fixtures", () => {
      assert.equal(p.runFixtures(new URL("fixtures/", RUST)), 2);
    });
  });
}
