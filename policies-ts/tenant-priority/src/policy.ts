/**
 * Tenant priority: maps API keys and Unix-socket uids to a named tenant with a priority class, and
 * clamps the client's own priority hint to the tenant's ceiling (lower is served earlier).
 *
 * A port of the Rust example `policies/tenant-priority` to the v2 world: the same settings, the
 * same decisions, the same messages.
 */

import type { Completion, Decision, Evaluation, Request, SettingsVerdict } from 'slotgate:policy/types@2.0.0';

import {
  TENANT_NAMED_HEADER,
  allow,
  checkSettings,
  forbidden,
  identity,
  isHashedKey,
  kept,
  parseSettings,
  settingsOk,
} from '../../../sdk-ts/src/index.js';

interface Tenant {
  /** Hashed API keys (`sha256:<hex>`, as `slotgate hash-key KEY` prints them). */
  apiKeys: string[];
  /** Unix-socket peer uids, used when the request carries no API key that a tenant lists. */
  uids: number[];
  /** Priority class: the priority of a request without a hint. */
  priority: bigint;
  /** The most urgent (lowest) priority a hint may ask for; defaults to `priority`. */
  ceiling?: bigint;
  /**
   * How long the tenant's answers are worth waiting for, in milliseconds: its requests must start
   * within it or leave the queue. A client's own `X-Slotgate-Deadline-Ms` may cut it further.
   */
  deadlineMs?: bigint;
}

/** The class of callers no tenant lists. */
interface Class {
  tenant: string;
  priority: bigint;
  ceiling?: bigint;
  deadlineMs?: bigint;
}

interface Settings {
  /** Tenants by name, in name order (the Rust example's `BTreeMap`). */
  tenants: Array<[string, Tenant]>;
  unknown: Class;
  /** Refuse (403) callers no tenant lists, instead of giving them the `unknown` class. */
  denyUnknown: boolean;
  /** A response header that names the tenant, e.g. `x-tenant`. */
  tenantHeader?: string;
  /** Added to the priority of a subagent's request (its client names a parent agent). */
  subagentStep: bigint;
}

export function validateSettings(json: string): SettingsVerdict {
  return checkSettings(() => {
    check(readSettings(parseSettings(json)));
    // Neither exact prompt counts nor completions: it decides on who asks, not on what.
    return settingsOk();
  });
}

/** The settings, parsed on an instance's first call and kept for its next ones. */
const settings = kept((json: string) => readSettings(parseSettings(json)));

export function evaluate(json: string, input: Evaluation): Decision {
  const s = settings(json);
  const request = input.request;
  const placement = place(request, s);
  if (placement === undefined && s.denyUnknown) {
    return forbidden(`${identity(request)} is not a known tenant`);
  }
  const p = placement ?? s.unknown;
  const ceiling = p.ceiling ?? p.priority;
  // A hint may always ask to wait longer; it may not jump above the tenant's ceiling.
  const hint = request.priorityHint;
  const clamped = hint === undefined ? p.priority : hint > ceiling ? hint : ceiling;
  // A subagent waits behind the agent that started it, whatever its hint asked.
  const priority = isSubagent(request) ? saturating(clamped + s.subagentStep) : clamped;
  return allow({
    tenant: p.tenant,
    priority,
    deadlineMs: p.deadlineMs,
    responseHeaders: s.tenantHeader === undefined ? [] : [[s.tenantHeader, p.tenant]],
  });
}

export function onComplete(_settings: string, _completion: Completion): void {
  // Not called: validateSettings does not ask for completions.
}

/**
 * Whether an agent's subagent sent it: contract 2.0.0 has no field for the parent agent, so the
 * host lists it among the headers, as `x-parent-agent-id` (docs/sessions.md).
 */
function isSubagent(request: Request): boolean {
  return request.headers.some(([name]) => name === 'x-parent-agent-id');
}

/** A 64-bit sum as Rust's `saturating_add`. */
function saturating(n: bigint): bigint {
  const max = 2n ** 63n - 1n;
  return n > max ? max : n;
}

/** The tenant listing the request's API key, else the one listing its uid. */
function place(request: Request, s: Settings): (Class & { tenant: string }) | undefined {
  // The tenant slotgate named (a key it issued) is the tenant: its class is the one listed under its
  // name, else the unknown callers' (it is known to slotgate, so never denied).
  const named = request.headers.find(([n]) => n === TENANT_NAMED_HEADER)?.[1];
  if (named) {
    const listed = s.tenants.find(([name]) => name === named)?.[1];
    return { ...(listed ?? s.unknown), tenant: named };
  }
  const key = request.apiKey;
  const uid = request.peer?.uid;
  const found =
    (key === undefined ? undefined : s.tenants.find(([, t]) => t.apiKeys.includes(key))) ??
    (uid === undefined ? undefined : s.tenants.find(([, t]) => t.uids.includes(uid)));
  return found === undefined ? undefined : { ...found[1], tenant: found[0] };
}

