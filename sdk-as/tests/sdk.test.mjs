// The SDK against its probe policy (probe.ts, built to build/probe.wasm by `npm test` or
// scripts/build-policies-as.sh), through the runner: wire types parsed and written, host functions,
// settings kept in a snapshot or parsed per call, errors, and the runner's own ABI checks.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import binaryen from "binaryen";

import { PolicyError, checkModule, loadPolicy, merged } from "../runner/index.mjs";
import { describe as describeModule, exportGlobals } from "../runner/wasm.mjs";

const PROBE = new URL("../build/probe.wasm", import.meta.url);

const ECHO = {
  request: {
    method: "POST",
    path: "/echo",
    model: "qwen\n\"é\" 🦀",
    stream: true,
    max_tokens: 256,
    prompt_chars: 1200,
    prompt_tokens_estimate: 300,
    prompt_tokens: 342,
    reserved_tokens: 598,
    priority_hint: -7,
    deadline_ms: 3000,
    peer: { uid: 1000, gid: 1001, pid: 4242 },
    api_key: "sha256:" + "ab".repeat(32),
    caller: "sha256:" + "ab".repeat(32),
    headers: { "user-agent": "openai-python/1.40", "x-b": "2" },
    queue: { depth: 3, capacity: 8, in_flight: 1, estimated_wait_seconds: 2.5 },
    some_future_field: { nested: [1, 2, { x: null }] },
  },
  settings: { label: "L", keys: ["a", "b\\c"], ratio: 0.25, max_chars: 99 },
  now_unix_ms: 1795950000000,
  another_future_field: true,
};

