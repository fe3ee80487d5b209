//! One version of the policy chain serving requests: each request asks every policy in turn
//! through the one contract (`guest.rs`), the decisions are counted and folded (`fold.rs`), and the
//! policies that allowed it are told how it ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use slotgate_sdk::{Completion, Decision, RequestSummary, Verdict};

use super::error::EvalError;
use super::fold::OnError;
use super::fold::{self, ChainOutcome, Mode, Step};
use super::guest::{Ask, Tell};
use super::guest::{Guest, Settings};
use super::sandbox::{block_on, Evaluation, Runs};
use crate::config::PolicySpec;
use crate::metrics as m;

/// One policy ready to serve, and what it was built from.
pub struct Loaded {
    pub name: String,
    /// Whose budgets its host state is: `name` when the operator set it, else the name the module
    /// declares (so renaming its file keeps them), else the file's.
    pub state_key: String,
    pub spec: PolicySpec,
    /// SHA-256 of the module file.
    pub sha256: [u8; 32],
    pub policy: Box<dyn Guest>,
    pub settings: Value,
    pub mode: Mode,
    pub on_error: OnError,
    /// Its `validate_settings` asked for the exact prompt count before it decides.
    pub needs_prompt_tokens: bool,
    /// `settings` as JSON text, serialised once: every evaluation's input carries it as it is (a
    /// component's calls take it as their `settings`). `None` when the policy serves from a
    /// snapshot that holds them parsed (see `policy::snapshot`).
    pub(super) settings_json: Option<Box<RawValue>>,
    /// The keys in the module cache of the compiled modules it was built from: the file's, and for
    /// a snapshot the instrumented module's and the snapshot's (SHA-256 of each).
    pub(super) module_keys: Vec<[u8; 32]>,
    /// Its metric series, looked up once rather than by name on every evaluation.
    pub(super) metrics: PolicyMetrics,
}

impl Loaded {
    /// Whether it serves from a snapshot that holds its settings parsed (see `policy::snapshot`).
    pub fn preinitialised(&self) -> bool {
        self.settings_json.is_none()
    }

    /// Its settings as every call carries them (`None` when it holds them already).
    pub fn settings(&self) -> Option<Settings<'_>> {
        self.settings_json.as_deref().map(|text| Settings {
            text,
            value: &self.settings,
        })
    }
}

/// One version of the whole chain. Requests hold it for as long as they run, so a reload never
/// changes the policies of a request already in progress.
pub struct Chain {
    pub(super) policies: Vec<Arc<Loaded>>,
    generation: u64,
    /// Set once an evaluation of this version took longer than [`INLINE_LIMIT`] or failed by fuel or
    /// deadline: from then on it runs on the blocking pool (see [`Chain::runs_inline`]).
    offloaded: AtomicBool,
}

/// Most CPU time one evaluation of a whole chain may take and the chain still run inline on an async
/// worker. The example policies take 10-50 us (a debug build several times that), the default
/// deadline is 20 ms.
pub const INLINE_LIMIT: Duration = Duration::from_millis(3);

/// The handles of one policy's series in the metrics registry.
pub(super) struct PolicyMetrics {
    eval_seconds: metrics::Histogram,
    fuel: metrics::Histogram,
    allow: metrics::Counter,
    deny: metrics::Counter,
    error: metrics::Counter,
}

impl PolicyMetrics {
    pub(super) fn register(policy: &str) -> PolicyMetrics {
        let decision = |d: &'static str| metrics::counter!(m::POLICY_DECISIONS_TOTAL, "policy" => policy.to_owned(), "decision" => d);
        PolicyMetrics {
            eval_seconds: metrics::histogram!(m::POLICY_EVAL_SECONDS, "policy" => policy.to_owned()),
            fuel: metrics::histogram!(m::POLICY_FUEL_CONSUMED, "policy" => policy.to_owned()),
            allow: decision("allow"),
            deny: decision("deny"),
            error: decision("error"),
        }
    }
}

impl Chain {
    pub(super) fn new(policies: Vec<Arc<Loaded>>, generation: u64) -> Chain {
        Chain {
            policies,
            generation,
            offloaded: AtomicBool::new(false),
        }
    }

    /// Whether evaluations of this version run on the async worker that serves the request (on a
    /// fiber that yields at every epoch tick, see [`Chain::evaluate_each_async`]), saving the
    /// hand-off to the blocking pool (~30-50 us). True until one evaluation used more than
    /// [`INLINE_LIMIT`] of CPU or ran out of fuel or time: such a chain (a slow or runaway policy)
    /// is evaluated on the blocking pool from then on. A new version (a reload) starts inline again.
    pub fn runs_inline(&self) -> bool {
        !self.offloaded.load(Ordering::Relaxed)
    }

