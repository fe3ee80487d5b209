//! One loaded policy: the module compiled off the request path, its exports checked against ABI v1,
//! host functions linked, and an `InstancePre` from which every evaluation gets a fresh instance.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::{
    Caller, Extern, InstancePre, Linker, Module, ResourceLimiter, Store, StoreLimitsBuilder, Trap,
    UpdateDeadline,
};

use slotgate_sdk::{Completion, Decision, EvaluateInput, SettingsValidation, Verdict};

use super::abi::{self, ABI_VERSION, IMPORT_MODULE};
use super::engine::{PolicyEngine, EPOCH_TICK};
pub use super::error::{EvalError, LoadError};
use super::state::{HostState, SharedState};

/// Fuel one host call costs, on top of the instructions around it: a loop of host calls runs out.
pub(super) const HOST_CALL_FUEL: u64 = 1_000;
/// Wall-clock deadline of the calls made while loading (ABI check, settings, canary): a loaded machine
/// must not make a healthy policy look slow. Fuel still bounds a runaway start function or canary.
pub const LOAD_DEADLINE: Duration = Duration::from_secs(1);
/// An evaluation slowed down by a busy machine still ends after this many times its deadline.
const WALL_CEILING_FACTOR: u32 = 10;
/// Longest key or log message a guest may pass to a host function.
pub(super) const MAX_HOST_STRING: usize = 4096;

/// Per-policy caps on one evaluation.
#[derive(Debug, Clone, Copy)]
pub struct PolicyLimits {
    pub fuel: u64,
    pub deadline: Duration,
    pub memory_bytes: usize,
    pub max_module_bytes: usize,
    pub max_output_bytes: usize,
}

impl Default for PolicyLimits {
    fn default() -> Self {
        PolicyLimits {
            fuel: 10_000_000,
            deadline: Duration::from_millis(20),
            memory_bytes: 16 << 20,
            max_module_bytes: 8 << 20,
            max_output_bytes: 64 << 10,
        }
    }
}

/// What a successful call returned, and what it cost.
#[derive(Debug)]
pub struct Evaluation {
    pub output: Option<Vec<u8>>,
    pub fuel_used: u64,
    pub elapsed: Duration,
    /// CPU time the deadline check counted (see `cpu_deadline`): zero for a call that ended before
    /// the first epoch tick, which is nearly every call of a healthy policy.
    pub cpu: Duration,
}

/// Where a call runs, which decides what its deadline check does while the deadline is not over:
/// on a thread of its own (the blocking pool, start-up, the CLI) it lets the call go on; on an async
/// worker it also yields to the worker's other tasks at every tick, so even a runaway policy holds
/// up no other connection for more than a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    Blocking,
    Async,
}

pub struct Policy {
    name: Arc<str>,
    /// Whose budgets its host state is (see [`Policy::keyed`]).
    state_key: Arc<str>,
    engine: PolicyEngine,
    shared: Arc<SharedState>,
    pre: InstancePre<HostState>,
    limits: PolicyLimits,
    has_validate: bool,
    has_on_complete: bool,
}

impl Policy {
    /// Compiles and links `bytes`. Slow (milliseconds): never call it on the request path.
    pub fn load(
        engine: &PolicyEngine,
        shared: Arc<SharedState>,
        name: &str,
        bytes: &[u8],
        limits: PolicyLimits,
    ) -> Result<Policy, LoadError> {
        let module = Policy::compile(engine, bytes, limits)?;
        Policy::link(engine, shared, name, &module, limits)
    }

    /// Compiles `bytes` (wasm or WAT) for `engine`, after the module-size cap. Slow: the result is
    /// worth caching (see `PolicySet`).
    pub fn compile(
        engine: &PolicyEngine,
        bytes: &[u8],
        limits: PolicyLimits,
    ) -> Result<Module, LoadError> {
        if bytes.len() > limits.max_module_bytes {
            return Err(LoadError::TooLarge {
                size: bytes.len(),
                limit: limits.max_module_bytes,
            });
        }
        Module::new(engine.engine(), bytes).map_err(|e| LoadError::Compile(format!("{e:#}")))
    }

    /// Checks a compiled module against ABI v1 and links the host functions: the policy is then
    /// ready to evaluate.
    pub fn link(
        engine: &PolicyEngine,
        shared: Arc<SharedState>,
        name: &str,
        module: &Module,
        limits: PolicyLimits,
    ) -> Result<Policy, LoadError> {
        check_exports(module)?;
        let linker = linker(engine)?;
        let pre = linker
            .instantiate_pre(module)
            .map_err(|e| LoadError::Abi(format!("{e:#}")))?;
        let has = |n: &str| module.get_export(n).is_some();
        let policy = Policy {
            name: Arc::from(name),
            state_key: Arc::from(name),
            engine: engine.clone(),
            shared,
            has_validate: has(abi::EXPORT_VALIDATE),
            has_on_complete: has(abi::EXPORT_ON_COMPLETE),
            pre,
            limits,
        };
        policy.check_version()?;
        Ok(policy)
    }

