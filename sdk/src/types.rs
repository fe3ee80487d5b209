//! Wire types: the request summary a policy evaluates and the decision it returns (ABI v1).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The ABI version these types describe.
pub const ABI_VERSION: u32 = 1;

/// The kernel-reported identity of the process on the other end of a Unix socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// Process id, when the kernel reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
}

/// How busy the sidecar is at the moment the request is evaluated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    /// Requests waiting for a slot.
    pub depth: usize,
    /// Queue capacity.
    pub capacity: usize,
    /// Requests holding a slot.
    pub in_flight: usize,
    /// Estimated wait for a request queued now, in seconds.
    pub estimated_wait_seconds: f64,
}

/// What a policy knows about one request. Built by the sidecar after the body was read and parsed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestSummary {
    /// HTTP method, e.g. `POST`.
    pub method: String,
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// The body's `model` field, when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The body's `stream` field (false when absent).
    #[serde(default)]
    pub stream: bool,
    /// The most tokens llama-server will generate: the body's `n_predict` when it holds a number (it
    /// overrides the others in llama-server), else the larger of `max_completion_tokens` and
    /// `max_tokens`. Absent when the body sets no bound (or a negative one, meaning the server's
    /// default). See docs/policy-abi.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Characters of prompt text (all message contents, or the prompt / input). slotgate always
    /// sends it; 0 when absent (a hand-written input to `slotgate policy eval`).
    #[serde(default)]
    pub prompt_chars: u64,
    /// Estimated prompt tokens (characters / 4, rounded up); 0 when absent, as `prompt_chars`.
    #[serde(default)]
    pub prompt_tokens_estimate: u64,
    /// The exact prompt tokens, counted by the served model's own template and tokenizer (as
    /// llama-server will count them in `usage.prompt_tokens`); absent when they could not be counted
    /// (see [`RequestSummary::prompt_tokens_best`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// Tokens reserved for the request: prompt + the most it may generate within its slot's context,
    /// `prompt + min(max_tokens or the server's default, n_ctx_slot - prompt)`. Absent when the slot's
    /// context size is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_tokens: Option<u64>,
    /// The client's priority hint from the body's `priority` field (lower is more urgent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_hint: Option<i64>,
    /// How long the client's answer is worth waiting for, in milliseconds from arrival: its
    /// `X-Slotgate-Deadline-Ms` header (capped by the queue timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Credentials of the Unix-socket peer; absent on TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<Peer>,
    /// The bearer token of `Authorization`, never raw: `sha256:<hex>` of the key. Policies map keys to
    /// tenants by their hash (`slotgate hash-key KEY` prints it), so no policy, log line or metric label
    /// ever holds a usable credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Allow-listed request headers, lower-cased names.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Queue state when the request arrived.
    #[serde(default)]
    pub queue: QueueSnapshot,
    /// The API the request speaks, when it takes a slot (`chat`, `messages`, `responses`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dialect: Option<String>,
    /// Size of the request body in bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub body_bytes: u64,
    /// The session the request belongs to, when its client names one: `X-Session-Id`, or an
    /// agent's own header for it (Claude Code's, the Codex CLI's, opencode's; docs/sessions.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The agent that sent it, when its client names one: `X-Agent-Id`, or an agent's own header
    /// (a Claude Code subagent's id, a Codex thread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The agent that started the one that sent it: present only for a subagent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_agent_id: Option<String>,
    /// The `X-Conversation-Id` header, when sent (a resumable answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
    /// The tenant slotgate itself named the caller (`--client-auth keys`: the key's tenant, or a
    /// mapped Unix peer's; docs/keys.md). When set, it is the caller's [`Identity`](crate::Identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The caller's identity, as the host named it once for the whole request: the tenant above,
    /// else `api_key`, else `uid:<n>` of `peer`, else `anonymous` (docs/policy-abi.md). Policies
    /// read it through [`RequestSummary::identity`]; none derives it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// The team of the key slotgate let the caller in with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The id of that key (never its secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// That key's labels (`key create --label K=V`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub key_labels: BTreeMap<String, String>,
    /// What the model it is booked under costs (the operator's `[prices]`), when priced: a money
    /// budget estimates its charge from it, and settles it by [`Completion::cost`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
}

