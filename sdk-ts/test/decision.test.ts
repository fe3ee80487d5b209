import assert from 'node:assert/strict';
import { test } from 'node:test';

import { allow, deny, forbidden, quotaExceeded, settingsOk, tooManyRequests, wholeSeconds } from '../src/index.js';

test('allow changes nothing unless told', () => {
  assert.deepEqual(allow(), {
    tag: 'allow',
    val: { disablePromptCache: false, stripIdSlot: false, responseHeaders: [], rateLimits: {} },
  });
  const d = allow({ tenant: 'chat', priority: -5n, responseHeaders: [['x-tenant', 'chat']] });
  assert.equal(d.val.tenant, 'chat');
  assert.equal(d.val.priority, -5n);
  assert.deepEqual(d.val.responseHeaders, [['x-tenant', 'chat']]);
  assert.equal(d.val.stripIdSlot, false);
});

test('the denials are the Rust SDK’s', () => {
  assert.deepEqual(forbidden('no'), { tag: 'deny', val: { status: 403, message: 'no', rateLimits: {} } });
  assert.deepEqual(deny(429, 'later', { reason: 'busy' }).val, {
    status: 429,
    message: 'later',
    reason: 'busy',
    rateLimits: {},
  });
  const t = tooManyRequests('slow down', 1.2);
  assert.equal(t.val.status, 429);
  assert.equal(t.val.retryAfterSeconds, 2n, 'a fractional wait rounds up');
  assert.equal(t.val.reason, undefined);
  assert.equal(tooManyRequests('slow down').val.retryAfterSeconds, undefined);

  const q = quotaExceeded('daily quota spent', 3600n);
  assert.deepEqual(q.val, {
    status: 429,
    message: 'daily quota spent',
    reason: 'quota_exceeded',
    shouldRetry: false,
    retryAfterSeconds: 3600n,
    rateLimits: {},
  });
});

test('waits become whole seconds, and a wait that never ends none', () => {
  assert.equal(wholeSeconds(0), 0n);
  assert.equal(wholeSeconds(0.001), 1n);
  assert.equal(wholeSeconds(-3), 0n);
  assert.equal(wholeSeconds(Infinity), undefined);
  assert.equal(wholeSeconds(Number.NaN), undefined);
  assert.equal(wholeSeconds(7n), 7n);
});

test('settingsOk asks for nothing unless told', () => {
  assert.deepEqual(settingsOk(), { needsPromptTokens: false, wantsCompletions: false });
  assert.equal(settingsOk({ needsPromptTokens: true }).needsPromptTokens, true);
});