for (const snapshot of [true, false]) {
  describe(`the SDK, settings ${snapshot ? "kept in a snapshot" : "parsed on every call"}`, async () => {
    const probe = await loadPolicy(PROBE, { snapshot });

    it("parses every field of the request and writes every field of a decision", () => {
      const d = probe.run(ECHO);
      assert.deepEqual(d, {
        verdict: "allow",
        cost: 342,
        priority: -7,
        tenant: ECHO.request.api_key,
        weight: 2.5,
        deadline_ms: 1500,
        mutations: {
          cap_max_tokens: 77,
          strip_id_slot: true,
          response_headers: {
            method: "POST",
            model: ECHO.request.model,
            stream: "true",
            "max-tokens": "256",
            "prompt-chars": "1200",
            "prompt-best": "342",
            reserved: "598",
            hint: "-7",
            deadline: "3000",
            peer: "1000/1001/4242",
            "api-key": ECHO.request.api_key,
            identity: ECHO.request.api_key,
            headers: "user-agent=openai-python/1.40;x-b=2;",
            queue: "3/8/1/2.5",
            now: "1795950000000",
            settings: "L|a,b\\c|0.25|99",
          },
        },
      });
    });

    it("leaves out what is absent, and reads the identity the host named", () => {
      const minimal = probe.run({ request: { path: "/echo", model: null, peer: { uid: 7, gid: 8 }, caller: "uid:7" } });
      const h = minimal.mutations.response_headers;
      assert.equal(h.model, "<none>");
      assert.equal(h["max-tokens"], "<none>");
      assert.equal(h.reserved, "<none>");
      assert.equal(h.deadline, "<none>");
      assert.equal(minimal.deadline_ms, undefined);
      assert.equal(h.peer, "7/8/-");
      assert.equal(h.identity, "uid:7");
      assert.equal(minimal.priority, -3);
      assert.equal(minimal.cost, 0, "the estimate stands in for the exact count");
      assert.equal(h.settings, "||0.0|10", "null settings read as {}: the defaults");
      assert.equal(probe.run({ request: { path: "/echo" } }).tenant, "anonymous");
      // The host names the caller; the SDK does not look at the key, uid or tenant again.
      const unnamed = probe.run({
        request: { path: "/echo", api_key: "sha256:ab", tenant: "alice", peer: { uid: 7, gid: 8 } },
      });
      assert.equal(unnamed.mutations.response_headers.identity, "anonymous");
      const named = probe.run({
        request: { path: "/echo", api_key: "sha256:ab", tenant: "alice", caller: "alice" },
      });
      assert.equal(named.mutations.response_headers.identity, "alice");
    });

    it("reads strings of any length, ASCII or not", () => {
      for (const model of ["", "a".repeat(255), "b".repeat(256), "c".repeat(3000), "é", "x".repeat(300) + "é", "y".repeat(10) + "\n"]) {
        const d = probe.run({ request: { path: "/echo", model } });
        assert.equal(d.mutations.response_headers.model, model, `${model.length} characters`);
      }
    });

    it("escapes strings both ways", () => {
      const d = probe.run({ request: { path: "/unicode", model: "a\"b\\c\u0001\u2028🦀\ud800x" } });
      assert.equal(d.status, 403);
      // A lone surrogate is not UTF-8: it comes back as U+FFFD.
      assert.equal(d.message, "model a\"b\\c\u0001\u2028🦀\ufffdx");
    });

    it("denies on its settings and validates them", () => {
      assert.equal(probe.run({ request: { prompt_chars: 11 } }).status, 403);
      assert.equal(probe.run({ request: { prompt_chars: 11 }, settings: { max_chars: 20 } }).verdict, "allow");
      assert.deepEqual(probe.validate({ max_chars: 5 }), { valid: true, keeps_settings: true });
      assert.deepEqual(probe.validate(null), { valid: true, keeps_settings: true });
      assert.equal(probe.validate({ count: true }).needs_prompt_tokens, true);
      for (const [bad, why] of [
        [{ max_chars: 0 }, "max_chars must be positive"],
        [{ max_chars: -1 }, "invalid settings: `max_chars`: expected a non-negative integer"],
        [{ max_chars: 1.5 }, "invalid settings: `max_chars`: expected a non-negative integer"],
        [{ max_chars: 18446744073709551616 }, "invalid settings: `max_chars`: integer out of range"],
        [{ max_chars: "10" }, "invalid settings: `max_chars`: expected a non-negative integer"],
        [{ keys: "a" }, "invalid settings: `keys`: expected an array"],
        [{ keys: [1] }, "invalid settings: `keys`: expected a string"],
        [{ burst: 3 }, "invalid settings: unknown field `burst`"],
        [[], "invalid settings: expected an object"],
      ]) {
        assert.deepEqual(probe.validate(bad), { valid: false, message: why }, JSON.stringify(bad));
      }
      const refused = probe.tryRun({ settings: { burst: 3 } }).error;
      assert.equal(refused.kind, "settings");
      assert.match(refused.message, /unknown field `burst`/);
    });

    it("reaches the host's buckets, windows and clock", () => {
      probe.reset();
      const take = (n) => probe.run({ request: { path: "/bucket", prompt_tokens_estimate: n, peer: { uid: 1, gid: 1 } } });
      assert.equal(take(60).cost, 60);
      const dry = take(60);
      assert.deepEqual([dry.status, dry.message, dry.retry_after_seconds], [429, "dry", 2]);
      probe.advanceMs(2000);
      assert.equal(take(60).verdict, "allow");
      assert.equal(take(101).retry_after_seconds, undefined, "more than the capacity: never");
      assert.equal(probe.run({ request: { path: "/refund", prompt_tokens_estimate: 30, peer: { uid: 1, gid: 1 } } }).cost, 30);
      assert.equal(probe.run({ request: { path: "/window" } }).cost, 1);
      probe.advanceMs(500);
      const w = probe.run({ request: { path: "/window" } });
      assert.deepEqual([w.cost, w.priority], [2, 2500]);
      probe.advanceMs(600);
      assert.equal(probe.run({ request: { path: "/window" } }).cost, 2, "the first is over 1000 ms old");
    });

    it("logs through the host, cut at 4096 bytes on a character boundary", () => {
      probe.takeLogs();
      probe.run({ request: { path: "/log" } });
      const logs = probe.takeLogs();
      assert.equal(logs.length, 2);
      assert.equal(logs[0].level, "warn");
      assert.equal(Buffer.byteLength(logs[0].message), 4096);
      assert.equal(logs[0].message, "é".repeat(2048));
      assert.deepEqual(logs[1], { level: "info", message: "short" });
      probe.run({ request: { path: "/trace" } });
      assert.deepEqual(probe.takeLogs(), [{ level: "debug", message: "trace: tracing 1.5, 2.0" }]);
    });

    it("learns of completions", () => {
      probe.reset();
      probe.complete({
        settings: { label: "done" },
        decision: { verdict: "allow", cost: 12 },
        chain_decision: { verdict: "deny", status: 429 },
        status: 429,
        outcome: "policy_denied",
        prompt_tokens: 5,
        completion_tokens: 6,
        queue_wait_ms: 7,
        upstream_ms: 8,
      });
      assert.deepEqual(probe.takeLogs(), [
        {
          level: "info",
          message: "complete policy_denied status=429 tokens=5+6 waited=7 upstream=8 mine=allow/12 chain=deny label=done",
        },
      ]);
    });

    it("fails a call it cannot answer, with the reason in its log", () => {
      const aborted = probe.tryRun({ request: { path: "/abort" } }).error;
      assert.equal(aborted.kind, "trap");
      assert.match(aborted.logs[0].message, /^abort: boom at tests\/probe\.ts:\d+:\d+$/);
      const long = probe.tryRun({ request: { path: "/long-key" } }).error;
      assert.equal(long.kind, "trap");
      assert.match(long.logs[0].message, /host state key of 5000 bytes is over the 4096-byte limit/);
      const abi = probe.tryRun({ abi: 2 }).error;
      assert.equal(abi.kind, "invalid_output");
      assert.deepEqual(abi.logs, [{ level: "error", message: "slotgate_evaluate: input is ABI 2; this policy speaks 1" }]);
      const status = probe.tryRun({ request: { path: "/bad-status" } }).error;
      assert.equal(status.kind, "invalid_output");
      assert.match(status.message, /403 or 429/);
      assert.equal(probe.run({ request: { path: "/random" } }).cost, 1, "Math.random works without env imports");
    });
  });
}

