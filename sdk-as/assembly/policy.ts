// The `Policy` class: what a policy author extends. The export helpers (export.ts) call it.

import { completeWith, evaluateWith, validateWith } from "./export";
import { JsonReader } from "./json";
import { Completion, Decision, EvaluateInput } from "./types";

/**
 * Any `Policy`, whatever its settings type: what the export helpers take, so that an entry file
 * calls `evaluate(POLICY, ptr, len)` without naming the settings type.
 */
export abstract class Exported {
  abstract callEvaluate(ptr: i32, len: i32): i64;
  abstract callValidateSettings(ptr: i32, len: i32): i64;
  abstract callOnComplete(ptr: i32, len: i32): i64;
}

/**
 * An admission policy with settings of type `S`. Extend it, create one instance at the top of the
 * entry file, and hand it to the export helpers (see `export.ts`).
 *
 * Every call runs in a fresh WebAssembly instance: nothing a policy keeps in memory survives to the
 * next request. State that must persist lives in the host (`bucketTake`, `windowAdd`).
 */
export abstract class Policy<S> extends Exported {
  /**
   * The settings the host validated in this instance's memory, when it serves from a snapshot
   * taken right after (`keeps_settings`); null otherwise. Set by the SDK only.
   */
  kept: S | null = null;

  /**
   * Reads the settings from `r`, positioned at their JSON value. When none are configured the host
   * sends `null`, and the SDK hands over `{}` instead, so settings whose keys are all optional need
   * no configuration (a required key then fails as "settings are required: ..."). Record problems
   * with `r.fail()` / `r.invalid()` / `r.unknown()`; the SDK reports the first.
   */
  abstract readSettings(r: JsonReader): S;

  /**
   * Checks settings that parsed but may still be unusable (a zero capacity, say): null when fine,
   * else the message for the operator. Runs at load, in `slotgate_validate_settings`.
   */
  validate(settings: S): string | null {
    return null;
  }

  /**
   * Whether, with these settings, `evaluate` needs the exact prompt count
   * (`request.promptTokens`). Asked once at load. Say true only when a decision depends on it:
   * slotgate then counts every request's prompt before the chain runs (about 1-2 ms).
   */
  needsPromptTokens(settings: S): bool {
    return false;
  }

  /** Decides one request. */
  abstract evaluate(input: EvaluateInput, settings: S): Decision;

  /**
   * Learns what really happened to a request this policy allowed, once its response has ended.
   * Called only when the entry file exports `slotgate_on_complete`.
   */
  onComplete(completion: Completion, settings: S): void {}

  callEvaluate(ptr: i32, len: i32): i64 {
    return evaluateWith<S>(this, ptr, len);
  }

  callValidateSettings(ptr: i32, len: i32): i64 {
    return validateWith<S>(this, ptr, len);
  }

  callOnComplete(ptr: i32, len: i32): i64 {
    return completeWith<S>(this, ptr, len);
  }
}