/// Prices per million tokens, in `currency` (docs/spend.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Price {
    /// ISO 4217: `EUR`, `USD`, ...
    pub currency: String,
    /// A prompt token llama-server processed.
    pub input: f64,
    /// A prompt token it read from its prompt cache.
    pub cached_input: f64,
    /// A generated token.
    pub output: f64,
}

impl Price {
    /// What `prompt` tokens (none of them cached) and `output` generated ones cost, in the
    /// currency: the most a request may cost before llama-server says what it reused.
    pub fn most(&self, prompt: u64, output: u64) -> f64 {
        (prompt as f64 * self.input + output as f64 * self.output) / 1e6
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the enforced policies before this one in a chain decided, combined as the chain combines
/// them: the first tenant named, the least urgent priority, the largest cost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Earlier {
    /// Enforced policies that allowed the request before this one.
    #[serde(default)]
    pub policies: u32,
    /// The tenant the first of them named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The least urgent priority any of them set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// The largest cost any of them set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
}

impl Earlier {
    /// Whether no earlier policy allowed the request (the first policy of a chain).
    pub fn is_empty(&self) -> bool {
        self.policies == 0
    }

    /// Adds an allowing decision of the next enforced policy.
    pub fn add(&mut self, d: &Decision) {
        self.policies += 1;
        if self.tenant.is_none() {
            self.tenant.clone_from(&d.tenant);
        }
        self.priority = self.priority.max(d.priority);
        self.cost = self.cost.max(d.cost);
    }
}

/// Allow or deny.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Admit the request (it may still queue).
    #[default]
    Allow,
    /// Reject it with [`Decision::status`].
    Deny,
}

/// Request changes a policy may ask for: a fixed, safe set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mutations {
    /// Lower `max_tokens`, `max_completion_tokens` and `n_predict`, every one present, to at most
    /// this value (setting `max_tokens`, or `n_predict` on `/completion`, when none is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_max_tokens: Option<u64>,
    /// Force `cache_prompt: false`.
    #[serde(default)]
    pub disable_prompt_cache: bool,
    /// Remove `id_slot` so a tenant cannot pick another tenant's slot cache.
    #[serde(default)]
    pub strip_id_slot: bool,
    /// Extra response headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub response_headers: BTreeMap<String, String>,
}

/// A policy's answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Allow or deny.
    #[serde(default)]
    pub verdict: Verdict,
    /// HTTP status of a denial: 403 or 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Message of a denial, shown to the client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Retry-After of a denial, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// Cost of the request in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// Scheduling priority (lower is served earlier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Tenant key for fair scheduling. Absent: the caller's identity (API key hash, else `uid:<n>`,
    /// else `anonymous`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The request's deadline in milliseconds from its arrival: it must start within it, or leave
    /// the queue (504 `deadline_exceeded`) without reaching llama-server. The smallest any policy
    /// and the client's header set wins, capped by the queue timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// The tenant's share of the slots relative to other tenants in fair scheduling (a positive
    /// number; absent: 1). A tenant of weight 2 is served about twice the tokens of a tenant of
    /// weight 1 while both wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// The most requests of this request's tenant in service at once while this one waits for its
    /// slot (at least 1): it starts only while fewer of its tenant's requests hold slots. The
    /// smallest any policy and the operator's settings give wins (docs/scheduling.md, "Per-tenant
    /// concurrency cap").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_service: Option<u32>,
    /// The most requests of this request's tenant waiting in the queue when it arrives: beyond it,
    /// it is refused at once (429 `tenant_busy`). The smallest any policy and the settings give
    /// wins; 0: it may not wait at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting: Option<u32>,
    /// Request changes.
    #[serde(default)]
    pub mutations: Mutations,
    /// The error code of a denial, for the client to switch on (OpenAI's `error.code`; the
    /// `error.type` stays the API's own): lowercase letters, digits and `_`, at most 64. Absent:
    /// `policy_denied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether the client should retry a denial: sent as `x-should-retry`, which the OpenAI and
    /// Anthropic SDKs obey before anything else (`false`: they raise at once instead of retrying
    /// a 429 on their own). Absent: no header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub should_retry: Option<bool>,
    /// The caller's allowance, sent on the answer (allowed or denied) as rate-limit headers in the
    /// names of the API it speaks (`x-ratelimit-*`, `anthropic-ratelimit-*`). In a chain, the
    /// allowance with the least left wins, for requests and for tokens each.
    #[serde(default, skip_serializing_if = "RateLimits::is_empty")]
    pub rate_limits: RateLimits,
}

