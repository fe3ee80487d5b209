// The native test runner: loads a compiled policy module in Node the way slotgate does (ABI v1
// exports and imports checked, type for type; a fresh instance for every call; the input written
// into memory from `slotgate_alloc`; the packed answer read back; settings validated once per
// value and, when the policy keeps them, every later call started from a snapshot of that
// instance) against an emulated host (host.mjs), and runs partial JSON inputs and fixture files
// like the Rust SDK's `testing` module, so AssemblyScript policies are unit-tested without slotgate.
//
//   import { loadPolicy } from "@slotgate/sdk-as/runner";
//   const policy = await loadPolicy(new URL("../build/my-policy.wasm", import.meta.url));
//   assert.equal(policy.run({ request: { prompt_chars: 11 }, settings: { max_chars: 10 } }).status, 403);
//
// Not emulated: fuel, the deadline, the memory limit (see README.md).

import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { EmulatedHost, HOST_FUNCTIONS, HostError } from "./host.mjs";
import { GLOBAL_EXPORT, describe, exportGlobals, signature } from "./wasm.mjs";

export { EmulatedHost, MAX_HOST_STRING } from "./host.mjs";

export const ABI_VERSION = 1;

/** Largest output slotgate accepts from a call (64 KiB). */
export const MAX_OUTPUT_BYTES = 64 << 10;

/** What `run` merges its input onto: a POST to `/v1/chat/completions` over TCP, no key, no settings. */
export const DEFAULT_INPUT = Object.freeze({
  abi: 1,
  request: {
    method: "POST",
    path: "/v1/chat/completions",
    stream: false,
    prompt_chars: 0,
    prompt_tokens_estimate: 0,
    headers: {},
    queue: { depth: 0, capacity: 8, in_flight: 0, estimated_wait_seconds: 0.0 },
  },
  settings: null,
  now_unix_ms: 1800000000000,
});

/** What `complete` merges its input onto: the request of `DEFAULT_INPUT`, allowed, answered 200. */
export const DEFAULT_COMPLETION = Object.freeze({
  abi: 1,
  request: DEFAULT_INPUT.request,
  decision: { verdict: "allow" },
  settings: null,
  status: 200,
  outcome: "ok",
  prompt_tokens: 0,
  completion_tokens: 0,
  queue_wait_ms: 0,
  upstream_ms: 0,
});

/**
 * A call that did not answer, as slotgate would count it: `kind` is `trap` (the guest trapped or
 * aborted), `abi` (it broke the calling convention), `invalid_output` (its answer is not what ABI v1
 * allows) or `settings` (its `slotgate_validate_settings` refused them). `logs` holds what the
 * policy logged during the call.
 */
export class PolicyError extends Error {
  constructor(kind, message, logs = []) {
    super(`${kind}: ${message}${logs.length ? `\n  policy log: ${logs.map((l) => `[${l.level}] ${l.message}`).join("\n  policy log: ")}` : ""}`);
    this.kind = kind;
    this.logs = logs;
  }
}

const REQUIRED = {
  slotgate_abi_version: "() -> (i32)",
  slotgate_alloc: "(i32) -> (i32)",
  slotgate_evaluate: "(i32, i32) -> (i64)",
};
const OPTIONAL = {
  slotgate_validate_settings: "(i32, i32) -> (i64)",
  slotgate_on_complete: "(i32, i32) -> (i64)",
};

/** Checks `bytes` against ABI v1 as slotgate does at load; throws a PolicyError (`abi`) if not. */
export function checkModule(bytes) {
  const { imports, exports } = describe(bytes);
  const refuse = (message) => {
    throw new PolicyError("abi", message);
  };
  if (!exports.some((e) => e.name === "memory" && e.kind === "memory")) refuse("the module must export its `memory`");
  for (const [name, want] of Object.entries({ ...REQUIRED, ...OPTIONAL })) {
    const e = exports.find((x) => x.name === name);
    if (!e) {
      if (name in REQUIRED) refuse(`missing required export \`${name}\``);
      continue;
    }
    if (e.kind !== "function") refuse(`\`${name}\` must be a function`);
    const got = signature(e.type);
    if (got !== want) refuse(`\`${name}\` must have the signature ${want}, not ${got}`);
  }
  for (const i of imports) {
    if (i.module !== "slotgate") {
      refuse(`imports \`${i.module}::${i.name}\`; policies may only import from \`slotgate\``);
    }
    const want = HOST_FUNCTIONS[i.name];
    if (!want || i.kind !== "function") refuse(`imports \`slotgate::${i.name}\`, which slotgate does not provide`);
    if (signature(i.type) !== signature(want)) {
      refuse(`imports \`slotgate::${i.name}\` as ${signature(i.type)}; slotgate provides ${signature(want)}`);
    }
  }
  return { exports: exports.map((e) => e.name), imports: imports.map((i) => i.name) };
}

