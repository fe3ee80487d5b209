/**
 * {{name}}: a slotgate policy. As it stands it allows every request unchanged; make `evaluate`
 * decide. The three exports are the world's (`wit/policy.wit`); their types are generated from it.
 */

import type { Completion, Decision, Evaluation, SettingsVerdict } from 'slotgate:policy/types@2.0.0';

import { allow, checkSettings, parseSettings, settingsOk } from '../slotgate-sdk/index.js';

/** Checks the operator's settings once, at load: what it throws is shown to the operator. */
export function validateSettings(settings: string): SettingsVerdict {
  return checkSettings(() => {
    const s = parseSettings(settings);
    if (s !== null && (typeof s !== 'object' || Array.isArray(s))) {
      throw new Error('settings: expected an object');
    }
    return settingsOk();
  });
}

/** Decides one request. */
export function evaluate(_settings: string, _input: Evaluation): Decision {
  return allow();
}

/** Told what happened to a request it allowed; called only if `validateSettings` asks for it. */
export function onComplete(_settings: string, _completion: Completion): void {}
