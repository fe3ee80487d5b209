//! Policies v2: WebAssembly components of the world `slotgate:policy/policy@2.0.0`
//! (`sdk/wit/policy.wit`, the one place its types are defined). Typed records in and out instead of
//! v1's JSON, the same sandbox as v1: a fresh instance per call from a pre-instantiated template (the
//! pooling allocator and copy-on-write memory images make that cheap), fuel, the CPU deadline, the
//! memory cap, and nothing of one call visible to the next.
//!
//! The WASI 0.2 imports that guest runtimes bring (componentize-py's Python, componentize-js's
//! JavaScript) are met by an empty context built only if the guest touches WASI: no files, no
//! sockets, no environment, no arguments, stdin at its end, stdout and stderr discarded; the clocks
//! are the host's and random numbers are random. Any other import outside the world fails the load,
//! naming it.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use slotgate_sdk::{
    Completion, Decision, Earlier, Mutations, RateLimit, RateLimits, RequestSummary, Verdict,
    CALLER_HEADER,
};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{ResourceLimiter, Store, StoreLimitsBuilder};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::engine::PolicyEngine;
use super::module::{
    arm, check_decision, classify, new_store, Evaluation, PolicyLimits, Runs, SettingsVerdict,
    HOST_CALL_FUEL, LOAD_DEADLINE, MAX_HOST_STRING,
};
use super::state::{HostState, SharedState};
use super::{EvalError, LoadError};

/// The bindings of the contract, generated from the WIT at build time.
#[allow(
    missing_docs,
    reason = "generated from sdk/wit/policy.wit, which documents them"
)]
mod wit {
    wasmtime::component::bindgen!({
        path: "../sdk/wit",
        world: "policy",
        imports: { default: trappable },
        exports: { default: async },
    });
}

pub use wit::slotgate::policy::types as t;

/// The contract, as `slotgate policy wit` prints it.
pub const WIT: &str = include_str!("../../../sdk/wit/policy.wit");

/// Instances, tables and memories one component may create: a Python component is a dozen core
/// modules linked together; a Rust one is one or two. The pool holds as many per evaluation.
const COMPONENT_INSTANCES: usize = super::engine::CORE_PER_CALL as usize;
const COMPONENT_MEMORIES: usize = super::engine::MEMORIES_PER_CALL as usize;

/// The empty WASI context of one call, made the first time the guest touches WASI.
pub struct Wasi {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl Wasi {
    fn new() -> Wasi {
        let ctx = WasiCtx::builder()
            // No network at all, not even an address check that says no.
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        Wasi {
            ctx,
            table: ResourceTable::new(),
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let wasi = self.wasi.get_or_insert_with(|| Box::new(Wasi::new()));
        WasiCtxView {
            ctx: &mut wasi.ctx,
            table: &mut wasi.table,
        }
    }
}

/// Whether `bytes` (binary or text) are a component rather than a core module.
pub fn is_component(bytes: &[u8]) -> bool {
    if bytes.starts_with(b"\0asm") {
        // The version field: 1 for a core module, 0x0d and layer 1 for a component.
        return bytes.get(4..8) == Some(&[0x0d, 0x00, 0x01, 0x00]);
    }
    std::str::from_utf8(bytes).is_ok_and(|text| {
        text.lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with(";;"))
            .is_some_and(|l| l.starts_with("(component"))
    })
}

/// Whether `bytes` are a core module built against the v2 contract (wit-bindgen's `component-type`
/// custom section naming `slotgate:policy`) rather than ABI v1: it is made a component on load.
pub fn embeds_contract(bytes: &[u8]) -> bool {
    if !bytes.starts_with(b"\0asm") || is_component(bytes) {
        return false;
    }
    wasmparser::Parser::new(0).parse_all(bytes).any(|p| {
        matches!(p, Ok(wasmparser::Payload::CustomSection(c))
            if c.name().starts_with("component-type") && c.data().windows(15).any(|w| w == b"slotgate:policy"))
    })
}

/// Wraps a core module built with wit-bindgen against the contract into a component.
pub fn componentize(bytes: &[u8]) -> Result<Vec<u8>, LoadError> {
    wit_component::ComponentEncoder::default()
        .module(bytes)
        .and_then(|e| e.validate(true).encode())
        .map_err(|e| LoadError::Compile(format!("making a component of the module: {e:#}")))
}

/// One loaded v2 policy.
pub struct ComponentPolicy {
    name: Arc<str>,
    state_key: Arc<str>,
    engine: PolicyEngine,
    shared: Arc<SharedState>,
    pre: wit::PolicyPre<HostState>,
    limits: PolicyLimits,
    imports_wasi: bool,
    /// Its settings asked for `on-complete` (see [`ComponentPolicy::completing`]).
    wants_completions: bool,
    /// Instances kept between calls, each bound to the caller it served, with `Isolation::Caller`;
    /// `None` with `Isolation::Call`.
    kept: Option<Mutex<Vec<Kept>>>,
}

/// How long an instance lives (docs/policies.md, "Isolation").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// A fresh instance for every call, as for v1 modules.
    Call,
    /// An instance serves one caller (API key, else Unix uid and gid, else anonymous) for up to
    /// [`KEPT_CALLS`] calls in a row, and is thrown away after any failure or once its memory has
    /// grown by half the room it had: a call may find what an earlier call of the same caller left
    /// in memory, never what another caller's did.
    Caller,
}

