/**
 * Who sent a request, as the host names it: slotgate decides the caller's identity once per request
 * and gives it to every policy in its header `x-slotgate-caller` (docs/policy-abi.md); a policy only
 * reads it, so policies in any language sharing host state (buckets, quotas) agree on whose it is.
 */

import type { Request } from 'slotgate:policy/types@2.0.0';

/**
 * Where the host lists the tenant it named the caller (`--client-auth keys`, docs/keys.md): contract
 * 2.0.0 has no field for it, and a client cannot send a header of this name to a policy.
 */
export const TENANT_NAMED_HEADER = 'x-slotgate-tenant';

/** Where the host gives the caller's identity, always: contract 2.0.0 has no field for it. */
export const CALLER_HEADER = 'x-slotgate-caller';

/**
 * The caller's identity as the host named it, a stable key for settings and host state: the tenant
 * slotgate named, else the API key's `sha256:<hex>`, else `uid:<n>` of the Unix-socket peer, else
 * `anonymous`.
 */
export function identity(request: Pick<Request, 'headers'>): string {
  return header(request, CALLER_HEADER) || 'anonymous';
}

/**
 * Whether `s` has the shape of a hashed API key, `sha256:` and 64 lower-case hex digits. Settings
 * that list raw keys never match (the host hashes every key), so validate them with this.
 */
export function isHashedKey(s: string): boolean {
  return /^sha256:[0-9a-f]{64}$/.test(s);
}

/**
 * The request headers policies see that name a caller on behalf of a router in front (LiteLLM calls
 * with one key for all its callers and forwards theirs): what a `tenant_header` setting may name.
 */
export const TENANT_HEADERS: readonly string[] = ['x-tenant', 'openai-organization', 'openai-project'];

/** Checks a `tenant_header` setting against {@link TENANT_HEADERS}: an error message, or undefined. */
export function checkTenantHeader(header: string): string | undefined {
  if (TENANT_HEADERS.includes(header)) return undefined;
  return `tenant_header \`${header}\` is not a header policies see; use one of ${TENANT_HEADERS.join(', ')}`;
}

/** The value of the request header `name` (lower-case, as the host gives them), if sent. */
export function header(request: Pick<Request, 'headers'>, name: string): string | undefined {
  return request.headers.find(([n]) => n === name)?.[1];
}

/**
 * Whom a budget or quota is kept for: `header:<value>` of `tenantHeader` when the request carries it
 * (not empty), else its {@link identity}. Any client that reaches slotgate can set the header: use it
 * only when a router in front is the only caller.
 */
export function tenantKey(request: Pick<Request, 'headers'>, tenantHeader?: string): string {
  const value = tenantHeader === undefined ? undefined : header(request, tenantHeader);
  return value ? `header:${value}` : identity(request);
}

/** The exact prompt tokens when slotgate counted them, else the estimate. */
export function promptTokensBest(request: Pick<Request, 'promptTokens' | 'promptTokensEstimate'>): bigint {
  return request.promptTokens ?? request.promptTokensEstimate;
}
