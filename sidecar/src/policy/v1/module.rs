//! An ABI v1 core module: compiled off the request path, its exports checked against the ABI, the
//! host's functions linked (`host.rs`), and an `InstancePre` from which every call gets a fresh
//! instance under the sandbox's limits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::{InstancePre, Module, ResourceLimiter, Store, StoreLimitsBuilder};

use super::abi::{self, ABI_VERSION, IMPORT_MODULE};
use super::host::linker;
use super::json::settings_verdict;
use crate::budgets::Budgets;
use crate::policy::engine::PolicyEngine;
use crate::policy::error::{EvalError, LoadError};
use crate::policy::sandbox::{
    classify, new_store, CallClock, Evaluation, HostState, PolicyLimits, Runs, SettingsVerdict,
    LOAD_DEADLINE,
};

pub struct Policy {
    name: Arc<str>,
    /// Whose budgets its host state is (see [`Policy::keyed`]).
    state_key: Arc<str>,
    engine: PolicyEngine,
    shared: Arc<Budgets>,
    pre: InstancePre<HostState>,
    limits: PolicyLimits,
    has_validate: bool,
    has_on_complete: bool,
}

impl Policy {
    /// Compiles and links `bytes`. Slow (milliseconds): never call it on the request path.
    #[cfg(test)]
    pub fn load(
        engine: &PolicyEngine,
        shared: Arc<Budgets>,
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
        limits.check_size(bytes)?;
        Module::new(engine.engine(), bytes).map_err(|e| LoadError::Compile(format!("{e:#}")))
    }

    /// Checks a compiled module against ABI v1 and links the host functions: the policy is then
    /// ready to evaluate.
    pub fn link(
        engine: &PolicyEngine,
        shared: Arc<Budgets>,
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
