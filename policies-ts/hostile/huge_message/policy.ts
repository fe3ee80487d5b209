/**
 * Hostile fixture: denies a request of the model `HOSTILE` with a 50 MiB message, far past what
 * the host accepts of an answer (any other request is allowed, so the load-time canary passes and
 * the policy serves). Under the default memory limit (16 MiB) such a string cannot even be built, so the
 * instance traps on memory first. Settings `{"bytes": N}` choose another size: one that fits in
 * memory still costs ~2,600 fuel per byte to hand over (StarlingMonkey encodes the string inside
 * the sandbox), so reaching the host's own check of the answer's size takes fuel to match.
 */

import type { Completion, Decision, Evaluation, SettingsVerdict } from 'slotgate:policy/types@2.0.0';

const DEFAULT_BYTES = 50 << 20;

const ALLOW: Decision = {
  tag: 'allow',
  val: { disablePromptCache: false, stripIdSlot: false, responseHeaders: [], rateLimits: {} },
};

export function validateSettings(settings: string): SettingsVerdict {
  bytes(settings);
  return { needsPromptTokens: false, wantsCompletions: false };
}

export function evaluate(settings: string, input: Evaluation): Decision {
  if (input.request.model !== 'HOSTILE') return ALLOW;
  return { tag: 'deny', val: { status: 403, message: 'x'.repeat(bytes(settings)), rateLimits: {} } };
}

export function onComplete(_settings: string, _completion: Completion): void {}

function bytes(settings: string): number {
  const s = JSON.parse(settings) as { bytes?: unknown } | null;
  const n = s?.bytes ?? DEFAULT_BYTES;
  if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < 0) {
    // A string is what componentize-js turns into the WIT error (an Error would trap).
    throw 'bytes: expected a whole number of bytes';
  }
  return n;
}