    /// Moves this version to the blocking pool for good, saying why once.
    fn offload(&self, why: &str) {
        if !self.offloaded.swap(true, Ordering::Relaxed) {
            tracing::info!(
                generation = self.generation,
                reason = why,
                "policy chain now evaluated on the blocking pool"
            );
        }
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// Counts versions: 1 after start-up, +1 on every swap.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn policies(&self) -> impl Iterator<Item = &Loaded> {
        self.policies.iter().map(|p| &**p)
    }

    /// Whether a policy of this chain decides on the exact prompt count: then every request is
    /// counted before the chain runs, not only those that wait for a slot.
    pub fn needs_prompt_tokens(&self) -> bool {
        self.policies.iter().any(|p| p.needs_prompt_tokens)
    }

    /// Evaluates every policy on `request` and folds the decisions. Synchronous and CPU-bound
    /// (bounded by each policy's fuel and deadline): run it off the async workers, or use
    /// [`Chain::evaluate_each_async`].
    pub fn evaluate(&self, request: &RequestSummary) -> ChainOutcome {
        self.evaluate_each(request).0
    }

    /// [`Chain::evaluate`], and also each policy's own decision (`None` where it failed), in chain
    /// order, for [`Chain::complete`].
    pub fn evaluate_each(&self, request: &RequestSummary) -> (ChainOutcome, Vec<Option<Decision>>) {
        self.evaluate_each_at(request, unix_ms())
    }

    /// [`Chain::evaluate_each`] with `now_unix_ms` given: the time the request's `on_complete`
    /// will say it was evaluated at (`evaluated_unix_ms`).
    pub fn evaluate_each_at(
        &self,
        request: &RequestSummary,
        now_unix_ms: u64,
    ) -> (ChainOutcome, Vec<Option<Decision>>) {
        block_on(self.ask_each(request, now_unix_ms, Runs::Blocking))
    }

    /// [`Chain::evaluate_each`] on an async worker: each evaluation yields to the worker's other
    /// tasks at every epoch tick, so not even a runaway policy holds up another connection for more
    /// than a tick (see `Runs` in sandbox.rs). What it costs is only the evaluations themselves: no
    /// hand-off to another thread.
    pub async fn evaluate_each_async(
        &self,
        request: &RequestSummary,
    ) -> (ChainOutcome, Vec<Option<Decision>>) {
        self.evaluate_each_async_at(request, unix_ms()).await
    }

    /// [`Chain::evaluate_each_async`] with `now_unix_ms` given (see [`Chain::evaluate_each_at`]).
    pub async fn evaluate_each_async_at(
        &self,
        request: &RequestSummary,
        now_unix_ms: u64,
    ) -> (ChainOutcome, Vec<Option<Decision>>) {
        self.ask_each(request, now_unix_ms, Runs::Async).await
    }

    /// Asks every policy in turn about `request`, each call run as `runs` says.
    async fn ask_each(
        &self,
        request: &RequestSummary,
        now_unix_ms: u64,
        runs: Runs,
    ) -> (ChainOutcome, Vec<Option<Decision>>) {
        let mut run = Run::new(self, request, now_unix_ms);
        for p in &self.policies {
            run.ask.settings = p.settings();
            let result = p.policy.evaluate(&mut run.ask, runs).await;
            run.record(p, result);
        }
        run.finish()
    }

    /// Runs the `on_complete` of every policy that allowed the request (`own`: each policy's decision,
    /// from [`Chain::evaluate_each`]) with the request's real outcome, so what it took from a budget
    /// can be settled, also when a later policy denied the request. `completion.decision` is the
    /// chain's; each policy gets its own as `decision`. Synchronous: run it off the async workers, or
    /// use [`Chain::complete_async`].
    pub fn complete(&self, completion: &Completion, own: &[Option<Decision>]) {
        block_on(self.tell_each(completion, own, Runs::Blocking));
    }

    /// [`Chain::complete`] on an async worker, as [`Chain::evaluate_each_async`].
    pub async fn complete_async(&self, completion: &Completion, own: &[Option<Decision>]) {
        self.tell_each(completion, own, Runs::Async).await;
    }

    /// Tells every policy that allowed the request how it ended, each call run as `runs` says.
    async fn tell_each(&self, completion: &Completion, own: &[Option<Decision>], runs: Runs) {
        let mut tell = Tell::new(completion);
        for (p, decision) in self.policies.iter().zip(own) {
            let Some(mine) = allowed(p, decision) else {
                continue;
            };
            tell.about(mine, p.settings());
            let result = p.policy.on_complete(&mut tell, runs).await;
            report_completion(p, result);
        }
    }