/// A caller's allowance of requests and of tokens, as a policy reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RateLimits {
    /// Requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<RateLimit>,
    /// Tokens (input and output together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<RateLimit>,
}

impl RateLimits {
    /// Neither is reported.
    pub fn is_empty(&self) -> bool {
        self.requests.is_none() && self.tokens.is_none()
    }
}

/// One allowance: how much, how much is left, and when it is whole again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RateLimit {
    /// The most the window or bucket allows.
    pub limit: u64,
    /// What is left now (after this request's charge).
    pub remaining: u64,
    /// Unix milliseconds when it is whole again (a calendar window's end; a bucket full again).
    pub reset_unix_ms: u64,
}

/// What `slotgate_evaluate` receives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvaluateInput {
    /// Always [`ABI_VERSION`].
    pub abi: u32,
    /// The request.
    pub request: RequestSummary,
    /// The policy's settings as configured (`null` when none).
    #[serde(default)]
    pub settings: serde_json::Value,
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub now_unix_ms: u64,
    /// What the policies before this one in the chain decided (absent for the first).
    #[serde(default, skip_serializing_if = "Earlier::is_empty")]
    pub earlier: Earlier,
}

/// What `slotgate_validate_settings` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingsValidation {
    /// Whether the settings are usable.
    pub valid: bool,
    /// Why not, for the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The policy decides on the exact prompt count: slotgate counts every request before the
    /// chain runs, instead of only those that wait (see `Policy::needs_prompt_tokens`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_prompt_tokens: bool,
    /// The policy kept its parsed settings in its memory: slotgate snapshots the instance after this
    /// call, starts every later instance from the snapshot, and leaves `settings` out of the inputs
    /// of `evaluate` and `on_complete` (the Rust SDK does this for every policy).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keeps_settings: bool,
}

/// What `slotgate_on_complete` receives once the response has ended: what really happened.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Always [`ABI_VERSION`].
    pub abi: u32,
    /// The request as it was evaluated.
    pub request: RequestSummary,
    /// This policy's own decision (always an allow: `on_complete` runs only for requests the policy
    /// allowed).
    pub decision: Decision,
    /// What the chain decided: the combined allow, or the deny of a later policy.
    #[serde(default)]
    pub chain_decision: Decision,
    /// The policy's settings.
    #[serde(default)]
    pub settings: serde_json::Value,
    /// HTTP status sent to the client (0 if the client left before one was sent).
    pub status: u16,
    /// How the request ended: the `outcome` label (`ok`, `client_gone`, ...).
    pub outcome: String,
    /// Prompt tokens the upstream reported in `usage`, else in llama-server's `timings` (`prompt_n` +
    /// `cache_n`); 0 if none.
    pub prompt_tokens: u64,
    /// Completion tokens the upstream reported, or generated before the client left.
    pub completion_tokens: u64,
    /// Of `prompt_tokens`, those llama-server read from its prompt cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// What a cached prompt token counts for in token budgets, as in fair scheduling (the
    /// operator's `--cached-token-weight`; `None`: 1, in full): see [`Completion::counted_tokens`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_weight: Option<f64>,
    /// What the request cost, in [`RequestSummary::price`]'s currency, as booked in the usage
    /// ledger; `None` when its model is not priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// Time spent waiting for a slot.
    pub queue_wait_ms: u64,
    /// Time from forwarding to the end of the response.
    pub upstream_ms: u64,
    /// The evaluation's `now_unix_ms`: the time the charge was made, so that settling it goes to
    /// the calendar window it was taken from ([`host::quota_refund`](crate::host::quota_refund)).
    #[serde(default)]
    pub evaluated_unix_ms: u64,
}

