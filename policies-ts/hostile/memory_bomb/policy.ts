/**
 * Hostile fixture: `evaluate` allocates without bound for a request of the model `HOSTILE` (any
 * other is allowed, so the load-time canary passes and the policy serves), keeping every
 * allocation reachable so no garbage collection can help. Only the host's memory limit stops it
 * (a growth is refused, the engine's allocation fails and it aborts). ArrayBuffers cost little
 * fuel per byte, so the memory limit, not the fuel, is what it meets first.
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
  const hoard: ArrayBuffer[] = [];
  for (let size = 1 << 20; ; size = Math.min(size * 2, 64 << 20)) {
    const chunk = new ArrayBuffer(size);
    // Touch a byte per page, so the pages are really committed, not merely reserved.
    const bytes = new Uint8Array(chunk);
    for (let i = 0; i < size; i += 65_536) bytes[i] = 1;
    hoard.push(chunk);
  }
}

export function onComplete(_settings: string, _completion: Completion): void {}