    /// Whether any policy that allowed the request (see [`Chain::complete`]) exports `on_complete`.
    pub fn wants_completion(&self, own: &[Option<Decision>]) -> bool {
        self.policies.iter().zip(own).any(|(p, d)| {
            p.policy.has_on_complete() && d.as_ref().is_some_and(|d| d.verdict == Verdict::Allow)
        })
    }
}

/// `p`'s own decision, if it allowed the request and wants to hear how it ended.
fn allowed<'d>(p: &Loaded, decision: &'d Option<Decision>) -> Option<&'d Decision> {
    let decision = decision.as_ref()?;
    (decision.verdict == Verdict::Allow && p.policy.has_on_complete()).then_some(decision)
}

fn report_completion(p: &Loaded, result: Result<Option<Evaluation>, EvalError>) {
    if let Err(e) = result {
        metrics::counter!(m::POLICY_ERRORS_TOTAL, "policy" => p.name.clone(), "kind" => e.kind())
            .increment(1);
        tracing::warn!(policy = %p.name, kind = e.kind(), error = %e, "policy on_complete failed");
    }
}

/// One evaluation of a chain in progress: the input, each policy's step, and the CPU time counted.
struct Run<'a> {
    chain: &'a Chain,
    /// The request, as each policy in turn is asked about it.
    ask: Ask<'a>,
    steps: Vec<Step<'a>>,
    own: Vec<Option<Decision>>,
    cpu: Duration,
}

impl<'a> Run<'a> {
    fn new(chain: &'a Chain, request: &'a RequestSummary, now: u64) -> Run<'a> {
        Run {
            chain,
            ask: Ask::new(request, now),
            steps: Vec::with_capacity(chain.policies.len()),
            own: Vec::with_capacity(chain.policies.len()),
            cpu: Duration::ZERO,
        }
    }

    /// Counts `p`'s result in the metrics and keeps it for the fold.
    fn record(&mut self, p: &'a Loaded, result: Result<(Decision, Evaluation), EvalError>) {
        let pm = &p.metrics;
        match &result {
            Ok((decision, ev)) => {
                self.cpu += ev.cpu;
                pm.eval_seconds.record(ev.elapsed.as_secs_f64());
                pm.fuel.record(ev.fuel_used as f64);
                if decision.verdict == Verdict::Deny {
                    pm.deny.increment(1);
                } else {
                    pm.allow.increment(1);
                }
            }
            Err(e) => {
                if matches!(e, EvalError::Timeout | EvalError::Fuel) {
                    self.chain
                        .offload(&format!("policy `{}` failed: {e}", p.name));
                }
                metrics::counter!(m::POLICY_ERRORS_TOTAL, "policy" => p.name.clone(), "kind" => e.kind())
                    .increment(1);
                pm.error.increment(1);
                tracing::warn!(policy = %p.name, kind = e.kind(), error = %e, "policy evaluation failed");
            }
        }
        if p.mode == Mode::Monitor {
            if let Ok((d, _)) = &result {
                // Enough to find the request and see what would have happened to whom.
                let r = self.ask.request();
                let id = r.headers.get("x-request-id").map_or("-", String::as_str);
                let tenant = d.tenant.clone().unwrap_or_else(|| r.tenant_key(None));
                let verdict = match d.verdict {
                    Verdict::Allow => "allow",
                    Verdict::Deny => "deny",
                };
                tracing::info!(policy = %p.name, request_id = %id, tenant = %tenant, verdict, status = d.status, reason = d.reason.as_deref(), said = d.message.as_deref(), cost = d.cost, priority = d.priority, "monitor-mode decision (not enforced)");
            }
        }
        let result = result.map(|(d, _)| d);
        if let (Mode::Enforce, Ok(d)) = (p.mode, &result) {
            if d.verdict == Verdict::Allow {
                self.ask.earlier.add(d);
            }
        }
        self.own.push(result.as_ref().ok().cloned());
        self.steps.push(Step {
            policy: &p.name,
            mode: p.mode,
            on_error: p.on_error,
            result,
        });
    }

    /// The folded outcome and each policy's decision. A chain whose evaluations the deadline checks
    /// counted more than [`INLINE_LIMIT`] of CPU for moves to the blocking pool: CPU time decides,
    /// not wall-clock, so a busy machine that preempts a fast evaluation does not make it slow; and
    /// the clock is only read in those checks, from the first epoch tick of a call on, so a fast
    /// evaluation never pays for it.
    fn finish(self) -> (ChainOutcome, Vec<Option<Decision>>) {
        if self.cpu > INLINE_LIMIT {
            self.chain.offload(&format!(
                "an evaluation took {:?} of CPU, over {INLINE_LIMIT:?}",
                self.cpu
            ));
        }
        (fold::fold(self.steps), self.own)
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}
