//! The host's interfaces as a component imports them: log, clocks and state. Every call is counted
//! against the policy's budget of host calls (its fuel over the fuel one call costs), so a loop of
//! host calls ends as a v1 module's does.

use super::records::cut;
use super::t;
use super::wit;
use crate::policy::error::EvalError;
use crate::policy::sandbox::{HostState, MAX_HOST_STRING};

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
        Ok(self.shared.clock().monotonic_ms())
    }

    fn wall_ms(&mut self) -> wasmtime::Result<i64> {
        self.host_call()?;
        Ok(self.shared.clock().wall_ms())
    }
}

/// `fn $name(key, [period,] $arg...)`: a host call on the policy's state, counted and its key
/// checked as every host call is, answering what `Budgets::$method` does for the policy's
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
