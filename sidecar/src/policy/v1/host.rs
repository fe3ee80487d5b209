//! The host's functions as an ABI v1 module imports them (`slotgate::*`): log, clocks, and the
//! policy's budgets. Each is a host call: it costs fuel, and its strings are bounded.

use wasmtime::{Caller, Extern, Linker, Trap};

use super::abi::{self, IMPORT_MODULE};
use crate::budgets::Clock;
use crate::policy::engine::PolicyEngine;
use crate::policy::error::{EvalError, LoadError};
use crate::policy::sandbox::{HostState, HOST_CALL_FUEL, MAX_HOST_STRING};

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
/// then the `$arg`s; the call answers what `Budgets::$method` does for the policy's state key,
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

pub(super) fn linker(engine: &PolicyEngine) -> Result<Linker<HostState>, LoadError> {
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
    link_clock(&mut l, "now_ms", Clock::monotonic_ms).map_err(wrap)?;
    link_state!(l, "bucket_take" => bucket_take(key, capacity: f64, refill: f64, amount: f64))
        .map_err(wrap)?;
    link_state!(l, "bucket_refund" => bucket_refund(key, capacity: f64, refill: f64, amount: f64))
        .map_err(wrap)?;
    link_state!(l, "window_add" => window_add(key, window_ms: i64, amount: i64)).map_err(wrap)?;
    link_v1_additions(&mut l).map_err(wrap)?;
    Ok(l)
}

/// Links `name`, a host call that answers `read` of the budgets' clock (and costs fuel as every host
/// call does).
fn link_clock(
    l: &mut Linker<HostState>,
    name: &str,
    read: fn(&Clock) -> i64,
) -> wasmtime::Result<()> {
    l.func_wrap(
        IMPORT_MODULE,
        name,
        move |mut c: Caller<'_, HostState>| -> wasmtime::Result<i64> {
            host_str(&mut c, 0, 0)?;
            Ok(read(c.data().shared.clock()))
        },
    )?;
    Ok(())
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
    link_clock(l, "wall_ms", Clock::wall_ms)?;
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
