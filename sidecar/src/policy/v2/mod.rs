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

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use slotgate_sdk::Decision;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{ResourceLimiter, Store, StoreLimitsBuilder};

use super::engine::PolicyEngine;
use super::error::{EvalError, LoadError};
use super::sandbox::{
    arm, block_on, classify, new_store, CallClock, Evaluation, HostState, PolicyLimits, Runs,
    SettingsVerdict, HOST_CALL_FUEL, LOAD_DEADLINE,
};
use crate::budgets::Budgets;

mod host;
pub mod records;

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
pub const WIT: &str = include_str!("../../../../sdk/wit/policy.wit");

/// Instances, tables and memories one component may create: a Python component is a dozen core
/// modules linked together; a Rust one is one or two. The pool holds as many per evaluation.
const COMPONENT_INSTANCES: usize = super::engine::CORE_PER_CALL as usize;
const COMPONENT_MEMORIES: usize = super::engine::MEMORIES_PER_CALL as usize;

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
    shared: Arc<Budgets>,
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
        limits.check_size(bytes)?;
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
        shared: Arc<Budgets>,
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
            Err(message) => Err(LoadError::Settings(records::cut(message, 4096))),
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
        Ok((
            records::decision_of(decision, self.limits.max_output_bytes)?,
            ev,
        ))
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

type Clock = Arc<CallClock>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
