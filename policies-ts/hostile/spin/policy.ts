/**
 * Hostile fixture: `evaluate` never returns, for a request of the model `HOSTILE`; any other is
 * allowed, so the load-time canary passes and the policy serves. Only the host's limits stop it:
 * fuel, or the evaluation deadline (the epoch), whichever comes first.
 */

import type { Completion, Decision, Evaluation, SettingsVerdict } from 'slotgate:policy/types@2.0.0';

const ALLOW: Decision = {
  tag: 'allow',
  val: { disablePromptCache: false, stripIdSlot: false, responseHeaders: [], rateLimits: {} },
};

export function validateSettings(_settings: string): SettingsVerdict {
  return { needsPromptTokens: false, wantsCompletions: false };
}

export function evaluate(_settings: string, input: Evaluation): Decision {
  if (input.request.model !== 'HOSTILE') return ALLOW;
  // Work the engine cannot prove useless, so no optimiser removes the loop.
  let n = Number(input.nowUnixMs);
  for (;;) n = (n * 1_103_515_245 + 12_345) % 2_147_483_648;
}

export function onComplete(_settings: string, _completion: Completion): void {}
