//! One record per request: its outcome, status, timings and peer. Counted and logged exactly once, when
//! the record drops, so a request whose future is cancelled (client gone) is still accounted for.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use slotgate_sdk::Peer;
use tokio::time::Instant;

use crate::dialect::usage::Usage;
use crate::error::{GateError, Outcome};
use crate::live::{Ended, Live, Tracked};
use crate::log::{self, Field};
use crate::metrics as m;
use crate::policy::complete::CompletionHook;
use crate::store::ledger::{Ledger, Usage as LedgerUsage, Who};

/// The shutdown is closing the connections still open (its drain timeout ran out, or a second
/// signal came): a request ended now was cut by slotgate, not left by its client.
static CUT_BY_SHUTDOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Marks every request that ends from now on as cut by the shutdown (`drain_timeout`).
pub fn cut_by_shutdown() {
    CUT_BY_SHUTDOWN.store(true, std::sync::atomic::Ordering::Release);
}

/// What a request that ended without an outcome of its own was: cut by the shutdown, or left by
/// its client.
pub fn ended_unfinished() -> Outcome {
    match CUT_BY_SHUTDOWN.load(std::sync::atomic::Ordering::Acquire) {
        true => Outcome::DrainTimeout,
        false => Outcome::ClientGone,
    }
}