describe("the SDK's JSON reader", async () => {
  const probe = await loadPolicy(PROBE, { snapshot: false });
  const raw = (text) => {
    const out = probe.call(probe.instantiate(), "slotgate_evaluate", text);
    return { out, logs: probe.takeLogs() };
  };

  it("refuses malformed input and reports why", () => {
    for (const [text, why] of [
      ["", "expected an object"],
      ["{", "unexpected end of the input in an object"],
      ['{"abi": 1,}', "expected a key in an object"],
      ['{"abi": 1} x', "trailing characters after the JSON value"],
      ['{"abi": 1, "request": {"path": "/x}}', "unterminated string"],
      ['{"abi": 1, "request": {"prompt_chars": 1.}}', "malformed number"],
      ['{"abi": 1, "request": {"stream": tru}}', "expected `true`"],
      ['{"abi": 1 "request": {}}', "expected `,` or `}` in an object"],
    ]) {
      const { out, logs } = raw(text);
      assert.equal(out, null, text);
      assert.equal(logs.length, 1, text);
      assert.ok(logs[0].message.startsWith("slotgate_evaluate: evaluate input: "), logs[0].message);
      assert.ok(logs[0].message.includes(why), `${text}: ${logs[0].message}`);
    }
  });

  it("reads whitespace, escapes and exponents, and skips what it does not know", () => {
    const text = ` { "abi" : 1 , "x": [ 1e3, -2.5E-1, "\\"}", {"a": [[]]}, true, false, null ] ,
      "request" : { "path" : "/echo", "model": "\\u0041\\ud83e\\udd80\\n\\t\\/",
      "queue": {"estimated_wait_seconds": 1e-3, "depth": 0} } , "now_unix_ms": 18446744073709551615 } `;
    const { out } = raw(text);
    const d = JSON.parse(out);
    assert.equal(d.mutations.response_headers.model, "A🦀\n\t/");
    assert.equal(d.mutations.response_headers.queue, "0/0/0/0.001");
    assert.equal(d.mutations.response_headers.now, "18446744073709551615");
  });
});

