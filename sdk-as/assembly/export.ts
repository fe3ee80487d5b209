// The ABI v1 exports, as helpers a policy's entry file calls from one-line functions:
//
//   export { slotgate_abi_version, slotgate_alloc } from "@slotgate/sdk-as";
//   const POLICY = new MyPolicy();
//   export function slotgate_evaluate(ptr: i32, len: i32): i64 { return evaluate(POLICY, ptr, len); }
//   export function slotgate_validate_settings(ptr: i32, len: i32): i64 { return validateSettings(POLICY, ptr, len); }
//   export function slotgate_on_complete(ptr: i32, len: i32): i64 { return onComplete(POLICY, ptr, len); }
//
// Memory is never freed: build with `--runtime stub` (the SDK's asconfig.json does). The host
// instantiates a fresh module for every call and drops it after copying the output, so a leaked
// buffer lives exactly as long as it must, and a collector would only spend fuel. One call may
// therefore allocate at most the policy's memory limit (16 MiB by default) in total.

import { JsonReader, JsonWriter } from "./json";
import { Level, log } from "./host";
import { Exported, Policy } from "./policy";
import { ABI_VERSION, Completion, Decision, EvaluateInput, RequestSummary } from "./types";

/** `slotgate_abi_version`: always 1. Re-export it from the entry file. */
export function slotgate_abi_version(): i32 {
  return <i32>ABI_VERSION;
}

/**
 * `slotgate_alloc`: `len` writable bytes for the host's input, or 0 for a negative length. Re-export
 * it from the entry file.
 */
export function slotgate_alloc(len: i32): i32 {
  if (len < 0) return 0;
  // At least one byte, so the pointer is a real allocation and never 0.
  return <i32>heap.alloc(<usize>max(len, 1));
}

/** `slotgate_evaluate`: the decision's JSON, or 0 (a policy error) after logging why there is none. */
export function evaluate(policy: Exported, ptr: i32, len: i32): i64 {
  return policy.callEvaluate(ptr, len);
}

/**
 * `slotgate_validate_settings`: always answers; anything wrong is an invalid result. Valid
 * settings stay parsed in this instance (`Policy.kept`), and the answer says so
 * (`keeps_settings`): the host then snapshots the instance and starts every later one from it.
 */
export function validateSettings(policy: Exported, ptr: i32, len: i32): i64 {
  return policy.callValidateSettings(ptr, len);
}

/** `slotgate_on_complete`: always 0 (no output); a bad input is logged. */
export function onComplete(policy: Exported, ptr: i32, len: i32): i64 {
  return policy.callOnComplete(ptr, len);
}

/** `evaluate` for a `Policy<S>`. */
export function evaluateWith<S>(policy: Policy<S>, ptr: i32, len: i32): i64 {
  const r = new JsonReader(<usize>ptr, <usize>len);
  const input = new EvaluateInput();
  let settings: u64 = 0;
  if (r.object()) {
    while (r.next()) {
      if (r.is("abi")) input.abi = <u32>r.u64();
      else if (r.is("request")) input.request = RequestSummary.read(r);
      else if (r.is("settings")) settings = r.capture();
      else if (r.is("now_unix_ms")) input.nowUnixMs = r.u64();
      else r.skip();
    }
  }
  r.finish();
  const error = r.error;
  if (error !== null) return report("slotgate_evaluate", "evaluate input: " + error);
  if (input.abi != ABI_VERSION) return report("slotgate_evaluate", abiMismatch(input.abi));
  const parsed = settingsFor(policy, settings);
  if (parsed.error !== null) return report("slotgate_evaluate", parsed.error!);
  const decision = policy.evaluate(input, parsed.value!);
  return answer(decision);
}