thread_local! {
    /// The access line being written, reused: no allocation per request.
    static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub struct Exchange {
    /// Its place in the live view, with its method, path and id.
    live: Tracked,
    peer: Option<Peer>,
    /// A TCP client's address.
    addr: Option<SocketAddr>,
    /// The Retry-After a refusal gave, in seconds.
    retry_after: Option<u64>,
    /// The policy that denied the request, and its reason.
    denied: Option<(String, String)>,
    /// What the monitor-mode policies would have done (`pipeline::decide::monitored`).
    monitor: Option<Box<str>>,
    started: Instant,
    priority: i64,
    tenant: Option<Arc<str>>,
    /// The team and id of the key slotgate let the caller in with (`--client-auth keys`).
    key: Option<(Option<Arc<str>>, Arc<str>)>,
    /// In front of llama-server's router: the model's id (one the router lists).
    model: Option<Arc<str>>,
    /// Where a request that reached llama-server is counted.
    ledger: Arc<Ledger>,
    queue_wait: Option<Duration>,
    /// Its own deadline from arrival (header or policy), when it set one.
    deadline: Option<Duration>,
    /// The overload band its priority falls in.
    band: Option<Arc<str>>,
    /// Times it was shed before its first byte and queued again.
    shed: u32,
    upstream: Option<Duration>,
    status: Option<u16>,
    outcome: Option<Outcome>,
    usage: Option<Usage>,
    reserved: Option<u64>,
    prompt_tokens: u64,
    /// Boxed: set only with a policy chain, and held inline it was two thirds of the record, which
    /// every request's future carries.
    completion: Option<Box<CompletionHook>>,
    /// Its trace's server span (`otel::request`); disabled while traces are off.
    span: tracing::Span,
}

impl Exchange {
    #[allow(
        clippy::too_many_arguments,
        reason = "what every request starts with, one for one"
    )]
    pub fn new(
        live: &Live,
        ledger: &Arc<Ledger>,
        method: &http::Method,
        path: &str,
        peer: Option<Peer>,
        addr: Option<SocketAddr>,
        request_id: &http::HeaderValue,
        span: tracing::Span,
    ) -> Self {
        if !span.is_disabled() {
            span.record("slotgate.request_id", request_id.to_str().unwrap_or("-"));
        }
        Exchange {
            span,
            live: live.track(request_id, method, path),
            peer,
            addr,
            retry_after: None,
            denied: None,
            monitor: None,
            started: Instant::now(),
            priority: 0,
            tenant: None,
            key: None,
            model: None,
            ledger: ledger.clone(),
            queue_wait: None,
            deadline: None,
            band: None,
            shed: 0,
            upstream: None,
            status: None,
            outcome: None,
            usage: None,
            reserved: None,
            prompt_tokens: 0,
            completion: None,
        }
    }

    /// The request's id (see `request_id`), as text.
    pub fn request_id(&self) -> String {
        self.live.request_id.to_str().unwrap_or("-").to_owned()
    }

    /// The request's server span (see `otel`).
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The request as the live view shows it (`GET /live`): its phase, tokens so far.
    pub fn live(&self) -> &Tracked {
        &self.live
    }

    pub fn set_priority(&mut self, priority: i64) {
        self.live.set_priority(priority);
        self.priority = priority;
    }

    /// The tenant the request was scheduled for (or, refused before it had one, the caller).
    pub fn set_tenant(&mut self, tenant: Arc<str>) {
        self.live.set_tenant(&tenant);
        self.tenant = Some(tenant);
    }

    /// The key the caller was let in with (its team, if any, and its id).
    pub fn set_key(&mut self, team: Option<&str>, id: &str) {
        self.key = Some((team.map(Arc::from), Arc::from(id)));
    }

    /// The router's model the request was queued for (its id: bounded by the router's list).
    pub fn set_model(&mut self, id: &str) {
        self.model = Some(id.into());
    }

    /// The deadline the request was scheduled by (its own, from arrival).
    pub fn set_deadline(&mut self, deadline: Duration) {
        self.live.set_deadline(deadline);
        self.deadline = Some(deadline);
    }

    /// The overload band the request was scheduled in.
    pub fn set_band(&mut self, band: Arc<str>) {
        self.live.set_band(&band);
        self.band = Some(band);
    }

    /// Shed before its first byte: queued again.
    pub fn shed(&mut self) {
        self.shed += 1;
        self.live.set_shed(self.shed);
    }

    /// The whole wait of a request queued again after a shed: for its record, the histogram
    /// having had its first wait already.
    pub fn set_total_queue_wait(&mut self, wait: Duration) {
        self.queue_wait = Some(wait);
    }

    pub fn set_queue_wait(&mut self, wait: Duration) {
        m::hot().queue_wait.record(wait.as_secs_f64());
        self.queue_wait = Some(wait);
    }

    pub fn set_status(&mut self, status: u16) {
        self.status = Some(status);
    }

    pub fn set_upstream_time(&mut self, t: Duration) {
        self.upstream = Some(t);
    }

    /// The tokens an admitted request reserves; what it does not use is counted as refunded when it
    /// ends.
    pub fn set_reserved(&mut self, tokens: u64) {
        m::hot().tokens_reserved.increment(tokens);
        self.reserved = Some(tokens);
    }

    /// The request's prompt tokens as counted before admission (exact, else estimated).
    pub fn set_prompt_tokens(&mut self, n: u64) {
        self.live.set_prompt_tokens(n);
        self.prompt_tokens = n;
    }

    pub fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }

    pub fn set_usage(&mut self, usage: Usage) {
        self.usage = Some(usage);
    }

    /// Arms the policies' `on_complete`, fired once when this record drops, whatever the outcome.
    pub fn on_complete(&mut self, hook: CompletionHook) {
        self.completion = Some(Box::new(hook));
    }

    /// What the chain's monitor-mode policies would have done to the request.
    pub fn set_monitor(&mut self, entries: String) {
        self.monitor = Some(entries.into());
    }

    /// What a refusal told the client: its Retry-After, and for a policy's denial who and why.
    pub fn refused(&mut self, e: &GateError) {
        self.retry_after = e.retry_after();
        if let GateError::PolicyDenied {
            policy, message, ..
        } = e
        {
            self.denied = Some((policy.clone(), message.clone()));
        }
    }

    /// The request's fate. Only the first call counts.
    pub fn finish(&mut self, outcome: Outcome) {
        self.outcome.get_or_insert(outcome);
    }

    pub fn is_finished(&self) -> bool {
        self.outcome.is_some()
    }
}