    /// The same policy keeping its budgets under `key` instead of its name.
    pub fn keyed(mut self, key: &str) -> Policy {
        self.state_key = Arc::from(key);
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn has_validate(&self) -> bool {
        self.has_validate
    }

    pub fn has_on_complete(&self) -> bool {
        self.has_on_complete
    }

    fn check_version(&self) -> Result<(), LoadError> {
        let (mut store, instance) = self
            .instantiate(self.limits.deadline.max(LOAD_DEADLINE))
            .map_err(LoadError::Eval)?;
        let version = instance
            .get_typed_func::<(), i32>(&mut store, abi::EXPORT_VERSION)
            .and_then(|f| f.call(&mut store, ()))
            .map_err(|e| LoadError::Eval(classify(&store, e)))?;
        if version != ABI_VERSION {
            return Err(LoadError::Abi(format!(
                "module speaks ABI {version}; this slotgate speaks {ABI_VERSION}"
            )));
        }
        Ok(())
    }

    /// Runs `slotgate_validate_settings` (when exported) on `settings`: what the policy, so
    /// configured, asks of the host.
    pub fn validate_settings(
        &self,
        settings: &serde_json::Value,
    ) -> Result<SettingsVerdict, LoadError> {
        self.validate_settings_then(settings, |_, _| ())
            .map(|(verdict, ())| verdict)
    }

    /// [`Policy::validate_settings`], then `then` with the instance it ran in (to snapshot it).
    pub fn validate_settings_then<R>(
        &self,
        settings: &serde_json::Value,
        then: impl FnOnce(&mut Store<HostState>, &wasmtime::Instance) -> R,
    ) -> Result<(SettingsVerdict, R), LoadError> {
        let input = serde_json::to_vec(settings).map_err(|e| LoadError::Settings(e.to_string()))?;
        let (mut store, instance) = self.instantiate(self.limits.deadline)?;
        if !self.has_validate {
            return Ok((SettingsVerdict::default(), then(&mut store, &instance)));
        }
        let out = abi::call_json(
            &mut store,
            &instance,
            abi::EXPORT_VALIDATE,
            &input,
            self.limits.max_output_bytes,
        )
        .map_err(|e| classify(&store, e))?
        .ok_or_else(|| EvalError::InvalidOutput("validate_settings returned nothing".into()))?;
        let verdict = settings_verdict(&out)?;
        Ok((verdict, then(&mut store, &instance)))
    }

    /// Evaluates one request: the decision, checked against the ABI, and what it cost.
    pub fn evaluate(&self, input: &EvaluateInput) -> Result<(Decision, Evaluation), EvalError> {
        let bytes = serde_json::to_vec(input).map_err(|e| EvalError::Abi(e.to_string()))?;
        self.evaluate_json(&bytes)
    }

    /// [`Policy::evaluate`] of an [`EvaluateInput`] already serialised.
    pub fn evaluate_json(&self, input: &[u8]) -> Result<(Decision, Evaluation), EvalError> {
        let mut ev = self.call(abi::EXPORT_EVALUATE, input)?;
        let out = ev
            .output
            .take()
            .ok_or_else(|| EvalError::InvalidOutput("evaluate returned nothing".into()))?;
        Ok((parse_decision(&out)?, ev))
    }

    /// [`Policy::evaluate_json`] on an async worker: it yields to the worker's other tasks at every
    /// epoch tick (see [`Runs`]).
    pub async fn evaluate_json_async(
        &self,
        input: &[u8],
    ) -> Result<(Decision, Evaluation), EvalError> {
        let mut ev = self.call_async(abi::EXPORT_EVALUATE, input).await?;
        let out = ev
            .output
            .take()
            .ok_or_else(|| EvalError::InvalidOutput("evaluate returned nothing".into()))?;
        Ok((parse_decision(&out)?, ev))
    }

    /// Tells the policy what really happened (`slotgate_on_complete`, when exported).
    pub fn on_complete(&self, completion: &Completion) -> Result<Option<Evaluation>, EvalError> {
        if !self.has_on_complete {
            return Ok(None);
        }
        let bytes = serde_json::to_vec(completion).map_err(|e| EvalError::Abi(e.to_string()))?;
        self.call(abi::EXPORT_ON_COMPLETE, &bytes).map(Some)
    }

    /// [`Policy::on_complete`] on an async worker (see [`Runs`]).
    pub async fn on_complete_async(
        &self,
        completion: &Completion,
    ) -> Result<Option<Evaluation>, EvalError> {
        if !self.has_on_complete {
            return Ok(None);
        }
        let bytes = serde_json::to_vec(completion).map_err(|e| EvalError::Abi(e.to_string()))?;
        self.call_async(abi::EXPORT_ON_COMPLETE, &bytes)
            .await
            .map(Some)
    }

    /// Calls `export` with `input` in a fresh instance under this policy's limits.
    pub fn call(&self, export: &str, input: &[u8]) -> Result<Evaluation, EvalError> {
        let started = Instant::now();
        let (mut store, clock) = self.store(self.limits.deadline, Runs::Blocking)?;
        let instance = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| classify(&store, e))?;
        let result = abi::call_json(
            &mut store,
            &instance,
            export,
            input,
            self.limits.max_output_bytes,
        );
        self.finish(&store, &clock, started, result)
    }

    /// [`Policy::call`] on an async worker (see [`Runs`]).
    pub async fn call_async(&self, export: &str, input: &[u8]) -> Result<Evaluation, EvalError> {
        let started = Instant::now();
        let (mut store, clock) = self.store(self.limits.deadline, Runs::Async)?;
        let instance = match self.pre.instantiate_async(&mut store).await {
            Ok(i) => i,
            Err(e) => return Err(classify(&store, e)),
        };
        let result = abi::call_json_async(
            &mut store,
            &instance,
            export,
            input,
            self.limits.max_output_bytes,
        )
        .await;
        self.finish(&store, &clock, started, result)
    }