/**
 * Loads a policy module (a path, file URL, or the bytes) and checks it against ABI v1.
 *
 * Options: `snapshot` (default true): serve a policy whose settings validation says
 * `keeps_settings` from a snapshot of that instance, its inputs without `settings`, as slotgate
 * does; false: give every call its settings, as slotgate does for a module it cannot snapshot.
 * `echo`: print the policy's log lines to stderr as they come.
 */
export async function loadPolicy(module, options = {}) {
  const bytes = module instanceof Uint8Array ? module : readFileSync(module instanceof URL ? fileURLToPath(module) : module);
  checkModule(bytes);
  const compiled = await WebAssembly.compile(bytes);
  const instrumented = await WebAssembly.compile(exportGlobals(bytes));
  const tester = new PolicyTester(compiled, instrumented, options);
  const version = tester.instantiate().exports.slotgate_abi_version();
  if (version !== ABI_VERSION) {
    throw new PolicyError("abi", `module speaks ABI ${version}; this runner speaks ${ABI_VERSION}`);
  }
  return tester;
}

export class PolicyTester {
  constructor(compiled, instrumented, options) {
    this.compiled = compiled;
    this.instrumented = instrumented;
    this.snapshots = options.snapshot ?? true;
    this.host = new EmulatedHost();
    this.host.echo = options.echo ?? false;
    const names = WebAssembly.Module.exports(compiled).map((e) => e.name);
    this.hasValidate = names.includes("slotgate_validate_settings");
    this.hasOnComplete = names.includes("slotgate_on_complete");
    /** Per settings (JSON text): how the policy was loaded with them. */
    this.loaded = new Map();
  }

  /** A fresh instance of the module (its start function run), as for every call in slotgate. */
  instantiate(module = this.compiled) {
    let instance = null;
    const memory = () => instance.exports.memory;
    try {
      instance = new WebAssembly.Instance(module, this.host.imports(memory));
    } catch (e) {
      const kind = e instanceof HostError ? "abi" : "trap";
      throw new PolicyError(kind, `instantiation: ${e.message}`, this.host.takeLogs());
    }
    return instance;
  }