impl Exchange {
    /// What the trace's server span says of the request's end.
    fn trace_end(&self, outcome: Outcome) {
        let span = &self.span;
        if let Some(status) = self.status {
            span.record("http.response.status_code", i64::from(status));
        }
        span.record("slotgate.outcome", outcome.label());
        span.record("slotgate.priority", self.priority);
        if let Some(tenant) = &self.tenant {
            span.record("slotgate.tenant", &**tenant);
        }
        if let Some(wait) = self.queue_wait {
            span.record("slotgate.queue_wait_ms", wait.as_millis() as i64);
        }
        if let Some(secs) = self.retry_after {
            span.record("slotgate.retry_after", secs as i64);
        }
        if let Some(u) = self.usage {
            span.record("gen_ai.usage.input_tokens", u.prompt_tokens as i64);
            span.record("gen_ai.usage.output_tokens", u.completion_tokens as i64);
        }
        if outcome != Outcome::Ok {
            span.record("error.type", outcome.label());
        }
        // A server span's error is the server's: slotgate's or llama-server's failure, or a cut;
        // a refusal (429) or a client that left is the client's.
        let failed = self.status.is_some_and(|s| s >= 500)
            || matches!(
                outcome,
                Outcome::UpstreamError
                    | Outcome::UpstreamTimeout
                    | Outcome::Upstream5xx
                    | Outcome::DrainTimeout
                    | Outcome::PolicyError
            );
        span.record("otel.status_code", if failed { "error" } else { "ok" });
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or_else(ended_unfinished);
        if let Some(reserved) = self.reserved {
            let used = self
                .usage
                .map_or(0, |u| u.prompt_tokens + u.completion_tokens);
            m::hot()
                .tokens_refunded
                .increment(reserved.saturating_sub(used));
        }
        // Booked first: the policies settle a money budget by the ledger's own figure.
        let cost = self.record_usage();
        if let Some(hook) = self.completion.take() {
            hook.fire(
                self.status.unwrap_or(0),
                outcome,
                self.usage.unwrap_or_default(),
                cost,
                self.queue_wait.map_or(0, |d| d.as_millis() as u64),
                self.upstream.map_or(0, |d| d.as_millis() as u64),
            );
        }
        m::hot().requests(outcome).increment(1);
        if let Some(model) = &self.model {
            metrics::counter!(m::MODEL_REQUESTS_TOTAL, "model" => model.to_string(), "outcome" => outcome.label())
                .increment(1);
        }
        if !self.span.is_disabled() {
            self.trace_end(outcome);
        }
        self.live.end(Ended {
            outcome,
            status: self.status,
            tenant: self.tenant.as_deref(),
            tokens: self
                .usage
                .map_or(0, |u| u.prompt_tokens + u.completion_tokens),
            completion_tokens: self.usage.map_or(0, |u| u.completion_tokens),
            // Only a request given a slot queued (or not) for one.
            queue_wait: self.reserved.and(self.queue_wait),
        });
        self.log_line(outcome, cost);
    }
}

impl Exchange {
    /// What llama-server served goes in the usage ledger, with what it reported, under the model it
    /// served (the router's model the request was queued for, else the one llama-server serves:
    /// never a name the client chose). A request llama-server refused for its caller (401, 403)
    /// is no usage: it adds nothing.
    /// Returns its cost, in billionths of the currency, when `[prices]` prices its model.
    fn record_usage(&self) -> Option<u64> {
        if self.upstream.is_none() && self.usage.is_none() {
            return None;
        }
        if matches!(self.status, Some(401 | 403)) {
            return None;
        }
        let u = self.usage.unwrap_or_default();
        let model = self.ledger.served(self.model.as_deref());
        let cost = self.ledger.cost(&model, &u);
        let (team, key) = match &self.key {
            Some((team, id)) => (team.as_deref(), Some(&**id)),
            None => (None, None),
        };
        self.ledger.record(
            crate::budgets::wall_ms(),
            Who::new(
                self.tenant.as_deref().unwrap_or("anonymous"),
                team,
                key,
                &model,
            ),
            &LedgerUsage {
                requests: 1,
                prompt_tokens: u.prompt_tokens,
                cached_tokens: u.cached_tokens,
                completion_tokens: u.completion_tokens,
                cost_nanos: cost.unwrap_or(0),
            },
        );
        cost
    }