    fn finish(
        &self,
        store: &Store<HostState>,
        clock: &CallClock,
        started: Instant,
        result: Result<Option<Vec<u8>>, wasmtime::Error>,
    ) -> Result<Evaluation, EvalError> {
        let fuel_used = self
            .limits
            .fuel
            .saturating_sub(store.get_fuel().unwrap_or(0));
        match result {
            Ok(output) => Ok(Evaluation {
                output,
                fuel_used,
                elapsed: started.elapsed(),
                cpu: clock.counted(),
            }),
            Err(e) => Err(classify(store, e)),
        }
    }

    fn instantiate(
        &self,
        deadline: Duration,
    ) -> Result<(Store<HostState>, wasmtime::Instance), EvalError> {
        let (mut store, _) = self.store(deadline, Runs::Blocking)?;
        // The start function runs here, under the same fuel, deadline and memory caps.
        let instance = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| classify(&store, e))?;
        Ok((store, instance))
    }

    /// A store for one call: this policy's fuel, memory caps and deadline check.
    fn store(
        &self,
        deadline: Duration,
        runs: Runs,
    ) -> Result<(Store<HostState>, Arc<CallClock>), EvalError> {
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.limits.memory_bytes)
            .instances(1)
            .tables(1)
            .memories(1)
            .build();
        let state = HostState::new(
            limits,
            self.shared.clone(),
            self.name.clone(),
            self.state_key.clone(),
        );
        let (mut store, clock) = new_store(&self.engine, state, self.limits.fuel, deadline, runs)?;
        store.limiter(|s| s as &mut dyn ResourceLimiter);
        Ok((store, clock))
    }
}

/// A store for one call of a core module or a component: `fuel`, and the deadline check.
pub(super) fn new_store(
    engine: &PolicyEngine,
    state: HostState,
    fuel: u64,
    deadline: Duration,
    runs: Runs,
) -> Result<(Store<HostState>, Arc<CallClock>), EvalError> {
    let mut store = Store::new(engine.engine(), state);
    let clock = arm(&mut store, fuel, deadline, runs)?;
    Ok((store, clock))
}

/// Readies `store` for one call: `fuel`, the deadline check from the next tick on, and the host
/// call counters at zero. A kept instance's store is armed again before each call.
pub(super) fn arm(
    store: &mut Store<HostState>,
    fuel: u64,
    deadline: Duration,
    runs: Runs,
) -> Result<Arc<CallClock>, EvalError> {
    store
        .set_fuel(fuel)
        .map_err(|e| EvalError::Abi(e.to_string()))?;
    // The first check comes at the next tick, where the thread's CPU clock is first read (see
    // `cpu_deadline`).
    let clock = Arc::new(CallClock::default());
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(cpu_deadline(deadline, clock.clone(), runs));
    let state = store.data_mut();
    state.host_calls = 0;
    state.memory_denied = false;
    Ok(clock)
}

/// The CPU time one call used, as its deadline check counts it: from its first check on, and on an
/// async worker only while it ran (not while it had yielded to other tasks).
#[derive(Debug)]
pub(super) struct CallClock {
    /// Nanoseconds counted so far.
    counted: AtomicU64,
    /// The thread's CPU clock when counting last resumed (the first check, or the end of a yield);
    /// `u64::MAX` before the first check.
    mark: AtomicU64,
}

impl Default for CallClock {
    fn default() -> Self {
        CallClock {
            counted: AtomicU64::new(0),
            mark: AtomicU64::new(u64::MAX),
        }
    }
}

impl CallClock {
    /// Counts the CPU time since the mark up to `cpu` (the thread's clock now), moves the mark to
    /// `cpu` and returns the total.
    fn count(&self, cpu: Duration) -> Duration {
        let now = cpu.as_nanos() as u64;
        let mark = self.mark.swap(now, Ordering::Relaxed);
        let add = if mark == u64::MAX {
            0
        } else {
            now.saturating_sub(mark)
        };
        Duration::from_nanos(self.counted.fetch_add(add, Ordering::Relaxed) + add)
    }

