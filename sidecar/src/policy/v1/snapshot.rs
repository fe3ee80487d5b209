//! Pre-initialisation, Wizer-style: a policy whose `slotgate_validate_settings` keeps its parsed
//! settings in its memory (`keeps_settings`) is snapshotted right after that call, globals and
//! memory, into a new module whose data segments are that state. Every evaluation still gets a fresh
//! instance, but one that starts with the settings parsed, so no evaluation parses them again.
//!
//! The module is instrumented first (every global and the memory exported, so their values can be
//! read), instantiated with the real host functions against scratch state, validated, and
//! rewritten by `wasmtime-wizer`. A module it cannot snapshot (a table it mutates, a dropped data
//! segment) is served as it is, parsing its settings on every call.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use wasmtime::{Instance, Module, Store, Val};
use wasmtime_wizer::{InstanceState, ModuleContext, SnapshotVal, ValType, Wizer};

use super::module::Policy;
use crate::budgets::Budgets;
use crate::policy::engine::PolicyEngine;
use crate::policy::error::LoadError;
use crate::policy::sandbox::{HostState, PolicyLimits};

/// The module `wasm` (binary) instrumented for a snapshot: every global and the memory exported.
/// The context is what [`take`] needs to rewrite it afterwards.
pub fn instrument(wasm: &[u8]) -> Result<(ModuleContext<'_>, Vec<u8>), LoadError> {
    Wizer::new()
        .instrument(wasm)
        .map_err(|e| LoadError::Compile(format!("cannot pre-initialise: {e:#}")))
}

/// Runs `validate_settings` with `settings` in an instance of `instrumented` (compiled from
/// [`instrument`]'s output) and returns that instance as a new module. An error when the policy
/// refuses the settings, does not keep them, or cannot be snapshotted.
pub fn take(
    engine: &PolicyEngine,
    name: &str,
    cx: &ModuleContext<'_>,
    instrumented: &Module,
    settings: &serde_json::Value,
    limits: PolicyLimits,
) -> Result<Vec<u8>, LoadError> {
    let scratch = Arc::new(Budgets::default());
    let probe = Policy::link(engine, scratch, name, instrumented, limits)?;
    let (verdict, (snapshot, refused)) =
        probe.validate_settings_then(settings, |store, instance| {
            let mut state = Running {
                store,
                instance: *instance,
                refused: None,
            };
            let snapshot = ready(Wizer::new().snapshot(cx, &mut state));
            (snapshot, state.refused)
        })?;
    if !verdict.keeps_settings {
        return Err(LoadError::Compile(
            "the instrumented module did not keep its settings".into(),
        ));
    }
    if let Some(why) = refused {
        return Err(LoadError::Compile(format!("snapshot: {why}")));
    }
    snapshot.map_err(|e| LoadError::Compile(format!("snapshot: {e:#}")))
}

/// The instance `validate_settings` ran in, as Wizer reads it.
struct Running<'a> {
    store: &'a mut Store<HostState>,
    instance: Instance,
    /// Why the instance cannot be snapshotted, found while Wizer read it. Wizer's callbacks cannot
    /// fail, so each answers a stand-in and `take` turns this into its error.
    refused: Option<String>,
}

impl Running<'_> {
    fn refuse(&mut self, why: String) {
        self.refused.get_or_insert(why);
    }
}

impl InstanceState for Running<'_> {
    async fn global_get(&mut self, name: &str, _type_hint: ValType) -> SnapshotVal {
        let Some(global) = self.instance.get_global(&mut *self.store, name) else {
            self.refuse(format!(
                "the instrumented module does not export global `{name}`"
            ));
            return SnapshotVal::I32(0);
        };
        match global.get(&mut *self.store) {
            Val::I32(x) => SnapshotVal::I32(x),
            Val::I64(x) => SnapshotVal::I64(x),
            Val::F32(x) => SnapshotVal::F32(x),
            Val::F64(x) => SnapshotVal::F64(x),
            Val::V128(x) => SnapshotVal::V128(x.as_u128()),
            other => {
                self.refuse(format!(
                    "global `{name}` holds a reference ({other:?}), which Wizer cannot snapshot"
                ));
                SnapshotVal::I32(0)
            }
        }
    }

    async fn memory_contents(&mut self, name: &str, contents: impl FnOnce(&[u8]) + Send) {
        let Some(memory) = self.instance.get_memory(&mut *self.store, name) else {
            self.refuse(format!(
                "the instrumented module does not export memory `{name}`"
            ));
            return contents(&[]);
        };
        contents(memory.data(&*self.store));
    }
}

/// Runs a future that never waits (Wizer's snapshot is `async` only so other embedders can await
/// their own instance state; ours answers at once).
fn ready<T>(future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::engine::EngineLimits;

    /// A policy that keeps its settings, with `extra` in its module.
    fn keeping(extra: &str) -> String {
        let answer = r#"{\"valid\":true,\"keeps_settings\":true}"#;
        format!(
            r#"(module
  (memory (export "memory") 1)
  (data (i32.const 100) "{answer}")
  (func (export "slotgate_abi_version") (result i32) (i32.const 1))
  (func (export "slotgate_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "slotgate_validate_settings") (param i32 i32) (result i64)
    (i64.or (i64.shl (i64.const 100) (i64.const 32)) (i64.const 36)))
  (func (export "slotgate_evaluate") (param i32 i32) (result i64)
    (i64.or (i64.shl (i64.const 100) (i64.const 32)) (i64.const 14)))
  {extra})"#
        )
    }

    /// What `take` makes of `module` instrumented as `plain` was: a module whose exports are not
    /// what the instrumentation promised is an error, never a panic.
    fn take_mismatched(plain: &str, module: &str) -> Result<Vec<u8>, LoadError> {
        let engine = PolicyEngine::new(EngineLimits {
            max_instances: 8,
            max_memory_bytes: 16 << 20,
        })
        .unwrap();
        let plain = wat::parse_str(plain).unwrap();
        let (cx, _) = instrument(&plain).unwrap();
        let module = Module::new(engine.engine(), wat::parse_str(module).unwrap()).unwrap();
        let settings = serde_json::json!({});
        take(
            &engine,
            "t",
            &cx,
            &module,
            &settings,
            PolicyLimits::default(),
        )
    }

    #[test]
    fn a_global_holding_a_reference_is_a_load_error() {
        let plain = keeping("(global (mut i32) (i32.const 7))");
        let holds_a_reference = keeping(
            r#"(global (export "__wizer_global_0") (mut funcref) (ref.null func))
               (export "__wizer_memory_0" (memory 0))"#,
        );
        let err = take_mismatched(&plain, &holds_a_reference).unwrap_err();
        assert!(
            matches!(&err, LoadError::Compile(m) if m.contains("holds a reference")),
            "{err:?}"
        );
    }

    #[test]
    fn a_global_or_memory_not_exported_is_a_load_error() {
        let plain = keeping("(global (mut i32) (i32.const 7))");
        let err = take_mismatched(&plain, &keeping("")).unwrap_err();
        assert!(
            matches!(&err, LoadError::Compile(m) if m.contains("does not export")),
            "{err:?}"
        );
    }

    #[test]
    fn a_module_as_instrumented_is_snapshotted() {
        let plain = keeping("(global (mut i32) (i32.const 7))");
        let instrumented = keeping(
            r#"(global (export "__wizer_global_0") (mut i32) (i32.const 7))
               (export "__wizer_memory_0" (memory 0))"#,
        );
        assert!(take_mismatched(&plain, &instrumented).is_ok());
    }
}
