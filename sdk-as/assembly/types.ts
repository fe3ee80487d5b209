// Wire types of ABI v1 (docs/policy-abi.md), mirroring sdk/src/types.rs: the request a policy
// evaluates, the decision it answers, and what `on_complete` learns. Field names are camelCase
// here and snake_case on the wire (`maxTokens` is `max_tokens`). An `Option` of the Rust types is a
// value with a `has…` flag beside it (AssemblyScript has no nullable numbers); on a `Decision` the
// setter raises the flag (`d.cost = 600`).

import { JsonReader, JsonWriter } from "./json";

/** The ABI version these types describe. */
export const ABI_VERSION: u32 = 1;

/** The kernel-reported identity of the process on the other end of a Unix socket. */
export class Peer {
  uid: u32 = 0;
  gid: u32 = 0;
  /** Process id, when the kernel reports one (`hasPid`). */
  pid: i32 = 0;
  hasPid: bool = false;

  static read(r: JsonReader): Peer {
    const p = new Peer();
    if (!r.object()) return p;
    while (r.next()) {
      if (r.is("uid")) p.uid = <u32>r.u64();
      else if (r.is("gid")) p.gid = <u32>r.u64();
      else if (r.is("pid")) {
        if (!r.null()) {
          p.pid = <i32>r.i64();
          p.hasPid = true;
        }
      } else r.skip();
    }
    return p;
  }
}

/** How busy the sidecar is at the moment the request is evaluated. */
export class QueueSnapshot {
  /** Requests waiting for a slot. */
  depth: u64 = 0;
  /** Queue capacity. */
  capacity: u64 = 0;
  /** Requests holding a slot. */
  inFlight: u64 = 0;
  /** Estimated wait for a request queued now, in seconds. */
  estimatedWaitSeconds: f64 = 0;

  static read(r: JsonReader): QueueSnapshot {
    const q = new QueueSnapshot();
    if (!r.object()) return q;
    while (r.next()) {
      if (r.is("depth")) q.depth = r.u64();
      else if (r.is("capacity")) q.capacity = r.u64();
      else if (r.is("in_flight")) q.inFlight = r.u64();
      else if (r.is("estimated_wait_seconds")) q.estimatedWaitSeconds = r.f64();
      else r.skip();
    }
    return q;
  }
}

/** What a policy knows about one request (`request` in the evaluate input). */
export class RequestSummary {
  /** HTTP method, e.g. `POST`. */
  method: string = "";
  /** Request path, e.g. `/v1/chat/completions`. */
  path: string = "";
  /** The body's `model` field, when present; null otherwise. */
  model: string | null = null;
  /** The body's `stream` field (false when absent). */
  stream: bool = false;
  /**
   * The most tokens llama-server will generate (`n_predict`, else the larger of
   * `max_completion_tokens` and `max_tokens`); `hasMaxTokens` is false when the body sets no bound.
   */
  maxTokens: u64 = 0;
  hasMaxTokens: bool = false;
  /** Characters of prompt text. */
  promptChars: u64 = 0;
  /** Estimated prompt tokens (characters / 4, rounded up). */
  promptTokensEstimate: u64 = 0;
  /** The exact prompt tokens, when slotgate counted them (`hasPromptTokens`). */
  promptTokens: u64 = 0;
  hasPromptTokens: bool = false;
  /** Tokens reserved for the request, when the slot's context size is known (`hasReservedTokens`). */
  reservedTokens: u64 = 0;
  hasReservedTokens: bool = false;
  /** The client's priority hint (`hasPriorityHint`); lower is more urgent. */
  priorityHint: i64 = 0;
  hasPriorityHint: bool = false;
  /** The client's own deadline, milliseconds from arrival (`hasDeadlineMs`; its
   * `X-Slotgate-Deadline-Ms`). */
  deadlineMs: u64 = 0;
  hasDeadlineMs: bool = false;
  /** Credentials of the Unix-socket peer; null on TCP. */
  peer: Peer | null = null;
  /** The bearer token as `sha256:<hex>`, never raw; null without one. */
  apiKey: string | null = null;
  /** The tenant slotgate itself named the caller (`--client-auth keys`, docs/keys.md), if it did. */
  tenant: string | null = null;
  /** The caller's identity as the host named it (read it through `identity()`). */
  caller: string | null = null;
  /** Allow-listed request headers, lower-cased names. */
  headers: Map<string, string> = new Map<string, string>();
  /** Queue state when the request arrived. */
  queue: QueueSnapshot = new QueueSnapshot();