    /// Counting resumes after a yield, at `cpu` (the clock of the thread that runs the call now: a
    /// task may resume on another worker).
    fn resume(&self, cpu: Duration) {
        self.mark.store(cpu.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(super) fn counted(&self) -> Duration {
        Duration::from_nanos(self.counted.load(Ordering::Relaxed))
    }
}

/// The smallest weight a policy may give. A request's charge is `cost / weight` virtual tokens; with
/// a cost up to 2^64 a smaller weight (1e-300, say) makes it infinite, and the fair-share counters it
/// is added to and subtracted from turn infinite and then NaN, which sorts that tenant first or last
/// for good. From 1e-6 the largest charge, 2^84, leaves the counters ample room.
pub const MIN_WEIGHT: f64 = 1e-6;

/// A policy's `evaluate` output as the host accepts it: ABI v1 JSON, a deny's status 403 or 429, a
/// weight usable as a divisor. Apart from [`Policy`] so the fuzz target reaches it without wasm.
pub fn parse_decision(out: &[u8]) -> Result<Decision, EvalError> {
    let decision: Decision = serde_json::from_slice(out).map_err(|e| {
        EvalError::InvalidOutput(format!("decision is not valid JSON for ABI v1: {e}"))
    })?;
    check_decision(decision)
}

/// A decision as the host accepts it, from a v1 module or a component: a deny's status 403 or 429,
/// a weight usable as a divisor, a tenant cap that lets one request in.
pub fn check_decision(decision: Decision) -> Result<Decision, EvalError> {
    if decision.verdict == Verdict::Deny && !matches!(decision.status, None | Some(403) | Some(429))
    {
        return Err(EvalError::InvalidOutput(format!(
            "a deny's status must be 403 or 429, not {:?}",
            decision.status
        )));
    }
    if let Some(w) = decision.weight {
        // JSON cannot carry NaN or infinity, but a weight must also be usable as a divisor.
        if !(w.is_finite() && w >= MIN_WEIGHT) {
            return Err(EvalError::InvalidOutput(format!(
                "weight must be a positive number of at least {MIN_WEIGHT}, not {w}"
            )));
        }
    }
    if decision.max_in_service == Some(0) {
        // A cap of 0 would hold the request until its queue timeout: a refusal is a deny.
        return Err(EvalError::InvalidOutput(
            "max_in_service must be at least 1 (to refuse the request, deny it)".into(),
        ));
    }
    Ok(decision)
}

/// What a policy's `validate_settings` asked of the host along with accepting its settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SettingsVerdict {
    /// Count every prompt before the chain runs (`needs_prompt_tokens`).
    pub needs_prompt_tokens: bool,
    /// The instance kept its parsed settings: snapshot it (`keeps_settings`).
    pub keeps_settings: bool,
    /// A component asked for `on-complete` after each request it allowed (`wants-completions`).
    pub wants_completions: bool,
}

/// A policy's `validate_settings` output: `Ok` when it accepts its settings, with whether it needs
/// the exact prompt count to decide.
pub fn settings_verdict(out: &[u8]) -> Result<SettingsVerdict, LoadError> {
    let v: SettingsValidation = serde_json::from_slice(out)
        .map_err(|e| EvalError::InvalidOutput(format!("validate_settings output: {e}")))?;
    if v.valid {
        Ok(SettingsVerdict {
            needs_prompt_tokens: v.needs_prompt_tokens,
            keeps_settings: v.keeps_settings,
            wants_completions: false,
        })
    } else {
        Err(LoadError::Settings(
            v.message.unwrap_or_else(|| "invalid settings".into()),
        ))
    }
}

/// Whole epoch ticks covering `d`, at least one.
fn ticks(d: Duration) -> u64 {
    d.as_millis().div_ceil(EPOCH_TICK.as_millis()).max(1) as u64
}

/// CPU time this thread has used.
pub fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// The deadline check run when the epoch deadline passes. The wall-clock deadline counts only time
/// the evaluation ran: when the machine is busy and the thread spent part of it waiting for a core,
/// the deadline is extended by the CPU time not yet used, so a healthy policy is not failed by
/// someone else's load. A wall-clock ceiling of [`WALL_CEILING_FACTOR`] times the deadline (at
/// least [`LOAD_DEADLINE`]) ends it regardless.
///
/// The thread's CPU clock is a system call, which would be a tenth of a fast evaluation; it is read
/// only from the first check on, at the first epoch tick, and most evaluations end before any tick.
/// What ran before that first check is not counted: at most one tick of CPU time (the tick comes
/// within [`EPOCH_TICK`] of the start, and a running evaluation reaches a check as soon as it has
/// passed), so a runaway policy gets at most one tick more than its deadline. Counting that time as
/// wall-clock instead would fail healthy policies on a busy machine (the thread may wait for a core
/// for many ticks before its first check).
fn cpu_deadline(
    deadline: Duration,
    clock: Arc<CallClock>,
    runs: Runs,
) -> impl FnMut(wasmtime::StoreContextMut<'_, HostState>) -> wasmtime::Result<UpdateDeadline>
       + Send
       + Sync
       + 'static {
    let wall0 = Instant::now();
    let ceiling = (deadline * WALL_CEILING_FACTOR).max(LOAD_DEADLINE);
    move |_| {
        let used = clock.count(thread_cpu());
        if used >= deadline || wall0.elapsed() >= ceiling {
            return Ok(UpdateDeadline::Interrupt);
        }
        Ok(match runs {
            Runs::Blocking => UpdateDeadline::Continue(ticks(deadline - used)),
            // Let the worker's other tasks run, then go on for another tick; what ran meanwhile is
            // not this call's.
            Runs::Async => {
                let clock = clock.clone();
                UpdateDeadline::YieldCustom(
                    1,
                    Box::pin(async move {
                        tokio::task::yield_now().await;
                        clock.resume(thread_cpu());
                    }),
                )
            }
        })
    }
}

pub(super) fn classify(store: &Store<HostState>, e: wasmtime::Error) -> EvalError {
    if store.data().memory_denied {
        return EvalError::Memory;
    }
    if let Some(known) = e.downcast_ref::<EvalError>() {
        return known.clone();
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => EvalError::Fuel,
        Some(Trap::Interrupt) => EvalError::Timeout,
        Some(t) => EvalError::Trap(t.to_string()),
        None => EvalError::Trap(format!("{e:#}")),
    }
}

fn check_exports(module: &Module) -> Result<(), LoadError> {
    use wasmtime::ExternType;
    let func = |name: &str| match module.get_export(name) {
        Some(ExternType::Func(f)) => Ok(Some(f)),
        Some(_) => Err(LoadError::Abi(format!("`{name}` must be a function"))),
        None => Ok(None),
    };
    if !matches!(
        module.get_export(abi::EXPORT_MEMORY),
        Some(ExternType::Memory(_))
    ) {
        return Err(LoadError::Abi("the module must export its `memory`".into()));
    }
    let json_call = "(i32, i32) -> (i64)";
    let exports = [
        (abi::EXPORT_VERSION, true, "() -> (i32)"),
        (abi::EXPORT_ALLOC, true, "(i32) -> (i32)"),
        (abi::EXPORT_EVALUATE, true, json_call),
        (abi::EXPORT_VALIDATE, false, json_call),
        (abi::EXPORT_ON_COMPLETE, false, json_call),
    ];
    for (name, required, want) in exports {
        match func(name)? {
            None if required => {
                return Err(LoadError::Abi(format!("missing required export `{name}`")))
            }
            None => {}
            Some(f) => {
                let list = |ts: &mut dyn Iterator<Item = wasmtime::ValType>| {
                    ts.map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
                };
                let got = format!(
                    "({}) -> ({})",
                    list(&mut f.params()),
                    list(&mut f.results())
                );
                if got != want {
                    return Err(LoadError::Abi(format!(
                        "`{name}` must have the signature {want}, not {got}"
                    )));
                }
            }
        }
    }
    for import in module.imports() {
        if import.module() != IMPORT_MODULE {
            return Err(LoadError::Abi(format!(
                "imports `{}::{}`; policies may only import from `{IMPORT_MODULE}`",
                import.module(),
                import.name()
            )));
        }
    }
    Ok(())
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = self.limits.memory_growing(current, desired, maximum)?;
        if ok {
            self.memory_high = self.memory_high.max(desired);
        } else {
            self.memory_denied = true;
            // Growth beyond the cap ends the evaluation instead of letting the guest see -1 and carry on.
            return Err(wasmtime::Error::msg("policy memory limit exceeded"));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// Charges a host call's fuel and reads a guest string argument.
fn host_str(caller: &mut Caller<'_, HostState>, ptr: i32, len: i32) -> wasmtime::Result<String> {
    caller.data_mut().host_calls += 1;
    let fuel = caller.get_fuel()?;
    caller.set_fuel(fuel.saturating_sub(HOST_CALL_FUEL))?;
    if fuel < HOST_CALL_FUEL {
        return Err(Trap::OutOfFuel.into());
    }
    let len = usize::try_from(len)
        .ok()
        .filter(|l| *l <= MAX_HOST_STRING)
        .ok_or_else(|| {
            wasmtime::Error::new(EvalError::Abi(format!(
                "host string of {len} bytes (limit {MAX_HOST_STRING})"
            )))
        })?;
    let mem = match caller.get_export(abi::EXPORT_MEMORY) {
        Some(Extern::Memory(m)) => m,
        _ => {
            return Err(wasmtime::Error::new(EvalError::Abi(
                "no memory export".into(),
            )))
        }
    };
    let bytes =
        abi::read(&*caller, &mem, ptr as u32 as usize, len).map_err(wasmtime::Error::new)?;
    String::from_utf8(bytes)
        .map_err(|_| wasmtime::Error::new(EvalError::Abi("host string is not UTF-8".into())))
}

/// Links `$name`, a host call on the policy's state: the guest passes the key (and for a quota
/// the period) as a pointer and a length each, read as [`host_str`] reads them (fuel, limits),
/// then the `$arg`s; the call answers what `SharedState::$method` does for the policy's state key,
/// its own error a trap (see [`HostAnswer`]).
macro_rules! link_state {
    ($l:expr, $name:literal => $method:ident(key, period $(, $arg:ident: $ty:ty)*)) => {
        $l.func_wrap(
            IMPORT_MODULE,
            $name,
            |mut c: Caller<'_, HostState>, kp: i32, kl: i32, pp: i32, pl: i32 $(, $arg: $ty)*| {
                let key = host_str(&mut c, kp, kl)?;
                let period = host_str(&mut c, pp, pl)?;
                let s = c.data();
                s.shared.$method(&s.state_key, &key, &period $(, $arg)*).answer()
            },
        )
    };
    ($l:expr, $name:literal => $method:ident(key $(, $arg:ident: $ty:ty)*)) => {
        $l.func_wrap(
            IMPORT_MODULE,
            $name,
            |mut c: Caller<'_, HostState>, kp: i32, kl: i32 $(, $arg: $ty)*| {
                let key = host_str(&mut c, kp, kl)?;
                let s = c.data();
                s.shared.$method(&s.state_key, &key $(, $arg)*).answer()
            },
        )
    };
}

/// What a state call returns, as its host call answers it: a number as it is, the call's own
/// error (a bad period, say) as the trap [`host_error`] makes of it.
trait HostAnswer {
    type Value;
    fn answer(self) -> wasmtime::Result<Self::Value>;
}

/// Numbers, answered as they are.
macro_rules! answer_as_is {
    ($($t:ty),*) => {$(
        impl HostAnswer for $t {
            type Value = $t;
            fn answer(self) -> wasmtime::Result<$t> {
                Ok(self)
            }
        }
    )*};
}
answer_as_is!(f64, i64);

impl<T> HostAnswer for Result<T, String> {
    type Value = T;
    fn answer(self) -> wasmtime::Result<T> {
        self.map_err(host_error)
    }
}

fn linker(engine: &PolicyEngine) -> Result<Linker<HostState>, LoadError> {
    let mut l = Linker::<HostState>::new(engine.engine());
    let wrap = |e: wasmtime::Error| LoadError::Abi(format!("linking host functions: {e:#}"));
    l.func_wrap(
        IMPORT_MODULE,
        "log",
        |mut c: Caller<'_, HostState>, level: i32, ptr: i32, len: i32| {
            let msg = host_str(&mut c, ptr, len)?;
            let policy = c.data().policy.clone();
            match level {
                0 => tracing::error!(target: "slotgate::policy", policy = %policy, "{msg}"),
                1 => tracing::warn!(target: "slotgate::policy", policy = %policy, "{msg}"),
                2 => tracing::info!(target: "slotgate::policy", policy = %policy, "{msg}"),
                _ => tracing::debug!(target: "slotgate::policy", policy = %policy, "{msg}"),
            }
            Ok(())
        },
    )
    .map_err(wrap)?;
    l.func_wrap(
        IMPORT_MODULE,
        "now_ms",
        |mut c: Caller<'_, HostState>| -> wasmtime::Result<i64> {
            host_str(&mut c, 0, 0)?;
            Ok(monotonic_ms())
        },
    )
    .map_err(wrap)?;
    link_state!(l, "bucket_take" => bucket_take(key, capacity: f64, refill: f64, amount: f64))
        .map_err(wrap)?;
    link_state!(l, "bucket_refund" => bucket_refund(key, capacity: f64, refill: f64, amount: f64))
        .map_err(wrap)?;
    link_state!(l, "window_add" => window_add(key, window_ms: i64, amount: i64)).map_err(wrap)?;
    link_v1_additions(&mut l).map_err(wrap)?;
    Ok(l)
}

