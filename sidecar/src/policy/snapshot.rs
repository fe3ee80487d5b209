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

use super::engine::PolicyEngine;
use super::module::{LoadError, Policy, PolicyLimits};
use super::state::{HostState, SharedState};

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
    let scratch = Arc::new(SharedState::default());
    let probe = Policy::link(engine, scratch, name, instrumented, limits)?;
    let (verdict, snapshot) = probe.validate_settings_then(settings, |store, instance| {
        let mut state = Running {
            store,
            instance: *instance,
        };
        ready(Wizer::new().snapshot(cx, &mut state))
    })?;
    if !verdict.keeps_settings {
        return Err(LoadError::Compile(
            "the instrumented module did not keep its settings".into(),
        ));
    }
    snapshot.map_err(|e| LoadError::Compile(format!("snapshot: {e:#}")))
}

/// The instance `validate_settings` ran in, as Wizer reads it.
struct Running<'a> {
    store: &'a mut Store<HostState>,
    instance: Instance,
}

impl InstanceState for Running<'_> {
    async fn global_get(&mut self, name: &str, _type_hint: ValType) -> SnapshotVal {
        let global = self
            .instance
            .get_global(&mut *self.store, name)
            .expect("the instrumented module exports every global");
        match global.get(&mut *self.store) {
            Val::I32(x) => SnapshotVal::I32(x),
            Val::I64(x) => SnapshotVal::I64(x),
            Val::F32(x) => SnapshotVal::F32(x),
            Val::F64(x) => SnapshotVal::F64(x),
            Val::V128(x) => SnapshotVal::V128(x.as_u128()),
            other => panic!("global `{name}` holds a reference ({other:?}), which Wizer refuses"),
        }
    }

    async fn memory_contents(&mut self, name: &str, contents: impl FnOnce(&[u8]) + Send) {
        let memory = self
            .instance
            .get_memory(&mut *self.store, name)
            .expect("the instrumented module exports its memory");
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