  /** The exact prompt tokens when slotgate could count them, else the estimate. */
  promptTokensBest(): u64 {
    return this.hasPromptTokens ? this.promptTokens : this.promptTokensEstimate;
  }

  /**
   * The caller's identity as the host named it (`caller`), a stable key: the tenant slotgate
   * named, else the API key's `sha256:<hex>`, else `uid:<n>` of the Unix-socket peer, else
   * `anonymous` (`RequestSummary::identity()` in the Rust SDK).
   */
  identity(): string {
    const caller = this.caller;
    return caller !== null ? caller : "anonymous";
  }

  /**
   * Whom a budget or quota is kept for: `header:<value>` of `tenantHeader` when the request
   * carries it (not empty), else its `identity()`. Any client that reaches slotgate can set the
   * header: use it only when a router in front is the only caller.
   */
  tenantKey(tenantHeader: string | null): string {
    if (tenantHeader !== null && this.headers.has(tenantHeader)) {
      const value = this.headers.get(tenantHeader);
      if (value.length > 0) return "header:" + value;
    }
    return this.identity();
  }

  static read(r: JsonReader): RequestSummary {
    const s = new RequestSummary();
    if (!r.object()) return s;
    while (r.next()) {
      if (r.is("method")) s.method = r.string();
      else if (r.is("path")) s.path = r.string();
      else if (r.is("model")) s.model = r.stringOrNull();
      else if (r.is("stream")) s.stream = r.null() ? false : r.bool();
      else if (r.is("max_tokens")) {
        if (!r.null()) {
          s.maxTokens = r.u64();
          s.hasMaxTokens = true;
        }
      } else if (r.is("prompt_chars")) s.promptChars = r.u64();
      else if (r.is("prompt_tokens_estimate")) s.promptTokensEstimate = r.u64();
      else if (r.is("prompt_tokens")) {
        if (!r.null()) {
          s.promptTokens = r.u64();
          s.hasPromptTokens = true;
        }
      } else if (r.is("reserved_tokens")) {
        if (!r.null()) {
          s.reservedTokens = r.u64();
          s.hasReservedTokens = true;
        }
      } else if (r.is("priority_hint")) {
        if (!r.null()) {
          s.priorityHint = r.i64();
          s.hasPriorityHint = true;
        }
      } else if (r.is("deadline_ms")) {
        if (!r.null()) {
          s.deadlineMs = r.u64();
          s.hasDeadlineMs = true;
        }
      } else if (r.is("peer")) s.peer = r.null() ? null : Peer.read(r);
      else if (r.is("api_key")) s.apiKey = r.stringOrNull();
      else if (r.is("tenant")) s.tenant = r.stringOrNull();
      else if (r.is("caller")) s.caller = r.stringOrNull();
      else if (r.is("headers")) {
        if (!r.null()) s.headers = r.stringMap();
      } else if (r.is("queue")) {
        if (!r.null()) s.queue = QueueSnapshot.read(r);
      } else r.skip();
    }
    return s;
  }
}

/** Allow or deny. */
export enum Verdict {
  Allow,
  Deny,
}

/** Request changes a policy may ask for: a fixed, safe set. */
export class Mutations {
  private _capMaxTokens: u64 = 0;
  private _hasCapMaxTokens: bool = false;
  /** Force `cache_prompt: false`. */
  disablePromptCache: bool = false;
  /** Remove `id_slot`, so a tenant cannot pick another tenant's slot cache. */
  stripIdSlot: bool = false;
  /** Extra response headers. */
  responseHeaders: Map<string, string> = new Map<string, string>();

  /** Lower `max_tokens`, `max_completion_tokens` and `n_predict` to at most this (`hasCapMaxTokens`). */
  get capMaxTokens(): u64 {
    return this._capMaxTokens;
  }
  set capMaxTokens(v: u64) {
    this._capMaxTokens = v;
    this._hasCapMaxTokens = true;
  }
  get hasCapMaxTokens(): bool {
    return this._hasCapMaxTokens;
  }

  get isEmpty(): bool {
    return !this._hasCapMaxTokens && !this.disablePromptCache && !this.stripIdSlot && this.responseHeaders.size == 0;
  }