/// A host function's own error (a bad period, say) as the trap it becomes: the call fails as a
/// policy error naming it.
fn host_error(e: String) -> wasmtime::Error {
    wasmtime::Error::new(EvalError::Abi(e))
}

/// The imports added to ABI v1 after its first release (issue 33): optional, so modules built
/// before them load unchanged. Each is a host call (fuel) like the others.
fn link_v1_additions(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    link_state!(l, "bucket_level" => bucket_level(key, capacity: f64, refill: f64))?;
    l.func_wrap(
        IMPORT_MODULE,
        "wall_ms",
        |mut c: Caller<'_, HostState>| -> wasmtime::Result<i64> {
            host_str(&mut c, 0, 0)?;
            Ok(super::state::wall_ms())
        },
    )?;
    link_state!(l, "quota_take" => quota_take(key, period, limit: f64, amount: f64))?;
    link_state!(l, "quota_refund" => quota_refund(key, period, limit: f64, amount: f64, at: i64))?;
    link_state!(l, "quota_level" => quota_level(key, period, limit: f64))?;
    link_state!(l, "quota_limit" => quota_limit_in_force(key, period, limit: f64))?;
    l.func_wrap(
        IMPORT_MODULE,
        "quota_reset_ms",
        |mut c: Caller<'_, HostState>, pp: i32, pl: i32| {
            let period = host_str(&mut c, pp, pl)?;
            c.data().shared.quota_reset_ms(&period).map_err(host_error)
        },
    )?;
    l.func_wrap(
        IMPORT_MODULE,
        "event",
        |mut c: Caller<'_, HostState>, np: i32, nl: i32| {
            let name = host_str(&mut c, np, nl)?;
            if !slotgate_sdk::host::is_event_name(&name) {
                return Err(host_error(format!(
                    "event name `{name}`: use [a-z0-9_], at most 64 bytes"
                )));
            }
            let s = c.data();
            s.shared.event(&s.policy, &name);
            Ok(())
        },
    )?;
    Ok(())
}