impl Completion {
    /// The tokens the request counts for in a token budget: its new prompt tokens and its output
    /// in full, its cached prompt tokens at [`Completion::cached_weight`].
    pub fn counted_tokens(&self, prompt_tokens: u64) -> u64 {
        let cached = self.cached_tokens.min(prompt_tokens);
        let weight = self.cached_weight.unwrap_or(1.0).clamp(0.0, 1.0);
        (prompt_tokens - cached)
            .saturating_add(self.completion_tokens)
            .saturating_add((cached as f64 * weight).round() as u64)
    }
}

impl Decision {
    /// A plain allow with no changes.
    pub fn allow() -> Self {
        Self::default()
    }

    /// A denial with `status` (the host accepts 403 and 429) and a message for the client.
    pub fn deny(status: u16, message: impl Into<String>) -> Self {
        Decision {
            verdict: Verdict::Deny,
            status: Some(status),
            message: Some(message.into()),
            ..Self::default()
        }
    }

    /// A 403: this request will never be admitted as it is.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::deny(403, message)
    }

    /// A 429: try again later, after `retry_after_seconds` when known.
    pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: Option<u64>) -> Self {
        Decision {
            retry_after_seconds,
            ..Self::deny(429, message)
        }
    }

    /// A 429 for a spent quota (`quota_exceeded`), not to be retried by the client's SDK before
    /// `retry_after_seconds` (the window's end): retrying at once could only be refused again.
    pub fn quota_exceeded(message: impl Into<String>, retry_after_seconds: u64) -> Self {
        Decision {
            reason: Some("quota_exceeded".into()),
            should_retry: Some(false),
            ..Self::too_many_requests(message, Some(retry_after_seconds))
        }
    }

    /// Whether the verdict is [`Verdict::Allow`].
    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allow
    }
}

impl SettingsValidation {
    /// Usable settings.
    pub fn ok() -> Self {
        SettingsValidation {
            valid: true,
            message: None,
            needs_prompt_tokens: false,
            keeps_settings: false,
        }
    }

    /// Unusable settings, and why.
    pub fn invalid(message: impl Into<String>) -> Self {
        SettingsValidation {
            valid: false,
            message: Some(message.into()),
            needs_prompt_tokens: false,
            keeps_settings: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_round_trips_and_defaults_to_allow() {
        let d: Decision = serde_json::from_str("{}").unwrap();
        assert_eq!(d.verdict, Verdict::Allow);
        let deny = Decision {
            verdict: Verdict::Deny,
            status: Some(429),
            retry_after_seconds: Some(3),
            ..Decision::default()
        };
        let text = serde_json::to_string(&deny).unwrap();
        assert!(text.contains(r#""verdict":"deny""#), "{text}");
        assert_eq!(serde_json::from_str::<Decision>(&text).unwrap(), deny);
    }

    #[test]
    fn summary_omits_absent_peer() {
        let s = RequestSummary {
            method: "POST".into(),
            path: "/v1/completions".into(),
            ..RequestSummary::default()
        };
        let v = serde_json::to_value(&s).unwrap();
        assert!(v.get("peer").is_none());
        assert_eq!(v["prompt_chars"], 0);
    }
}
