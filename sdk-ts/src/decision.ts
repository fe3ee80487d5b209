/**
 * A policy's answers: allow and deny decisions, and the verdict on settings, with the defaults the
 * WIT leaves to the guest (every `bool` false, every list empty, every option none).
 *
 * The constructors mirror the Rust SDK's (`Decision::allow`, `forbidden`, `too_many_requests`,
 * `quota_exceeded`), so a policy ported from one to the other answers the same.
 */

import type {
  Allow,
  DecisionAllow,
  DecisionDeny,
  Deny,
  SettingsVerdict,
} from 'slotgate:policy/types@2.0.0';

/** Admit the request; `fields` sets what differs from "change nothing". */
export function allow(fields: Partial<Allow> = {}): DecisionAllow {
  return {
    tag: 'allow',
    val: {
      disablePromptCache: false,
      stripIdSlot: false,
      responseHeaders: [],
      rateLimits: {},
      ...fields,
    },
  };
}

/** Refuse the request with `status` (the host accepts 403 and 429) and a message for the client. */
export function deny(
  status: number,
  message: string,
  fields: Partial<Omit<Deny, 'status' | 'message'>> = {},
): DecisionDeny {
  return { tag: 'deny', val: { status, message, rateLimits: {}, ...fields } };
}

/** A 403: this request will never be admitted as it is. */
export function forbidden(message: string): DecisionDeny {
  return deny(403, message);
}

/** A 429: try again later, after `retryAfterSeconds` when known. */
export function tooManyRequests(message: string, retryAfterSeconds?: number | bigint): DecisionDeny {
  return deny(429, message, { retryAfterSeconds: wholeSeconds(retryAfterSeconds) });
}

/**
 * A 429 for a spent quota (reason `quota_exceeded`), not to be retried by the client's SDK before
 * `retryAfterSeconds` (the window's end): retrying at once could only be refused again.
 */
export function quotaExceeded(message: string, retryAfterSeconds: number | bigint): DecisionDeny {
  const d = tooManyRequests(message, retryAfterSeconds);
  d.val.reason = 'quota_exceeded';
  d.val.shouldRetry = false;
  return d;
}

/** Accept the settings; `fields` asks the host for more (exact prompt tokens, completions). */
export function settingsOk(fields: Partial<SettingsVerdict> = {}): SettingsVerdict {
  return { needsPromptTokens: false, wantsCompletions: false, ...fields };
}

/**
 * Seconds as the WIT's `u64`: the host's waits (`bucket-take`, `quota-take`) are fractional
 * seconds, and a client told to come back early is only refused again, so they round up. A wait
 * that never ends (infinity) or is not a number has no `Retry-After` to give.
 */
export function wholeSeconds(seconds: number | bigint | undefined): bigint | undefined {
  if (typeof seconds === 'bigint') return seconds < 0n ? 0n : seconds;
  if (seconds === undefined || !Number.isFinite(seconds)) return undefined;
  return BigInt(Math.max(0, Math.ceil(seconds)));
}