  write(w: JsonWriter): void {
    w.begin();
    if (this._hasCapMaxTokens) {
      w.key("cap_max_tokens");
      w.u64(this._capMaxTokens);
    }
    if (this.disablePromptCache) {
      w.key("disable_prompt_cache");
      w.bool(true);
    }
    if (this.stripIdSlot) {
      w.key("strip_id_slot");
      w.bool(true);
    }
    if (this.responseHeaders.size > 0) {
      w.key("response_headers");
      w.begin();
      const keys = this.responseHeaders.keys();
      for (let i = 0; i < keys.length; i++) {
        w.keyString(keys[i]);
        w.str(this.responseHeaders.get(keys[i]));
      }
      w.end();
    }
    w.end();
  }

  static read(r: JsonReader): Mutations {
    const m = new Mutations();
    if (!r.object()) return m;
    while (r.next()) {
      if (r.is("cap_max_tokens")) {
        if (!r.null()) m.capMaxTokens = r.u64();
      } else if (r.is("disable_prompt_cache")) m.disablePromptCache = r.bool();
      else if (r.is("strip_id_slot")) m.stripIdSlot = r.bool();
      else if (r.is("response_headers")) m.responseHeaders = r.stringMap();
      else r.skip();
    }
    return m;
  }
}

/**
 * A policy's answer. `Decision.allow()`, `Decision.forbidden(msg)` and
 * `Decision.tooManyRequests(msg, seconds)` cover most; set `cost`, `priority`, `tenant`, `weight`
 * and `mutations` on an allow to steer the queue.
 */
export class Decision {
  verdict: Verdict = Verdict.Allow;
  /** HTTP status of a denial: 403 or 429 (0: left out, which the host reads as 403). */
  status: u16 = 0;
  /** Message of a denial, shown to the client. */
  message: string | null = null;
  /** Tenant key for fair scheduling; null: the caller's identity. */
  tenant: string | null = null;
  /** Request changes. */
  mutations: Mutations = new Mutations();
  private _retryAfterSeconds: u64 = 0;
  private _hasRetryAfterSeconds: bool = false;
  private _cost: u64 = 0;
  private _hasCost: bool = false;
  private _priority: i64 = 0;
  private _hasPriority: bool = false;
  private _weight: f64 = 1;
  private _hasWeight: bool = false;
  private _deadlineMs: u64 = 0;
  private _hasDeadlineMs: bool = false;

  /** A plain allow with no changes. */
  static allow(): Decision {
    return new Decision();
  }

  /** A denial with `status` (the host accepts 403 and 429) and a message for the client. */
  static deny(status: u16, message: string): Decision {
    const d = new Decision();
    d.verdict = Verdict.Deny;
    d.status = status;
    d.message = message;
    return d;
  }

  /** A 403: this request will never be admitted as it is. */
  static forbidden(message: string): Decision {
    return Decision.deny(403, message);
  }

  /** A 429: try again later, after `retryAfterSeconds` when it is not negative. */
  static tooManyRequests(message: string, retryAfterSeconds: i64 = -1): Decision {
    const d = Decision.deny(429, message);
    if (retryAfterSeconds >= 0) d.retryAfterSeconds = <u64>retryAfterSeconds;
    return d;
  }

  get isAllowed(): bool {
    return this.verdict == Verdict.Allow;
  }

  /** Retry-After of a denial, in seconds (`hasRetryAfterSeconds`). */
  get retryAfterSeconds(): u64 {
    return this._retryAfterSeconds;
  }
  set retryAfterSeconds(v: u64) {
    this._retryAfterSeconds = v;
    this._hasRetryAfterSeconds = true;
  }
  get hasRetryAfterSeconds(): bool {
    return this._hasRetryAfterSeconds;
  }

  /** Cost of the request in tokens (`hasCost`; left out: estimate + max_tokens). */
  get cost(): u64 {
    return this._cost;
  }
  set cost(v: u64) {
    this._cost = v;
    this._hasCost = true;
  }
  get hasCost(): bool {
    return this._hasCost;
  }

  /** Scheduling priority, lower served earlier (`hasPriority`; left out: the client's hint). */
  get priority(): i64 {
    return this._priority;
  }
  set priority(v: i64) {
    this._priority = v;
    this._hasPriority = true;
  }
  get hasPriority(): bool {
    return this._hasPriority;
  }

  /** The tenant's share relative to others, at least 1e-6 (`hasWeight`; left out: 1). */
  get weight(): f64 {
    return this._weight;
  }
  set weight(v: f64) {
    this._weight = v;
    this._hasWeight = true;
  }
  get hasWeight(): bool {
    return this._hasWeight;
  }

