// Who sent a request, as the host names it (`RequestSummary.identity()` reads it), and the checks
// of settings that name callers: the Rust SDK's `check_tenant` and `check_tenant_header`, with
// their texts.

/**
 * The request headers policies see that name a caller on behalf of a router in front (LiteLLM calls
 * with one key for all its callers and forwards theirs): what a `tenant_header` setting may name.
 */
export const TENANT_HEADERS: string[] = ["x-tenant", "openai-organization", "openai-project"];

/** Checks a `tenant_header` setting against `TENANT_HEADERS`: an error message, or null. */
export function checkTenantHeader(header: string): string | null {
  if (TENANT_HEADERS.includes(header)) return null;
  return "tenant_header `" + header + "` is not a header policies see; use one of " + TENANT_HEADERS.join(", ");
}

/**
 * Checks a tenant named in a policy's settings: a tenant's name (`isTenantName`), a hashed key,
 * `uid:<n>`, `anonymous`, or, when the policy has a `tenant_header` (`byHeader`), `header:<value>`,
 * as `RequestSummary.tenantKey` names them. An error message, or null.
 */
export function checkTenant(tenant: string, byHeader: bool): string | null {
  const header = byHeader && tenant.startsWith("header:") && tenant.length > 7;
  if (isTenantName(tenant) || isHashedKey(tenant) || header || tenant == "anonymous" || isUidKey(tenant)) {
    return null;
  }
  return (
    "tenant `" +
    tenant +
    "` is not a tenant's name (as `slotgate key create --tenant` gives it; never a raw key), " +
    "`sha256:<64 hex>` (`slotgate hash-key KEY` prints it), `uid:<n>`, `anonymous` or, with " +
    "tenant_header, `header:<value>`"
  );
}

/**
 * Whether `s` is a tenant's name as slotgate's keys give them: 1 to 64 of `A-Z a-z 0-9 . _ @ -`,
 * not a name slotgate gives callers itself, and not shaped like a raw API key (`sk-…`, `sgk_…`).
 */
export function isTenantName(s: string): bool {
  if (s.length == 0 || s.length > 64 || s == "anonymous" || s == "other") return false;
  if (s.startsWith("sk-") || s.startsWith("sk_") || s.startsWith("sgk_")) return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const alnum = (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a);
    if (!alnum && c != 0x2e && c != 0x5f && c != 0x40 && c != 0x2d) return false;
  }
  return true;
}

/**
 * Whether `s` has the shape of a hashed API key, `sha256:` and 64 lower-case hex digits. Settings
 * that list raw keys never match (the host hashes every key), so validate them with this.
 */
export function isHashedKey(s: string): bool {
  if (s.length != 71 || !s.startsWith("sha256:")) return false;
  for (let i = 7; i < 71; i++) {
    const c = s.charCodeAt(i);
    if (!((c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66))) return false;
  }
  return true;
}

/**
 * Whether `s` is `uid:<n>` with `n` a 32-bit unsigned number (as Rust's `u32::from_str` reads it: an
 * optional `+`, then digits), the way `identity()` names a Unix-socket peer.
 */
export function isUidKey(s: string): bool {
  if (!s.startsWith("uid:")) return false;
  let i = 4;
  if (i < s.length && s.charCodeAt(i) == 0x2b) i++;
  if (i == s.length) return false;
  let n: u64 = 0;
  for (; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x30 || c > 0x39) return false;
    n = n * 10 + <u64>(c - 0x30);
    if (n > <u64>u32.MAX_VALUE) return false;
  }
  return true;
}
