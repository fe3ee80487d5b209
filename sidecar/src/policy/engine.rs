//! The one wasmtime engine: tier-1 features only, fuel metering, epoch interruption driven by a
//! ticker thread, and the pooling allocator so a fresh instance per evaluation is cheap.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::{
    Cache, CacheConfig, Config, Enabled, Engine, InstanceAllocationStrategy,
    PoolingAllocationConfig,
};

/// One epoch tick; evaluation deadlines are whole ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Bytes of each pooled linear memory reset in place rather than released between evaluations.
const KEEP_RESIDENT: usize = 4 << 20;

/// Core instances one evaluation may use: one for a v1 module, up to this many for a component.
pub const CORE_PER_CALL: u32 = 16;
/// Linear memories one evaluation may use.
pub const MEMORIES_PER_CALL: u32 = 4;

/// Idle pool slots kept warm (resident) before a used one is taken over instead of a cold one.
const WARM_SLOTS: u32 = 8;

/// Sizes of the instance pool, shared by every policy.
#[derive(Debug, Clone, Copy)]
pub struct EngineLimits {
    /// Instances alive at once (evaluations in progress, across all policies).
    pub max_instances: u32,
    /// Upper bound of any policy's linear memory, in bytes.
    pub max_memory_bytes: usize,
}

impl EngineLimits {
    pub const DEFAULT_INSTANCES: u32 = 256;
}

impl Default for EngineLimits {
    fn default() -> Self {
        EngineLimits {
            max_instances: EngineLimits::DEFAULT_INSTANCES,
            max_memory_bytes: crate::config::POLICY_MAX_MEMORY_BYTES,
        }
    }
}

#[derive(Clone)]
pub struct PolicyEngine {
    engine: Engine,
    limits: EngineLimits,
    disk_cache: Option<Cache>,
    _ticker: Arc<Ticker>,
}

impl PolicyEngine {
    pub fn new(limits: EngineLimits) -> wasmtime::Result<Self> {
        PolicyEngine::with_disk_cache(limits, None)
    }

    /// An engine that also keeps compiled modules in `cache_dir` (wasmtime's cache, keyed by the
    /// module's hash and this engine's compiler and settings), so a restart does not recompile.
    pub fn with_disk_cache(
        limits: EngineLimits,
        cache_dir: Option<&Path>,
    ) -> wasmtime::Result<Self> {
        let mut cfg = config(limits);
        let disk_cache = match cache_dir {
            Some(dir) => {
                // wasmtime loads native code from it: only slotgate's user may write there.
                crate::owner_only::dir(dir)
                    .map_err(|e| wasmtime::Error::msg(format!("policy-cache-dir: {e}")))?;
                let mut cc = CacheConfig::new();
                cc.with_directory(dir);
                let cache = Cache::new(cc)?;
                cfg.cache(Some(cache.clone()));
                Some(cache)
            }
            None => None,
        };
        let engine = Engine::new(&cfg)?;
        let ticker = Ticker::start(engine.clone());
        Ok(PolicyEngine {
            engine,
            limits,
            disk_cache,
            _ticker: Arc::new(ticker),
        })
    }

    /// Hits and misses of the on-disk module cache, when there is one.
    pub fn disk_cache_stats(&self) -> Option<(usize, usize)> {
        self.disk_cache
            .as_ref()
            .map(|c| (c.cache_hits(), c.cache_misses()))
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn limits(&self) -> EngineLimits {
        self.limits
    }
}

fn config(limits: EngineLimits) -> Config {
    let mut cfg = Config::new();
    cfg.consume_fuel(true)
        .epoch_interruption(true)
        // Tier-1 core wasm only: everything a policy could use to escape the limits or that is less
        // hardened is off. Threads, GC (with function references and exceptions) and the component
        // model are not even compiled in: their cargo features are off.
        .wasm_gc(false)
        .wasm_memory64(false)
        .wasm_multi_memory(false)
        .wasm_relaxed_simd(false)
        .wasm_stack_switching(false)
        .wasm_custom_page_sizes(false)
        .wasm_wide_arithmetic(false)
        .max_wasm_stack(512 << 10)
        // Calls on an async worker run on a fiber of their own (see `Runs` in sandbox.rs): room for
        // the wasm stack and the host frames below it.
        .async_stack_size(1 << 20);
    let mut pool = PoolingAllocationConfig::default();
    // A v1 module is one core instance with one memory and one table; a component is several
    // (a Python runtime is a dozen core modules linked together, with a few memories): room for
    // that many per evaluation. Each slot is address space reserved, not memory used.
    pool.total_component_instances(limits.max_instances)
        .total_core_instances(limits.max_instances * CORE_PER_CALL)
        .total_memories(limits.max_instances * MEMORIES_PER_CALL)
        .total_tables(limits.max_instances * CORE_PER_CALL)
        .total_stacks(limits.max_instances)
        // Reuse warm slots rather than touching cold ones: by default the pool prefers a never-used
        // slot until 100 used ones sit idle, so each fiber stack (they have no module affinity)
        // and memory slot touched once stays resident, and the idle RSS crept up over a soak.
        // Memories still go to a slot of their own module first.
        .max_unused_warm_slots(WARM_SLOTS)
        .max_memory_size(limits.max_memory_bytes)
        // A fresh instance per evaluation must not pay page faults for the pages the last one
        // touched: reset them in place (only the dirty ones, found with PAGEMAP_SCAN where the
        // kernel has it) instead of handing them back to the kernel.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(64 << 10)
        .pagemap_scan(Enabled::Auto);
    cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    cfg
}

/// Advances the engine's epoch every [`EPOCH_TICK`] on its own thread, so a deadline fires even if
/// every runtime worker is busy.
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    fn start(engine: Engine) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("slotgate-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .ok();
        Ticker { stop, thread }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