  /**
   * Calls `exportName` with `input` (bytes or a string) in `instance`: the output as text, or null
   * for a 0 answer. Throws a PolicyError, with the call's log lines, when the call fails.
   */
  call(instance, exportName, input) {
    const bytes = typeof input === "string" ? new TextEncoder().encode(input) : input;
    const logsBefore = this.host.logs.length;
    // The logs of a failed call go with its error.
    const fail = (kind, message) => {
      throw new PolicyError(kind, message, this.host.logs.splice(logsBefore));
    };
    const { exports } = instance;
    let packed;
    try {
      const ptr = exports.slotgate_alloc(bytes.length);
      if (ptr === 0) fail("abi", "slotgate_alloc returned 0");
      const mem = new Uint8Array(exports.memory.buffer);
      if ((ptr >>> 0) + bytes.length > mem.length) fail("abi", "slotgate_alloc returned memory out of bounds");
      mem.set(bytes, ptr >>> 0);
      packed = BigInt.asUintN(64, exports[exportName](ptr, bytes.length));
    } catch (e) {
      if (e instanceof PolicyError) throw e;
      fail(e instanceof HostError ? "abi" : "trap", `${exportName}: ${e.message}`);
    }
    if (packed === 0n) return null;
    const ptr = Number(packed >> 32n);
    const len = Number(packed & 0xffffffffn);
    if (len > MAX_OUTPUT_BYTES) fail("invalid_output", `output of ${len} bytes is over the ${MAX_OUTPUT_BYTES}-byte limit`);
    const mem = new Uint8Array(exports.memory.buffer);
    if (ptr + len > mem.length) fail("invalid_output", `pointer ${ptr}+${len} is outside the guest's memory`);
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(mem.subarray(ptr, ptr + len));
    } catch {
      return fail("invalid_output", "output is not UTF-8");
    }
  }

  /** Runs `slotgate_validate_settings` on `settings` (a value) in a fresh instance: its answer. */
  validate(settings) {
    return this.validateIn(this.instantiate(), settings);
  }

  validateIn(instance, settings) {
    if (!this.hasValidate) return { valid: true };
    const before = this.host.logs.length;
    const out = this.call(instance, "slotgate_validate_settings", JSON.stringify(settings ?? null));
    if (out === null) throw new PolicyError("invalid_output", "validate_settings returned nothing", this.host.logs.splice(before));
    const answer = parseJson(out, "validate_settings output");
    if (typeof answer.valid !== "boolean") throw new PolicyError("invalid_output", `validate_settings output: ${out}`);
    return answer;
  }

  /**
   * The policy loaded with `settings`, as slotgate loads it: validated (a refusal throws a
   * PolicyError of kind `settings`), and snapshotted when it keeps them.
   */
  load(settings) {
    const key = JSON.stringify(settings ?? null);
    let loaded = this.loaded.get(key);
    if (loaded) return loaded;
    loaded = { settings: settings ?? null, snapshot: null, needsPromptTokens: false };
    if (this.hasValidate) {
      const instance = this.instantiate(this.instrumented);
      const answer = this.validateIn(instance, settings);
      if (!answer.valid) throw new PolicyError("settings", answer.message ?? "invalid settings");
      loaded.needsPromptTokens = answer.needs_prompt_tokens === true;
      if (answer.keeps_settings === true && this.snapshots) loaded.snapshot = takeSnapshot(instance);
    }
    this.loaded.set(key, loaded);
    return loaded;
  }

  /** A fresh instance for a call with `loaded` settings: from its snapshot when there is one. */
  instanceFor(loaded) {
    if (!loaded.snapshot) return this.instantiate();
    const instance = this.instantiate(this.instrumented);
    restoreSnapshot(instance, loaded.snapshot);
    return instance;
  }

  /** Evaluates a whole input object: the decision object. Throws a PolicyError when there is none. */
  evaluateInput(input) {
    const loaded = this.load(input.settings);
    const wire = { ...input };
    if (loaded.snapshot) delete wire.settings;
    const before = this.host.logs.length;
    const out = this.call(this.instanceFor(loaded), "slotgate_evaluate", JSON.stringify(wire));
    if (out === null) throw new PolicyError("invalid_output", "evaluate returned nothing", this.host.logs.splice(before));
    return checkDecision(parseJson(out, "decision"), out);
  }

  /** Calls `slotgate_on_complete` with a whole completion object, if the policy exports it. */
  completeInput(completion) {
    if (!this.hasOnComplete) return;
    const loaded = this.load(completion.settings);
    const wire = { ...completion };
    if (loaded.snapshot) delete wire.settings;
    this.call(this.instanceFor(loaded), "slotgate_on_complete", JSON.stringify(wire));
  }

  /** Evaluates a partial input, merged onto `DEFAULT_INPUT`: the decision as a JSON object. */
  run(partial = {}) {
    return this.evaluateInput(merged(DEFAULT_INPUT, partial));
  }

  /** `run`, returning `{decision}` or `{error}` (a PolicyError) instead of throwing. */
  tryRun(partial = {}) {
    try {
      return { decision: this.run(partial) };
    } catch (error) {
      if (error instanceof PolicyError) return { error };
      throw error;
    }
  }

  /** Calls `on_complete` with a partial completion, merged onto `DEFAULT_COMPLETION`. */
  complete(partial = {}) {
    this.completeInput(merged(DEFAULT_COMPLETION, partial));
  }

  /** Forgets all emulated host state (buckets, windows, log); the clock goes to 0. */
  reset() {
    this.host.reset();
  }

  /** Moves the emulated monotonic clock forward, refilling buckets and ageing windows. */
  advanceMs(ms) {
    this.host.advanceMs(ms);
  }

  /** The policy's log lines since the last call (or `reset`), as `{level, message}`. */
  takeLogs() {
    return this.host.takeLogs();
  }

  /**
   * Runs one fixture file from a clean emulated host, in the Rust SDK's format (`testing.rs`):
   * `{"input": {...}, "expect": {...}}`, or `{"steps": [...]}` with steps `{"input", "expect"}`,
   * `{"complete"}` or `{"advance_ms"}`; a top-level `settings` applies to every input without
   * its own. `expect` matches partially (`null` = absent). Throws on the first mismatch.
   */
  runFixture(path) {
    const fixture = parseJson(readFileSync(path, "utf8"), `fixture ${path}`);
    const known = new Set(["description", "settings", "input", "expect", "steps"]);
    for (const k of Object.keys(fixture)) if (!known.has(k)) throw new Error(`fixture ${path}: unknown field \`${k}\``);
    const single = "input" in fixture || "expect" in fixture;
    const steps = fixture.steps ?? [];
    if (single === (steps.length > 0)) throw new Error(`fixture ${path} needs either \`input\` (+ \`expect\`) or \`steps\``);
    this.reset();
    (single ? [{ input: fixture.input, expect: fixture.expect }] : steps).forEach((step, i) => {
      const at = `${path} step ${i + 1}`;
      const withSettings = (v) => ("settings" in fixture && !("settings" in v) ? { ...v, settings: fixture.settings } : v);
      if ("input" in step) {
        const decision = this.run(withSettings(step.input));
        if (step.expect !== undefined) {
          const why = [];
          if (!matches(step.expect, decision, "decision", why)) {
            throw new Error(`${at}: the decision does not match \`expect\`:\n${why.join("\n")}\n  decision: ${JSON.stringify(decision)}`);
          }
        }
      } else if ("complete" in step) {
        this.complete(withSettings(step.complete));
      } else if ("advance_ms" in step) {
        this.advanceMs(step.advance_ms);
      } else {
        throw new Error(`${at}: a step is one of \`input\` (+ \`expect\`), \`complete\` or \`advance_ms\``);
      }
    });
  }

  /** Runs every `*.json` fixture in `dir` (sorted by name); throws if there is none. Returns how many ran. */
  runFixtures(dir) {
    const path = dir instanceof URL ? fileURLToPath(dir) : dir;
    const files = readdirSync(path).filter((f) => f.endsWith(".json")).sort();
    if (files.length === 0) throw new Error(`no *.json fixtures in ${path}`);
    for (const f of files) this.runFixture(join(path, f));
    return files.length;
  }
}

