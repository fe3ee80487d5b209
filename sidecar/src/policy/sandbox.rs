//! What every policy call runs in, whatever contract the policy speaks: its limits, the store and
//! its data, fuel, the CPU deadline checked at every epoch tick, the memory limiter, the empty WASI
//! context a guest runtime may ask for, the checks every decision passes, and how a failed call is
//! named.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use slotgate_sdk::{Decision, Verdict};
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, StoreLimits, Trap, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::engine::{PolicyEngine, EPOCH_TICK};
use super::error::{EvalError, LoadError};
use crate::budgets::Budgets;

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

impl PolicyLimits {
    /// Refuses a policy file over `max_module_bytes`, before anything compiles it.
    pub fn check_size(&self, bytes: &[u8]) -> Result<(), LoadError> {
        match bytes.len() > self.max_module_bytes {
            true => Err(LoadError::TooLarge {
                size: bytes.len(),
                limit: self.max_module_bytes,
            }),
            false => Ok(()),
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

/// What one store carries: its limits, the shared state and who it is evaluating for.
pub struct HostState {
    pub limits: StoreLimits,
    pub shared: Arc<Budgets>,
    pub policy: Arc<str>,
    /// Whose budgets the state functions use: the operator's name for the policy, else the name
    /// the module declares, else the file's (`Policy::keyed`).
    pub state_key: Arc<str>,
    /// Host calls made during this evaluation (each also costs fuel).
    pub host_calls: u64,
    /// Set when the memory cap refused a growth, to tell that failure from other traps.
    pub memory_denied: bool,
    /// Host calls this call may make (a component's; a core module's are charged fuel instead).
    pub host_call_budget: u64,
    /// The largest linear memory of the store so far, in bytes.
    pub memory_high: usize,
    /// A component's WASI context, made the first time it touches WASI.
    pub wasi: Option<Box<Wasi>>,
}

impl HostState {
    pub fn new(
        limits: StoreLimits,
        shared: Arc<Budgets>,
        policy: Arc<str>,
        state_key: Arc<str>,
    ) -> HostState {
        HostState {
            limits,
            shared,
            policy,
            state_key,
            host_calls: 0,
            memory_denied: false,
            host_call_budget: u64::MAX,
            memory_high: 0,
            wasi: None,
        }
    }

    pub fn with_host_call_budget(mut self, calls: u64) -> HostState {
        self.host_call_budget = calls;
        self
    }
}

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