impl Isolation {
    pub fn label(self) -> &'static str {
        match self {
            Isolation::Call => "call",
            Isolation::Caller => "caller",
        }
    }
}

/// Instances a policy keeps idle, the least recently used dropped first.
const KEPT_IDLE: usize = 4;
/// Calls one kept instance serves before a fresh one replaces it.
pub const KEPT_CALLS: u32 = 10_000;

/// An instance kept for its caller's next call.
struct Kept {
    store: Store<HostState>,
    bindings: wit::Policy,
    caller: u64,
    calls: u32,
    /// Its memory when it was made, in bytes.
    born: usize,
}

/// Whom a call is for, as [`Isolation::Caller`] keeps instances apart: the caller's hashed key,
/// else its Unix uid and gid, else nobody in particular (anonymous).
pub fn caller_of(r: &t::Request) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let mut h = SEED.get_or_init(Default::default).build_hasher();
    match (&r.api_key, &r.peer) {
        (Some(key), _) => (0u8, key).hash(&mut h),
        (None, Some(p)) => (1u8, (p.uid, p.gid)).hash(&mut h),
        (None, None) => 2u8.hash(&mut h),
    }
    h.finish()
}

impl ComponentPolicy {
    /// Compiles `bytes` (a component, binary or text). Slow: never on the request path.
    pub fn compile(
        engine: &PolicyEngine,
        bytes: &[u8],
        limits: PolicyLimits,
    ) -> Result<Component, LoadError> {
        if bytes.len() > limits.max_module_bytes {
            return Err(LoadError::TooLarge {
                size: bytes.len(),
                limit: limits.max_module_bytes,
            });
        }
        // wasmtime 48 panics on some components instead of refusing them (one whose adapter needs
        // several memories, which this engine does not enable): refused like any other.
        let compile = std::panic::AssertUnwindSafe(|| Component::new(engine.engine(), bytes));
        match std::panic::catch_unwind(compile) {
            Ok(compiled) => compiled.map_err(|e| LoadError::Compile(format!("{e:#}"))),
            Err(_) => Err(LoadError::Compile(
                "wasmtime could not compile this component (it needs a feature this host does not enable, such as multiple memories)".into(),
            )),
        }
    }

