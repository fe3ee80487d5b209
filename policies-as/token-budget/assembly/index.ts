// Token budget, in AssemblyScript: a token bucket per tenant (API key, else uid, else one shared
// anonymous bucket; or a header's value, with `tenant_header`), charged each request's estimated cost up front and settled against the actual
// usage once the response has ended. An empty bucket answers 429 with Retry-After. A port of
// policies/token-budget (Rust), with the same settings and decisions.

import {
  Completion,
  Decision,
  EvaluateInput,
  JsonReader,
  Level,
  Policy,
  RequestSummary,
  Verdict,
  bucketRefund,
  bucketTake,
  checkTenant,
  checkTenantHeader,
  evaluate,
  log,
  onComplete,
  slotgate_abi_version,
  slotgate_alloc,
  validateSettings,
} from "@slotgate/sdk-as/assembly";

export { slotgate_abi_version, slotgate_alloc };

class Budget {
  /** Tokens a full bucket holds: the largest burst, and the largest single request. */
  capacity: u64 = 0;
  /** Tokens added back per second. */
  refillPerSecond: f64 = 0;

  static read(r: JsonReader): Budget {
    const b = new Budget();
    let capacity = false;
    let refill = false;
    if (!r.object()) return b;
    while (r.next()) {
      if (r.is("capacity")) {
        b.capacity = r.u64();
        capacity = true;
      } else if (r.is("refill_per_second")) {
        b.refillPerSecond = r.f64();
        refill = true;
      } else r.unknown();
    }
    if (!capacity) r.fail("missing field `capacity`");
    else if (!refill) r.fail("missing field `refill_per_second`");
    return b;
  }

  check(what: string): string | null {
    if (this.capacity == 0) return what + ": capacity must be positive";
    if (!(isFinite(this.refillPerSecond) && this.refillPerSecond >= 0)) {
      return what + ": refill_per_second must be a number >= 0 (0: a fixed quota)";
    }
    return null;
  }
}

class Settings {
  /** The default budget. */
  budget: Budget = new Budget();
  /** `max_tokens` assumed for a request that sets none. */
  defaultMaxTokens: u64 = 1024;
  /**
   * Budgets of particular tenants, by tenant key: a tenant's name, `sha256:<hex>`, `uid:<n>`,
   * `anonymous`, or `header:<value>` with `tenant_header`.
   */
  tenants: Map<string, Budget> = new Map<string, Budget>();
  /** Key the budget by this request header when present (`header:<value>`); see the Rust original. */
  tenantHeader: string | null = null;

  budgetOf(tenant: string): Budget {
    return this.tenants.has(tenant) ? this.tenants.get(tenant) : this.budget;
  }
}

/** The bucket a request is charged to. */
function tenantOf(request: RequestSummary, s: Settings): string {
  return request.tenantKey(s.tenantHeader);
}

function saturatingAdd(a: u64, b: u64): u64 {
  const sum = a + b;
  return sum < a ? u64.MAX_VALUE : sum;
}

/**
 * What a request is charged up front: its prompt (counted exactly when slotgate could, else
 * estimated) plus the most it may generate.
 */
function estimate(request: RequestSummary, s: Settings): u64 {
  const output = request.hasMaxTokens ? request.maxTokens : s.defaultMaxTokens;
  return saturatingAdd(request.promptTokensBest(), output);
}

/**
 * What a request really used. Nothing if it never reached the upstream (rejected by the queue,
 * timed out waiting); the prompt estimate stands in when the upstream reported no prompt count.
 */
function usage(c: Completion): u64 {
  const reachedUpstream = c.promptTokens > 0 || c.completionTokens > 0 || c.upstreamMs > 0;
  if (!reachedUpstream) return 0;
  const prompt = c.promptTokens == 0 ? c.request.promptTokensBest() : c.promptTokens;
  return saturatingAdd(prompt, c.completionTokens);
}