pub(super) fn monotonic_ms() -> i64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as i64
}

/// A hand-written ABI v1 module in WAT, for tests and benchmarks: `imports` (WAT import fields),
/// ABI `version`, a bump allocator from `heap` on, and `slotgate_evaluate` answering `decision` (JSON,
/// kept at offset 16) after running `evaluate_body` (WAT instructions, e.g. `(loop $l (br $l))`,
/// to make hostile variants); `extra` adds module fields.
#[doc(hidden)]
pub fn raw_v1_wat(
    imports: &str,
    version: i32,
    heap: u32,
    decision: &str,
    evaluate_body: &str,
    extra: &str,
) -> String {
    let escaped = decision.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        r#"(module
  {imports}
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const {heap}))
  (data (i32.const 16) "{escaped}")
  (func (export "slotgate_abi_version") (result i32) (i32.const {version}))
  (func (export "slotgate_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (global.set $next (i32.add (global.get $next) (local.get $n)))
    (local.get $p))
  (func (export "slotgate_evaluate") (param $p i32) (param $n i32) (result i64)
    {evaluate_body}
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const {len})))
  {extra}
)"#,
        len = decision.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::EngineLimits;

    /// A bump allocator, the ABI version, and `evaluate` returning a fixed decision; `$body` is spliced
    /// into `evaluate` before it returns, to make hostile variants.
    fn wat(version: i32, body: &str, extra: &str) -> String {
        let take = r#"(import "slotgate" "bucket_take" (func $take (param i32 i32 f64 f64 f64) (result f64)))"#;
        raw_v1_wat(
            take,
            version,
            1024,
            r#"{"verdict":"allow","cost":7}"#,
            body,
            extra,
        )
    }

    fn load(src: &str, limits: PolicyLimits) -> Result<Policy, LoadError> {
        let engine = PolicyEngine::new(EngineLimits {
            max_instances: 16,
            max_memory_bytes: 64 << 20,
        })
        .unwrap();
        Policy::load(&engine, Arc::default(), "t", src.as_bytes(), limits)
    }

    fn eval(src: &str, limits: PolicyLimits) -> Result<Evaluation, EvalError> {
        load(src, limits).unwrap().call(abi::EXPORT_EVALUATE, b"{}")
    }

    #[test]
    fn a_good_policy_answers_with_its_decision_and_fuel() {
        let ev = eval(&wat(1, "", ""), PolicyLimits::default()).unwrap();
        assert_eq!(
            ev.output.as_deref(),
            Some(&br#"{"verdict":"allow","cost":7}"#[..])
        );
        assert!(ev.fuel_used > 0);
    }

    #[test]
    fn a_weight_must_be_a_positive_number() {
        for (decision, valid) in [
            (r#"{"verdict":"allow","weight":2.5}"#, true),
            (r#"{"verdict":"allow","weight":0}"#, false),
            (r#"{"verdict":"allow","weight":-1.0}"#, false),
            // Found by fuzzing: a cost over so small a weight is an infinite charge.
            (r#"{"verdict":"allow","weight":1e-300}"#, false),
        ] {
            let src = wat(1, "", "")
                .replace(
                    r#"{\"verdict\":\"allow\",\"cost\":7}"#,
                    &decision.replace('"', "\\\""),
                )
                .replace("(i64.const 28)", &format!("(i64.const {})", decision.len()));
            let got = load(&src, PolicyLimits::default())
                .unwrap()
                .evaluate(&EvaluateInput::default());
            match got {
                Ok((d, _)) => assert!(valid && d.weight == Some(2.5), "{decision}: {d:?}"),
                Err(e) => assert!(!valid && e.kind() == "invalid_output", "{decision}: {e}"),
            }
        }
    }

    #[test]
    fn a_tenant_cap_must_let_one_request_in() {
        let ok = parse_decision(br#"{"verdict":"allow","max_in_service":2,"max_waiting":0}"#);
        let d = ok.unwrap();
        assert_eq!((d.max_in_service, d.max_waiting), (Some(2), Some(0)));
        let err = parse_decision(br#"{"verdict":"allow","max_in_service":0}"#).unwrap_err();
        assert_eq!(err.kind(), "invalid_output", "{err}");
    }

    #[test]
    fn hostile_modules_fail_cleanly_with_the_right_kind() {
        // Generous deadline, so only the fuel can stop these; the timeout case below swaps the two.
        let lim = PolicyLimits {
            fuel: 200_000,
            deadline: Duration::from_secs(10),
            ..PolicyLimits::default()
        };
        let spin = "(loop $l (br $l))";
        assert_eq!(eval(&wat(1, spin, ""), lim).unwrap_err().kind(), "fuel");
        let long_fuel = PolicyLimits {
            fuel: u64::MAX / 4,
            deadline: Duration::from_millis(30),
            ..lim
        };
        let t = Instant::now();
        assert_eq!(
            eval(&wat(1, spin, ""), long_fuel).unwrap_err().kind(),
            "timeout"
        );
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "deadline took {:?}",
            t.elapsed()
        );
        let bomb = "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))";
        assert_eq!(eval(&wat(1, bomb, ""), lim).unwrap_err().kind(), "memory");
        assert_eq!(
            eval(&wat(1, "unreachable", ""), lim).unwrap_err().kind(),
            "trap"
        );
        let recurse = "(call $deep)";
        let deep = "(func $deep (call $deep))";
        assert_eq!(
            eval(&wat(1, recurse, deep), lim).unwrap_err().kind(),
            "trap"
        );
        let host_loop = "(loop $l (drop (call $take (i32.const 0) (i32.const 1) (f64.const 1) (f64.const 1) (f64.const 0))) (br $l))";
        assert_eq!(
            eval(&wat(1, host_loop, ""), lim).unwrap_err().kind(),
            "fuel"
        );
        let huge = wat(
            1,
            "(return (i64.or (i64.shl (i64.const 0) (i64.const 32)) (i64.const 10000000)))",
            "",
        );
        assert_eq!(eval(&huge, lim).unwrap_err().kind(), "invalid_output");
        let outside = wat(
            1,
            "(return (i64.or (i64.shl (i64.const 65530) (i64.const 32)) (i64.const 100)))",
            "",
        );
        assert_eq!(eval(&outside, lim).unwrap_err().kind(), "invalid_output");
    }

    #[test]
    fn a_start_function_is_bounded_too() {
        let lim = PolicyLimits {
            fuel: 200_000,
            deadline: Duration::from_secs(10),
            ..PolicyLimits::default()
        };
        let start = "(func $s (loop $l (br $l))) (start $s)";
        assert!(matches!(
            load(&wat(1, "", start), lim),
            Err(LoadError::Eval(EvalError::Fuel))
        ));
    }

    #[test]
    fn wrong_abi_and_missing_exports_are_refused_at_load() {
        let lim = PolicyLimits::default();
        assert!(
            matches!(load(&wat(2, "", ""), lim), Err(LoadError::Abi(m)) if m.contains("ABI 2"))
        );
        let no_eval = wat(1, "", "").replace("\"slotgate_evaluate\"", "\"other\"");
        assert!(
            matches!(load(&no_eval, lim), Err(LoadError::Abi(m)) if m.contains("slotgate_evaluate"))
        );
        let wasi = wat(1, "", "").replace(
            "(import \"slotgate\" \"bucket_take\"",
            "(import \"wasi\" \"bucket_take\"",
        );
        assert!(matches!(load(&wasi, lim), Err(LoadError::Abi(m)) if m.contains("wasi")));
        let small = PolicyLimits {
            max_module_bytes: 10,
            ..lim
        };
        assert!(matches!(
            load(&wat(1, "", ""), small),
            Err(LoadError::TooLarge { .. })
        ));
    }
}

#[cfg(test)]
mod deadline_and_signature_tests {
    use super::*;
    use crate::policy::EngineLimits;

    fn policy(evaluate_body: &str, extra: &str, limits: PolicyLimits) -> Result<Policy, LoadError> {
        let src = format!(
            r#"(module
  (memory (export "memory") 1)
  (data (i32.const 16) "{{}}")
  (func (export "slotgate_abi_version") (result i32) (i32.const 1))
  (func (export "slotgate_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "slotgate_evaluate") (param $p i32) (param $n i32) (result i64)
    (local $i i32)
    {evaluate_body}
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 2)))
  {extra})"#
        );
        let engine = PolicyEngine::new(EngineLimits {
            max_instances: 8,
            max_memory_bytes: 1 << 20,
        })
        .unwrap();
        Policy::load(&engine, Arc::default(), "t", src.as_bytes(), limits)
    }

    #[test]
    fn an_optional_export_with_the_wrong_signature_is_refused() {
        let bad =
            r#"(func (export "slotgate_on_complete") (param i32) (result i32) (i32.const 0))"#;
        let err = policy("", bad, PolicyLimits::default())
            .err()
            .expect("refused");
        assert!(
            err.to_string()
                .contains("`slotgate_on_complete` must have the signature (i32, i32) -> (i64)"),
            "{err}"
        );
        let good =
            r#"(func (export "slotgate_on_complete") (param i32 i32) (result i64) (i64.const 0))"#;
        assert!(policy("", good, PolicyLimits::default()).is_ok());
    }

    /// The deadline counts the time the evaluation ran, not time it spent waiting for a core: with
    /// every core busy with other threads, an evaluation needing a third of its deadline in CPU time
    /// still succeeds, though it takes several deadlines of wall-clock time.
    #[test]
    fn a_busy_machine_does_not_make_a_healthy_policy_time_out() {
        // A counted loop: about a millisecond or more of CPU time in a debug build.
        let burn = "(loop $l (local.set $i (i32.add (local.get $i) (i32.const 1))) (br_if $l (i32.lt_u (local.get $i) (i32.const 300000))))";
        let calibrate = policy(
            burn,
            "",
            PolicyLimits {
                fuel: u64::MAX / 4,
                deadline: Duration::from_secs(5),
                ..PolicyLimits::default()
            },
        )
        .unwrap();
        let alone = (0..5)
            .map(|_| {
                let t0 = Instant::now();
                calibrate.call(abi::EXPORT_EVALUATE, b"{}").unwrap();
                t0.elapsed()
            })
            .min()
            .unwrap();
        let deadline = (alone * 3).max(Duration::from_millis(3));
        let p = policy(
            burn,
            "",
            PolicyLimits {
                fuel: u64::MAX / 4,
                deadline,
                ..PolicyLimits::default()
            },
        )
        .unwrap();

        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let spinners: Vec<_> = (0..cores * 4)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let mut slowest = Duration::ZERO;
        let results: Vec<_> = (0..20)
            .map(|_| {
                let t0 = Instant::now();
                let r = p.call(abi::EXPORT_EVALUATE, b"{}");
                slowest = slowest.max(t0.elapsed());
                r
            })
            .collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(
            failed.is_empty(),
            "{} of 20 timed out (deadline {deadline:?}, {alone:?} alone, slowest {slowest:?}): {failed:?}",
            failed.len()
        );

        // A runaway one still ends by its deadline, within the wall-clock ceiling.
        let spin = policy(
            "(loop $l (br $l))",
            "",
            PolicyLimits {
                fuel: u64::MAX / 4,
                deadline: Duration::from_millis(20),
                ..PolicyLimits::default()
            },
        )
        .unwrap();
        let t0 = Instant::now();
        assert_eq!(
            spin.call(abi::EXPORT_EVALUATE, b"{}").unwrap_err(),
            EvalError::Timeout
        );
        assert!(t0.elapsed() < LOAD_DEADLINE * 2, "{:?}", t0.elapsed());
    }
}