describe("the runner", () => {
  const wat = (text) => {
    const m = binaryen.parseText(text);
    const bytes = m.emitBinary();
    m.dispose();
    return bytes;
  };
  const minimal = (extra = "", version = 1) => `(module
    ${extra}
    (memory (export "memory") 1)
    (data (i32.const 16) "{\\"verdict\\":\\"allow\\"}")
    (func (export "slotgate_abi_version") (result i32) (i32.const ${version}))
    (func (export "slotgate_alloc") (param i32) (result i32) (i32.const 1024))
    (func (export "slotgate_evaluate") (param i32 i32) (result i64)
      (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 19))))`;

  it("runs a hand-written module", async () => {
    const p = await loadPolicy(wat(minimal()));
    assert.deepEqual(p.run({}), { verdict: "allow" });
  });

  it("refuses what slotgate refuses at load", async () => {
    const refused = async (bytes, why) => {
      await assert.rejects(loadPolicy(bytes), (e) => e instanceof PolicyError && e.kind === "abi" && e.message.includes(why));
    };
    await refused(wat(minimal('(import "env" "abort" (func (param i32 i32 i32 i32)))')), "imports `env::abort`");
    await refused(
      wat(minimal('(import "slotgate" "window_add" (func (param i32 i32 i32 i32) (result i32)))')),
      "imports `slotgate::window_add` as (i32, i32, i32, i32) -> (i32); slotgate provides (i32, i32, i64, i64) -> (i64)",
    );
    await refused(wat(minimal('(import "slotgate" "sleep" (func))')), "which slotgate does not provide");
    await refused(wat(minimal().replace('"slotgate_evaluate"', '"other"')), "missing required export `slotgate_evaluate`");
    await refused(
      wat(minimal('(func (export "slotgate_on_complete") (param i32) (result i32) (i32.const 0))')),
      "`slotgate_on_complete` must have the signature (i32, i32) -> (i64), not (i32) -> (i32)",
    );
    await refused(wat(minimal("", 2)), "module speaks ABI 2");
    assert.deepEqual(checkModule(wat(minimal())).imports, []);
  });

  it("exports every global for a snapshot, leaving the module as it was otherwise", async () => {
    const bytes = wat(`(module
      (import "slotgate" "now_ms" (func (result i64)))
      (global $a (mut i32) (i32.const 5)) (global $b i64 (i64.const 9))
      (memory (export "memory") 1)
      (func (export "get") (result i32) (global.get $a)))`);
    const out = exportGlobals(bytes);
    const d = describeModule(out);
    assert.deepEqual(
      d.exports.map((e) => e.name).sort(),
      ["__slotgate_runner_global_0", "__slotgate_runner_global_1", "get", "memory"],
    );
    const { instance } = await WebAssembly.instantiate(out, { slotgate: { now_ms: () => 0n } });
    instance.exports.__slotgate_runner_global_0.value = 42;
    assert.equal(instance.exports.get(), 42);
    assert.equal(instance.exports.__slotgate_runner_global_1.value, 9n);
  });

  it("merges partial inputs like the Rust SDK's testing module", () => {
    const m = merged({ a: { b: 1, c: [1] }, d: 1 }, { a: { c: [2], e: null }, d: { x: 1 } });
    assert.deepEqual(m, { a: { b: 1, c: [2], e: null }, d: { x: 1 } });
  });
});