/** Every global and the whole memory of `instance` (loaded from the instrumented module). */
function takeSnapshot(instance) {
  const globals = [];
  for (const [name, value] of Object.entries(instance.exports)) {
    if (name.startsWith(GLOBAL_EXPORT)) globals.push({ name, value: value.value });
  }
  return { globals, memory: new Uint8Array(instance.exports.memory.buffer).slice() };
}

/**
 * Makes a fresh instance the snapshot's copy: its memory grown to the snapshot's size and
 * overwritten, its mutable globals set (immutable ones cannot differ). slotgate builds a new
 * module instead (Wizer), whose start function is gone; here the start function has run again
 * and its effects are overwritten.
 */
function restoreSnapshot(instance, snapshot) {
  const memory = instance.exports.memory;
  const missing = snapshot.memory.length - memory.buffer.byteLength;
  if (missing > 0) memory.grow(missing / 65536);
  new Uint8Array(memory.buffer).set(snapshot.memory);
  for (const { name, value } of snapshot.globals) {
    try {
      instance.exports[name].value = value;
    } catch {
      // Immutable: the same in every instance.
    }
  }
}

/** A decision as slotgate accepts it (module.rs `parse_decision`), else a PolicyError. */
function checkDecision(d, text) {
  const bad = (why) => {
    throw new PolicyError("invalid_output", `${why}: ${text}`);
  };
  if (typeof d !== "object" || d === null || Array.isArray(d)) bad("a decision is a JSON object");
  const verdict = d.verdict ?? "allow";
  if (verdict !== "allow" && verdict !== "deny") bad("verdict must be allow or deny");
  if (verdict === "deny" && d.status != null && d.status !== 403 && d.status !== 429) bad("a deny's status must be 403 or 429");
  if (d.weight != null && !(Number.isFinite(d.weight) && d.weight >= 1e-6)) bad("weight must be a number of at least 1e-6");
  for (const k of ["status", "retry_after_seconds", "cost"]) {
    if (d[k] != null && !(Number.isInteger(d[k]) && d[k] >= 0)) bad(`${k} must be a non-negative integer`);
  }
  if (d.priority != null && !Number.isInteger(d.priority)) bad("priority must be an integer");
  return d;
}

function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new PolicyError("invalid_output", `${what} is not JSON (${e.message}): ${text}`);
  }
}

/** `patch` merged onto a copy of `base`: objects key by key, recursively; anything else replaces. */
export function merged(base, patch) {
  const out = structuredClone(base);
  return mergeInto(out, patch);
}

function mergeInto(base, patch) {
  if (isObject(base) && isObject(patch)) {
    for (const [k, v] of Object.entries(patch)) base[k] = k in base ? mergeInto(base[k], v) : structuredClone(v);
    return base;
  }
  return structuredClone(patch);
}

function isObject(v) {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Whether `actual` has every field of `expected` (objects recursively; `null` = absent), noting each difference. */
export function matches(expected, actual, at, why) {
  if (isObject(expected)) {
    let ok = true;
    for (const [k, want] of Object.entries(expected)) {
      ok = matches(want, isObject(actual) ? actual[k] ?? null : null, `${at}.${k}`, why) && ok;
    }
    return ok;
  }
  if (JSON.stringify(expected) === JSON.stringify(actual ?? null)) return true;
  why.push(`  ${at}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual ?? null)}`);
  return false;
}