/** The rules beyond the shape of the settings, refused at load. */
function check(s: Settings): void {
  const owners = new Map<string, string>();
  for (const [name, t] of s.tenants) {
    if (name === '') throw new Error('a tenant name is empty');
    checkClass(`tenant \`${name}\``, t.priority, t.ceiling, t.deadlineMs);
    for (const k of t.apiKeys) {
      if (!isHashedKey(k)) {
        throw new Error(
          `tenant \`${name}\`: \`${k}\` is not a hashed key: list \`slotgate hash-key KEY\` output, never the key`,
        );
      }
    }
    // Keyed as `identity()` names callers, so a key and a uid never collide.
    for (const id of [...t.apiKeys, ...t.uids.map((u) => `uid:${u}`)]) {
      const other = owners.get(id);
      if (other !== undefined) throw new Error(`${id} is listed by both \`${other}\` and \`${name}\``);
      owners.set(id, name);
    }
  }
  if (s.unknown.tenant === '') throw new Error('unknown.tenant is empty');
  checkClass('unknown', s.unknown.priority, s.unknown.ceiling, s.unknown.deadlineMs);
  if (s.subagentStep < 0n) {
    throw new Error(`subagent_step ${s.subagentStep} would serve subagents before their root agent; give 0 or more`);
  }
  const h = s.tenantHeader;
  if (h !== undefined && !/^[a-z0-9-]+$/.test(h)) {
    throw new Error(`tenant_header \`${h}\` is not a lower-case header name`);
  }
}

function checkClass(what: string, priority: bigint, ceiling?: bigint, deadlineMs?: bigint): void {
  if (deadlineMs === 0n) {
    throw new Error(`${what}: deadline_ms 0 leaves no time at all; give milliseconds from 1, or leave it out`);
  }
  if (ceiling !== undefined && ceiling > priority) {
    throw new Error(
      `${what}: ceiling ${ceiling} is less urgent than its own priority ${priority} (lower is more urgent)`,
    );
  }
}

// --- Reading the settings JSON: serde's rules of the Rust example (unknown fields refused, missing
// ones defaulted, `null` for an optional one the same as missing). ---

function readSettings(v: unknown): Settings {
  if (v === null) v = {};
  const o = fields(v, 'settings', ['tenants', 'unknown', 'deny_unknown', 'tenant_header', 'subagent_step']);
  const tenants = o.tenants === undefined ? {} : fields(o.tenants, 'tenants');
  return {
    tenants: Object.keys(tenants)
      .sort()
      .map((name) => [name, readTenant(tenants[name], `tenants.${name}`)]),
    unknown: readClass(o.unknown === undefined ? {} : o.unknown, 'unknown'),
    denyUnknown: o.deny_unknown === undefined ? false : bool(o.deny_unknown, 'deny_unknown'),
    tenantHeader: o.tenant_header == null ? undefined : str(o.tenant_header, 'tenant_header'),
    subagentStep: o.subagent_step === undefined ? 0n : int(o.subagent_step, 'subagent_step'),
  };
}

function readTenant(v: unknown, what: string): Tenant {
  const o = fields(v, what, ['api_keys', 'uids', 'priority', 'ceiling', 'deadline_ms']);
  if (o.priority === undefined) throw new Error(`${what}: missing field \`priority\``);
  return {
    apiKeys: list(o.api_keys, `${what}.api_keys`).map((k, i) => str(k, `${what}.api_keys[${i}]`)),
    uids: list(o.uids, `${what}.uids`).map((u, i) => Number(int(u, `${what}.uids[${i}]`, 0n, 0xffff_ffffn))),
    priority: int(o.priority, `${what}.priority`),
    ceiling: o.ceiling == null ? undefined : int(o.ceiling, `${what}.ceiling`),
    deadlineMs: o.deadline_ms == null ? undefined : int(o.deadline_ms, `${what}.deadline_ms`, 0n),
  };
}

function readClass(v: unknown, what: string): Class {
  const o = fields(v, what, ['tenant', 'priority', 'ceiling', 'deadline_ms']);
  return {
    tenant: o.tenant === undefined ? 'default' : str(o.tenant, `${what}.tenant`),
    priority: o.priority === undefined ? 0n : int(o.priority, `${what}.priority`),
    ceiling: o.ceiling == null ? undefined : int(o.ceiling, `${what}.ceiling`),
    deadlineMs: o.deadline_ms == null ? undefined : int(o.deadline_ms, `${what}.deadline_ms`, 0n),
  };
}

/** `v` as a JSON object; with `known`, refusing any other field. */
function fields(v: unknown, what: string, known?: string[]): Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Error(`${what}: expected an object`);
  const o = v as Record<string, unknown>;
  const unexpected = known === undefined ? undefined : Object.keys(o).find((k) => !known.includes(k));
  if (unexpected !== undefined) {
    throw new Error(`${what}: unknown field \`${unexpected}\`, expected one of ${known!.map((k) => `\`${k}\``).join(', ')}`);
  }
  return o;
}

function list(v: unknown, what: string): unknown[] {
  if (v === undefined) return [];
  if (!Array.isArray(v)) throw new Error(`${what}: expected a list`);
  return v;
}

function str(v: unknown, what: string): string {
  if (typeof v !== 'string') throw new Error(`${what}: expected a string`);
  return v;
}

function bool(v: unknown, what: string): boolean {
  if (typeof v !== 'boolean') throw new Error(`${what}: expected true or false`);
  return v;
}

/** An integer, as the WIT's 64-bit `bigint`. JSON numbers past 2^53 are already rounded: refused. */
function int(v: unknown, what: string, min = -(2n ** 63n), max = 2n ** 63n - 1n): bigint {
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) throw new Error(`${what}: expected an integer, got ${JSON.stringify(v)}`);
  const n = BigInt(v);
  if (n < min || n > max) throw new Error(`${what}: ${n} is out of range ${min}..=${max}`);
  return n;
}