/** `validateSettings` for a `Policy<S>`. */
export function validateWith<S>(policy: Policy<S>, ptr: i32, len: i32): i64 {
  const parsed = readSettings(policy, new JsonReader(<usize>ptr, <usize>len));
  const w = new JsonWriter(128);
  w.begin();
  w.key("valid");
  const error = parsed.error !== null ? parsed.error : policy.validate(parsed.value!);
  if (error !== null) {
    w.bool(false);
    w.key("message");
    w.str(error);
  } else {
    const settings = parsed.value!;
    policy.kept = settings;
    w.bool(true);
    if (policy.needsPromptTokens(settings)) {
      w.key("needs_prompt_tokens");
      w.bool(true);
    }
    w.key("keeps_settings");
    w.bool(true);
  }
  w.end();
  return w.packed();
}

/** `onComplete` for a `Policy<S>`. */
export function completeWith<S>(policy: Policy<S>, ptr: i32, len: i32): i64 {
  const r = new JsonReader(<usize>ptr, <usize>len);
  const c = new Completion();
  let settings: u64 = 0;
  if (r.object()) {
    while (r.next()) {
      if (r.is("abi")) c.abi = <u32>r.u64();
      else if (r.is("request")) c.request = RequestSummary.read(r);
      else if (r.is("decision")) c.decision = Decision.read(r);
      else if (r.is("chain_decision")) c.chainDecision = Decision.read(r);
      else if (r.is("settings")) settings = r.capture();
      else if (r.is("status")) c.status = <u16>r.u64();
      else if (r.is("outcome")) c.outcome = r.string();
      else if (r.is("prompt_tokens")) c.promptTokens = r.u64();
      else if (r.is("completion_tokens")) c.completionTokens = r.u64();
      else if (r.is("queue_wait_ms")) c.queueWaitMs = r.u64();
      else if (r.is("upstream_ms")) c.upstreamMs = r.u64();
      else r.skip();
    }
  }
  r.finish();
  const error = r.error;
  if (error !== null) return report("slotgate_on_complete", "on_complete input: " + error);
  if (c.abi != ABI_VERSION) return report("slotgate_on_complete", abiMismatch(c.abi));
  const parsed = settingsFor(policy, settings);
  if (parsed.error !== null) return report("slotgate_on_complete", parsed.error!);
  policy.onComplete(c, parsed.value!);
  return 0;
}

/** A decision's JSON, packed. */
export function answer(decision: Decision): i64 {
  const w = new JsonWriter(256);
  decision.write(w);
  return w.packed();
}

/** Settings read by a policy, or why they could not be. */
class Parsed<S> {
  value: S | null = null;
  error: string | null = null;
}

/** The settings this instance keeps, else those of the input (`captured` by the reader; 0: none). */
function settingsFor<S>(policy: Policy<S>, captured: u64): Parsed<S> {
  const kept = policy.kept;
  if (kept !== null) {
    const p = new Parsed<S>();
    p.value = kept;
    return p;
  }
  return readSettings(policy, captured == 0 ? JsonReader.of("null") : JsonReader.span(captured));
}

/** Reads settings; `null` (nothing configured) reads `{}` instead, so all-optional settings work. */
function readSettings<S>(policy: Policy<S>, r: JsonReader): Parsed<S> {
  const p = new Parsed<S>();
  if (r.null() && r.finish()) {
    const empty = JsonReader.of("{}");
    const s = policy.readSettings(empty);
    empty.finish();
    if (empty.error !== null) p.error = "settings are required: " + empty.error!;
    else p.value = s;
    return p;
  }
  const s = policy.readSettings(r);
  r.finish();
  if (r.error !== null) p.error = "invalid settings: " + r.error!;
  else p.value = s;
  return p;
}

function abiMismatch(abi: u32): string {
  return "input is ABI " + abi.toString() + "; this policy speaks " + ABI_VERSION.toString();
}

/** Logs why a call has no answer; the host only sees the 0. */
function report(call: string, error: string): i64 {
  log(Level.Error, call + ": " + error);
  return 0;
}