class TokenBudget extends Policy<Settings> {
  readSettings(r: JsonReader): Settings {
    const s = new Settings();
    let capacity = false;
    let refill = false;
    if (!r.object()) return s;
    while (r.next()) {
      if (r.is("capacity")) {
        s.budget.capacity = r.u64();
        capacity = true;
      } else if (r.is("refill_per_second")) {
        s.budget.refillPerSecond = r.f64();
        refill = true;
      } else if (r.is("default_max_tokens")) s.defaultMaxTokens = r.u64();
      else if (r.is("tenant_header")) s.tenantHeader = r.stringOrNull();
      else if (r.is("tenants")) {
        if (!r.object()) break;
        while (r.next()) {
          const tenant = r.key();
          s.tenants.set(tenant, Budget.read(r));
        }
      } else r.unknown();
    }
    if (!capacity) r.fail("missing field `capacity`");
    else if (!refill) r.fail("missing field `refill_per_second`");
    return s;
  }

  validate(s: Settings): string | null {
    const own = s.budget.check("the default budget");
    if (own !== null) return own;
    const header = s.tenantHeader;
    if (header !== null) {
      const bad = checkTenantHeader(header);
      if (bad !== null) return bad;
    }
    // In key order, as the Rust original (a BTreeMap) reports the first problem.
    const tenants = s.tenants.keys().sort();
    for (let i = 0; i < tenants.length; i++) {
      const tenant = tenants[i];
      const unknown = checkTenant(tenant, header !== null);
      if (unknown !== null) return unknown;
      const bad = s.tenants.get(tenant).check("tenant `" + tenant + "`");
      if (bad !== null) return bad;
    }
    return null;
  }

  evaluate(input: EvaluateInput, s: Settings): Decision {
    const tenant = tenantOf(input.request, s);
    const budget = s.budgetOf(tenant);
    const cost = estimate(input.request, s);
    if (cost > budget.capacity) {
      return Decision.forbidden(
        "this request may use " +
          cost.toString() +
          " tokens, more than the budget of " +
          budget.capacity.toString() +
          " holds: lower max_tokens",
      );
    }
    const wait = bucketTake(tenant, <f64>budget.capacity, budget.refillPerSecond, <f64>cost);
    if (wait > 0) {
      // Infinite with no refill: a spent fixed quota, when retrying will not help.
      return Decision.tooManyRequests("token budget exhausted", isFinite(wait) ? <i64>Math.max(Math.ceil(wait), 1) : -1);
    }
    const d = Decision.allow();
    d.cost = cost;
    return d;
  }

  onComplete(c: Completion, s: Settings): void {
    // slotgate calls this only for requests this policy allowed (and so charged), including those
    // a later policy in the chain denied: then nothing was used and the whole estimate comes back.
    if (c.decision.verdict == Verdict.Deny) return;
    const tenant = tenantOf(c.request, s);
    const budget = s.budgetOf(tenant);
    const charged = estimate(c.request, s);
    if (charged > budget.capacity) return;
    // Negative when the estimate was low (no max_tokens, short default): the bucket goes into debt
    // and the tenant's next request waits for it.
    const refund = <f64>charged - <f64>usage(c);
    if (refund != 0) {
      const level = bucketRefund(tenant, <f64>budget.capacity, budget.refillPerSecond, refund);
      log(
        Level.Debug,
        tenant + ": charged " + charged.toString() + ", settled by " + refund.toString() + ", level " + level.toString(),
      );
    }
  }
}

const POLICY = new TokenBudget();

export function slotgate_evaluate(ptr: i32, len: i32): i64 {
  return evaluate(POLICY, ptr, len);
}

export function slotgate_validate_settings(ptr: i32, len: i32): i64 {
  return validateSettings(POLICY, ptr, len);
}

export function slotgate_on_complete(ptr: i32, len: i32): i64 {
  return onComplete(POLICY, ptr, len);
}
