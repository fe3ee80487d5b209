import assert from 'node:assert/strict';
import { beforeEach, test } from 'node:test';

import { allow } from '../slotgate-sdk/index.js';
import { evaluation, fakeHost, validate } from '../slotgate-sdk/testing/index.js';
import * as policy from '../src/policy.js';

// The exports must be the world's: the compiler checks them against the generated declarations.
const exportsAreTheWorlds: Pick<
  typeof import('slotgate:policy/policy@2.0.0'),
  'validateSettings' | 'evaluate' | 'onComplete'
> = policy;
void exportsAreTheWorlds;

// Host state (buckets, quotas, logs) lives in the fake host and survives between calls.
beforeEach(() => fakeHost.reset());

test('every request is allowed unchanged', () => {
  const d = policy.evaluate('null', evaluation({ request: { apiKey: `sha256:${'ab'.repeat(32)}` } }));
  assert.deepEqual(d, allow());
});

test('settings are an object, or none', () => {
  assert.equal(validate(policy.validateSettings, null).tag, 'ok');
  assert.equal(validate(policy.validateSettings, {}).tag, 'ok');
  assert.deepEqual(validate(policy.validateSettings, [1]), { tag: 'err', val: 'settings: expected an object' });
});
