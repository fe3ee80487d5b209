import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { test } from 'node:test';

import type { Decision, DecisionAllow, Request } from 'slotgate:policy/types@2.0.0';

import { evaluation, validate, type RequestPatch } from '../../../sdk-ts/src/testing/index.js';
import * as policy from '../src/policy.js';

// The exports must be the world's: checked by the compiler against the generated declarations.
const exportsAreTheWorlds: Pick<
  typeof import('slotgate:policy/policy@2.0.0'),
  'validateSettings' | 'evaluate' | 'onComplete'
> = policy;
void exportsAreTheWorlds;

/** This policy's folder: the test runs compiled, from build/policies-ts/tenant-priority/test/. */
const here = new URL('../../../../', import.meta.url);
/** The Rust example's own files: the port must take the same settings and answer the same. */
const rustExample = new URL('../../policies/tenant-priority/', here);

const key = (n: number) => `sha256:${n.toString(16).padStart(2, '0').repeat(32)}`;

const settings = {
  tenants: {
    chat: { api_keys: [key(1)], uids: [1000], priority: -5, ceiling: -10, deadline_ms: 2000 },
    batch: { uids: [1001], priority: 10 },
  },
  unknown: { tenant: 'public', priority: 5, ceiling: 0 },
  tenant_header: 'x-tenant',
  subagent_step: 1,
};

function evaluate(r: RequestPatch, s: unknown = settings): Decision {
  return policy.evaluate(JSON.stringify(s), evaluation({ request: r }));
}

function allowed(r: RequestPatch, s: unknown = settings): DecisionAllow['val'] {
  const d = evaluate(r, s);
  assert.equal(d.tag, 'allow', JSON.stringify(d, (_, v: unknown) => (typeof v === 'bigint' ? `${v}` : v)));
  return (d as DecisionAllow).val;
}

/** A Unix-socket peer's request, as the host names its caller. */
const uid = (n: number): RequestPatch => ({ peer: { uid: n, gid: 1 }, caller: `uid:${n}` });

test('keys and uids map to tenants and classes', () => {
  let d = allowed({ apiKey: key(1) });
  assert.deepEqual([d.tenant, d.priority], ['chat', -5n]);
  assert.deepEqual(d.responseHeaders, [['x-tenant', 'chat']]);
  d = allowed(uid(1000));
  assert.deepEqual([d.tenant, d.priority], ['chat', -5n]);
  d = allowed(uid(1001));
  assert.deepEqual([d.tenant, d.priority], ['batch', 10n]);
  d = allowed({ method: 'POST' });
  assert.deepEqual([d.tenant, d.priority], ['public', 5n]);
});

test('a listed key wins over the uid, and an unlisted one falls back to it', () => {
  assert.equal(allowed({ apiKey: key(1), ...uid(1001) }).tenant, 'chat');
  assert.equal(allowed({ apiKey: key(9), ...uid(1001) }).tenant, 'batch');
  assert.equal(allowed({ apiKey: key(9) }).tenant, 'public');
});

test('hints are clamped to the ceiling, but may always lower urgency', () => {
  const hint = (who: RequestPatch, h: bigint) => allowed({ ...who, priorityHint: h }).priority;
  assert.equal(hint(uid(1000), -100n), -10n);
  assert.equal(hint(uid(1000), -7n), -7n);
  assert.equal(hint(uid(1001), -100n), 10n, 'the ceiling defaults to the class');
  assert.equal(hint(uid(1001), 50n), 50n);
  assert.equal(hint({ stream: true }, -3n), 0n);
});

test('a subagent waits behind its root agent, whatever its hint', () => {
  const parent = (id: string): Partial<Request> => ({ headers: [['x-parent-agent-id', id]] });
  assert.equal(allowed({ ...uid(1000), sessionId: 's' }).priority, -5n);
  assert.equal(allowed({ ...uid(1000), sessionId: 's', ...parent('a1') }).priority, -4n);
  assert.equal(allowed({ ...uid(1000), ...parent('a1'), priorityHint: -100n }).priority, -9n, 'the ceiling, then the step');
});

test('a tenant class may carry a deadline', () => {
  assert.equal(allowed(uid(1000)).deadlineMs, 2000n);
  assert.equal(allowed(uid(1001)).deadlineMs, undefined);
});

test('unknown callers can be refused', () => {
  const s = { deny_unknown: true, tenants: { a: { uids: [1], priority: 0 } } };
  assert.deepEqual(evaluate(uid(4242), s), {
    tag: 'deny',
    val: { status: 403, message: 'uid:4242 is not a known tenant', rateLimits: {} },
  });
  const message = (d: Decision) => (d.tag === 'deny' ? d.val.message : 'allowed');
  assert.equal(message(evaluate({ apiKey: key(3), caller: key(3) }, s)), `${key(3)} is not a known tenant`);
  assert.equal(message(evaluate({}, s)), 'anonymous is not a known tenant');
  assert.equal(evaluate(uid(1), s).tag, 'allow');
});

test('no settings put everyone in one default class', () => {
  const d = policy.evaluate('null', evaluation({ request: { priorityHint: -4n } }));
  assert.equal(d.tag, 'allow');
  assert.deepEqual([d.val.tenant, d.val.priority], ['default', 0n]);
  assert.deepEqual(d.val.responseHeaders, []);
  assert.deepEqual(validate(policy.validateSettings, null), {
    tag: 'ok',
    val: { needsPromptTokens: false, wantsCompletions: false },
  });
});