  /** The request's deadline, milliseconds from arrival (`hasDeadlineMs`): it must start within it
   * or leave the queue. The shortest of the policies' and the client's wins. */
  get deadlineMs(): u64 {
    return this._deadlineMs;
  }
  set deadlineMs(v: u64) {
    this._deadlineMs = v;
    this._hasDeadlineMs = true;
  }
  get hasDeadlineMs(): bool {
    return this._hasDeadlineMs;
  }

  /** The decision as ABI v1 JSON. */
  write(w: JsonWriter): void {
    w.begin();
    w.key("verdict");
    w.str(this.verdict == Verdict.Deny ? "deny" : "allow");
    if (this.status != 0) {
      w.key("status");
      w.u64(this.status);
    }
    const message = this.message;
    if (message !== null) {
      w.key("message");
      w.str(message);
    }
    if (this._hasRetryAfterSeconds) {
      w.key("retry_after_seconds");
      w.u64(this._retryAfterSeconds);
    }
    if (this._hasCost) {
      w.key("cost");
      w.u64(this._cost);
    }
    if (this._hasPriority) {
      w.key("priority");
      w.i64(this._priority);
    }
    const tenant = this.tenant;
    if (tenant !== null) {
      w.key("tenant");
      w.str(tenant);
    }
    if (this._hasWeight) {
      w.key("weight");
      w.f64(this._weight);
    }
    if (this._hasDeadlineMs) {
      w.key("deadline_ms");
      w.u64(this._deadlineMs);
    }
    if (!this.mutations.isEmpty) {
      w.key("mutations");
      this.mutations.write(w);
    }
    w.end();
  }

  static read(r: JsonReader): Decision {
    const d = new Decision();
    if (!r.object()) return d;
    while (r.next()) {
      if (r.is("verdict")) {
        const v = r.string();
        if (v == "deny") d.verdict = Verdict.Deny;
        else if (v != "allow") r.invalid("expected `allow` or `deny`");
      } else if (r.is("status")) {
        if (!r.null()) d.status = <u16>r.u64();
      } else if (r.is("message")) d.message = r.stringOrNull();
      else if (r.is("retry_after_seconds")) {
        if (!r.null()) d.retryAfterSeconds = r.u64();
      } else if (r.is("cost")) {
        if (!r.null()) d.cost = r.u64();
      } else if (r.is("priority")) {
        if (!r.null()) d.priority = r.i64();
      } else if (r.is("tenant")) d.tenant = r.stringOrNull();
      else if (r.is("weight")) {
        if (!r.null()) d.weight = r.f64();
      } else if (r.is("deadline_ms")) {
        if (!r.null()) d.deadlineMs = r.u64();
      } else if (r.is("mutations")) {
        if (!r.null()) d.mutations = Mutations.read(r);
      } else r.skip();
    }
    return d;
  }
}

/** What `slotgate_evaluate` receives, the settings aside (the SDK hands them over parsed). */
export class EvaluateInput {
  /** Always `ABI_VERSION`. */
  abi: u32 = 0;
  /** The request. */
  request: RequestSummary = new RequestSummary();
  /** Wall-clock time, milliseconds since the Unix epoch. */
  nowUnixMs: u64 = 0;
}

/** What `slotgate_on_complete` receives once the response has ended: what really happened. */
export class Completion {
  /** Always `ABI_VERSION`. */
  abi: u32 = 0;
  /** The request as it was evaluated. */
  request: RequestSummary = new RequestSummary();
  /** This policy's own decision (an allow: `on_complete` runs only for requests it allowed). */
  decision: Decision = new Decision();
  /** What the chain decided: the combined allow, or the deny of a later policy. */
  chainDecision: Decision = new Decision();
  /** HTTP status sent to the client (0 if the client left before one was sent). */
  status: u16 = 0;
  /** How the request ended: the `outcome` label (`ok`, `client_gone`, `policy_denied`, ...). */
  outcome: string = "";
  /** Prompt tokens the upstream reported (usage, else llama-server's timings); 0 if none. */
  promptTokens: u64 = 0;
  /** Completion tokens the upstream reported, or generated before the client left. */
  completionTokens: u64 = 0;
  /** Time spent waiting for a slot. */
  queueWaitMs: u64 = 0;
  /** Time from forwarding to the end of the response. */
  upstreamMs: u64 = 0;
}