    /// Links the host's interfaces and the empty WASI: refused, naming the import, when the
    /// component imports anything else or does not export the world.
    pub fn link(
        engine: &PolicyEngine,
        shared: Arc<SharedState>,
        name: &str,
        component: &Component,
        limits: PolicyLimits,
    ) -> Result<ComponentPolicy, LoadError> {
        let mut linker = Linker::<HostState>::new(engine.engine());
        let wrap = |e: wasmtime::Error| LoadError::Abi(format!("linking host functions: {e:#}"));
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(wrap)?;
        wit::Policy::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |s| s).map_err(wrap)?;
        let ty = component.component_type();
        let imports_wasi = ty
            .imports(engine.engine())
            .any(|(name, _)| name.starts_with("wasi:"));
        let pre = linker
            .instantiate_pre(component)
            .map_err(|e| LoadError::Abi(format!("{e:#}")))?;
        let pre = wit::PolicyPre::new(pre).map_err(|e| {
            LoadError::Abi(format!(
                "not a slotgate:policy@2.0.0 component (`slotgate policy wit` prints the contract): {e:#}"
            ))
        })?;
        Ok(ComponentPolicy {
            name: Arc::from(name),
            state_key: Arc::from(name),
            engine: engine.clone(),
            shared,
            pre,
            limits,
            imports_wasi,
            wants_completions: false,
            kept: Some(Mutex::new(Vec::new())),
        })
    }

    /// The same policy, its instances living as `isolation` says.
    pub fn isolated(mut self, isolation: Isolation) -> ComponentPolicy {
        self.kept = match isolation {
            Isolation::Call => None,
            Isolation::Caller => Some(Mutex::new(Vec::new())),
        };
        self
    }

    pub fn isolation(&self) -> Isolation {
        match self.kept {
            Some(_) => Isolation::Caller,
            None => Isolation::Call,
        }
    }

    /// Instances kept idle now.
    pub fn kept_idle(&self) -> usize {
        self.kept.as_ref().map_or(0, |k| lock(k).len())
    }

    /// The same policy keeping its budgets under `key` instead of its name.
    pub fn keyed(mut self, key: &str) -> ComponentPolicy {
        self.state_key = Arc::from(key);
        self
    }

    /// The same policy, told whether its `on-complete` is wanted (what `validate-settings` said).
    pub fn completing(mut self, wants: bool) -> ComponentPolicy {
        self.wants_completions = wants;
        self
    }

    pub fn wants_completions(&self) -> bool {
        self.wants_completions
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it imports any WASI interface (a Python or JavaScript runtime does).
    pub fn imports_wasi(&self) -> bool {
        self.imports_wasi
    }

    fn store(
        &self,
        deadline: Duration,
        runs: Runs,
    ) -> Result<(Store<HostState>, Clock), EvalError> {
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.limits.memory_bytes)
            .instances(COMPONENT_INSTANCES)
            .tables(COMPONENT_INSTANCES)
            .memories(COMPONENT_MEMORIES)
            .build();
        let (mut store, clock) = new_store(
            &self.engine,
            HostState::new(
                limits,
                self.shared.clone(),
                self.name.clone(),
                self.state_key.clone(),
            )
            .with_host_call_budget(self.limits.fuel / HOST_CALL_FUEL),
            self.limits.fuel,
            deadline,
            runs,
        )?;
        store.limiter(|s| s as &mut dyn ResourceLimiter);
        Ok((store, clock))
    }

    /// Runs `validate-settings` once, at load.
    pub fn validate_settings(
        &self,
        settings: &serde_json::Value,
    ) -> Result<SettingsVerdict, LoadError> {
        let text =
            serde_json::to_string(settings).map_err(|e| LoadError::Settings(e.to_string()))?;
        let deadline = self.limits.deadline.max(LOAD_DEADLINE);
        let verdict = block_on(async {
            let (mut store, _clock) = self.store(deadline, Runs::Blocking)?;
            let run = async {
                let p = self.pre.instantiate_async(&mut store).await?;
                p.call_validate_settings(&mut store, &text).await
            }
            .await;
            run.map_err(|e| classify(&store, e))
        })?;
        match verdict {
            Ok(v) => Ok(SettingsVerdict {
                needs_prompt_tokens: v.needs_prompt_tokens,
                keeps_settings: false,
                wants_completions: v.wants_completions,
            }),
            Err(message) => Err(LoadError::Settings(cut(message, 4096))),
        }
    }

    /// Evaluates one request, in a fresh instance or one kept for its caller.
    pub async fn evaluate_async(
        &self,
        settings: &str,
        input: &t::Evaluation,
        runs: Runs,
    ) -> Result<(Decision, Evaluation), EvalError> {
        let (decision, ev) = self
            .call(
                caller_of(&input.request),
                runs,
                async |p: &wit::Policy, store: &mut Store<HostState>| {
                    p.call_evaluate(store, settings, input).await
                },
            )
            .await?;
        Ok((decision_of(decision, self.limits.max_output_bytes)?, ev))
    }

    /// [`ComponentPolicy::evaluate_async`] on this thread.
    pub fn evaluate(
        &self,
        settings: &str,
        input: &t::Evaluation,
    ) -> Result<(Decision, Evaluation), EvalError> {
        block_on(self.evaluate_async(settings, input, Runs::Blocking))
    }

    /// Tells the policy what really happened to a request it allowed.
    pub async fn on_complete_async(
        &self,
        settings: &str,
        input: &t::Completion,
        runs: Runs,
    ) -> Result<Evaluation, EvalError> {
        let ((), ev) = self
            .call(
                caller_of(&input.request),
                runs,
                async |p: &wit::Policy, store: &mut Store<HostState>| {
                    p.call_on_complete(store, settings, input).await
                },
            )
            .await?;
        Ok(ev)
    }

    /// Runs `f` on an instance for `caller`: one kept for it, else a fresh one. The instance is kept
    /// afterwards (with [`Isolation::Caller`]) only if the call succeeded, it has served fewer than
    /// [`KEPT_CALLS`] calls and its memory has grown by at most half the room a fresh instance has
    /// under the cap, so a call on a kept instance always has at least half that room.
    async fn call<R>(
        &self,
        caller: u64,
        runs: Runs,
        f: impl AsyncFnOnce(&wit::Policy, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<(R, Evaluation), EvalError> {
        let started = Instant::now();
        let deadline = self.limits.deadline;
        let kept = self.kept.as_ref().and_then(|k| {
            let mut idle = lock(k);
            let i = idle.iter().rposition(|w| w.caller == caller)?;
            Some(idle.remove(i))
        });
        let (mut store, bindings, calls, born, clock) = match kept {
            Some(mut w) => {
                let clock = arm(&mut w.store, self.limits.fuel, deadline, runs)?;
                (w.store, w.bindings, w.calls, w.born, clock)
            }
            None => {
                let (mut store, clock) = self.store(deadline, runs)?;
                let bindings = match self.pre.instantiate_async(&mut store).await {
                    Ok(b) => b,
                    Err(e) => return Err(classify(&store, e)),
                };
                let born = store.data().memory_high;
                (store, bindings, 0, born, clock)
            }
        };
        let result = f(&bindings, &mut store).await;
        let ev = self.finish(&store, &clock, started);
        let r = result.map_err(|e| classify(&store, e))?;
        if let Some(k) = &self.kept {
            let calls = calls + 1;
            let grown = store.data().memory_high.saturating_sub(born);
            let room = self.limits.memory_bytes.saturating_sub(born);
            if calls < KEPT_CALLS && grown <= room / 2 {
                let evicted = {
                    let mut idle = lock(k);
                    let evicted = (idle.len() >= KEPT_IDLE).then(|| idle.remove(0));
                    idle.push(Kept {
                        store,
                        bindings,
                        caller,
                        calls,
                        born,
                    });
                    evicted
                };
                drop(evicted);
            }
        }
        Ok((r, ev))
    }

    /// [`ComponentPolicy::on_complete_async`] on this thread.
    pub fn on_complete(
        &self,
        settings: &str,
        input: &t::Completion,
    ) -> Result<Evaluation, EvalError> {
        block_on(self.on_complete_async(settings, input, Runs::Blocking))
    }

    fn finish(&self, store: &Store<HostState>, clock: &Clock, started: Instant) -> Evaluation {
        Evaluation {
            output: None,
            fuel_used: self
                .limits
                .fuel
                .saturating_sub(store.get_fuel().unwrap_or(0)),
            elapsed: started.elapsed(),
            cpu: clock.counted(),
        }
    }
}

type Clock = Arc<super::module::CallClock>;

/// The request as the contract carries it, the caller's identity among the host's headers.
pub fn request_of(r: &RequestSummary) -> t::Request {
    t::Request {
        method: r.method.clone(),
        path: r.path.clone(),
        dialect: r.dialect.clone(),
        model: r.model.clone(),
        stream: r.stream,
        max_tokens: r.max_tokens,
        prompt_chars: r.prompt_chars,
        prompt_tokens_estimate: r.prompt_tokens_estimate,
        prompt_tokens: r.prompt_tokens,
        reserved_tokens: r.reserved_tokens,
        body_bytes: r.body_bytes,
        priority_hint: r.priority_hint,
        deadline_ms: r.deadline_ms,
        peer: r.peer.map(|p| t::Peer {
            uid: p.uid,
            gid: p.gid,
            pid: p.pid,
        }),
        api_key: r.api_key.clone(),
        headers: r
            .headers
            .iter()
            .filter(|(k, _)| *k != CALLER_HEADER)
            .map(|(k, v)| (k.clone(), v.clone()))
            // Contract 2.0.0 has no field for it: the host's header gives it, always.
            .chain([(CALLER_HEADER.to_owned(), r.identity().to_string())])
            .collect(),
        session_id: r.session_id.clone(),
        conversation_id: r.conversation_id.clone(),
        queue: t::QueueState {
            depth: sat32(r.queue.depth),
            capacity: sat32(r.queue.capacity),
            in_flight: sat32(r.queue.in_flight),
            estimated_wait_seconds: r.queue.estimated_wait_seconds,
        },
    }
}

fn sat32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What earlier policies decided, as the contract carries it.
pub fn earlier_of(e: &Earlier) -> t::Earlier {
    t::Earlier {
        policies: e.policies,
        tenant: e.tenant.clone(),
        priority: e.priority,
        cost: e.cost,
    }
}

fn rate_limits_of(r: &RateLimits) -> t::RateLimits {
    let one = |l: &Option<RateLimit>| {
        l.map(|l| t::RateLimit {
            limit: l.limit,
            remaining: l.remaining,
            reset_unix_ms: l.reset_unix_ms,
        })
    };
    t::RateLimits {
        requests: one(&r.requests),
        tokens: one(&r.tokens),
    }
}

fn rate_limits_from(r: t::RateLimits) -> RateLimits {
    let one = |l: Option<t::RateLimit>| {
        l.map(|l| RateLimit {
            limit: l.limit,
            remaining: l.remaining,
            reset_unix_ms: l.reset_unix_ms,
        })
    };
    RateLimits {
        requests: one(r.requests),
        tokens: one(r.tokens),
    }
}

/// An allowing decision as the contract carries it (a completion's `decision`).
pub fn allow_of(d: &Decision) -> t::Allow {
    t::Allow {
        tenant: d.tenant.clone(),
        cost: d.cost,
        weight: d.weight,
        priority: d.priority,
        deadline_ms: d.deadline_ms,
        max_in_service: d.max_in_service,
        max_waiting: d.max_waiting,
        cap_max_tokens: d.mutations.cap_max_tokens,
        disable_prompt_cache: d.mutations.disable_prompt_cache,
        strip_id_slot: d.mutations.strip_id_slot,
        response_headers: d
            .mutations
            .response_headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        rate_limits: rate_limits_of(&d.rate_limits),
    }
}

/// How a request ended, for a component that allowed it with `mine`; `c.decision` is the chain's
/// (as [`crate::policy::complete::CompletionHook`] fires it).
pub fn completion_of(c: &Completion, mine: &Decision) -> t::Completion {
    let mut request = request_of(&c.request);
    // Contract 2.0.0's record has no fields for them: a header of the host's lists them.
    if c.cached_tokens > 0 || c.cached_weight.is_some() || c.cost.is_some() {
        let more = serde_json::json!({
            "cached_tokens": c.cached_tokens,
            "cached_weight": c.cached_weight,
            "cost": c.cost,
        });
        request
            .headers
            .push((slotgate_sdk::USAGE_HEADER.to_owned(), more.to_string()));
    }
    t::Completion {
        request,
        decision: allow_of(mine),
        chain_allowed: c.decision.verdict == Verdict::Allow,
        status: c.status,
        outcome: c.outcome.clone(),
        prompt_tokens: c.prompt_tokens,
        completion_tokens: c.completion_tokens,
        queue_wait_ms: c.queue_wait_ms,
        upstream_ms: c.upstream_ms,
        evaluated_unix_ms: c.evaluated_unix_ms,
    }
}

/// A component's decision as the host's, checked as a v1 decision is: over `max_output` bytes of
/// text in all is refused, as a v1 answer of that size is.
pub fn decision_of(d: t::Decision, max_output: usize) -> Result<Decision, EvalError> {
    let headers = |h: &[(String, String)]| h.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let size = match &d {
        t::Decision::Allow(a) => text(&a.tenant) + headers(&a.response_headers),
        t::Decision::Deny(x) => x.message.len() + text(&x.reason),
    };
    if size > max_output {
        return Err(EvalError::InvalidOutput(format!(
            "decision of {size} bytes of text is over the {max_output}-byte limit"
        )));
    }
    let decision = match d {
        t::Decision::Allow(a) => Decision {
            verdict: Verdict::Allow,
            tenant: a.tenant,
            cost: a.cost,
            weight: a.weight,
            priority: a.priority,
            deadline_ms: a.deadline_ms,
            max_in_service: a.max_in_service,
            max_waiting: a.max_waiting,
            mutations: Mutations {
                cap_max_tokens: a.cap_max_tokens,
                disable_prompt_cache: a.disable_prompt_cache,
                strip_id_slot: a.strip_id_slot,
                response_headers: a.response_headers.into_iter().collect::<BTreeMap<_, _>>(),
            },
            rate_limits: rate_limits_from(a.rate_limits),
            ..Decision::default()
        },
        t::Decision::Deny(x) => Decision {
            verdict: Verdict::Deny,
            status: Some(x.status),
            reason: x.reason,
            message: Some(x.message),
            retry_after_seconds: x.retry_after_seconds,
            should_retry: x.should_retry,
            rate_limits: rate_limits_from(x.rate_limits),
            ..Decision::default()
        },
    };
    check_decision(decision)
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

// The host's interfaces. Every call is counted against the policy's budget of host calls (its fuel
// over the fuel one call costs), so a loop of host calls ends as a v1 module's does.

impl HostState {
    fn host_call(&mut self) -> wasmtime::Result<()> {
        self.host_calls += 1;
        if self.host_calls > self.host_call_budget {
            return Err(wasmtime::Error::new(EvalError::Fuel));
        }
        Ok(())
    }

    fn key(&mut self, key: &str) -> wasmtime::Result<()> {
        self.host_call()?;
        if key.len() > MAX_HOST_STRING {
            return Err(wasmtime::Error::new(EvalError::Abi(format!(
                "host string of {} bytes (limit {MAX_HOST_STRING})",
                key.len()
            ))));
        }
        Ok(())
    }
}

impl t::Host for HostState {}

impl wit::slotgate::policy::log::Host for HostState {
    fn log(
        &mut self,
        level: wit::slotgate::policy::log::Level,
        message: String,
    ) -> wasmtime::Result<()> {
        use wit::slotgate::policy::log::Level;
        self.host_call()?;
        let msg = cut(message, MAX_HOST_STRING);
        let policy = &self.policy;
        match level {
            Level::Error => tracing::error!(target: "slotgate::policy", policy = %policy, "{msg}"),
            Level::Warn => tracing::warn!(target: "slotgate::policy", policy = %policy, "{msg}"),
            Level::Info => tracing::info!(target: "slotgate::policy", policy = %policy, "{msg}"),
            Level::Debug => tracing::debug!(target: "slotgate::policy", policy = %policy, "{msg}"),
        }
        Ok(())
    }
}

impl wit::slotgate::policy::clocks::Host for HostState {
    fn monotonic_ms(&mut self) -> wasmtime::Result<i64> {
        self.host_call()?;
        Ok(super::module::monotonic_ms())
    }

    fn wall_ms(&mut self) -> wasmtime::Result<i64> {
        self.host_call()?;
        Ok(super::state::wall_ms())
    }
}

/// `fn $name(key, [period,] $arg...)`: a host call on the policy's state, counted and its key
/// checked as every host call is, answering what `SharedState::$method` does for the policy's
/// state key.
macro_rules! state_call {
    (fn $name:ident(key, period $(, $arg:ident: $ty:ty)*) -> $ret:ty = $method:ident) => {
        fn $name(&mut self, key: String, period: String $(, $arg: $ty)*) -> wasmtime::Result<$ret> {
            self.key(&key)?;
            Ok(self.shared.$method(&self.state_key, &key, &period $(, $arg)*))
        }
    };
    (fn $name:ident(key $(, $arg:ident: $ty:ty)*) -> $ret:ty = $method:ident) => {
        fn $name(&mut self, key: String $(, $arg: $ty)*) -> wasmtime::Result<$ret> {
            self.key(&key)?;
            Ok(self.shared.$method(&self.state_key, &key $(, $arg)*))
        }
    };
}

impl wit::slotgate::policy::state::Host for HostState {
    state_call!(fn bucket_take(key, capacity: f64, refill: f64, amount: f64) -> f64 = bucket_take);
    state_call!(fn bucket_refund(key, capacity: f64, refill: f64, amount: f64) -> f64 = bucket_refund);
    state_call!(fn bucket_level(key, capacity: f64, refill: f64) -> f64 = bucket_level);
    state_call!(fn window_add(key, window_ms: i64, amount: i64) -> i64 = window_add);
    state_call!(fn quota_take(key, period, limit: f64, amount: f64) -> Result<f64, String> = quota_take);
    state_call!(
        fn quota_refund(key, period, limit: f64, amount: f64, at: i64) -> Result<f64, String> = quota_refund
    );
    state_call!(fn quota_level(key, period, limit: f64) -> Result<f64, String> = quota_level);
    state_call!(fn quota_limit(key, period, limit: f64) -> f64 = quota_limit_in_force);

    fn quota_reset_ms(&mut self, period: String) -> wasmtime::Result<Result<i64, String>> {
        self.host_call()?;
        Ok(self.shared.quota_reset_ms(&period))
    }

    fn event(&mut self, name: String) -> wasmtime::Result<()> {
        self.host_call()?;
        if !slotgate_sdk::host::is_event_name(&name) {
            return Err(wasmtime::Error::new(EvalError::Abi(format!(
                "event name `{}`: use [a-z0-9_], at most 64 bytes",
                cut(name, 80)
            ))));
        }
        self.shared.event(&self.policy, &name);
        Ok(())
    }
}

/// Runs `f` to its end on this thread: a call made with [`Runs::Blocking`] never yields at its
/// deadline checks, and the host functions it calls do not wait, so this only parks when a WASI
/// call truly waits (a guest sleeping, say).
pub fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
