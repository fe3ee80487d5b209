import assert from 'node:assert/strict';
import { test } from 'node:test';

import { checkTenantHeader, header, identity, isHashedKey, promptTokensBest, tenantKey } from '../src/index.js';
import { request } from '../src/testing/index.js';

test('the identity is the one the host named', () => {
  // The host names the caller; the request's key and peer are not looked at again.
  const r = request({ peer: { uid: 1000, gid: 1000 }, apiKey: 'sha256:ab' });
  assert.equal(identity(r), 'anonymous');
  for (const caller of ['uid:1000', 'sha256:ab', 'alice']) {
    const r = request({ peer: { uid: 1000, gid: 1000 }, apiKey: 'sha256:ab', caller });
    assert.equal(identity(r), caller);
    assert.equal(tenantKey(r), caller);
  }
});

test('hashed keys are recognised', () => {
  const good = `sha256:${'0a'.repeat(32)}`;
  assert.ok(isHashedKey(good));
  assert.ok(!isHashedKey('sk-secret'));
  assert.ok(!isHashedKey(good.toUpperCase()));
  assert.ok(!isHashedKey(good.slice(0, -1)));
  assert.ok(!isHashedKey(`${good}0`));
});

test('a tenant header names the tenant when sent and not empty', () => {
  const r = request({ caller: 'uid:7', headers: [['x-tenant', 'team-a']] });
  assert.equal(header(r, 'x-tenant'), 'team-a');
  assert.equal(tenantKey(r, 'x-tenant'), 'header:team-a');
  assert.equal(tenantKey(r), 'uid:7');
  assert.equal(tenantKey(request({ headers: [['x-tenant', '']] }), 'x-tenant'), 'anonymous');
  assert.equal(checkTenantHeader('openai-project'), undefined);
  assert.match(checkTenantHeader('x-user') ?? '', /not a header policies see/);
});

test('the exact prompt count wins over the estimate', () => {
  assert.equal(promptTokensBest(request({ promptTokensEstimate: 10n })), 10n);
  assert.equal(promptTokensBest(request({ promptTokensEstimate: 10n, promptTokens: 12n })), 12n);
});