test('settings are validated', () => {
  const example = readFileSync(new URL('settings.example.json', here), 'utf8');
  assert.deepEqual(
    JSON.parse(example),
    JSON.parse(readFileSync(new URL('settings.example.json', rustExample), 'utf8')),
    'the same example as the Rust policy',
  );
  assert.equal(validate(policy.validateSettings, example).tag, 'ok');
  assert.equal(validate(policy.validateSettings, settings).tag, 'ok');

  const k = key(1);
  const bad: Array<[unknown, RegExp]> = [
    [{ tenants: { a: { api_keys: ['sk-raw'], priority: 0 } } }, /`sk-raw` is not a hashed key/],
    [
      { tenants: { a: { api_keys: [k], priority: 0 }, b: { api_keys: [k], priority: 1 } } },
      /is listed by both `a` and `b`/,
    ],
    [{ tenants: { a: { uids: [7], priority: 0 }, b: { uids: [7], priority: 0 } } }, /^uid:7 is listed by both `a` and `b`$/],
    [{ tenants: { a: { priority: 0, ceiling: 3 } } }, /ceiling 3 is less urgent than its own priority 0/],
    [{ unknown: { priority: 0, ceiling: 1 } }, /^unknown: ceiling 1/],
    [{ tenants: { a: { uids: [7], priority: 0, deadline_ms: 0 } } }, /deadline_ms 0 leaves no time at all/],
    [{ tenant_header: 'X Tenant' }, /is not a lower-case header name/],
    [{ tenants: { a: { uids: [7] } } }, /missing field `priority`/],
    [{ tenant: {} }, /unknown field `tenant`/],
    [{ tenants: { '': { priority: 0 } } }, /a tenant name is empty/],
    [{ unknown: { tenant: '' } }, /unknown.tenant is empty/],
    [{ tenants: { a: { uids: [-1], priority: 0 } } }, /out of range/],
    [{ tenants: { a: { priority: 1.5 } } }, /expected an integer/],
    [{ deny_unknown: 'yes' }, /expected true or false/],
    [{ subagent_step: -1 }, /would serve subagents before their root agent/],
    ['{"tenants": ', /JSON/],
  ];
  for (const [s, why] of bad) {
    const v = validate(policy.validateSettings, s);
    assert.equal(v.tag, 'err', `${JSON.stringify(s)} passed`);
    assert.match(v.val as string, why);
  }
});

// The Rust example's fixtures, read as they are: its inputs translated to the v2 records, its
// expectations checked against the v2 decision.
test('the Rust example’s fixtures give the same decisions', () => {
  const dir = new URL('fixtures/', rustExample);
  const files = readdirSync(dir).filter((f) => f.endsWith('.json'));
  assert.ok(files.length > 0, 'no fixtures found');
  for (const file of files) {
    const fixture = JSON.parse(readFileSync(new URL(file, dir), 'utf8')) as Fixture;
    const steps = fixture.steps ?? [{ input: fixture.input!, expect: fixture.expect }];
    steps.forEach((step, i) => {
      const s = step.input.settings ?? fixture.settings ?? null;
      const d = evaluate(requestOf(step.input.request ?? {}), s);
      if (step.expect !== undefined) expectMatches(d, step.expect, `${file} step ${i + 1}`);
    });
  }
});

interface Fixture {
  settings?: unknown;
  input?: { request?: V1Request; settings?: unknown };
  expect?: V1Expect;
  steps?: Array<{ input: { request?: V1Request; settings?: unknown }; expect?: V1Expect }>;
}

interface V1Request {
  caller?: string;
  peer?: { uid: number; gid: number; pid?: number };
  api_key?: string;
  priority_hint?: number;
  stream?: boolean;
  method?: string;
}

interface V1Expect {
  verdict?: 'allow' | 'deny';
  tenant?: string;
  priority?: number;
  status?: number;
  message?: string;
  deadline_ms?: number | null;
  mutations?: { response_headers?: Record<string, string> };
}

function requestOf(r: V1Request): RequestPatch {
  return {
    caller: r.caller,
    peer: r.peer,
    apiKey: r.api_key,
    priorityHint: r.priority_hint === undefined ? undefined : BigInt(r.priority_hint),
    stream: r.stream ?? false,
    method: r.method ?? 'POST',
  };
}

function expectMatches(d: Decision, e: V1Expect, at: string): void {
  if (e.verdict !== undefined) assert.equal(d.tag, e.verdict, at);
  if (d.tag === 'allow') {
    const a = d.val;
    if (e.tenant !== undefined) assert.equal(a.tenant, e.tenant, at);
    if (e.priority !== undefined) assert.equal(a.priority, BigInt(e.priority), at);
    if (e.deadline_ms !== undefined) {
      assert.equal(a.deadlineMs, e.deadline_ms === null ? undefined : BigInt(e.deadline_ms), at);
    }
    for (const [name, value] of Object.entries(e.mutations?.response_headers ?? {})) {
      assert.ok(a.responseHeaders.some(([n, v]) => n === name && v === value), `${at}: header ${name}`);
    }
  } else {
    if (e.status !== undefined) assert.equal(d.val.status, e.status, at);
    if (e.message !== undefined) assert.equal(d.val.message, e.message, at);
  }
}