    /// The access log's line for it, when the access log is on.
    fn log_line(&self, outcome: Outcome, cost: Option<u64>) {
        // Absent values (no status yet, no peer on TCP) are left out of the line rather than faked,
        // and numbers stay numbers in JSON logs.
        let Some(format) = log::format() else { return };
        if !tracing::enabled!(target: "slotgate::access", tracing::Level::INFO) {
            return;
        }
        let ms = |d: Option<Duration>| d.map(|d| Field::Num(d.as_millis() as u64));
        let id = self.live.request_id.to_str().ok();
        let lineage = self.live.lineage();
        let fields = [
            ("outcome", Some(Field::Str(outcome.label()))),
            ("status", self.status.map(|s| Field::Num(s.into()))),
            ("method", Some(Field::Str(self.live.method.as_str()))),
            ("path", Some(Field::Str(&self.live.path))),
            ("request_id", id.map(Field::Str)),
            ("priority", Some(Field::Int(self.priority))),
            ("tenant", self.tenant.as_deref().map(Field::Str)),
            ("model", self.model.as_deref().map(Field::Str)),
            ("queue_wait_ms", ms(self.queue_wait)),
            ("deadline_ms", ms(self.deadline)),
            ("band", self.band.as_deref().map(Field::Str)),
            (
                "session",
                lineage.and_then(|l| l.session.as_deref()).map(Field::Str),
            ),
            (
                "agent",
                lineage.and_then(|l| l.agent.as_deref()).map(Field::Str),
            ),
            (
                "parent_agent",
                lineage.and_then(|l| l.parent.as_deref()).map(Field::Str),
            ),
            (
                "conversation",
                lineage
                    .and_then(|l| l.conversation.as_deref())
                    .map(Field::Str),
            ),
            (
                "shed",
                (self.shed > 0).then_some(Field::Num(self.shed.into())),
            ),
            ("reserved_tokens", self.reserved.map(Field::Num)),
            (
                "prompt_tokens",
                self.usage.map(|u| Field::Num(u.prompt_tokens)),
            ),
            (
                "cached_tokens",
                self.usage
                    .filter(|u| u.cached_tokens > 0)
                    .map(|u| Field::Num(u.cached_tokens)),
            ),
            (
                "completion_tokens",
                self.usage.map(|u| Field::Num(u.completion_tokens)),
            ),
            ("cost", cost.map(Field::Money)),
            ("retry_after", self.retry_after.map(Field::Num)),
            ("policy", self.denied.as_ref().map(|d| Field::Str(&d.0))),
            ("reason", self.denied.as_ref().map(|d| Field::Str(&d.1))),
            ("monitor", self.monitor.as_deref().map(Field::Str)),
            ("upstream_ms", ms(self.upstream)),
            ("total_ms", ms(Some(self.started.elapsed()))),
            ("peer_uid", self.peer.map(|p| Field::Num(p.uid.into()))),
            ("peer_gid", self.peer.map(|p| Field::Num(p.gid.into()))),
            (
                "peer_pid",
                self.peer.and_then(|p| p.pid).map(|p| Field::Int(p.into())),
            ),
            ("peer_addr", self.addr.map(Field::Addr)),
        ];
        LINE.with(|line| {
            let mut line = line.borrow_mut();
            line.clear();
            let now = std::time::SystemTime::now();
            log::info_line(
                &mut line,
                format,
                now,
                "slotgate::access",
                "request",
                &fields,
            );
            log::line(&line);
        });
    }
}
